"""Reading a decoded line's fields, and the fields several messages share.

:class:`_Fields` gives typed access to one JSON object and turns every failure into a
``bad_message`` :class:`ProtocolError` naming the field; the helpers read and write the
optional fields that requests and records share (labels, ``unit``, ``limit_s``, a ticket).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from .._check import check_bool, check_int, check_real
from ._bounds import MAX_ID, MAX_TEXT
from ._framing import MAX_GPUS, TICKET, ErrorCode, ProtocolError, Unit

_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)  # made once: dumps()
# with arguments would build a new encoder for every message


class _Fields:
    """Typed access to one decoded object; every failure is a BAD_MESSAGE naming the field."""

    __slots__ = ("obj", "op", "req")

    def __init__(self, obj: Mapping[str, object], op: str, req: int | None) -> None:
        self.obj, self.op, self.req = obj, op, req

    def fail(self, what: str) -> ProtocolError:
        return ProtocolError(ErrorCode.BAD_MESSAGE, f"{self.op}: {what}", self.req)

    def get(self, key: str) -> object:
        if key not in self.obj:
            raise self.fail(f"field {key!r} is missing")
        return self.obj[key]

    def num(self, key: str, lo: int = 0, hi: int = MAX_ID) -> int:
        value = self.obj.get(key)
        if type(value) is int and lo <= value <= hi:  # the common case, without the ABCs
            return value
        try:
            return check_int(key, self.get(key), minimum=lo, maximum=hi)
        except (TypeError, ValueError) as exc:
            raise self.fail(str(exc)) from None

    def opt_num(self, key: str, lo: int = 0, hi: int = MAX_ID) -> int | None:
        return None if self.obj.get(key) is None else self.num(key, lo, hi)

    def flag(self, key: str) -> bool:
        value = self.obj.get(key)
        if value is True or value is False:  # the common case
            return value
        try:
            return check_bool(key, self.get(key))
        except TypeError as exc:
            raise self.fail(str(exc)) from None

    def opt_flag(self, key: str) -> bool:
        """An optional bool, False when left out (or null)."""
        return False if self.obj.get(key) is None else self.flag(key)

    def age(self, key: str) -> float:
        try:
            number = check_real(key, self.get(key))
        except (TypeError, ValueError) as exc:
            raise self.fail(str(exc)) from None
        if not 0.0 <= number < math.inf:
            raise self.fail(f"{key} must be a finite number >= 0, got {number!r}")
        return number

    def text(self, key: str, limit: int = MAX_TEXT) -> str:
        value = self.get(key)
        if not isinstance(value, str):
            raise self.fail(f"{key} must be a string, got {value!r}")
        if len(value) > limit:
            raise self.fail(f"{key} is longer than {limit} characters")
        if not value.isascii():
            try:
                value.encode()
            except UnicodeEncodeError:  # a lone surrogate: no line could carry it on
                raise self.fail(f"{key} holds a lone surrogate, which UTF-8 cannot carry") from None
        return value

    def opt_text(self, key: str) -> str | None:
        return None if self.obj.get(key) is None else self.text(key)

    def ints(self, key: str, hi: int = MAX_GPUS - 1) -> tuple[int, ...]:
        value = self.get(key)
        if not isinstance(value, list) or len(value) > MAX_GPUS:
            raise self.fail(f"{key} must be a list of at most {MAX_GPUS} ints")
        if all(type(v) is int and 0 <= v <= hi for v in value):  # the common case
            return tuple(value)
        return tuple(_Fields({key: v}, self.op, self.req).num(key, 0, hi) for v in value)

    def pairs(self, key: str) -> tuple[tuple[int, int], ...]:
        value = self.get(key)
        if not isinstance(value, list) or not 0 < len(value) <= MAX_GPUS:
            raise self.fail(f"{key} must be a non-empty list of [gpu, units] pairs")
        pairs = []
        for item in value:
            if not isinstance(item, list) or len(item) != 2:
                raise self.fail(f"{key} must hold [gpu, units] pairs, got {item!r}")
            pair = _Fields({"gpu": item[0], "units": item[1]}, self.op, self.req)
            pairs.append((pair.num("gpu", 0, MAX_GPUS - 1), pair.num("units", 1)))
        return tuple(pairs)

    def objects(self, key: str) -> list[_Fields]:
        value = self.get(key)
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise self.fail(f"{key} must be a list of objects")
        return [_Fields(v, self.op, self.req) for v in value]


_DECODE = json.JSONDecoder().decode  # what json.loads uses, without its checks of the input


def _load(line: bytes) -> dict[str, object]:
    try:
        if line[:1] == b"{" and line[1:2] != b"\x00":  # a line json.loads reads as UTF-8
            obj = _DECODE(line.decode("utf-8", "surrogatepass"))  # as json.loads decodes it
        else:
            obj = json.loads(line)  # (it guesses UTF-16 and UTF-32 from the first bytes)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ProtocolError(ErrorCode.BAD_JSON, "a line is not valid UTF-8 JSON") from None
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.BAD_JSON, f"a message must be a JSON object, got {obj!r}")
    return obj


def _opened(line: bytes, side: str) -> _Fields:
    """The object of ``line`` with its op and, best effort, its req (for error replies)."""
    obj = _load(line)
    op = obj.get("op")
    raw = obj.get("req")
    req = raw if type(raw) is int and 0 <= raw <= MAX_ID else None  # best effort, for errors
    if not isinstance(op, str):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"a {side} message needs a string 'op'", req)
    return _Fields(obj, op, req)


def _texts(f: _Fields) -> dict[str, str | None]:
    return {"name": f.opt_text("name"), "command": f.opt_text("command")}


def _unit(f: _Fields) -> Unit:
    """The optional ``unit`` of a request: ``gpu`` when left out."""
    value = f.obj.get("unit", "gpu")
    if value == "mib":
        return "mib"
    if value == "gpu":
        return "gpu"
    raise f.fail(f"unit must be 'gpu' or 'mib', got {value!r}")


def _put_texts(out: dict[str, object], name: str | None, command: str | None) -> None:
    if name is not None:
        out["name"] = name
    if command is not None:
        out["command"] = command


def _limit(f: _Fields) -> float | None:
    """The optional ``limit_s`` of a request: a finite number of seconds > 0."""
    if f.obj.get("limit_s") is None:
        return None
    number = f.age("limit_s")
    if number <= 0.0:
        raise f.fail(f"limit_s must be a finite number of seconds > 0, got {number!r}")
    return number


def _ticket(f: _Fields) -> str:
    """The ``ticket`` of a ``take`` or ``given``: see :data:`TICKET`."""
    value = f.get("ticket")
    if not isinstance(value, str) or not TICKET.fullmatch(value):
        raise f.fail(f"ticket must be 16 to 64 letters, digits, '_' or '-', got {value!r:.80}")
    return value
