"""Regenerate the example traces bundled in src/hwpool/_sim/traces (deterministic: fixed seeds).

python examples/make_example_traces.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TRACES = Path(__file__).resolve().parents[1] / "src" / "hwpool" / "_sim" / "traces"


def embedding_service(seed: int = 1) -> list[dict[str, object]]:
    """A steady embedding service: Poisson calls of 0.1-0.25 GPU, plus a periodic re-index."""
    rng = random.Random(seed)
    rows: list[dict[str, object]] = []
    t = 0.0
    while (t := t + rng.expovariate(22.0)) < 40.0:
        demand = rng.choice((0.1, 0.1, 0.2, 0.25))
        rows.append(
            {
                "arrival": round(t, 3),
                "demand": demand,
                "duration": round(rng.uniform(0.2, 1.5), 3),
                "name": f"embed{len(rows)}",
            }
        )
    for k in range(4):
        rows.append(
            {"arrival": 10.0 * k + 2.0, "demand": 0.5, "duration": 4.0, "name": f"reindex{k}"}
        )
    return sorted(rows, key=lambda row: float(str(row["arrival"])))


def bursty_batch(seed: int = 2) -> list[tuple[float, float, float, str]]:
    """Batch bursts every 30 s of half- and whole-GPU jobs and 2-GPU jobs, over a small stream."""
    rng = random.Random(seed)
    rows: list[tuple[float, float, float, str]] = []
    for burst in range(5):
        base = 30.0 * burst
        for j in range(8):
            demand = rng.choice((0.5, 0.5, 1))
            rows.append((base + rng.uniform(0, 3), demand, rng.uniform(3, 10), f"b{burst}job{j}"))
        for j in range(1 + burst % 2):
            rows.append((base + rng.uniform(0, 3), 2, rng.uniform(5, 12), f"b{burst}wide{j}"))
    t = 0.0
    while (t := t + rng.expovariate(1.5)) < 150.0:
        rows.append((t, 0.25, rng.uniform(1, 4), f"small{len(rows)}"))
    return sorted(((round(a, 3), d, round(u, 3), n) for a, d, u, n in rows))


def main() -> None:
    lines = ["# steady embedding service: arrival s, demand (fraction of a GPU), duration s"]
    lines += [json.dumps(row) for row in embedding_service()]
    (TRACES / "embedding-service.jsonl").write_text("\n".join(lines) + "\n")
    csv = ["# bursty batch: bursts every 30 s, with 2-GPU jobs", "arrival,demand,duration,name"]
    csv += [f"{a},{d:g},{u},{n}" for a, d, u, n in bursty_batch()]
    (TRACES / "bursty-batch.csv").write_text("\n".join(csv) + "\n")


if __name__ == "__main__":
    main()
