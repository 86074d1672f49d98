"""What runs on the nodes: leased functions, leased actor classes, and the node probe.

A leased function or actor sees exactly its GPUs: ``CUDA_VISIBLE_DEVICES`` lists their device
ids (UUIDs where the node knows them) before the user's code runs, and
:func:`hwpool.current_gpus` returns their indices on the node (as ``ray.get_gpu_ids()`` does for
Ray's own GPU tasks; inside the process they are CUDA devices ``0..n-1``). The functions here
are wrapped by ``ray.remote`` where they are launched.

CUDA reads ``CUDA_VISIBLE_DEVICES`` once per process, so a worker process keeps the GPUs of
its first lease: a *pinned* lease (the default) runs only in a process whose earlier pinned
leases were on exactly the same devices (:func:`run_leased` refuses any other before the
user's code runs); only leases launched with ``reuse_across_gpus`` skip the check.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ray.exceptions import AsyncioActorExit

from .._gpu._lease import _current
from .._host._detect import GPUSource, detect_gpus
from . import _api
from ._state import NodeGPU

__all__ = [
    "WATCH_GROUP",
    "bound_leased",
    "device_env",
    "leased_class",
    "pin_devices",
    "probe_node",
    "run_leased",
    "task_name",
]

VISIBLE_VAR = "CUDA_VISIBLE_DEVICES"
ORDER_VAR = "CUDA_DEVICE_ORDER"
WATCH_GROUP = "_hwpool"
"""The concurrency group of a leased actor's lifetime watch (apart from the user's calls)."""

_EXITS = (SystemExit, AsyncioActorExit)
"""What a method raises to end its actor: ``ray.actor.exit_actor()`` (``AsyncioActorExit`` in
an async actor) or ``sys.exit()``."""
_exiting = threading.Event()  # the leased actor of this process is ending by itself
_first_devices: tuple[str, ...] | None = None  # the devices of this process's first pinned lease
_async_watches: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []


def device_env(devices: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that make a process see exactly ``devices``.

    Indices are made to mean nvidia-smi's order (``CUDA_DEVICE_ORDER=PCI_BUS_ID``) unless the
    node set an order of its own; UUIDs need no order.
    """
    env = {VISIBLE_VAR: ",".join(devices)}
    if ORDER_VAR not in environ and not all(d.startswith(("GPU-", "MIG-")) for d in devices):
        env[ORDER_VAR] = "PCI_BUS_ID"
    return env


@contextlib.contextmanager
def _leased_env(gpus: tuple[int, ...], devices: Sequence[str]) -> Iterator[None]:
    """Set the lease's variables and ``current_gpus()`` for the body; restore both after,
    so that a reused worker process starts its next task as it was."""
    env = device_env(devices, os.environ)
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    token = _current.set(gpus)
    try:
        yield
    finally:
        _current.reset(token)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def task_name(fn: Callable[..., Any]) -> str:
    """What Ray calls the task running ``fn``: the function's qualified name (as plain Ray
    names a task after its function), so that its errors and the dashboard show the user's
    function rather than hwpool's wrappers; the type's name for other callables."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) and name else type(fn).__qualname__


def pin_devices(devices: tuple[str, ...]) -> None:
    """Record ``devices`` as this process's GPUs if it has none yet; RuntimeError, naming both,
    if it has others (its CUDA may be bound to them already: CUDA reads
    ``CUDA_VISIBLE_DEVICES`` once per process, when it initialises)."""
    global _first_devices
    if _first_devices is None:
        _first_devices = tuple(devices)
    elif _first_devices != tuple(devices):
        raise RuntimeError(
            f"hwpool.ray: worker process {os.getpid()} ran a lease on "
            f"{VISIBLE_VAR}={','.join(_first_devices)!r} first, and CUDA reads that variable "
            f"once per process: a lease on {VISIBLE_VAR}={','.join(devices)!r} must not run "
            "here (reuse_across_gpus=True allows it, for work that never initialises CUDA)"
        )


def run_leased(
    fn: Callable[..., Any],
    gpus: tuple[int, ...],
    devices: tuple[str, ...],
    pinned: bool,
    /,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """Call ``fn(*args, **kwargs)`` on the lease's GPUs; a coroutine is run to completion.
    A ``pinned`` lease first checks that this process has had no other GPUs
    (:func:`pin_devices`)."""
    if pinned:
        pin_devices(devices)
    with _leased_env(gpus, devices):
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = asyncio.run(_awaited(result))
        return result


def bound_leased(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``run_leased`` with ``fn`` bound: a function Ray ships to a worker once, where
    ``run_leased`` ships ``fn`` with every call."""

    def run_bound(
        gpus: tuple[int, ...], devices: tuple[str, ...], pinned: bool, /, *args: Any, **kwargs: Any
    ) -> Any:
        return run_leased(fn, gpus, devices, pinned, *args, **kwargs)

    return run_bound


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


_HARDWARE = (GPUSource.NVIDIA_SMI, GPUSource.NVML)


def probe_node(count: int) -> tuple[NodeGPU, ...]:
    """The ``count`` GPUs Ray counts on this node, with device ids, UUIDs and memory.

    Ray numbers a node's GPUs by the entries of the ``CUDA_VISIBLE_DEVICES`` it was started
    with (else 0, 1, ...), and leaves that variable as it was in a task that asks for no GPU;
    nvidia-smi (through :func:`hwpool.detect_gpus`) adds UUIDs and memory where it runs. GPUs
    it does not find (logical ones, e.g. ``--num-gpus`` on a machine without GPUs) keep their
    index as device id.
    """
    visible = os.environ.get(VISIBLE_VAR)
    entries = [e.strip() for e in visible.split(",")] if visible else []
    found = detect_gpus({"PATH": os.environ.get("PATH", "")})
    smi = {g.device_id: g for g in found.gpus} if found.source in _HARDWARE else {}
    by_uuid = {g.uuid: g for g in smi.values() if g.uuid}
    gpus = []
    for i in range(count):
        device = entries[i] if i < len(entries) else str(i)
        info = smi.get(device) or by_uuid.get(device)
        if info is None:
            gpus.append(NodeGPU(i, device))
        else:
            gpus.append(NodeGPU(i, info.uuid or device, info.uuid, info.memory_mib))
    return tuple(gpus)


def leased_class(cls: type, gpus: tuple[int, ...]) -> type:
    """A subclass of ``cls`` whose methods run with ``current_gpus() == gpus``, plus a watch.

    The watch (``_hwpool_watch``, in its own concurrency group so that it never holds up the
    user's calls) returns only when a method ends the actor (``exit_actor()``, ``sys.exit()``):
    the client awaits it, and Ray fails it when the actor dies otherwise, which is how the
    actor's lease ends with its life. ``CUDA_VISIBLE_DEVICES`` comes from the
    actor's runtime environment, set before its process starts.
    """
    is_async = any(
        inspect.iscoroutinefunction(m) or inspect.isasyncgenfunction(m)
        for _, m in inspect.getmembers(cls, inspect.isfunction)
    )
    namespace: dict[str, Any] = {
        name: _bound_to(method, gpus)
        for name, method in inspect.getmembers(cls, inspect.isfunction)
        if _is_plain_method(cls, name, method)
    }
    namespace["_hwpool_watch"] = _async_watch if is_async else _watch
    leased = type(cls.__name__, (cls,), namespace)
    leased.__qualname__ = f"hwpool_leased.{cls.__qualname__}"
    leased.__doc__ = cls.__doc__
    return leased


def _is_plain_method(cls: type, name: str, method: Callable[..., Any]) -> bool:
    """Whether ``name`` is a method to wrap: ``__init__`` or a public or private method, not a
    static or class method, a generator (its body runs after the call returns) or a dunder."""
    if name.startswith("__") and name != "__init__":
        return False
    if isinstance(inspect.getattr_static(cls, name), staticmethod | classmethod):
        return False
    return not (inspect.isgeneratorfunction(method) or inspect.isasyncgenfunction(method))


def _bound_to(method: Callable[..., Any], gpus: tuple[int, ...]) -> Callable[..., Any]:
    """``method`` with ``current_gpus()`` returning ``gpus`` for the length of each call.

    The wrappers travel by value with the class, so they name only module-level helpers
    (which travel by reference), never the context variable itself.
    """
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def call_async(*args: Any, **kwargs: Any) -> Any:
            return await _awaited_on(gpus, method, args, kwargs)

        return call_async

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        return _called_on(gpus, method, args, kwargs)

    return call


def _called_on(
    gpus: tuple[int, ...], method: Callable[..., Any], args: Any, kwargs: dict[str, Any]
) -> Any:
    token = _current.set(gpus)
    try:
        return method(*args, **kwargs)
    except _EXITS:
        _end_watch()
        raise
    finally:
        _current.reset(token)


async def _awaited_on(
    gpus: tuple[int, ...], method: Callable[..., Any], args: Any, kwargs: dict[str, Any]
) -> Any:
    token = _current.set(gpus)
    try:
        return await method(*args, **kwargs)
    except _EXITS:
        _end_watch()
        raise
    finally:
        _current.reset(token)


def _end_watch() -> None:
    """The actor ends by itself: end its watch, whose client then releases the lease.

    Ray lets the calls running in an actor that exits by itself run to completion before the
    process exits, so a watch that never returned would keep the actor, and its lease, alive
    for ever.
    """
    _exiting.set()
    for loop, event in _async_watches:
        loop.call_soon_threadsafe(event.set)


@_api.method(concurrency_group=WATCH_GROUP)
def _watch(self: object) -> None:
    _exiting.wait()


@_api.method(concurrency_group=WATCH_GROUP)
async def _async_watch(self: object) -> None:
    event = asyncio.Event()
    _async_watches.append((asyncio.get_running_loop(), event))
    if not _exiting.is_set():
        await event.wait()
