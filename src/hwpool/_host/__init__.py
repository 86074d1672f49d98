"""What the machine has: GPU detection, CPU topology, cgroup quotas and team sizing."""
