"""The policy benchmark runs end to end as a script: a table per trace with a row per policy,
makespans never below the packing bound, and a verdict per aim (its figures are not judged:
a benchmark reports). The real-time one likewise, on one short workload."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from hwpool._sim._simulate import POLICIES

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_policy.py"


@dataclass
class Row:
    policy: str
    makespan: float
    ratio: float


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH), "--quick", *args],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )


def tables(out: str) -> dict[str, tuple[float, list[Row]]]:
    """Each trace's packing bound and rows, from the ``== name: ... packing bound X s`` title,
    the header after it and the rows up to the next blank line."""
    found: dict[str, tuple[float, list[Row]]] = {}
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("== "):
            continue
        name = line[3:].split(":")[0]
        bound = float(line.split("packing bound ")[1].split()[0])
        assert lines[i + 1].split()[:3] == ["policy", "makespan", "ratio"]
        rows = []
        for row in lines[i + 2 :]:
            if not row.strip():
                break
            policy, makespan, ratio = row.split()[:3]
            assert ratio.endswith("x"), row
            rows.append(Row(policy, float(makespan), float(ratio.removesuffix("x"))))
        found[name] = (bound, rows)
    return found


def verdicts(out: str) -> dict[str, dict[str, str]]:
    """Aim letter -> trace -> 'met', 'missed' or 'n/a'."""
    found: dict[str, dict[str, str]] = {}
    aim = ""
    for line in out.splitlines():
        if line.startswith("(") and ")" in line[:4]:
            aim = line[1]
            found[aim] = {}
        elif aim and line.startswith("    "):
            name, rest = line.strip().split(": ", 1)
            found[aim][name] = rest.split()[0]
    return found


@pytest.mark.timeout(120)
def test_a_row_per_policy_and_no_makespan_below_the_bound() -> None:
    done = bench("--trace", "P1,stream-70")
    assert done.returncode == 0, done.stderr
    found = tables(done.stdout)
    assert list(found) == ["P1", "stream-70"]
    for name, (bound, rows) in found.items():
        assert [row.policy for row in rows] == list(POLICIES), name
        for row in rows:
            assert row.ratio >= 1.0, (name, row)
            assert row.makespan >= bound - 0.05, (name, row)  # both printed to 0.1 s
    # P1: the old policy's makespan is 120 s against a bound of 110 s
    p1 = {row.policy: row for row in found["P1"][1]}
    assert p1["hwpool-reserve-all"].ratio == pytest.approx(120 / 110, abs=1e-3)
    aims = verdicts(done.stdout)
    assert set(aims) == {"a", "b", "c"}
    assert set(aims["a"]) == set(aims["b"]) == {"P1", "stream-70"}
    assert set(aims["c"]) == {"stream-70"}
    assert all(v in ("met", "missed", "n/a") for by in aims.values() for v in by.values())


@pytest.mark.timeout(120)
def test_chosen_policies_only_and_aims_without_them_say_so() -> None:
    done = bench("--trace", "pack-0.6", "--policy", "fifo,first-fit")
    assert done.returncode == 0, done.stderr
    ((bound, rows),) = tables(done.stdout).values()
    assert [row.policy for row in rows] == ["fifo", "first-fit"]
    assert bound == 25.0  # 100 x 0.6 GPU of 1 s never share a GPU: 100 s over 4 GPUs
    assert all(row.ratio >= 1.0 for row in rows)
    assert verdicts(done.stdout)["a"] == {"pack-0.6": "n/a"}


@pytest.mark.timeout(60)
def test_an_unknown_trace_is_refused_by_name() -> None:
    done = bench("--trace", "no-such")
    assert done.returncode != 0
    assert "unknown trace 'no-such'" in done.stderr


@pytest.mark.timeout(60)
def test_it_loads_as_hwpool_bench_loads_it(capsys: pytest.CaptureFixture[str]) -> None:
    # `hwpool bench` execs the file as a module that is not in sys.modules (see _cli/_bench.py)
    spec = importlib.util.spec_from_file_location("_hwpool_bench_bench_policy", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = module.main(["--quick", "--trace", "pack-0.6", "--policy", "hwpool"])
    assert [row.policy for row in tables(text)["pack-0.6"][1]] == ["hwpool"]
    assert text in capsys.readouterr().out


REALTIME = BENCH.with_name("bench_policy_realtime.py")


@pytest.mark.timeout(120)
def test_the_real_time_benchmark_prints_a_ratio_per_policy_never_above_one() -> None:
    proc = subprocess.run(
        [sys.executable, str(REALTIME), "--seeds", "1", "--seconds", "0.5"],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {}
    for line in proc.stdout.splitlines():
        for policy in ("easy", "reserve-all", "first-fit toy"):
            if line.startswith(policy + " "):
                rows[policy] = [float(x) for x in line[len(policy) :].split()]
    assert set(rows) == {"easy", "reserve-all", "first-fit toy"}
    for mean, worst, seed7, wide in rows.values():
        assert 0.0 < worst <= mean <= 1.0 + 1e-9  # a schedule never beats its bound
        assert seed7 == mean  # one seed: 7
        assert wide >= 0.0
    assert "aim: easy's mean at least 0.95" in proc.stdout
