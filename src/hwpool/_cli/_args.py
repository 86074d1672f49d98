"""The argument types of the ``hwpool`` command line, and the error of a bad argument.

Each type is an argparse ``type=``: it returns the value parsed or raises
``argparse.ArgumentTypeError`` with what is wrong (argparse names the option). They are here,
apart from the commands, because the parser is built before every command and must load
nothing that a command needs only when it runs. The defaults and notes that a command and
its help text share (``DEMO_SECONDS``, ``WAIT_TIMED_OUT``, ``JOB_ID_NOTE``) are here too, so
that no command imports the parser.
"""

from __future__ import annotations

import argparse
import math
import re
from fractions import Fraction

from .. import _exits
from .._check import check_int, duration_from_text, int_from_text
from .._core._memory import parse_memory
from .._jobs._arrays import ArraySpec, parse_array_spec
from .._jobs._model import JOB_ID_PREFIX, JobState, parse_job_ref
from .._sim._names import POLICIES as SIMULATED_POLICIES
from .._wire._bounds import MAX_PRIORITY, MAX_REASON
from ._env import seconds_from_text

__all__ = [
    "DEMO_SECONDS",
    "JOB_ID_NOTE",
    "MAX_DEMO_SECONDS",
    "MAX_GPUS",
    "WAIT_TIMED_OUT",
    "UserError",
    "array_spec",
    "cancel_id",
    "count",
    "demand_from_text",
    "drain_reason",
    "env_assignment",
    "gpu_count",
    "gpu_index",
    "gpu_memory_list",
    "job_id_argument",
    "job_ids_argument",
    "job_states",
    "limit_from_text",
    "memory_from_text",
    "policies",
    "port",
    "positive_seconds",
    "priority_from_text",
    "seconds_or_zero",
    "seconds_within_an_hour",
    "share",
    "wait_timeout",
]

DEMO_SECONDS = 8.0
"""The length ``hwpool demo`` lays its workload out for, unless ``--seconds`` scales it."""
WAIT_TIMED_OUT = _exits.GAVE_UP
"""``hwpool wait --timeout``'s status when the time passed first (EX_TEMPFAIL: try again)."""
JOB_ID_NOTE = (
    "job ids look like j12; #12 in `hwpool status` is the host server's request id, not a job's"
)

MAX_GPUS = 4096
"""The most GPUs a list of sizes may name (a bound, so that a typo cannot exhaust memory)."""
MAX_DEMO_SECONDS = 3600.0
"""The longest ``demo --seconds`` accepts."""


class UserError(Exception):
    """A mistake in the command line or its input: reported in one line, exit status 2."""


# ----------------------------------------------------------------- shared by several commands
def gpu_memory_list(text: str) -> tuple[int, ...]:
    """``--gpu-memory 80GiB,24GiB``: one memory size per GPU, in MiB."""
    parts = text.split(",")
    if len(parts) > MAX_GPUS:
        raise argparse.ArgumentTypeError(f"at most {MAX_GPUS} GPUs, got {len(parts)}")
    try:
        return tuple(
            parse_memory(part.strip(), f"GPU {i}'s memory") for i, part in enumerate(parts)
        )
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def demand_from_text(text: str) -> Fraction | int:
    """``--gpus``: a fraction in (0, 1] (``0.25``, ``1/4``) or an integer >= 2 of whole GPUs."""
    try:
        value = Fraction(text.strip()) if len(text) <= 40 else None
    except (ValueError, ZeroDivisionError):
        value = None
    if value is not None and value.denominator == 1 and value >= 2:
        return int(value)
    if value is None or not 0 < value <= 1:
        raise argparse.ArgumentTypeError(
            f"must be a fraction in (0, 1] of one GPU or an integer >= 2 of whole GPUs, "
            f"got {text[:40]!r}"
        )
    return value


def priority_from_text(text: str) -> int:
    """``--priority``: an int within the protocol's bounds (argparse names the option)."""
    try:
        return check_int("priority", int(text, 10), minimum=-MAX_PRIORITY, maximum=MAX_PRIORITY)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an integer in -{MAX_PRIORITY}..{MAX_PRIORITY}"
        ) from exc


def memory_from_text(text: str) -> int:
    """``--mem``: an amount of memory (see ``hwpool._core._memory``), in MiB."""
    try:
        return parse_memory(text, "SIZE")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def limit_from_text(text: str) -> float:
    """``--time``: a duration (``90s``, ``30m``, ``2h``, or seconds), > 0."""
    try:
        return duration_from_text(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_assignment(text: str) -> tuple[str, str]:
    """``submit --env KEY=VALUE``: a variable name as a shell writes one, and its value (which
    may hold ``=``; not NUL, which no environment can carry)."""
    key, sep, value = text.partition("=")
    if not sep or _ENV_NAME.fullmatch(key) is None or "\0" in value:
        raise argparse.ArgumentTypeError(
            f"must be KEY=VALUE with KEY a variable name (letters, digits, _; not first a "
            f"digit), got {text[:60]!r}"
        )
    return key, value


def array_spec(text: str) -> ArraySpec:
    """``submit --array 0-99%4``: the members' indices and the limit (see ``_jobs._arrays``)."""
    try:
        return parse_array_spec(text, "SPEC")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("SPEC ")) from None


def job_id_argument(text: str) -> str:
    """A job id (``j12``, or an array's member ``j12_3``), refused with the value named
    otherwise."""
    try:
        parse_job_ref("ID", text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("ID ")) from None
    return text


def job_ids_argument(text: str) -> list[str]:
    """``--after j1,j2`` (and ``--after-any``, ``--after-notok``): job ids, comma-separated."""
    ids = [word.strip() for word in text.split(",")]
    for word in ids:
        try:
            parse_job_ref("ID", word)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("ID ")) from None
    return ids


JOB_STATE_NAMES = (
    JobState.QUEUED.value,
    "held",
    *(state.value for state in JobState if state is not JobState.QUEUED),
)
"""What ``jobs --state`` takes: every state a job's record can have, and ``held``."""


def job_states(text: str) -> frozenset[str]:
    """``jobs --state queued,running``: states, comma-separated; ``queued`` also takes
    ``waiting-on-dependency`` (Slurm's PENDING is both; a held job is ``held``)."""
    states: set[str] = set()
    for word in (word.strip() for word in text.split(",")):
        if word not in JOB_STATE_NAMES:
            raise argparse.ArgumentTypeError(
                f"must be states, comma-separated, of {', '.join(JOB_STATE_NAMES)}; "
                f"got {word[:40]!r}"
            )
        states.add(word)
    if JobState.QUEUED.value in states:
        states.add(JobState.WAITING.value)
    return frozenset(states)


def count(text: str) -> int:
    """An int >= 1."""
    try:
        return int_from_text("the value", text, minimum=1)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("the value ")) from None


def gpu_index(text: str) -> int:
    """A GPU's index, as ``hwpool status`` shows it: an int 0..MAX_GPUS - 1."""
    try:
        return int_from_text("the value", text, minimum=0, maximum=MAX_GPUS - 1)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"a GPU index: {exc}") from None


def drain_reason(text: str) -> str:
    """A drain's reason: printable text of at most MAX_REASON characters."""
    if len(text) > MAX_REASON:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_REASON} characters, got {len(text)}: {text[:40]!r}..."
        )
    if not text.isprintable():
        raise argparse.ArgumentTypeError(
            f"must be printable text (no control characters), got {text[:80]!r}"
        )
    return text


def port(text: str) -> int:
    """A TCP port number, 0 (any free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0..65535, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """A finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def seconds_or_off(text: str) -> float:
    """A finite number of seconds >= 0, or ``off`` (0: turned off)."""
    if text == "off":
        return 0.0
    try:
        return seconds_or_zero(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds >= 0 or off, got {text!r}"
        ) from None


def seconds_or_zero(text: str) -> float:
    """A finite number of seconds >= 0."""
    try:
        return seconds_from_text(text, "S")
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds >= 0, got {text[:40]!r}"
        ) from None


# ----------------------------------------------------------------- hwpool cancel, wait
def cancel_id(text: str) -> int | str:
    """``j12`` (a job id, kept as text) or ``12`` (a server request id, as an int)."""
    if text.startswith(JOB_ID_PREFIX):
        return job_id_argument(text)
    if not text.isascii() or not text.isdigit():
        raise argparse.ArgumentTypeError(
            f"must be a job id such as 'j12' (`hwpool jobs`) or a server request id such as 12 "
            f"(`hwpool status` shows #12), got {text!r}"
        )
    return count(text)


def wait_timeout(text: str) -> float:
    """``hwpool wait --timeout``: a duration, or 0 (look once)."""
    if text.strip() in ("0", "0s"):
        return 0.0
    try:
        return duration_from_text(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# ----------------------------------------------------------------- hwpool simulate, demo
def gpu_count(text: str) -> int:
    """``simulate --gpus``: 1 to ``MAX_GPUS``."""
    try:
        return int_from_text("--gpus", text, minimum=1, maximum=MAX_GPUS)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--gpus ")) from None


def seconds_within_an_hour(text: str) -> float:
    """``demo --seconds``, ``simulate --half-life``: > 0 and <= ``MAX_DEMO_SECONDS``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_DEMO_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds > 0 and <= {MAX_DEMO_SECONDS:g}, got {text[:40]!r}"
        )
    return value


def share(text: str) -> tuple[str, float]:
    """``simulate --share OWNER=N``."""
    owner, sep, number = text.rpartition("=")
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    if not sep or not owner or not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(
            f"must be OWNER=N with N a finite number > 0, got {text[:60]!r}"
        )
    return owner, value


def policies(text: str) -> list[str]:
    """``simulate --policy P[,P...]`` or ``all``."""
    names = list(SIMULATED_POLICIES) if text == "all" else [p.strip() for p in text.split(",")]
    for name in names:
        if name not in SIMULATED_POLICIES:
            raise argparse.ArgumentTypeError(
                f"unknown policy {name!r}; choose from {', '.join(SIMULATED_POLICIES)} or 'all'"
            )
    return list(dict.fromkeys(names))
