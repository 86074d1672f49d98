"""The driver's side: ``hwpool.ray.connect()`` and the pool it returns.

The pool validates demands as the local ``GPUPool`` does (the same checks, the same errors,
raised before anything is sent), then hands the work to this driver's client actor, whose
answer is the ``ObjectRef`` returned: ``ray.get`` it or ``await`` it.
"""

from __future__ import annotations

import inspect
import itertools
import time
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Any, Generic, ParamSpec, TypeVar, overload

from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .._check import check_bool, check_callable, check_int, check_real
from .._core._demand import make_demand
from .._core._memory import parse_memory
from .._core._scheduler import Demand
from .._errors import PoolClosedError
from . import _api
from ._actor import CLIENT_PREFIX, SCHEDULER_NAME, SchedulerActor
from ._client import KEEP_S, RETRY_PAUSE_S, SCHEDULER_RETRY_S, Call, ClientActor, TaskOptions
from ._lending import LentLeases
from ._state import ClusterSnapshot, MemoryDemand, infeasible
from ._worker import task_name

__all__ = ["LeasedFunction", "RayGPUPool", "connect"]

P = ParamSpec("P")
R = TypeVar("R")

RUNS_KEPT = 1024
"""The client's ``run`` methods with options (one per task name) a pool keeps, at most."""
MAX_CONCURRENCY = 100_000
"""Calls one scheduler or client actor serves at once: every waiting request is one."""


def connect(
    *,
    namespace: str = "hwpool",
    num_cpus: float = 0,
    reuse_workers: bool = True,
    reuse_across_gpus: bool = False,
    keep_s: float = KEEP_S,
) -> RayGPUPool:
    """Join the cluster's hwpool scheduler (starting it if need be) and open this driver's pool.

    Call ``ray.init(...)`` first. ``namespace`` names the Ray namespace of the scheduler and
    clients: pools of one namespace share one queue over the cluster's GPUs. ``num_cpus`` is
    what each leased task or actor reserves through Ray besides its GPUs (0: the GPU lease is
    the admission control, and a granted task never waits for a CPU while holding its GPUs).
    ``reuse_workers`` (default True) lets one worker process run several leased tasks on the
    same GPUs, never on others (CUDA reads ``CUDA_VISIBLE_DEVICES`` once per process); ``False``
    starts a fresh process for each task (``max_calls=1``). ``reuse_across_gpus`` (default
    False) lets a worker process run tasks on other GPUs than its first: only for work that
    never initialises CUDA (docs/ray.md, "Worker processes").
    ``keep_s`` (seconds, default 0.2; 0 turns it off): how long this driver keeps the lease of
    a finished task for its next task of the same demand, while the scheduler sees nobody
    waiting; a stream of equal tasks then costs no scheduler message per task, and a request
    that has to wait makes every kept lease go back (an idle one at once, a busy one when its
    task ends). The client lends its kept leases to this driver, which then launches a task of
    the same demand itself, as fast as a plain Ray task, while none of its calls through the
    client is unfinished (docs/ray.md, "Kept leases").
    """
    if not isinstance(namespace, str) or not namespace:
        raise TypeError(f"namespace must be a non-empty str, got {namespace!r}")
    options = _task_options(num_cpus, reuse_workers, reuse_across_gpus)
    keep = check_real("keep_s", keep_s)
    if not 0 <= keep < float("inf"):
        raise ValueError(f"keep_s must be a finite number of seconds >= 0, got {keep_s!r}")
    if not _api.is_initialized():
        raise RuntimeError("hwpool.ray.connect() needs Ray: call ray.init(...) first")
    scheduler = _scheduler(namespace)
    _ask(scheduler.ready)
    name = f"{CLIENT_PREFIX}{uuid.uuid4().hex}"
    here = _api.here()
    client = (
        _api.remote(ClientActor)
        .options(
            name=name,
            namespace=namespace,
            num_cpus=0,
            max_restarts=0,
            max_concurrency=MAX_CONCURRENCY,
            scheduling_strategy=_api.affinity(here),
        )
        .remote(SCHEDULER_NAME, namespace, name, keep)
    )
    snapshot = _ask(scheduler.snapshot)
    largest = (snapshot.largest_node, snapshot.largest_gpu_mib)
    return RayGPUPool(namespace, scheduler, client, options, largest, keep_s=keep)


def _scheduler(namespace: str) -> Any:
    """The scheduler actor of ``namespace``, started on the head node if there is none."""
    head = [
        str(node["NodeID"])
        for node in _api.nodes()
        if node.get("Alive") and "node:__internal_head__" in node.get("Resources", {})
    ]
    placement = (
        {}
        if not head
        else {"scheduling_strategy": NodeAffinitySchedulingStrategy(head[0], soft=True)}
    )
    return (
        _api.remote(SchedulerActor)
        .options(
            name=SCHEDULER_NAME,
            namespace=namespace,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_restarts=-1,
            max_concurrency=MAX_CONCURRENCY,
            **placement,
        )
        .remote(namespace)
    )


def _ask(method: Any) -> Any:
    """Call a scheduler method and wait for its answer, again while the actor restarts."""
    deadline = time.monotonic() + SCHEDULER_RETRY_S
    while True:
        try:
            return _api.get(method.remote())
        except RayActorError:
            if time.monotonic() > deadline:
                raise
            time.sleep(RETRY_PAUSE_S)


def _task_options(num_cpus: object, reuse_worker: object, across_gpus: object) -> TaskOptions:
    cpus = check_real("num_cpus", num_cpus)
    if not 0 <= cpus < float("inf"):
        raise ValueError(f"num_cpus must be a finite number >= 0, got {num_cpus!r}")
    reuse = check_bool("reuse_worker", reuse_worker)
    if check_bool("reuse_across_gpus", across_gpus) and not reuse:
        raise ValueError(
            "reuse_across_gpus=True lets a worker process run several tasks: it needs "
            "reuse_workers=True (reuse_worker=True), got reuse_workers=False"
        )
    return TaskOptions(cpus, reuse, bool(across_gpus))


def _demand(fraction: object, gpus: object, memory: object = None) -> Demand:
    """The demand of ``fraction`` of one GPU, of ``gpus`` whole GPUs, or of ``memory`` (MiB,
    or a text such as ``"6GiB"``) on one GPU; one whole GPU if none is given."""
    given = {"fraction": fraction, "gpus": gpus, "memory": memory}
    named = [f"{name}={value!r}" for name, value in given.items() if value is not None]
    if len(named) > 1:
        raise ValueError(f"give one of fraction, gpus or memory, not several ({', '.join(named)})")
    if memory is not None:
        return MemoryDemand(1, parse_memory(memory, "memory"))
    count = 1 if gpus is None else check_int("gpus", gpus, minimum=1)
    return make_demand(count=count, fraction=fraction)


class RayGPUPool:
    """Shares of the GPUs of a whole Ray cluster for functions and actors, in one fair queue.

    Made by :func:`hwpool.ray.connect`. ``submit`` and :meth:`remote` functions return an
    ``ObjectRef`` at once; the work starts when the scheduler grants its GPUs, on the node
    that holds them, and its lease ends when it returns, raises, or its worker or node dies.
    """

    def __init__(
        self,
        namespace: str,
        scheduler: Any,
        client: Any,
        options: TaskOptions,
        largest: tuple[int, int | None],
        *,
        ordered: bool = True,
        keep_s: float = 0.0,
    ) -> None:
        self._namespace = namespace
        # The pool made by connect() numbers its calls, so that its client queues them in
        # order; copies sent to tasks do not (their calls are ordered among themselves only).
        self._seq = itertools.count(1) if ordered else None
        self._scheduler = scheduler
        self._client = client
        self._options = options
        self._largest = largest  # GPUs of the largest node, MiB of the largest GPU (or None)
        self._closed = False
        self._runs: dict[str, Any] = {}  # the client's run method with each task name
        # Kept leases the client lends this driver, to launch tasks on itself (see _lending);
        # only the pool made by connect(): it alone knows the driver's order.
        self._lent = LentLeases(client, keep_s) if ordered and keep_s > 0 else None

    def __repr__(self) -> str:
        options = self._options
        return (
            f"RayGPUPool(num_cpus={options.num_cpus}, reuse_workers={options.reuse_worker}, "
            f"reuse_across_gpus={options.reuse_across_gpus})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Tasks and actors may submit through the driver's pool (its client serves them too).
        state = (self._namespace, self._scheduler, self._client, self._options, self._largest)
        return (_unpickled, state)

    @property
    def namespace(self) -> str:
        """The Ray namespace of this pool's scheduler: pools of one namespace share a queue."""
        return self._namespace

    # ----------------------------------------------------------------- work
    def submit(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        fraction: float | None = None,
        gpus: int | None = None,
        memory: int | str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` on ``fraction`` of one GPU, on ``gpus`` whole GPUs of
        one node, or on ``memory`` MiB (or ``"6GiB"``) of one GPU (one whole GPU if none is
        given); return its ``ObjectRef`` at once.

        Raises TypeError/ValueError as ``GPUPool.acquire`` does, and ValueError for more GPUs
        than any node has, more memory than any GPU has (or memory on a cluster where some
        GPU's size is unknown), or more than one of ``fraction``, ``gpus`` and ``memory``;
        nothing is queued then.
        """
        check_callable("fn", fn)
        demand = self._checked(fraction, gpus, memory)
        return self._submit(fn, demand, self._options, args, kwargs)

    @overload
    def remote(self, fn: Callable[P, R], /) -> LeasedFunction[P, R]: ...
    @overload
    def remote(
        self,
        fn: None = None,
        /,
        *,
        fraction: float | None = None,
        gpus: int | None = None,
        memory: int | str | None = None,
        num_cpus: float | None = None,
        reuse_worker: bool | None = None,
        reuse_across_gpus: bool | None = None,
    ) -> _Decorator: ...
    def remote(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        fraction: float | None = None,
        gpus: int | None = None,
        memory: int | str | None = None,
        num_cpus: float | None = None,
        reuse_worker: bool | None = None,
        reuse_across_gpus: bool | None = None,
    ) -> LeasedFunction[..., Any] | _Decorator:
        """Decorate a function to run on a GPU share: ``@pool.remote(fraction=0.25)``, then
        ``f.remote(*args) -> ObjectRef``. Bare ``@pool.remote`` asks for one whole GPU;
        ``memory=`` asks for MiB of one GPU, as in ``submit``; ``num_cpus``,
        ``reuse_worker`` and ``reuse_across_gpus`` (for work that never initialises CUDA)
        override the pool's for this function."""
        demand = self._checked(fraction, gpus, memory)
        base = self._options
        options = _task_options(
            base.num_cpus if num_cpus is None else num_cpus,
            base.reuse_worker if reuse_worker is None else reuse_worker,
            base.reuse_across_gpus if reuse_across_gpus is None else reuse_across_gpus,
        )

        decorate = _Decorator(self, demand, options)
        return decorate if fn is None else decorate(fn)

    def start_actor(
        self,
        cls: type,
        /,
        *args: Any,
        fraction: float | None = None,
        gpus: int | None = None,
        memory: int | str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Start ``cls(*args, **kwargs)`` as a Ray actor holding a GPU share for its lifetime;
        return an ``ObjectRef`` of its handle at once (``ray.get`` or ``await`` it).

        The lease ends when the actor does (``ray.kill``, a crash, its node lost, the driver's
        exit). ``cls`` is a plain class, not one decorated with ``ray.remote``.
        """
        if not inspect.isclass(cls):
            raise TypeError(f"cls must be a class, got {cls!r} ({type(cls).__name__})")
        demand = self._checked(fraction, gpus, memory)
        return self._call(self._client.start_actor, demand, self._options, cls, args, kwargs)

    # ----------------------------------------------------------------- state
    def snapshot(self) -> ClusterSnapshot:
        """The cluster's GPU nodes with free capacity, every lease, and the queue in order."""
        self._check_open()
        snapshot: ClusterSnapshot = _ask(self._scheduler.snapshot)
        self._largest = (snapshot.largest_node, snapshot.largest_gpu_mib)
        return snapshot

    def close(self) -> None:
        """End this pool's client: what it still waits for is withdrawn and what it runs is
        stopped (its leases return). Idempotent; other pools are not affected."""
        if not self._closed:
            self._closed = True
            if self._lent is not None:
                self._lent.close()
            _api.kill(self._client)

    def __enter__(self) -> RayGPUPool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ----------------------------------------------------------------- internals
    def _checked(self, fraction: object, gpus: object, memory: object) -> Demand:
        demand = _demand(fraction, gpus, memory)
        if infeasible(demand, *self._largest) is not None:  # it may have grown since we looked
            snapshot = _ask(self._scheduler.sync_nodes)
            self._largest = (snapshot.largest_node, snapshot.largest_gpu_mib)
            reason = infeasible(demand, *self._largest)
            if reason is not None:
                raise ValueError(reason)
        return demand

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError("this RayGPUPool is closed")

    def _submit(
        self,
        fn: Callable[..., Any],
        demand: Demand,
        options: TaskOptions,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        if self._lent is not None:
            self._check_open()
            ref = self._lent.launch(fn, demand, options, args, kwargs)
            if ref is not None:
                return ref
        name = task_name(fn)
        run = self._runs.get(name)
        if run is None:  # Ray's .options() per call costs about as much as the call
            if len(self._runs) >= RUNS_KEPT:
                self._runs.clear()
            run = self._runs[name] = self._client.run.options(name=name)
        return self._call(run, demand, options, fn, args, kwargs)

    def _call(self, method: Any, demand: Demand, options: TaskOptions, *rest: Any) -> Any:
        """``method.remote(Call(...), *rest)``; a call that cannot be sent gives up its place
        in the order."""
        self._check_open()
        seq = None if self._seq is None else next(self._seq)
        try:
            memory = isinstance(demand, MemoryDemand)
            ref = method.remote(Call(seq, demand.count, demand.units, options, memory), *rest)
        except BaseException:
            if seq is not None:
                self._client.skip.remote(seq)
            raise
        if self._lent is not None:
            self._lent.through_client(ref)
        return ref


def _unpickled(
    namespace: str,
    scheduler: Any,
    client: Any,
    options: TaskOptions,
    largest: tuple[int, int | None],
) -> RayGPUPool:
    return RayGPUPool(namespace, scheduler, client, options, largest, ordered=False)


class _Decorator:
    """What ``pool.remote(...)`` returns: applied to a function, binds it to the share."""

    def __init__(self, pool: RayGPUPool, demand: Demand, options: TaskOptions) -> None:
        self._pool, self._demand, self._options = pool, demand, options

    def __call__(self, fn: Callable[P, R], /) -> LeasedFunction[P, R]:
        if inspect.isclass(fn):
            raise TypeError("pool.remote takes functions; start actors with pool.start_actor")
        check_callable("fn", fn)
        return LeasedFunction(self._pool, fn, self._demand, self._options)


class LeasedFunction(Generic[P, R]):
    """A function bound to a GPU share by :meth:`RayGPUPool.remote`; call ``.remote()``."""

    def __init__(
        self, pool: RayGPUPool, fn: Callable[P, R], demand: Demand, options: TaskOptions
    ) -> None:
        self._pool = pool
        self._fn = fn
        self._demand = demand
        self._options = options
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", "leased")

    def __repr__(self) -> str:
        demand = self._demand
        return f"LeasedFunction({self.__name__}, count={demand.count}, units={demand.units})"

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Queue a call on this function's GPU share; return its ``ObjectRef`` at once."""
        return self._pool._submit(self._fn, self._demand, self._options, args, kwargs)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        raise TypeError(f"call {self.__name__}.remote(...) to run it on a GPU share")
