"""The pure scheduling core: capacity units, demands, grants, the scheduler (no I/O, no clock)."""
