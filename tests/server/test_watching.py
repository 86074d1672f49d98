"""The server's watch step without a process: a report applied to a HostState (sans-I/O),
and the status fields it adds. The loop and the sampler are the server tests' part
(test_server_watch.py); here the edges: units on each kind of server, an unknown total,
the cap on the processes listed."""

from __future__ import annotations

from fractions import Fraction

from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._host._detect import GPUInfo
from hwpool._server._host_entries import Delivery
from hwpool._server._host_state import HostState
from hwpool._server._watching import Watching
from hwpool._watch import Attributed, GPUProcess, GPUReading, Sample, WatchReport
from hwpool._wire import _protocol as p

UUID = "GPU-1"


def watching(state: HostState, memory_mib: int = 16384) -> tuple[Watching, list[str]]:
    said: list[str] = []
    sent: list[Delivery] = []
    gpus = [GPUInfo(0, UUID, uuid=UUID, memory_mib=memory_mib)]
    found = Watching(state, gpus, interval_s=2.0, policy="warn", owner_policies={},
                     grace_s=30.0, say=said.append, after=sent.extend)  # fmt: skip
    return found, said


def report(withheld: int, total: int | None = 16384, outside: int = 0) -> WatchReport:
    processes = tuple(GPUProcess(1000 + i, UUID, 10 + i) for i in range(outside))
    sample = Sample("nvml", (GPUReading(UUID, total, withheld, 5, processes),))
    found = tuple(Attributed(proc, None, 0, "root") for proc in processes)
    return WatchReport(sample, found, {UUID: withheld}, ())


def test_on_a_server_sized_in_memory_the_mib_seen_are_withheld() -> None:
    state = HostState(1, totals=[16384])
    watch, said = watching(state)
    watch.apply(report(5000), 1.0)
    assert state.core.free == (16384 - 5000,)
    assert said == [
        "GPU 0: 5000 MiB used outside the queue: withholding 5000 MiB of what is shared"
    ]
    watch.apply(report(0), 2.0)
    assert state.core.free == (16384,)
    assert said[-1] == "GPU 0: nothing used outside the queue: withholding nothing"


def test_on_a_server_of_fractions_the_share_of_the_memory_is_withheld_rounded_up() -> None:
    state = HostState(1)
    watch, _ = watching(state)
    watch.apply(report(5000), 1.0)
    withheld = UNITS_PER_GPU - state.core.free[0]
    assert withheld == -(-Fraction(5000 * UNITS_PER_GPU, 16384) // 1)


def test_an_unknown_total_keeps_what_is_withheld_on_a_server_of_fractions() -> None:
    state = HostState(1)
    watch, said = watching(state)
    watch.apply(report(5000), 1.0)
    free = state.core.free
    watch.apply(report(6000, total=None), 2.0)
    assert state.core.free == free and len(said) == 1


def test_status_lists_the_largest_processes_outside_the_queue_first_and_counts_the_rest() -> None:
    state = HostState(1, totals=[16384])
    watch, _ = watching(state)
    watch.apply(report(0, outside=p.MAX_OUTSIDE + 6), 1.0)
    reply = watch.decorate(state.status(1, 1.5, 0.0), 1.5)
    assert len(reply.outside) == p.MAX_OUTSIDE and reply.outside_left_out == 6
    sizes = [o.used_mib or 0 for o in reply.outside]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == 10 + p.MAX_OUTSIDE + 5
    assert reply.watch == p.WatchRecord("", 2.0, 0.5, "")
    assert reply.gpu_state == (p.GPUStateRecord(0, UUID, 16384, 0, 5, 0),)
