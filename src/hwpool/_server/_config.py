"""``hwpool serve``'s config file: TOML, read with the standard library's ``tomllib``.

Every key is optional; a command-line flag overrides the file's value. The file is checked
whole before anything starts: an unknown key, a value of the wrong type or out of range, an
unknown user or group is a :class:`ConfigError` naming the key and its line. The file must
belong to root or the server's user and be writable by its owner only
(:func:`hwpool._wire._safety.read_trusted_file`).

Keys (see docs/server.md for the reference): ``half_life`` and ``[shares]`` set the fair
share between owners (the scheduler's rules 8-10); ``[accounts]`` gathers users into one
owner each (an account's members share one fair share, one usage and one set of limits);
``[limits.default]``, ``[limits.users.NAME]``, ``[limits.groups.NAME]`` (each member's, not
shared) and ``[limits.accounts.NAME]`` (the account's as a whole) limit what each owner may
hold and queue (rule 11); ``[over_lease_owners]`` sets an owner's over-lease policy (the GPU
watch's ``warn``, ``term`` or ``off``) instead of ``over_lease``; the rest are ``hwpool
serve``'s flags, spelt with underscores (``watch_interval`` may also be ``"off"``).

An owner is a uid (an int) or an account (its name, a str): the two can never be equal.
"""

from __future__ import annotations

import grp
import math
import pwd
import re
import tomllib
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TypeVar

from .._check import duration_from_text as _duration
from .._core._limits import LIMIT_MODES, OwnerLimits
from .._core._memory import parse_memory
from .._core._policies import POLICIES
from .._wire._safety import check_directory, read_trusted_file
from ._bounds import MOST_LIMIT, MOST_SHARE, at_most, bounded
from ._defaults import DEFAULT_CONFIG

__all__ = [
    "DEFAULT_CONFIG",
    "KEYS",
    "LIMIT_KEYS",
    "OVER_LEASE_POLICIES",
    "ConfigError",
    "Owner",
    "group_members",
    "parse_config",
    "read_config",
]

"""The machine-wide server's config file, read when it exists, no ``--config`` is given and
the server listens on the machine-wide socket (a per-user server never reads it)."""

MAX_GPUS = 4096

OVER_LEASE_POLICIES = ("warn", "term", "off")
"""What the server may do about a lease over its memory (``hwpool._watch.OverLeasePolicy``)."""

Owner = int | str
"""Who the scheduler serves: a uid, or an account's name."""

T = TypeVar("T")

ACCOUNT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""What an account may be called: it is printed in logs and ``hwpool status``, and must not
read as a member (``uid:N``, ``@group``)."""


class ConfigError(ValueError):
    """A config file that cannot be used: the message names the file, the line and the key."""


def _seconds(value: object) -> float:
    """A number of seconds > 0, or a duration such as ``"90s"``, ``"30m"``, ``"1h"``, ``"2d"``."""
    if isinstance(value, str):
        return _duration(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f'must be a number of seconds or a duration like "1h", got {value!r}')
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be a number of seconds > 0, got {value!r}")
    return float(value)


def _count(value: object) -> int:
    if type(value) is not int or not 1 <= value <= 2**31:
        raise ValueError(f"must be an integer >= 1, got {value!r}")
    return value


def _gpus(value: object) -> int:
    number = _count(value)
    if number > MAX_GPUS:
        raise ValueError(f"must be at most {MAX_GPUS}, got {value!r}")
    return number


def _flag(value: object) -> bool:
    if type(value) is not bool:
        raise ValueError(f"must be true or false, got {value!r}")
    return value


def _port(value: object) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    if type(value) is not int or not 0 <= value <= 65535:
        raise ValueError(f"must be a port number 0..65535, got {value!r}")
    return value


def _host(value: object) -> str:
    """An address to listen on (a name or an IP address), not empty."""
    if not isinstance(value, str) or not value.strip() or not value.isprintable():
        raise ValueError(f"must be a host name or an IP address, got {value!r}")
    return value


def _policy(value: object) -> str:
    if not isinstance(value, str) or value not in POLICIES:
        raise ValueError(f"must be one of {', '.join(map(repr, POLICIES))}, got {value!r}")
    return value


def _group(value: object) -> int:
    """A group name or gid: its gid."""
    if type(value) is int and value >= 0:
        return value
    if not isinstance(value, str):
        raise ValueError(f"must be a group name or a gid, got {value!r}")
    try:
        return grp.getgrnam(value).gr_gid
    except KeyError:
        raise ValueError(f"no group named {value!r}") from None


def _gpu_memory(value: object) -> tuple[int, ...]:
    """A list of memory sizes (``["80GiB", "24GiB"]``) or one string of them, comma-separated."""
    parts = value.split(",") if isinstance(value, str) else value
    if not isinstance(parts, list) or not parts or len(parts) > MAX_GPUS:
        raise ValueError(f'must be a list of memory sizes like ["80GiB", "24GiB"], got {value!r}')
    sizes = []
    for index, part in enumerate(parts):
        if not isinstance(part, (str, int)) or isinstance(part, bool):
            raise ValueError(f'GPU {index}\'s memory must be a size like "80GiB", got {part!r}')
        sizes.append(parse_memory(str(part).strip(), f"GPU {index}'s memory"))
    return tuple(sizes)


def _seconds_or_zero(value: object) -> float:
    """A number of seconds >= 0, or a duration such as ``"30s"``."""
    if isinstance(value, str):
        return _duration(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(
            f'must be a number of seconds >= 0 or a duration like "30s", got {value!r}'
        )
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"must be a number of seconds >= 0, got {value!r}")
    return float(value)


def _watch_interval(value: object) -> float:
    """Seconds between two samples of the GPUs: a number >= 0, a duration, or ``"off"``
    (read as 0: the server does not watch)."""
    if value == "off":
        return 0.0
    try:
        return _seconds_or_zero(value)
    except ValueError:
        raise ValueError(
            f'must be a number of seconds >= 0, a duration like "2s", or "off", got {value!r}'
        ) from None


def _over_lease(value: object) -> str:
    """What the server does about a lease over its memory: ``warn``, ``term`` or ``off``."""
    if not isinstance(value, str) or value not in OVER_LEASE_POLICIES:
        raise ValueError(
            f"must be one of {', '.join(map(repr, OVER_LEASE_POLICIES))}, got {value!r}"
        )
    return value


KEYS: dict[str, Callable[[object], object]] = {
    "half_life": _seconds,
    "gpus": _gpus,
    "memory": _flag,
    "gpu_memory": _gpu_memory,
    "reserve_in_use": _flag,
    "group": _group,
    "admin_group": _group,
    "grace": _seconds,
    "policy": _policy,
    "max_connections": _count,
    "max_control_connections": _count,
    "max_requests_per_connection": _count,
    "max_requests_per_user": _count,
    "hello_timeout": _seconds,
    "idle_timeout": _seconds,
    "metrics_port": _port,
    "metrics_host": _host,
    "metrics_max_connections": _count,
    "metrics_timeout": _seconds,
    "watch_interval": _watch_interval,
    "over_lease": _over_lease,
    "over_lease_grace": _seconds_or_zero,
}
"""The plain keys and what checks each (a ValueError saying what is wrong); ``[shares]`` and
``[limits]`` are the tables."""
KEYS = {key: bounded(key, check) for key, check in KEYS.items()}

TABLES = ("accounts", "limits", "over_lease_owners", "shares")


def _owner(name: str) -> int:
    """A user name, or ``uid:N``: its uid."""
    if name.startswith("uid:"):
        digits = name[4:]
        if digits.isascii() and digits.isdigit() and int(digits) < 2**32:
            return int(digits)
        raise ValueError(f"{name!r} is not uid:N with N a uid")
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        raise ValueError(f"no user named {name!r} (give a user name or uid:N)") from None


def _share(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be a number > 0, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be a finite number > 0, got {value!r}")
    if value > MOST_SHARE:
        raise ValueError(f"must be at most {MOST_SHARE:.0f} (shares are relative), got {value!r}")
    return float(value)


def _line_of(text: str, table: str | None, key: str) -> int | None:
    """The line (from 1) where ``key`` is set in ``table`` (None: the top; dotted for a
    table in a table, unquoted), if one is found (tomllib gives no positions for values,
    so the text is searched for the key)."""
    current: str | None = None
    spelt = rf"(?:{re.escape(key)}|\"{re.escape(key)}\"|'{re.escape(key)}')"
    for number, line in enumerate(text.splitlines(), 1):
        header = re.fullmatch(r"\s*\[\s*([^\[\]]+?)\s*\]\s*(?:#.*)?", line)
        if header is not None:
            current = re.sub(r"[\"'\s]", "", header[1])
            if table is not None and current == table and key == table:
                return number
            if table is not None and current == f"{table}.{key}":  # a table named by the key
                return number
            continue
        if current == table and re.match(rf"\s*{spelt}\s*=", line):
            return number
    return None


def parse_config(text: str, source: str) -> dict[str, object]:
    """The checked settings of a config file's ``text`` (``source`` names it in errors):
    key -> value (seconds as floats, a group as its gid, ``shares`` as owner -> share,
    ``accounts`` as name -> its members' uids, ``limits`` as owner -> limits)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None

    def fail(table: str | None, key: str, problem: str) -> ConfigError:
        line = _line_of(text, table, key)
        where = f"{source}, line {line}" if line is not None else source
        name = key if table is None or table == key else f"{table}.{key}"
        return ConfigError(f"{where}: {name}: {problem}")

    settings: dict[str, object] = {}
    accounts = _accounts(raw["accounts"], fail) if "accounts" in raw else {}
    if accounts:
        settings["accounts"] = accounts
    account_of = {uid: name for name, members in accounts.items() for uid in members}
    for key, value in raw.items():
        if key == "accounts":
            continue
        if key == "shares":
            settings["shares"] = _shares(value, account_of, accounts, fail)
            continue
        if key == "over_lease_owners":
            settings[key] = _over_lease_owners(value, account_of, accounts, fail)
            continue
        if key == "limits":
            settings["default_limits"], settings["limits"] = _limits(
                value, account_of, accounts, fail
            )
            continue
        check = KEYS.get(key)
        if check is None:
            known = ", ".join(sorted([*KEYS, *TABLES]))
            raise fail(None, key, f"unknown key (the keys are: {known})")
        try:
            settings[key] = check(value)
        except ValueError as exc:
            raise fail(None, key, str(exc)) from None
    return settings


def _shares(
    value: object, account_of: Mapping[int, str], accounts: Mapping[str, object], fail: Fail
) -> dict[Owner, float]:
    """``[shares]``: owner -> share, an owner named by a user name, ``uid:N`` or an account's
    name (a user of an account has no share of its own: its account's is set instead)."""
    return _per_owner(
        value, "shares", example="alice = 2", check=_share, what="share",
        account_of=account_of, accounts=accounts, fail=fail,
    )  # fmt: skip


def _over_lease_owners(
    value: object, account_of: Mapping[int, str], accounts: Mapping[str, object], fail: Fail
) -> dict[Owner, str]:
    """``[over_lease_owners]``: owner -> its over-lease policy (``warn``, ``term``, ``off``),
    an owner named as in ``[shares]`` (a member of an account takes its account's)."""
    return _per_owner(
        value, "over_lease_owners", example='alice = "term"', check=_over_lease,
        what="over_lease", account_of=account_of, accounts=accounts, fail=fail,
    )  # fmt: skip


def _per_owner(
    value: object,
    table: str,
    *,
    example: str,
    check: Callable[[object], T],
    what: str,
    account_of: Mapping[int, str],
    accounts: Mapping[str, object],
    fail: Fail,
) -> dict[Owner, T]:
    """A table of ``[table]``: owner -> ``check(value)``, each owner a user name, ``uid:N`` or
    an account's name, named once; ``fail`` names the table and the key that is wrong."""
    if not isinstance(value, dict):
        raise fail(None, table, f"must be a table: [{table}] with lines like {example}")
    out: dict[Owner, T] = {}
    for name, item in value.items():
        try:
            owner: Owner = name if name in accounts else _user_owner(name, account_of, what)
            if owner in out:
                said = f"uid {owner}" if isinstance(owner, int) else f"account {owner!r}"
                raise ValueError(f"names {said} twice")
            out[owner] = check(item)
        except ValueError as exc:
            raise fail(table, name, str(exc)) from None
    return out


def _user_owner(name: str, account_of: Mapping[int, str], what: str) -> int:
    """The uid a user name or ``uid:N`` names, where that user is its own owner; ValueError
    for a member of an account (the account's ``what`` applies to it)."""
    uid = _owner(name)
    account = account_of.get(uid)
    if account is not None:
        raise ValueError(
            f"{name!r} is in account {account!r}, which is scheduled as one owner: set the "
            f"account's {what} instead"
        )
    return uid


def _accounts(value: object, fail: Fail) -> dict[str, frozenset[int]]:
    """``[accounts]``: account name -> the uids of its members (users, ``uid:N``, ``@group``
    or ``@gid:N`` for a group's members, as the system says now). A user in two accounts,
    an account named like a user, or a member that does not exist is an error."""
    if not isinstance(value, dict):
        raise fail(
            None, "accounts", 'must be a table: [accounts] with lines like ml = ["alice", "@ml"]'
        )
    accounts: dict[str, frozenset[int]] = {}
    first_in: dict[int, str] = {}
    for name, members in value.items():
        try:
            _account_name(name)
            uids = _account_members(members)
        except ValueError as exc:
            raise fail("accounts", name, str(exc)) from None
        for uid in sorted(uids):
            other = first_in.setdefault(uid, name)
            if other != name:
                raise fail(
                    "accounts", name,
                    f"{_user_name(uid)} is in accounts {other!r} and {name!r}: a user may be "
                    "in one account only",
                )  # fmt: skip
        accounts[name] = frozenset(uids)
    return accounts


def _account_name(name: str) -> None:
    """ValueError unless ``name`` may name an account: letters, digits, ``_.-`` (at most 64,
    a letter or digit first), and no user's name (a ``[shares]`` key must say one owner)."""
    if ACCOUNT_NAME.fullmatch(name) is None:
        raise ValueError(
            "an account's name must be 1 to 64 letters, digits, '_', '.' or '-', beginning "
            f"with a letter or digit, got {name!r}"
        )
    try:
        pwd.getpwnam(name)
    except KeyError:
        return
    raise ValueError(f"{name!r} is a user's name: give the account another")


def _account_members(members: object) -> set[int]:
    """The uids an account's list names (at least one entry; a group may have none now)."""
    if not isinstance(members, list) or not members:
        raise ValueError(
            f'must be a non-empty list of users, "uid:N", "@group" or "@gid:N", got {members!r}'
        )
    uids: set[int] = set()
    for member in members:
        if not isinstance(member, str):
            raise ValueError(f'a member must be a user, "uid:N" or "@group", got {member!r}')
        uids |= _members(member[1:]) if member.startswith("@") else {_owner(member)}
    return uids


def _user_name(uid: int) -> str:
    """``alice (uid 1000)``, or ``uid 1000`` for a uid with no user."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def read_config(path: Path, owners: Collection[int]) -> dict[str, object]:
    """The checked settings of the config file at ``path``, which must belong to a uid in
    ``owners`` (root and the server's) and be writable by its owner only, in a directory
    checked as the socket's is (``_wire._safety.check_directory``: its own and every one
    above it, so that nobody else can replace the file). ConfigError for a file that is
    missing, unsafe, unreadable or not a valid config."""
    try:
        check_directory(path.parent, owners, what="config file")
        data = read_trusted_file(path, owners)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except OSError as exc:  # UnsafePathError names the file or the directory
        raise ConfigError(str(exc) or f"config file {str(path)!r}: {exc!r}") from None
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_config(text, str(path))


def _limit_gpus(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(
            f"must be a number of GPUs > 0 (a fraction counts its share), got {value!r}"
        )
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be a finite number of GPUs > 0, got {value!r}")
    return float(value)


def _limit_queued(value: object) -> int:
    if type(value) is not int or not 0 <= value <= 2**31:
        raise ValueError(f"must be an integer >= 0, got {value!r}")
    return value


def _limit_memory(value: object) -> int:
    """MiB: an int, or a size such as ``"24GiB"`` (only on a server sized in memory)."""
    try:
        return parse_memory(value, "memory")
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def _limit_mode(value: object) -> str:
    if not isinstance(value, str) or value not in LIMIT_MODES:
        raise ValueError(f"must be one of {', '.join(map(repr, LIMIT_MODES))}, got {value!r}")
    return value


LIMIT_KEYS: dict[str, Callable[[object], object]] = {
    "gpus": at_most(MOST_LIMIT["gpus"], _limit_gpus),
    "running": at_most(MOST_LIMIT["running"], _count),
    "queued": at_most(MOST_LIMIT["queued"], _limit_queued),
    "memory": _limit_memory,
    "mode": _limit_mode,
}
"""The keys of one ``[limits.default]`` or ``[limits.users.NAME]`` table (the core's
:class:`~hwpool._core._limits.OwnerLimits`; ``memory`` is its ``units``, MiB on a server
sized in memory) and what checks each."""


Fail = Callable[[str | None, str, str], ConfigError]


def _limits(
    value: object, account_of: Mapping[int, str], accounts: Mapping[str, object], fail: Fail
) -> tuple[OwnerLimits | None, dict[Owner, OwnerLimits]]:
    """``[limits]``: the default limits and those per owner (a user's own table first, then
    the first group table in the file that has the user as a member; an account's table
    for the account as a whole). A group's members in an account are left out of its
    table (their account's limits apply); a user's own table for one is an error."""
    if not isinstance(value, dict):
        raise fail(None, "limits", "must be a table: [limits.default] or [limits.users.NAME]")
    default: OwnerLimits | None = None
    users: dict[Owner, OwnerLimits] = {}
    by_group: dict[Owner, OwnerLimits] = {}
    for name, table in value.items():
        if name == "default":
            default = _owner_limits(table, "limits.default", fail)
        elif name == "accounts":
            users.update(_account_limits(table, accounts, fail))
        elif name == "groups":
            if not isinstance(table, dict):
                raise fail("limits", "groups", "must be a table of groups: [limits.groups.NAME]")
            for group, limits in table.items():
                try:
                    members = _members(group)
                except ValueError as exc:
                    raise fail("limits.groups", group, str(exc)) from None
                checked = _owner_limits(limits, f"limits.groups.{group}", fail)
                for uid in members - account_of.keys():
                    by_group.setdefault(uid, checked)
        elif name == "users":
            if not isinstance(table, dict):
                raise fail("limits", "users", "must be a table of users: [limits.users.NAME]")
            for user, limits in table.items():
                try:
                    uid = _user_owner(user, account_of, "limits ([limits.accounts.NAME])")
                    if uid in users:
                        raise ValueError(f"names uid {uid} twice")
                except ValueError as exc:
                    raise fail("limits.users", user, str(exc)) from None
                users[uid] = _owner_limits(limits, f"limits.users.{user}", fail)
        else:
            raise fail(
                "limits", name, "unknown table (the tables are: default, users, groups, accounts)"
            )
    return default, {**by_group, **users}


def _account_limits(
    value: object, accounts: Mapping[str, object], fail: Fail
) -> dict[Owner, OwnerLimits]:
    """``[limits.accounts]``: account name -> the limits of the account as a whole."""
    if not isinstance(value, dict):
        raise fail("limits", "accounts", "must be a table of accounts: [limits.accounts.NAME]")
    limits: dict[Owner, OwnerLimits] = {}
    for name, table in value.items():
        if name not in accounts:
            known = ", ".join(map(repr, accounts)) or "none"
            problem = f"no account named {name!r} in [accounts] (it has: {known})"
            raise fail("limits.accounts", name, problem)
        limits[name] = _owner_limits(table, f"limits.accounts.{name}", fail)
    return limits


def _members(name: str) -> set[int]:
    """A ``[limits.groups]`` key: a group name or ``gid:N``; the uids of its members (those
    it names, and those whose primary group it is), as the system says now."""
    if name.startswith("gid:"):
        digits = name[4:]
        if not (digits.isascii() and digits.isdigit() and int(digits) < 2**32):
            raise ValueError(f"{name!r} is not gid:N with N a gid")
        try:
            group = grp.getgrgid(int(digits))
        except KeyError:
            raise ValueError(f"no group with gid {digits}") from None
    else:
        try:
            group = grp.getgrnam(name)
        except KeyError:
            raise ValueError(f"no group named {name!r} (give a group name or gid:N)") from None
    return group_members(group.gr_gid)


def group_members(gid: int) -> set[int]:
    """The uids of group ``gid``'s members as the system says now: those it names, and those
    whose primary group it is (none for a gid with no group)."""
    try:
        group = grp.getgrgid(gid)
    except KeyError:
        return set()
    members = {p.pw_uid for p in pwd.getpwall() if p.pw_gid == gid}
    for member in group.gr_mem:
        try:
            members.add(pwd.getpwnam(member).pw_uid)
        except KeyError:
            continue  # a name in the group file with no user: nobody to count
    return members


def _owner_limits(value: object, table: str, fail: Fail) -> OwnerLimits:
    """One table of limits, checked key by key."""
    if not isinstance(value, dict):
        parent, _, key = table.rpartition(".")
        raise fail(parent, key, f"must be a table of limits with keys {', '.join(LIMIT_KEYS)}")
    checked: dict[str, object] = {}
    for key, setting in value.items():
        check = LIMIT_KEYS.get(key)
        if check is None:
            raise fail(table, key, f"unknown key (the keys are: {', '.join(LIMIT_KEYS)})")
        try:
            checked["units" if key == "memory" else key] = check(setting)
        except ValueError as exc:
            raise fail(table, key, str(exc)) from None
    return OwnerLimits(**checked)  # type: ignore[arg-type]
