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


def model_serving(seed: int = 3) -> list[dict[str, object]]:
    """Models of several sizes on one 80 GiB and one 24 GiB GPU, asked for by memory.

    Embedders (6 GiB) and rerankers (2 GiB) stream in; 7B-class models (16 GiB) and a few
    70B-class ones (44 GiB, which fit only the large card) come in bursts; a few fine-tuning
    steps take 24 GiB each (all of the small card, or a share of the large one).
    """
    rng = random.Random(seed)
    rows: list[dict[str, object]] = []

    def add(arrival: float, duration: float, name: str, **demand: object) -> None:
        rows.append(
            {"arrival": round(arrival, 3), **demand, "duration": round(duration, 3), "name": name}
        )

    t = 0.0
    while (t := t + rng.expovariate(2.0)) < 120.0:
        if rng.random() < 0.6:
            add(t, rng.uniform(0.5, 2.5), f"embed{len(rows)}", memory="6GiB")
        else:
            add(t, rng.uniform(0.3, 1.5), f"rerank{len(rows)}", memory="2GiB")
    for burst in range(6):
        base = 20.0 * burst + rng.uniform(0, 4)
        for j in range(3):
            add(base + rng.uniform(0, 2), rng.uniform(4, 10), f"llm7b-{burst}-{j}", memory="16GiB")
        add(base + rng.uniform(0, 2), rng.uniform(8, 14), f"llm70b-{burst}", memory="44GiB")
    for k in range(3):
        add(35.0 * k + 10.0, rng.uniform(6, 10), f"finetune{k}", memory="24GiB")
    return sorted(rows, key=lambda row: float(str(row["arrival"])))


def main() -> None:
    lines = ["# steady embedding service: arrival s, demand (fraction of a GPU), duration s"]
    lines += [json.dumps(row) for row in embedding_service()]
    (TRACES / "embedding-service.jsonl").write_text("\n".join(lines) + "\n")
    csv = ["# bursty batch: bursts every 30 s, with 2-GPU jobs", "arrival,demand,duration,name"]
    csv += [f"{a},{d:g},{u},{n}" for a, d, u, n in bursty_batch()]
    (TRACES / "bursty-batch.csv").write_text("\n".join(csv) + "\n")
    lines = ["# model serving by memory, for --gpu-memory 80GiB,24GiB: arrival s, memory, duration"]
    lines += [json.dumps(row) for row in model_serving()]
    (TRACES / "model-serving.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
