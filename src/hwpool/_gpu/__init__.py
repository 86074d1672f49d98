"""The GPUPool front: leases, current_gpus and snapshots, over a backend."""
