"""The ``hwpool`` command, run as a user runs it: a subprocess, real exit codes and output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hwpool import __version__ as hwpool_version

SRC = str(Path(__file__).resolve().parents[2] / "src")


def hwpool(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": SRC, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "hwpool", *args],
        capture_output=True,
        text=True,
        env=environ,
        cwd=cwd,
        timeout=60,
        check=False,
    )


def assert_user_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Exit 2, nothing on stdout, one line on stderr that says what is wrong, no traceback."""
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]


# ----------------------------------------------------------------- usage
def test_help_lists_the_commands() -> None:
    proc = hwpool("--help")
    assert proc.returncode == 0
    for command in ("info", "demo", "simulate", "bench"):
        assert command in proc.stdout


def test_no_command_is_bad_usage_in_one_line() -> None:
    assert_user_error(hwpool(), "hwpool: error: ", "COMMAND", "hwpool --help")


def test_version_comes_from_the_package() -> None:
    proc = hwpool("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"hwpool {hwpool_version}\n"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("simulate", "batch", "--bogus"), "--bogus"),
        (("info", "--verbose"), "--verbose"),
        (("frobnicate",), "frobnicate"),
        (("simulate",), "TRACE"),
        (("simulate", "batch", "--gpus", "0"), "--gpus"),
        (("simulate", "batch", "--gpus", "two"), "'two'"),
        (("simulate", "batch", "--gpus", "²"), "'²'"),
        (("simulate", "batch", "--gpus", "99999999999999999999"), "between 1 and 4096"),
        (("simulate", "batch", "--gpus", "1000000000"), "between 1 and 4096"),
        (("simulate", "batch", "--gpus", "4097"), "got 4097"),
        (("simulate", "batch", "--gpus", "9" * 5000), "between 1 and 4096"),
        (("simulate", "batch", "--policy", "random"), "random"),
        (("serve", "--policy", "fifo"), "'fifo'"),
        (("demo", "--seconds", "-1"), "--seconds"),
        (("demo", "--seconds", "1e308"), "--seconds"),
        (("demo", "--seconds", "nan"), "--seconds"),
    ],
)
def test_bad_flags_give_one_line_and_exit_2(args: tuple[str, ...], fragment: str) -> None:
    assert_user_error(hwpool(*args), "hwpool: error: ", fragment)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("HWPOOL_SPIN", "abc"),
        ("HWPOOL_THREADS", "0"),
        ("HWPOOL_NUMA", "sideways"),
        ("HWPOOL_NUM_GPUS", "lots"),
    ],
)
@pytest.mark.parametrize(
    "command", [("demo", "--seconds", "0.3"), ("info",), ("simulate", "batch")]
)
def test_malformed_variable_stops_every_command_before_any_work(
    variable: str, value: str, command: tuple[str, ...]
) -> None:
    # Before the fix, `HWPOOL_SPIN=abc hwpool demo` ran the whole GPU stage, then died with a
    # traceback (exit 1) when the CPU pool first read the variable.
    assert_user_error(hwpool(*command, env={variable: value}), variable, repr(value))


def test_counts_of_one_are_singular(tmp_path: Path) -> None:
    trace = tmp_path / "one.csv"
    trace.write_text("arrival,demand,duration\n0,0.5,1\n")
    proc = hwpool("simulate", str(trace), "--gpus", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{trace}: 1 task on 1 GPU (virtual time)\n")
    info = hwpool("info", env={"HWPOOL_THREADS": "1"})
    assert "team of 1 thread (" in info.stdout


# ----------------------------------------------------------------- simulate
HAND_TRACE = """\
arrival,demand,duration,name
0,0.7,4,x
0,0.6,3,y
0,0.6,2,z
1,2,1,w
1.5,0.3,1,s
"""


def test_simulate_json_matches_the_hand_worked_schedule(tmp_path: Path) -> None:
    trace = tmp_path / "hand.csv"
    trace.write_text(HAND_TRACE)
    proc = hwpool("simulate", str(trace), "--gpus", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["policy"] == "hwpool"
    assert doc["makespan"] == 4.0
    assert doc["lower_bound"] == 4.0
    assert doc["utilization"] == pytest.approx(8.1 / 12)
    got = {t["name"]: (t["start"], t["end"], t["gpus"]) for t in doc["tasks"]}
    assert got == {
        "x": (0, 4, [0]),
        "y": (0, 3, [1]),
        "z": (0, 2, [2]),
        "w": (3, 4, [1, 2]),
        "s": (1.5, 2.5, [0]),
    }
    assert {t["name"]: t["demand"] for t in doc["tasks"]}["w"] == 2
    assert {t["name"]: t["arrival"] for t in doc["tasks"]}["s"] == 1.5


def test_simulate_all_policies_json_has_one_object_per_policy() -> None:
    proc = hwpool("simulate", "batch", "--policy", "all", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert list(doc["policies"]) == [
        "hwpool",
        "hwpool-limits",
        "hwpool-reserve-all",
        "fifo",
        "first-fit",
        "shortest-queue",
    ]
    for result in doc["policies"].values():
        assert {"tasks", "makespan", "lower_bound", "utilization"} <= set(result)
        assert result["makespan"] >= doc["lower_bound"]
        assert len(result["tasks"]) == len(doc["policies"]["hwpool"]["tasks"])


def test_simulate_table_shows_policies_side_by_side() -> None:
    proc = hwpool("simulate", "batch", "--policy", "hwpool,first-fit")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("batch: ")
    header = lines[1].split()
    assert header == ["hwpool", "first-fit"]
    assert any(line.startswith("makespan lower bound (s)") for line in lines)
    assert any(line.startswith("2 GPUs x") for line in lines)
    p99 = [line.split() for line in lines if line.strip().startswith("p99 wait")]
    assert p99 and all(len(cells) == 5 for cells in p99)  # "p99 wait (s)" + two columns


def test_simulate_is_deterministic() -> None:
    first = hwpool("simulate", "embedding", "--policy", "all", "--json")
    second = hwpool("simulate", "embedding", "--policy", "all", "--json")
    assert first.returncode == 0
    assert first.stdout == second.stdout


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        ("arrival,demand,duration\n0,0.5,1\n1,1.5,2\n", ("line 3", "'demand'")),
        ("arrival,demand\n0,0.5\n", ("line 1", "'duration'")),
        ('{"arrival": 0, "demand": 0.5, "duration": 1}\n{"arrival": 1}\n', ("line 2",)),
        ("arrival,demand,duration\n0,4,1\n", ("bad.csv: line 2:", "needs 4 GPUs", "gpus=2")),
    ],
)
def test_bad_traces_exit_2_naming_the_line(
    tmp_path: Path, content: str, fragments: tuple[str, ...]
) -> None:
    trace = tmp_path / ("bad.jsonl" if content.startswith("{") else "bad.csv")
    trace.write_text(content)
    assert_user_error(hwpool("simulate", str(trace), "--gpus", "2"), *fragments)


def test_missing_trace_file() -> None:
    assert_user_error(hwpool("simulate", "/nonexistent/trace.csv"), "/nonexistent/trace.csv")


def test_a_directory_is_not_reported_as_a_missing_file(tmp_path: Path) -> None:
    proc = hwpool("simulate", str(tmp_path))
    assert_user_error(proc, str(tmp_path), "is a directory")
    assert "no such file" not in proc.stderr


def test_a_name_with_a_newline_still_gives_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "two\nlines\u2028here"
    folder.mkdir()
    assert_user_error(hwpool("simulate", str(folder)), "two\\nlines\\u2028here", "is a directory")
    assert_user_error(hwpool("info", "--bogus\nflag"), "--bogus\\nflag")


NESTED = "[" * 100_000 + "]" * 100_000
CRASHERS = {  # file name -> (content, what the one-line error must say); each was a traceback
    "long-int.jsonl": ('{"arrival": ' + "7" * 400 + ', "demand": 0.5, "duration": 1}\n', "line 1"),
    "deep.jsonl": (
        '{"arrival": 0, "demand": 0.5, "duration": 1, "name": ' + NESTED + "}\n",
        "line 1",
    ),
    "wide.csv": ("arrival,demand,duration,name\n0,0.5,1," + "n" * 200_000 + "\n", "line 2"),
    "digits.jsonl": ('{"arrival": 0, "demand": ' + "2" * 5000 + ', "duration": 1}\n', "line 1"),
}


@pytest.mark.parametrize("name", sorted(CRASHERS))
def test_traces_that_used_to_crash_give_one_line_with_file_and_line(
    tmp_path: Path, name: str
) -> None:
    content, where = CRASHERS[name]
    trace = tmp_path / name
    trace.write_text(content)
    assert_user_error(hwpool("simulate", str(trace)), f"{trace}: {where}:")


def test_a_name_holding_u2028_is_read_and_written_back(tmp_path: Path) -> None:
    trace = tmp_path / "sep.jsonl"
    trace.write_text('{"arrival": 0, "demand": 0.5, "duration": 1, "name": "a\u2028b"}\n')
    proc = hwpool("simulate", str(trace), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tasks"][0]["name"] == "a\u2028b"


def test_a_csv_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    trace = tmp_path / "excel.csv"
    trace.write_bytes(b"\xef\xbb\xbf" + HAND_TRACE.encode())
    proc = hwpool("simulate", str(trace), "--gpus", "3")
    assert proc.returncode == 0, proc.stderr
    assert "5 tasks on 3 GPUs" in proc.stdout


def test_json_output_reads_back_as_a_trace(tmp_path: Path) -> None:
    first = hwpool("simulate", "batch", "--policy", "hwpool,fifo", "--json")
    saved = tmp_path / "out.json"
    saved.write_text(first.stdout)
    again = hwpool("simulate", str(saved), "--policy", "hwpool,fifo", "--json")
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout


def _no_constants(name: str) -> None:
    raise AssertionError(f"{name} in the JSON output")


def test_json_output_never_holds_infinity(tmp_path: Path) -> None:
    # Each time was finite, but arrival + duration overflowed: the output said "Infinity".
    trace = tmp_path / "far.csv"
    trace.write_text("arrival,demand,duration\n1e308,0.5,1e308\n")
    assert_user_error(hwpool("simulate", str(trace), "--json"), "line 2", "at most 1e+12")
    trace.write_text("arrival,demand,duration\n1e12,0.5,1e12\n0,2,1e12\n")
    proc = hwpool("simulate", str(trace), "--json", "--policy", "all")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout, parse_constant=_no_constants)
    assert doc["policies"]["hwpool"]["makespan"] == 2e12


def test_plot_without_matplotlib_says_how_to_install(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from hwpool._cli._main import main\n"
        f"sys.exit(main(['simulate', 'batch', '--plot', {str(tmp_path / 'x.png')!r}]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC},
        timeout=60,
        check=False,
    )
    assert_user_error(proc, "pip install 'hwpool[plot]'")
    assert not (tmp_path / "x.png").exists()


def test_plot_into_missing_directory_is_a_user_error(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    assert_user_error(hwpool("simulate", "batch", "--plot", "/nonexistent/x.png"), "--plot")
    assert_user_error(hwpool("demo", "--plot", str(tmp_path)), "is a directory")


def test_simulate_plot_writes_a_png_and_says_so(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "chart.png"
    proc = hwpool("simulate", "batch", "--policy", "hwpool,first-fit", "--plot", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes().startswith(b"\x89PNG")
    assert proc.stderr == f"wrote {out}\n"


@pytest.mark.parametrize(
    ("name", "fragment"),
    [("out.txt", "cannot write 'txt' images"), ("noext", "has no extension")],
)
@pytest.mark.parametrize("command", ["simulate", "demo"])
def test_plot_format_is_checked_before_any_work(
    tmp_path: Path, name: str, fragment: str, command: str
) -> None:
    # Before, `--plot out.txt` ran everything and failed on the format only at the end, and
    # `--plot noext` silently wrote noext.png.
    pytest.importorskip("matplotlib")
    target = tmp_path / name
    # The trace does not exist: the plot's error, not the trace's, proves nothing was read.
    args = ["simulate", str(tmp_path / "absent.csv")] if command == "simulate" else ["demo"]
    assert_user_error(hwpool(*args, "--plot", str(target)), "--plot", fragment)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------- info
def test_info_text_and_json_agree() -> None:
    env = {"HWPOOL_NUM_GPUS": "3"}
    text = hwpool("info", env=env)
    doc = hwpool("info", "--json", env=env)
    assert text.returncode == doc.returncode == 0
    info = json.loads(doc.stdout)
    assert info["gpus"]["count"] == 3
    assert info["gpus"]["source"] == "env"
    assert [d["index"] for d in info["gpus"]["devices"]] == [0, 1, 2]
    assert "GPUs: 3 (source: env" in text.stdout


def test_info_with_bad_environment_variable() -> None:
    assert_user_error(hwpool("info", env={"HWPOOL_NUM_GPUS": "lots"}), "HWPOOL_NUM_GPUS", "lots")


# ----------------------------------------------------------------- demo
def test_demo_runs_a_short_workload_and_prints_the_table() -> None:
    proc = hwpool("demo", "--seconds", "1.5")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "GPUPool (measured)" in out
    assert "simulated" in out
    counts = {
        line.split(" x")[0]: int(line.split(" x")[1])
        for line in out.splitlines()
        if " GPU" in line and " x" in line and not line.startswith(" ")
    }
    assert set(counts) == {"0.1 GPU", "0.2 GPU", "0.25 GPU", "0.5 GPU", "2 GPUs"}
    assert counts["2 GPUs"] == 3
    header = out.splitlines()[0]
    assert f"{sum(counts.values())} calls" in header


# ----------------------------------------------------------------- bench
def test_bench_runs_each_script_and_prints_its_table(tmp_path: Path) -> None:
    (tmp_path / "bench_alpha.py").write_text("def main():\n    return 'alpha table'\n")
    (tmp_path / "bench_beta.py").write_text("def main():\n    return 'beta table'\n")
    proc = hwpool("bench", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["== alpha ==", "alpha table", "== beta ==", "beta table"]
    only = hwpool("bench", "beta", "--dir", str(tmp_path))
    assert only.stdout.splitlines() == ["== beta ==", "beta table"]


def test_bench_keeps_going_after_a_failure_and_exits_1(tmp_path: Path) -> None:
    # Before, the first benchmark to fail ended the command: nothing after it ran.
    (tmp_path / "bench_a.py").write_text("def main():\n    raise OSError('disk on fire')\n")
    (tmp_path / "bench_b.py").write_text("def main():\n    return 'b table'\n")
    proc = hwpool("bench", "--dir", str(tmp_path))
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == ["== a ==", "== b ==", "b table"]
    assert proc.stderr.splitlines() == [
        "hwpool: error: bench_a.py failed: OSError: disk on fire",
        "hwpool: error: 1 of 2 benchmarks failed: a",
    ]


def test_bench_does_not_hand_its_own_argv_to_a_benchmark(tmp_path: Path) -> None:
    # bench_policy_realtime's main() parsed sys.argv, saw hwpool's "bench" and stopped the
    # whole run: "unrecognized arguments: bench".
    (tmp_path / "bench_args.py").write_text(
        "import argparse\n"
        "def main():\n"
        "    parser = argparse.ArgumentParser()\n"
        "    parser.add_argument('--quick', action='store_true')\n"
        "    return f'quick={parser.parse_args().quick}'\n"
    )
    (tmp_path / "bench_argv.py").write_text("def main(argv):\n    return f'argv={argv}'\n")
    proc = hwpool("bench", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["== args ==", "quick=False", "== argv ==", "argv=[]"]
    quick = hwpool("bench", "--quick", "--dir", str(tmp_path))
    assert quick.returncode == 0, quick.stderr
    assert quick.stdout.splitlines()[1::2] == ["quick=True", "argv=['--quick']"]


def test_a_benchmark_that_exits_is_a_failure_not_the_end(tmp_path: Path) -> None:
    (tmp_path / "bench_a.py").write_text("import sys\ndef main():\n    sys.exit(2)\n")
    (tmp_path / "bench_b.py").write_text("def main():\n    return 'b table'\n")
    proc = hwpool("bench", "--dir", str(tmp_path))
    assert proc.returncode == 1
    assert "bench_a.py exited with status 2" in proc.stderr
    assert proc.stdout.splitlines()[-1] == "b table"


def test_bench_failures_are_reported_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "bench_bad.py").write_text("def main():\n    raise OSError('disk on fire')\n")
    proc = hwpool("bench", "--dir", str(tmp_path))
    assert proc.returncode == 1
    assert "bench_bad.py failed: OSError: disk on fire" in proc.stderr
    assert "Traceback" not in proc.stderr
    unknown = hwpool("bench", "gamma", "--dir", str(tmp_path))
    assert unknown.returncode == 1
    assert "no benchmark 'gamma'" in unknown.stderr


def test_bench_without_benchmarks_says_where_it_looked(tmp_path: Path) -> None:
    proc = hwpool("bench", "--dir", str(tmp_path))
    assert proc.returncode == 1
    assert "no bench_*.py" in proc.stderr


def test_demo_cpu_stage_of_one_thread_is_singular() -> None:
    proc = hwpool("demo", "--seconds", "0.3", env={"HWPOOL_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "team of 1 thread " in proc.stdout


def test_demo_reports_the_cpu_stage() -> None:
    proc = hwpool("demo", "--seconds", "0.5", env={"HWPOOL_THREADS": "2"})
    assert proc.returncode == 0, proc.stderr
    assert "CPU stage: 8 rows of hashing" in proc.stdout
    assert "team of 2 threads" in proc.stdout
    assert "x over serial" in proc.stdout


def test_demo_with_bad_threads_variable_fails_before_any_output() -> None:
    proc = hwpool("demo", "--seconds", "0.5", env={"HWPOOL_THREADS": "many"})
    assert_user_error(proc, "HWPOOL_THREADS", "many")


def test_info_shows_cpus_and_files(tmp_path: Path) -> None:
    data = tmp_path / "data.bin"
    data.write_bytes(b"y" * 8192)
    proc = hwpool("info", "--file", str(data))
    assert proc.returncode == 0, proc.stderr
    assert "CPUs: " in proc.stdout
    assert "CPUPool.from_env(): team of" in proc.stdout
    assert f"{data}: sampled pages in the page cache by NUMA node" in proc.stdout
    doc = json.loads(hwpool("info", "--json", "--file", str(data)).stdout)
    assert doc["files"][0]["path"] == str(data)
    assert doc["cpus"]["usable"] >= 1
    assert_user_error(hwpool("info", "--file", str(tmp_path / "nope")), "--file", "nope")


def test_demo_plot_writes_a_gantt_chart(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "demo.png"
    proc = hwpool("demo", "--seconds", "0.5", "--plot", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes().startswith(b"\x89PNG")
    assert f"wrote {out}\n" in proc.stderr
