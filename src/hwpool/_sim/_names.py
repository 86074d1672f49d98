"""What ``hwpool simulate`` names in its help, on their own: the policies the simulator
compares and the bundled traces (the parser, built before every command, loads neither the
simulator nor the trace reader)."""

__all__ = ["EXAMPLE_TRACES", "POLICIES"]

POLICIES = (
    "hwpool",
    "hwpool-limits",
    "hwpool-reserve-all",
    "fifo",
    "first-fit",
    "shortest-queue",
)
"""The policies ``hwpool simulate --policy`` compares (see ``_simulate``: hwpool's own first)."""

EXAMPLE_TRACES = {
    "embedding": "embedding-service.jsonl",
    "batch": "bursty-batch.csv",
    "serving": "model-serving.jsonl",
}
"""Bundled example traces: short name -> file under ``hwpool/traces``."""
