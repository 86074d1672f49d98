"""``hwpool run --priority P``: sent to the server, which orders the user's own jobs by it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hostserver import Server, run_cli
from runproc import Run, eventually, waiting_pids

StartServer = Callable[..., Server]


def test_a_higher_priority_run_goes_before_the_users_earlier_ones(
    start_server: StartServer, sockdir: Path
) -> None:
    server = start_server("--gpus", "1")
    holder = Run(server, sockdir, "a", "wait=a.go")
    holder.started()
    head = Run(server, sockdir, "head", "wait=head.go")  # the head keeps its place (10e)
    eventually(lambda: waiting_pids(server.socket) == [head.pid], "head waits", head)
    low = Run(server, sockdir, "low", options=("--priority", "-5"))
    eventually(lambda: waiting_pids(server.socket) == [head.pid, low.pid], "low waits", low)
    high = Run(server, sockdir, "high", "wait=high.go", options=("--priority", "7"))
    queued = [high.pid, head.pid, low.pid]  # status lists the queue order, head included
    eventually(lambda: waiting_pids(server.socket) == queued, "high waits", high)
    (sockdir / "a.go").write_text("")
    head.started()
    assert waiting_pids(server.socket) == [high.pid, low.pid]
    (sockdir / "head.go").write_text("")
    high.started()  # before low, which came first
    assert waiting_pids(server.socket) == [low.pid]
    (sockdir / "high.go").write_text("")
    low.started()
    assert [r.finish()[0] for r in (holder, head, high, low)] == [0, 0, 0, 0]


@pytest.mark.parametrize("value", ["1001", "-1001", "1.5", "high", ""])
def test_a_bad_priority_is_one_line_and_exit_2(value: str) -> None:
    code, out, err = run_cli("run", "--priority", value, "--", "true")
    assert code == 2, err
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "--priority" in err and "-1000..1000" in err
