"""What the server's log and ``hwpool status`` say, in words a reader would use (issue 22,
"Wording"): "serving 1 GPU", "1 whole GPU", not "serving 1 GPUs" and "1 of a GPU"."""

from __future__ import annotations

from collections.abc import Callable

from hostserver import ClientProc, Server, run_cli


def test_the_log_counts_one_gpu_in_the_singular(
    start_server: Callable[..., Server], clients: Callable[..., ClientProc]
) -> None:
    server = start_server("--gpus", "1")
    assert "serving 1 GPU on '" in server.wait_for("serving"), server.lines
    holder, waiter = clients(server.socket), clients(server.socket)
    holder.send("acquire a 0.5")
    holder.expect("granted a [0]")
    waiter.send("acquire whole 1.0")
    assert server.wait_for("wait #").endswith(": 1 whole GPU"), server.lines
    code, out, err = run_cli("status", "--socket", str(server.socket))
    assert code == 0, err
    assert ": 1 whole GPU" in out and "1 of a GPU" not in out, out
    after = len(server.lines)
    waiter.send("acquire three-quarters 0.75")
    assert server.wait_for("wait #", after).endswith(": 0.75 of a GPU"), server.lines


def test_the_log_counts_several_gpus_in_the_plural(start_server: Callable[..., Server]) -> None:
    server = start_server("--gpus", "2")
    assert "serving 2 GPUs on '" in server.wait_for("serving"), server.lines
