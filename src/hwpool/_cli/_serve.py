"""``hwpool serve``: share this host's GPUs among all its processes (and ``--check-config``).

Errors are reported as ``hwpool status``'s are (see ``_host_cmds``): one line, exit 2 for bad
usage or a bad config file.
"""

from __future__ import annotations

import argparse
import grp
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from .._core._fairshare import DEFAULT_HALF_LIFE
from .._core._limits import OwnerLimits
from .._core._policies import POLICIES as SERVER_POLICIES
from .._gpu._sizing import capacities_of, sized_gpus
from .._host._detect import GPUInfo, detect_gpus
from .._host._visible import no_gpu_message
from .._server import _listen
from .._server._bounds import check_bound
from .._server._config import ConfigError, read_config
from .._server._defaults import (
    MAX_REQUESTS_PER_CONNECTION,
    MAX_REQUESTS_PER_USER,
    METRICS_MAX_CONNECTIONS,
    METRICS_TIMEOUT_S,
    default_config,
)
from .._server._server import ServeConfig, serve
from .._wire._paths import system_socket
from ._host_access import Usage, guarded, socket_of, user_name
from ._text import printable

__all__ = ["cmd_serve"]

_BUILT_IN: dict[str, object] = {
    "gpus": None, "memory": False, "gpu_memory": None, "reserve_in_use": False, "group": None,
    "admin_group": None,
    "grace": 5.0, "policy": SERVER_POLICIES[0], "max_connections": 64, "max_control_connections": 8,
    "max_requests_per_connection": MAX_REQUESTS_PER_CONNECTION,
    "max_requests_per_user": MAX_REQUESTS_PER_USER, "hello_timeout": 10.0,
    "idle_timeout": None, "half_life": DEFAULT_HALF_LIFE, "shares": {}, "limits": {},
    "default_limits": None, "accounts": {}, "metrics_port": None, "metrics_host": "127.0.0.1",
    "metrics_max_connections": METRICS_MAX_CONNECTIONS, "metrics_timeout": METRICS_TIMEOUT_S,
    "watch_interval": 2.0, "over_lease": "warn", "over_lease_grace": 30.0,
    "over_lease_owners": {},
}  # fmt: skip
"""Each setting's value when neither a flag nor the config file gives it."""


def _config_file(args: argparse.Namespace, socket: Path) -> Path | None:
    """The config file to read: ``--config``, else the default one for the machine-wide
    server (``HWPOOL_CONFIG``, else /etc/hwpool/serve.toml: on the machine-wide socket) if
    it exists, else none. Bad usage for a relative ``HWPOOL_CONFIG``."""
    if args.config is not None:
        return Path(args.config)
    try:
        default = default_config()
    except ValueError as exc:
        raise Usage(str(exc)) from None
    try:
        machine_wide = system_socket()
    except ValueError:
        machine_wide = None
    if machine_wide is None or socket != machine_wide or default is None:
        return None
    return default if default.exists() else None


def _settings(args: argparse.Namespace, socket: Path) -> tuple[Path | None, dict[str, Any]]:
    """The config file read (if any) and the effective settings: a flag given on the command
    line, else the file's value, else the built-in default. Bad usage for a bad file."""
    path = _config_file(args, socket)
    try:
        from_file = {} if path is None else read_config(path, {0, os.geteuid()})
    except ConfigError as exc:
        raise Usage(str(exc)) from None
    settings: dict[str, Any] = {**_BUILT_IN, **from_file}
    for key in _BUILT_IN:
        given = getattr(args, key, None)
        if key in ("group", "admin_group") and given is not None:
            settings[key] = _group(given, key)
        elif given is not None and given is not False:  # a flag given overrides the file
            settings[key] = _bounded_flag(key, given)
    return path, settings


def _bounded_flag(key: str, value: object) -> object:
    """A flag's ``value``, within the bounds its config key has; bad usage naming the flag
    and the value otherwise (nothing is started)."""
    try:
        check_bound(key, value)
    except ValueError as exc:
        raise Usage(f"--{key.replace('_', '-')}: {exc}") from None
    return value


def _check_config(path: Path | None, settings: dict[str, Any]) -> int:
    """``--check-config``: the file and the effective settings, one per line (TOML)."""
    print(f"# config file: {path if path is not None else 'none'}")
    for key, value in settings.items():
        if key in ("shares", "limits", "default_limits", "accounts", "over_lease_owners"):
            continue
        if value is None:
            print(f"# {key}: not set")
        else:
            print(f"{key} = {json.dumps(list(value) if isinstance(value, tuple) else value)}")
    _print_accounts(settings["accounts"])
    print("[shares]  # uid or account: share (everyone else: 1)")
    for owner, share in sorted(settings["shares"].items(), key=_owner_order):
        print(f"{_owner_key(owner)} = {share:g}{_owner_comment(owner)}")
    if settings["default_limits"] is None:
        print("# limits.default: not set (users not named have no limits)")
    else:
        print("[limits.default]")
        _print_limits(settings["default_limits"])
    for owner, limits in sorted(settings["limits"].items(), key=_owner_order):
        table = "accounts" if isinstance(owner, str) else "users"
        print(f"[limits.{table}.{_owner_key(owner)}]{_owner_comment(owner)}")
        _print_limits(limits)
    _print_over_lease_owners(settings["over_lease_owners"])
    return 0


def _print_accounts(accounts: dict[str, frozenset[int]]) -> None:
    """``[accounts]`` as resolved: each account's members by uid, their names beside."""
    if not accounts:
        print("# accounts: none (each user is its own owner)")
        return
    print("[accounts]  # each account's members, as resolved now: scheduled as one owner")
    for name, uids in sorted(accounts.items()):
        members = ", ".join(f'"uid:{uid}"' for uid in sorted(uids))
        names = ", ".join(printable(user_name(uid)) for uid in sorted(uids))
        print(f"{name} = [{members}]" + (f"  # {names}" if names else ""))


def _print_over_lease_owners(policies: dict[int | str, str]) -> None:
    """``[over_lease_owners]``: each owner's over-lease policy, where it is not ``over_lease``
    (nothing where none is set: every owner has ``over_lease``)."""
    if not policies:
        return
    print("[over_lease_owners]  # uid or account: its over-lease policy")
    for owner, policy in sorted(policies.items(), key=_owner_order):
        print(f'{_owner_key(owner)} = "{policy}"{_owner_comment(owner)}')


def _owner_order(item: tuple[int | str, object]) -> tuple[int, int, str]:
    """uids by number first, then accounts by name."""
    owner = item[0]
    return (1, 0, owner) if isinstance(owner, str) else (0, owner, "")


def _owner_key(owner: int | str) -> str:
    """An owner as a TOML key: ``"uid:1000"`` or an account's name (bare: it needs no quotes)."""
    return owner if isinstance(owner, str) else f'"uid:{owner}"'


def _owner_comment(owner: int | str) -> str:
    """``  # alice`` beside a uid; nothing beside an account (its name says it)."""
    return "" if isinstance(owner, str) else f"  # {printable(user_name(owner))}"


def _print_limits(limits: OwnerLimits) -> None:
    """One table of limits as TOML lines (those not set as comments)."""
    for key, field in (("gpus", "gpus"), ("memory", "units"), ("running", "running"),
                       ("queued", "queued")):  # fmt: skip
        value = getattr(limits, field)
        print(f"# {key}: not set" if value is None else f"{key} = {value:g}")
    print(f'mode = "{limits.mode}"')


def _memory_limits_need_memory(settings: dict[str, Any]) -> None:
    """Bad usage for a ``memory`` limit on a server that shares fractions, not memory."""
    if settings["memory"] or settings["gpu_memory"] is not None:
        return
    tables = [settings["default_limits"], *settings["limits"].values()]
    if any(limits is not None and limits.units is not None for limits in tables):
        raise Usage(
            "[limits]: a memory limit needs a server sized in memory (--memory or "
            "--gpu-memory, or memory or gpu_memory in the config file)"
        )


def _cmd_serve(args: argparse.Namespace) -> int:
    path = socket_of(args, client=False)
    config_path, settings = _settings(args, path)
    args = argparse.Namespace(**{**vars(args), **settings})
    _memory_limits_need_memory(settings)
    if args.check_config:
        return _check_config(config_path, settings)
    if args.gpu_memory is None and not args.memory and not args.reserve_in_use:
        gpus, totals = _gpus(args.gpus), None
    else:
        gpus = _sized(args)
        totals = capacities_of(gpus, args.reserve_in_use)
    detected = args.gpus is None and args.gpu_memory is None
    config = ServeConfig(
        socket=path, gpus=gpus, group=args.group, admin_group=args.admin_group,
        grace_s=args.grace, left_out=_left_out(detected),
        hello_timeout_s=args.hello_timeout, max_connections=args.max_connections,
        max_control_connections=args.max_control_connections,
        max_requests_per_connection=args.max_requests_per_connection,
        max_requests_per_user=args.max_requests_per_user,
        idle_timeout_s=args.idle_timeout, policy=args.policy, totals=totals,
        shares=args.shares, half_life=args.half_life, limits=args.limits,
        default_limits=args.default_limits, accounts=args.accounts,
        metrics_port=args.metrics_port, metrics_host=args.metrics_host,
        metrics_max_connections=args.metrics_max_connections,
        metrics_timeout_s=args.metrics_timeout,
        watch_interval_s=args.watch_interval, over_lease=args.over_lease,
        over_lease_grace_s=args.over_lease_grace, over_lease_owners=args.over_lease_owners,
    )  # fmt: skip
    if config.metrics_port is not None:
        _metrics_importable()
    try:
        serve(config)
    except _listen.ServeError as exc:
        raise Usage(str(exc)) from None
    return 0


def _metrics_importable() -> None:
    """Bad usage for metrics asked for without prometheus-client installed."""
    if importlib.util.find_spec("prometheus_client") is None:
        raise Usage(
            "--metrics-port needs prometheus-client, which is not installed: pip install "
            "'hwpool[metrics]' (or prometheus-client)"
        )


def _gpus(count: int | None) -> tuple[GPUInfo, ...]:
    if count is not None:
        return tuple(GPUInfo(i, str(i)) for i in range(count))
    try:
        found = detect_gpus()
    except ValueError as exc:  # a malformed HWPOOL_NUM_GPUS, GPU indexes CUDA numbers apart
        raise Usage(str(exc)) from None
    if not found.gpus:  # nothing to serve; --gpus 0 is refused (the scheduler needs a GPU)
        raise Usage(
            no_gpu_message(found.detail, "serve")
            + ", or give --gpus N to serve N logical GPUs whatever this process may see"
        )
    return found.gpus


def _left_out(detected: bool) -> tuple[tuple[str, str], ...]:
    """The GPUs detection named as failing (it is cached: not asked again), for the log."""
    if not detected:
        return ()
    try:
        return detect_gpus().failed
    except ValueError:  # a malformed HWPOOL_NUM_GPUS: said where the GPUs were read
        return ()


def _sized(args: argparse.Namespace) -> tuple[GPUInfo, ...]:
    """The GPUs of a server sized in memory: ``--gpu-memory``'s, or detected (``--memory``)."""
    if args.reserve_in_use and not args.memory:
        raise Usage("--reserve-in-use reads the memory in use on detected GPUs: give --memory")
    if args.gpus is not None:
        flag = "--memory" if args.memory else "--gpu-memory"
        raise Usage(f"give --gpus or {flag}, not both (--gpus {args.gpus})")
    if args.memory and args.gpu_memory is not None:
        raise Usage("give --memory (detect the sizes) or --gpu-memory SIZES, not both")
    try:
        sized = sized_gpus(None, args.memory, args.gpu_memory, args.reserve_in_use)
    except ValueError as exc:  # detection found no memory size (or use) for some GPU
        raise Usage(f"--memory: {exc}") from None
    assert sized is not None
    return sized


def _group(name: str | None, key: str = "group") -> int | None:
    if name is None:
        return None
    if name.isdigit():
        return int(name)
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise Usage(f"--{key.replace('_', '-')}: no group named {name!r}") from None


cmd_serve = guarded(_cmd_serve)
