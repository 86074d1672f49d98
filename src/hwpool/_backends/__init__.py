"""Backends under the GPUPool front: whatever owns the scheduler core (in-process, a server)."""
