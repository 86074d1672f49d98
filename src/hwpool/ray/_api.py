"""The few Ray calls that hwpool.ray makes, in one place and loosely typed.

Ray's annotations differ between versions (and are absent where Ray is not installed when
the type checker runs), so the rest of the package sees these plain signatures instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

__all__ = [
    "affinity",
    "cancel",
    "current_actor",
    "get",
    "get_actor",
    "here",
    "is_initialized",
    "kill",
    "method",
    "named_actors",
    "nodes",
    "remote",
    "wait",
]

_ray: Any = ray
F = TypeVar("F", bound=Callable[..., Any])


def remote(target: Any, **options: Any) -> Any:
    """``ray.remote(**options)(target)``: a remote function or actor class."""
    return _ray.remote(**options)(target) if options else _ray.remote(target)


def method(**options: Any) -> Callable[[F], F]:
    """``ray.method(**options)``, for an actor method's options (its concurrency group)."""
    return cast(Callable[[F], F], _ray.method(**options))


def affinity(node_id: str, *, soft: bool = False) -> Any:
    """A scheduling strategy that puts a task or actor on ``node_id`` (only there if hard)."""
    return NodeAffinitySchedulingStrategy(node_id, soft=soft)


def nodes() -> list[dict[str, Any]]:
    """Every node the cluster has known, alive or not (``ray.nodes()``)."""
    return cast(list[dict[str, Any]], _ray.nodes())


def named_actors() -> list[dict[str, Any]]:
    """Every named actor alive, with its namespace."""
    return cast(list[dict[str, Any]], _ray.util.list_named_actors(all_namespaces=True))


def get_actor(name: str, namespace: str) -> Any:
    """The handle of a named actor; ValueError if there is none."""
    return _ray.get_actor(name, namespace=namespace)


def get(ref: Any, timeout: float | None = None) -> Any:
    """``ray.get``."""
    return _ray.get(ref, timeout=timeout)


def wait(
    refs: list[Any], *, num_returns: int, timeout: float | None
) -> tuple[list[Any], list[Any]]:
    """``ray.wait`` (ready and not ready)."""
    ready, rest = _ray.wait(refs, num_returns=num_returns, timeout=timeout)
    return list(ready), list(rest)


def cancel(ref: Any, *, force: bool = False) -> None:
    """``ray.cancel``."""
    _ray.cancel(ref, force=force)


def kill(handle: Any, *, no_restart: bool = True) -> None:
    """``ray.kill``."""
    _ray.kill(handle, no_restart=no_restart)


def is_initialized() -> bool:
    """Whether this process is connected to Ray."""
    return bool(_ray.is_initialized())


def current_actor() -> Any:
    """The handle of the actor this code runs in."""
    return _ray.get_runtime_context().current_actor


def here() -> str:
    """The id of the node this process runs on."""
    return str(_ray.get_runtime_context().get_node_id())
