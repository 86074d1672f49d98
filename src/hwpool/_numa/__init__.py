"""NUMA placement on multi-socket Linux: page nodes, binding, page placement."""
