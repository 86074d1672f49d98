"""``hwpool run`` as users run it: real ``hwpool run`` processes, real servers, real jobs.

Every wait is bounded; orderings are proven with files the jobs write (tests/run/job.py) and
with the server's own status, never with sleeps.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

import hwpool
from hostserver import ENV, Server, run_cli, status_of
from interactive import INTERACTIVE
from runproc import Run, eventually, gone, waiting_pids

UUIDS = ("GPU-1111aaaa-0000-0000-0000-000000000000", "GPU-2222bbbb-0000-0000-0000-000000000000")
SMI = (  # the CSV query (index, uuid, name, MiB, MiB used); nothing for -L (no MIG instance)
    f"[ \"$1\" = -L ] && exit 0\ncat <<'EOF'\n"
    f"0, {UUIDS[0]}, Fake, 81559, 0, 0\n1, {UUIDS[1]}, Fake, 81559, 0, 0\nEOF\n"
)

StartServer = Callable[..., Server]


@pytest.fixture
def one_gpu(start_server: StartServer) -> Server:
    return start_server("--gpus", "1")


# ----------------------------------------------------------------- what the child sees
def test_the_child_sees_the_uuid_of_its_gpu(
    start_server: StartServer, sockdir: Path, fake_smi: Callable[[str], Path]
) -> None:
    fake_smi(SMI)
    env = {k: v for k, v in ENV.items() if k not in ("CUDA_VISIBLE_DEVICES", "HWPOOL_NUM_GPUS")}
    server = start_server(env={**env, "PATH": os.environ["PATH"]})
    with hwpool.connect(server.socket) as pool, pool.lease(1.0):
        run = Run(server, sockdir, "a", "wait=a.go", options=("--gpus", "0.5"))
        seen = run.started()
        status = run_cli("status", "--socket", str(server.socket))[1]  # while the job runs
        (sockdir / "a.go").touch()
        code, err = run.finish()
    assert f"  1  0.50  {UUIDS[1]}\n" in status  # the device the job sees, by its GPU index
    assert code == 0, err
    assert seen["CUDA_VISIBLE_DEVICES"] == UUIDS[1]
    assert seen["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    lease = json.loads(seen["HWPOOL_LEASE"])
    assert (lease["gpus"], lease["fraction"], lease["devices"]) == ([1], 0.5, [UUIDS[1]])
    assert seen["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"  # lease.env()'s framework knobs
    assert seen["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert err.strip().splitlines() == [
        f"hwpool run: 0.5 of GPU 1 (device {UUIDS[1]}) granted after "
        + err.split(" after ")[1].split(" s;")[0]
        + f" s; running {shlex.join(run.argv)}"
    ]


def test_an_inherited_visible_list_gives_logical_gpu_1_its_entry(
    start_server: StartServer, sockdir: Path
) -> None:
    env = {k: v for k, v in ENV.items() if k != "HWPOOL_NUM_GPUS"}
    server = start_server(env={**env, "CUDA_VISIBLE_DEVICES": "2,3"})
    with hwpool.connect(server.socket) as pool, pool.lease(1.0) as held:
        assert held == [0]
        run = Run(server, sockdir, "a")
        seen = run.started()
        assert run.finish()[0] == 0
    assert seen["CUDA_VISIBLE_DEVICES"] == "3"


def test_whole_gpus_are_listed_together(start_server: StartServer, sockdir: Path) -> None:
    server = start_server("--gpus", "3")
    run = Run(server, sockdir, "a", options=("--gpus", "2", "--name", "tp"))
    seen = run.started()
    assert run.finish()[0] == 0
    assert seen["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert json.loads(seen["HWPOOL_LEASE"])["fraction"] == 1.0


# ----------------------------------------------------------------- exit status
@pytest.mark.parametrize(("words", "expected"), [((), 0), (("exit=3",), 3), (("kill",), 137)])
def test_the_exit_status_is_the_jobs(
    one_gpu: Server, sockdir: Path, words: tuple[str, ...], expected: int
) -> None:
    run = Run(one_gpu, sockdir, "a", *words)
    code, err = run.finish()
    assert code == expected, err
    assert (sockdir / "a.done").exists()
    assert status_of(one_gpu.socket)["leases"] == []


# ----------------------------------------------------------------- queueing
def test_two_whole_gpu_runs_on_one_gpu_run_one_after_the_other(
    one_gpu: Server, sockdir: Path
) -> None:
    first = Run(one_gpu, sockdir, "a", "wait=a.go")
    first.started()
    second = Run(one_gpu, sockdir, "b")
    eventually(lambda: waiting_pids(one_gpu.socket) == [second.pid], "b waits", second)
    assert not (sockdir / "b.started").exists()  # queued while a holds the GPU
    (sockdir / "a.go").write_text("")
    seen = second.started()
    assert (first.finish()[0], second.finish()[0]) == (0, 0)
    assert "a.done" in seen["files"]  # b started after a was done


def test_two_half_gpu_runs_share_the_gpu_side_by_side(one_gpu: Server, sockdir: Path) -> None:
    # Each job waits until the other has started: they finish only if they run together.
    first = Run(one_gpu, sockdir, "a", "wait=b.started", options=("--gpus", "0.5"))
    second = Run(one_gpu, sockdir, "b", "wait=a.started", options=("--gpus", "1/2"))
    assert (first.finish()[0], second.finish()[0]) == (0, 0)
    assert first.started()["CUDA_VISIBLE_DEVICES"] == second.started()["CUDA_VISIBLE_DEVICES"]


@pytest.mark.parametrize(
    ("signum", "expected"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]
)
def test_a_signal_while_waiting_withdraws_the_request(
    one_gpu: Server, sockdir: Path, signum: int, expected: int
) -> None:
    with hwpool.connect(one_gpu.socket) as pool, pool.lease(1.0):
        run = Run(one_gpu, sockdir, "a", launcher=INTERACTIVE)  # even under nohup
        eventually(lambda: waiting_pids(one_gpu.socket) == [run.pid], "a waits", run)
        run.proc.send_signal(signum)
        code, err = run.finish()
        status = status_of(one_gpu.socket)
    assert code == expected, err
    assert status["waiting"] == [] and len(status["leases"]) == 1
    assert not (sockdir / "a.started").exists()
    assert err.startswith("hwpool: error: run: ") and "withdrawn" in err
    assert len(err.strip().splitlines()) == 1


def test_timeout_gives_up_with_75(one_gpu: Server, sockdir: Path) -> None:
    with hwpool.connect(one_gpu.socket) as pool, pool.lease(0.75):
        run = Run(one_gpu, sockdir, "a", options=("--gpus", "0.5", "--timeout", "0.2"))
        code, err = run.finish()
        status = status_of(one_gpu.socket)
    assert code == 75, err  # gave up waiting: try again later (hwpool._exits.GAVE_UP)
    assert "--timeout 0.2 s" in err and status["waiting"] == []
    assert status["counters"]["timed_out"] == 1


def test_status_shows_the_jobs_command_line_and_name(one_gpu: Server, sockdir: Path) -> None:
    with hwpool.connect(one_gpu.socket) as pool, pool.lease(1.0):
        run = Run(
            one_gpu, sockdir, "a", "exit=0", options=("--name", "embed batch 7"),
            launcher=INTERACTIVE,
        )  # fmt: skip
        eventually(lambda: waiting_pids(one_gpu.socket) == [run.pid], "a waits", run)
        (waiter,) = status_of(one_gpu.socket)["waiting"]
        code, text, _ = run_cli("status", "--socket", str(one_gpu.socket))
        run.proc.send_signal(signal.SIGINT)
        assert run.finish()[0] == 130
    assert (waiter["name"], waiter["command"]) == ("embed batch 7", shlex.join(run.argv))
    assert code == 0 and f"[embed batch 7 | {shlex.join(run.argv)}]" in text


# ----------------------------------------------------------------- the job's processes
def test_sigkill_of_hwpool_run_ends_the_job_and_frees_the_lease(
    one_gpu: Server, sockdir: Path
) -> None:
    run = Run(one_gpu, sockdir, "a", "sleep")
    job = run.started()["pid"]
    eventually((sockdir / "a.done").exists, "a sleeps", run)
    assert len(status_of(one_gpu.socket)["leases"]) == 1
    run.kill()
    eventually(lambda: gone(job), "the job died with hwpool run (PR_SET_PDEATHSIG)")
    eventually(lambda: status_of(one_gpu.socket)["leases"] == [], "the lease is free")


@pytest.mark.parametrize(
    ("words", "grace"),
    [
        (("grandchild",), "0.2"),
        (("grandchild", "stubborn"), "0.2"),  # ignores SIGTERM: SIGKILL after the grace
        (("grandchild", "stopped"), "600"),  # stopped: ended at once all the same
    ],
)
def test_what_the_job_leaves_in_its_group_ends_before_the_release(
    one_gpu: Server, sockdir: Path, words: tuple[str, ...], grace: str
) -> None:
    run = Run(one_gpu, sockdir, "a", *words, options=("--grace", grace))
    code, err = run.finish()
    grandchild = int((sockdir / "a.grandchild").read_text())
    assert code == 0, err
    assert gone(grandchild)  # when hwpool run has exited, nothing of the job is left


def test_signals_while_the_job_runs_go_to_its_group(one_gpu: Server, sockdir: Path) -> None:
    run = Run(one_gpu, sockdir, "a", "sleep")
    run.started()
    eventually((sockdir / "a.done").exists, "a sleeps", run)
    run.proc.send_signal(signal.SIGTERM)
    code, _ = run.finish()
    assert code == 128 + signal.SIGTERM  # the job died of the forwarded SIGTERM
    assert status_of(one_gpu.socket)["leases"] == []


def test_a_revoked_lease_ends_the_job(one_gpu: Server, sockdir: Path) -> None:
    run = Run(one_gpu, sockdir, "a", "sleep")
    job = run.started()["pid"]
    eventually((sockdir / "a.done").exists, "a sleeps", run)
    (lease,) = status_of(one_gpu.socket)["leases"]
    assert run_cli("cancel", str(lease["id"]), "--socket", str(one_gpu.socket))[0] == 0
    code, err = run.finish()
    assert code == 128 + signal.SIGTERM and gone(job)
    assert "the lease is no longer held (revoked by `hwpool cancel`" in err
    assert "goes on" not in err  # one story: the job is ended, not "the code goes on"


# ----------------------------------------------------------------- bad usage
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--gpus", "0", "--", "true"), "--gpus"),
        (("--gpus", "1.5", "--", "true"), "'1.5'"),
        (("--gpus", "nan", "--", "true"), "'nan'"),
        (("--gpus", "-0.5", "--", "true"), "'-0.5'"),
        (("--gpus", "2.5", "--", "true"), "'2.5'"),
        (("--gpus", "9" * 5000, "--", "true"), "--gpus"),
        (("--timeout", "-1", "--", "true"), "--timeout"),
        (("--timeout", "inf", "--", "true"), "--timeout"),
        (("--grace", "x", "--", "true"), "--grace"),
        (("--name", "n" * 5000, "--", "true"), "--name"),
        (("--",), "give the command"),
        ((), "give the command"),
        (("--socket", "", "--", "true"), "--socket"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args: tuple[str, ...], fragment: str) -> None:
    code, out, err = run_cli("run", *args)
    assert code == 2, err
    assert out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("hwpool: error: run: ") and fragment in err


def test_more_gpus_than_the_server_has_is_bad_usage(one_gpu: Server) -> None:
    code, _, err = run_cli("run", "--socket", str(one_gpu.socket), "--gpus", "2", "--", "true")
    assert code == 2 and err.rstrip().endswith("has 1 GPU")  # not "1 GPUs"
    assert status_of(one_gpu.socket)["counters"]["granted"] == 0


@pytest.mark.parametrize(("program", "expected"), [("no-such-program-xyz", 127), ("/etc", 126)])
def test_a_command_that_cannot_run_is_refused_before_queueing(program: str, expected: int) -> None:
    code, _, err = run_cli("run", "--no-start", "--", program)
    assert code == expected and err.count("\n") == 1 and program in err


# ----------------------------------------------------------------- memory
def test_mem_asks_a_memory_server_for_that_much_of_one_gpu(
    start_server: StartServer, sockdir: Path
) -> None:
    server = start_server("--gpu-memory", "80GiB,24GiB")
    run = Run(server, sockdir, "a", options=("--mem", "6GiB"))
    seen = run.started()
    code, err = run.finish()
    assert code == 0, err
    assert seen["CUDA_VISIBLE_DEVICES"] == "1"  # best fit: the 24 GiB card
    lease = json.loads(seen["HWPOOL_LEASE"])
    assert (lease["gpus"], lease["memory_mib"], lease["fraction"]) == ([1], 6144, 0.25)
    assert err.startswith("hwpool run: 6GiB of GPU 1 (device 1) granted after ")


@pytest.mark.parametrize(
    ("server_args", "mem", "fragment"),
    [
        (("--gpus", "1"), "6GiB", "--mem 6GiB: memory=6144: this pool shares fractions of a GPU"),
        (("--gpu-memory", "80GiB,24GiB"), "81GiB", "is more than the largest GPU of this pool"),
    ],
)
def test_mem_that_the_server_cannot_give_is_bad_usage(
    start_server: StartServer, server_args: tuple[str, ...], mem: str, fragment: str
) -> None:
    server = start_server(*server_args)
    code, _, err = run_cli("run", "--socket", str(server.socket), "--mem", mem, "--", "true")
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1
    assert status_of(server.socket)["counters"]["granted"] == 0


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--mem", "6gigs", "--", "true"), "argument --mem: SIZE must be an int of MiB"),
        (("--mem", "6GB", "--", "true"), "got '6GB'"),
        (("--mem", "0MiB", "--", "true"), "SIZE must be between 1 MiB and"),
        (("--gpus", "0.5", "--mem", "6GiB", "--", "true"), "give --gpus or --mem, not both"),
    ],
)
def test_bad_mem_arguments_are_one_line_and_exit_2(args: tuple[str, ...], fragment: str) -> None:
    code, out, err = run_cli("run", "--no-start", *args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("hwpool: error: run: ") and fragment in err
