"""Traces, the virtual-time simulator, baseline policies and shipped traces."""
