"""What a job is: its states, its id, its record, and the checks on every field of it.

**Job ids** are ``j`` followed by a positive decimal number without leading zeros (``j1``,
``j12``): the host server's request and lease ids, which ``hwpool status`` shows and
``hwpool cancel`` takes, are plain integers, so the two can never be confused. A job id is
given once per user (a user's table never reuses one, even after the job is pruned); two
users' tables may both hold a ``j3``.

Every check raises TypeError for a wrong type and ValueError for a wrong value, naming the
argument and the value (the project's rule, as in ``hwpool._check``).
"""

from __future__ import annotations

import math
import numbers
import os
import re
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import NamedTuple

from .._check import check_int
from .._wire._bounds import MAX_ID, MAX_PRIORITY

__all__ = [
    "FINISHED",
    "JOB_ID_PREFIX",
    "MAX_NAME",
    "MAX_REASON",
    "MAX_SIGNAL",
    "UNFINISHED",
    "JobRecord",
    "JobRef",
    "JobState",
    "Usage",
    "check_after",
    "check_argv",
    "check_cwd",
    "check_environment",
    "check_exit",
    "check_gpu_ids",
    "check_job_id",
    "check_name",
    "check_optional_int",
    "check_priority",
    "check_reason",
    "check_request",
    "check_state",
    "check_time",
    "check_usage",
    "format_job_id",
    "how_ended",
    "parse_job_ref",
    "signal_name",
]

JOB_ID_PREFIX = "j"
MAX_NAME = 256
MAX_REASON = 1000
MAX_SIGNAL = signal.NSIG - 1
_JOB_ID = re.compile(r"j([1-9][0-9]{0,15})")
_JOB_REF = re.compile(r"j([1-9][0-9]{0,15})(?:_(0|[1-9][0-9]{0,6}))?")


class JobRef(NamedTuple):
    """A job id as a user writes it: ``j12`` (``member`` None: the job, or the whole array
    numbered 12) or ``j12_3`` (``member`` 3 of the array ``j12``)."""

    number: int
    member: int | None

    def __str__(self) -> str:
        base = format_job_id(self.number)
        return base if self.member is None else f"{base}_{self.member}"


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal 77`` for a number with no name here."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def how_ended(exit_code: int | None, signum: int | None) -> str:
    """`` (exit 1)``, `` (SIGKILL)``, or nothing: how a finished job ended, for a reason."""
    if signum is not None:
        return f" ({signal_name(signum)})"
    return "" if exit_code is None else f" (exit {exit_code})"


class JobState(StrEnum):
    """Where a job is in its life (the values are what ``hwpool jobs`` shows)."""

    QUEUED = "queued"  # its dependencies (if any) succeeded; waits for its share
    WAITING = "waiting-on-dependency"  # some dependency has not succeeded yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # exited with 0
    FAILED = "failed"  # exited with another code, or was killed by a signal
    CANCELLED = "cancelled"  # by its user, or because a dependency did not succeed
    TIMED_OUT = "timed-out"  # ended for running past its time limit
    LOST = "lost"  # died while nothing watched it; what is known is kept

    @property
    def finished(self) -> bool:
        """Whether the job has ended (nothing will change it but pruning)."""
        return self in FINISHED


FINISHED = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT, JobState.LOST}
)
UNFINISHED = frozenset({JobState.QUEUED, JobState.WAITING, JobState.RUNNING})


class Usage(NamedTuple):
    """What a finished job's process tree used, as ``getrusage(RUSAGE_CHILDREN)`` tells its
    launcher: CPU seconds in user and system mode, and its largest process's peak RSS (KiB)."""

    cpu_user_s: float
    cpu_system_s: float
    max_rss_kib: int


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job as the table holds it (a snapshot: the table is the truth).

    The request is ``gpus`` (a fraction in (0, 1] of one GPU, or an int >= 2 of whole GPUs)
    or ``memory_mib``, never both. Times are wall-clock seconds (``time.time()``).
    ``gpu_ids`` are the ``CUDA_VISIBLE_DEVICES`` entries the job was started with;
    ``lease`` the host server's request id for its share; ``pid`` and ``pid_start`` (the
    process's start time in clock ticks after boot, ``/proc/PID/stat`` field 22) tell the
    job's process from a later one that reuses its pid. ``retry_of`` is the job this one
    re-runs. ``after``, ``after_any`` and ``after_notok`` are its dependencies of each kind
    (see ``_depends``); ``held_by``: who holds it (``hwpool hold``), None when nobody does.
    Accounting: ``gpu_share`` (the GPUs it held, 0.5 or 2: its GPU-seconds per second, from
    its start), ``usage`` (its process tree's CPU time and peak RSS, once it ended; None
    where its launcher could not tell) and ``ended_by`` (who cancelled it). ``notify``: the
    shell command run once it has ended (``submit --notify``). ``number``: its own row's
    number (``j12`` -> 12; an array's member has one too, as a Slurm array task has its job
    id); an array's member has ``array_id`` (``j12``), ``array_index`` and ``array_limit``
    (at most that many members running at once), and ``id`` ``j12_3``.
    """

    id: str
    name: str
    argv: tuple[str, ...]
    cwd: str
    environment: Mapping[str, str]
    gpus: Fraction | int | None
    memory_mib: int | None
    priority: int
    time_limit: int | None
    after: tuple[str, ...]
    state: JobState
    exit_code: int | None
    signal: int | None
    gpu_ids: tuple[str, ...]
    lease: int | None
    pid: int | None
    pid_start: int | None
    queued_at: float
    started_at: float | None
    ended_at: float | None
    reason: str | None
    stdout_log: str | None
    stderr_log: str | None
    retry_of: str | None
    after_any: tuple[str, ...] = ()
    after_notok: tuple[str, ...] = ()
    held_by: str | None = None
    gpu_share: float | None = None
    usage: Usage | None = None
    ended_by: str | None = None
    notify: str | None = None
    number: int = 0
    array_id: str | None = None
    array_index: int | None = None
    array_limit: int | None = None

    @property
    def held(self) -> bool:
        """Whether it is held: queued or waiting, and never started until released."""
        return self.held_by is not None and self.state in (JobState.QUEUED, JobState.WAITING)

    @property
    def shown_state(self) -> str:
        """Its state as ``hwpool jobs`` shows it: ``held`` for a held job, else ``state``."""
        return "held" if self.held else self.state.value


def format_job_id(number: int) -> str:
    """The id of the job numbered ``number`` (``12`` -> ``"j12"``)."""
    return f"{JOB_ID_PREFIX}{number}"


def parse_job_ref(name: str, value: object) -> JobRef:
    """The :class:`JobRef` ``value`` names (``"j12"``, ``"j12_3"``); TypeError or ValueError
    naming ``name`` otherwise (a bare number with the hint of :func:`check_job_id`)."""
    if not isinstance(value, str):
        check_job_id(name, value)  # its TypeError
    assert isinstance(value, str)
    found = _JOB_REF.fullmatch(value)
    if found is None or int(found[1]) > MAX_ID:
        check_job_id(name, value)  # its message, with its hint
        raise ValueError(
            f"{name} must be a job id such as 'j12', or an array's member such as 'j12_3', "
            f"got {value!r}"
        )
    return JobRef(int(found[1]), None if found[2] is None else int(found[2]))


def check_job_id(name: str, value: object) -> int:
    """The number of the job id ``value`` (``"j12"`` -> 12). A bare number is refused, with
    a hint: it is the host server's request id, not a job's."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a job id such as 'j12', got {value!r}")
    found = _JOB_ID.fullmatch(value)
    if found is None or int(found[1]) > MAX_ID:
        hint = ""
        if value.isascii() and value.isdigit():
            hint = " (a bare number is a host server's request id, as `hwpool status` shows)"
        raise ValueError(f"{name} must be a job id such as 'j12', got {value!r}{hint}")
    return int(found[1])


def check_argv(value: object) -> tuple[str, ...]:
    """``value`` (a list or tuple of strings, the first non-empty, none with a NUL)."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(f"argv must be a list of strings, got {value!r}")
    if not value:
        raise ValueError("argv must not be empty: a job needs a command to run, got []")
    for index, arg in enumerate(value):
        if not isinstance(arg, str):
            raise TypeError(f"argv[{index}] must be a string, got {arg!r}")
        if "\0" in arg:
            raise ValueError(f"argv[{index}] must not contain a NUL character, got {arg!r}")
    if not value[0]:
        raise ValueError(f"argv[0] (the command) must not be empty, got {list(value)!r}")
    return tuple(value)


def check_name(value: object, argv: Sequence[str]) -> str:
    """``value`` as a job's name; None names the job after its command (``argv[0]``'s
    basename)."""
    if value is None:
        return os.path.basename(argv[0])[:MAX_NAME] or argv[0][:MAX_NAME]
    if not isinstance(value, str):
        raise TypeError(f"name must be a string, got {value!r}")
    if not value or len(value) > MAX_NAME:
        raise ValueError(f"name must be 1 to {MAX_NAME} characters, got {value[:80]!r}")
    return value


def check_cwd(value: object) -> str:
    """``value`` as the job's working directory: an absolute path, as a string."""
    if not isinstance(value, str | os.PathLike):
        raise TypeError(f"cwd must be a path, got {value!r}")
    path = os.fspath(value)
    if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
        raise ValueError(f"cwd must be an absolute path, got {path!r}")
    return path


def check_environment(value: object) -> dict[str, str]:
    """``value`` as the job's environment: a mapping of names (non-empty, no ``=``) to
    values, all strings without NUL."""
    if not isinstance(value, Mapping):
        raise TypeError(f"environment must be a mapping of strings, got {type(value).__name__}")
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise TypeError(f"environment[{key!r}] must map a string to a string, got {item!r}")
        if not key or "=" in key or "\0" in key or "\0" in item:
            raise ValueError(
                f"environment[{key!r}]: a variable's name must be non-empty without '=' or "
                "NUL, and its value without NUL"
            )
    return dict(value)


def check_request(gpus: object, memory_mib: object) -> tuple[Fraction | int | None, int | None]:
    """The job's request: ``gpus`` (a fraction in (0, 1] of one GPU, or an int >= 2 of whole
    GPUs; a float is read as its decimal text) or ``memory_mib`` (an int >= 1), not both;
    neither asks for one whole GPU, as ``hwpool run`` does."""
    if gpus is not None and memory_mib is not None:
        raise ValueError(f"give gpus or memory_mib, not both (gpus={gpus!r}, {memory_mib=!r})")
    if memory_mib is not None:
        return None, check_int("memory_mib", memory_mib, minimum=1)
    if gpus is None:
        return Fraction(1), None
    return _gpu_share(gpus), None


def _gpu_share(value: object) -> Fraction | int:
    """``gpus`` exactly: a rational as it is, a float as its shortest decimal (0.1 is 1/10)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"gpus must be a number, got {value!r}")
    share: Fraction | None = None
    if isinstance(value, numbers.Rational):
        share = Fraction(int(value.numerator), int(value.denominator))
    elif isinstance(value, float) and math.isfinite(value):
        share = Fraction(repr(value))
    if share is not None and share.denominator == 1 and share >= 2:
        return int(share)
    if share is None or not 0 < share <= 1:
        raise ValueError(f"gpus must be a fraction in (0, 1] or an int >= 2, got {value!r}")
    return share


def check_priority(value: object) -> int:
    """``value`` as a priority, within the host server's bounds."""
    return check_int("priority", value, minimum=-MAX_PRIORITY, maximum=MAX_PRIORITY)


def check_optional_int(name: str, value: object, minimum: int, maximum: int) -> int | None:
    """``value`` (None, or an int in ``[minimum, maximum]``)."""
    return None if value is None else check_int(name, value, minimum=minimum, maximum=maximum)


def check_exit(exit_code: object, signal_number: object) -> tuple[int | None, int | None]:
    """How a process ended: an exit code (0 to 255) or a signal (1 to NSIG - 1), not both."""
    if (exit_code is None) == (signal_number is None):
        raise ValueError(
            f"give exit_code or signal, exactly one (exit_code={exit_code!r}, "
            f"signal={signal_number!r})"
        )
    return (
        check_optional_int("exit_code", exit_code, 0, 255),
        check_optional_int("signal", signal_number, 1, MAX_SIGNAL),
    )


def check_gpu_ids(value: object) -> tuple[str, ...]:
    """``value`` as the GPUs a job saw: a list of non-empty strings (``GPU-...`` UUIDs)."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(f"gpu_ids must be a list of strings, got {value!r}")
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item or "," in item:
            raise ValueError(f"gpu_ids[{index}] must be a GPU's id (no comma), got {item!r}")
    return tuple(value)


def check_reason(value: object) -> str | None:
    """``value`` as a reason text (None, or 1 to MAX_REASON characters)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"reason must be a string, got {value!r}")
    if not value or len(value) > MAX_REASON:
        raise ValueError(f"reason must be 1 to {MAX_REASON} characters, got {value[:80]!r}")
    return value


def check_time(name: str, value: object) -> float:
    """``value`` as a wall-clock time: a finite real number >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a time in seconds, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a finite time >= 0, got {value!r}")
    return number


def check_state(name: str, value: object) -> str:
    """``value`` as a job state's name (``"queued"``, ``"timed-out"``, ...)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a job state (a string), got {value!r}")
    try:
        return JobState(value).value
    except ValueError:
        known = ", ".join(state.value for state in JobState)
        raise ValueError(f"{name} must be a job state ({known}), got {value!r}") from None


def check_usage(value: object) -> Usage | None:
    """``value`` as a job's :class:`Usage` (None: unknown); CPU seconds finite and >= 0, the
    peak RSS an int >= 0."""
    if value is None:
        return None
    if not isinstance(value, Usage):
        raise TypeError(f"usage must be a Usage or None, got {value!r}")
    for name in ("cpu_user_s", "cpu_system_s"):
        seconds = getattr(value, name)
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise TypeError(f"usage.{name} must be a number of seconds, got {seconds!r}")
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"usage.{name} must be a number of seconds >= 0, got {seconds!r}")
    rss = value.max_rss_kib
    if isinstance(rss, bool) or not isinstance(rss, int) or rss < 0:
        raise ValueError(f"usage.max_rss_kib must be an int >= 0, got {rss!r}")
    return value


def check_after(after: Iterable[str], name: str = "after") -> list[JobRef]:
    """The job ids in ``after`` (the argument ``name``; jobs, arrays or members), in order,
    each once."""
    if isinstance(after, str):
        raise TypeError(f"{name} must be a list of job ids, got the string {after!r}")
    refs: list[JobRef] = []
    for index, job_id in enumerate(after):
        ref = parse_job_ref(f"{name}[{index}]", job_id)
        if ref not in refs:
            refs.append(ref)
    return refs
