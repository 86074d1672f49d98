"""KeyboardInterrupt injected at the n-th line, or the n-th signal point, that runs in chosen
files (sys.settrace).

Lines (:class:`Injection`): the exception comes out of the traced line as one raised by a
signal handler would (only more often: at every line, not only where CPython checks for
signals). A trace function that raises is unset, so each run injects at most once. A line
event back at a ``with`` statement (its exit) is not counted: raised there, before
``__exit__`` runs, the exception would leave a lock held, where no signal can land (CPython
checks for them after the call to __exit__).

Signal points (:class:`AtSignalPoints`): every place *inside* a line where CPython 3.11 runs
signal handlers and raises asynchronous exceptions, found by tracing opcodes: on entering a
function (of these files, or one they call), after every call returns (before the next
instruction: the result of ``ticket, grant = core.submit(...)`` is then never stored), at a
loop's back edge and on resuming after ``yield``. Line events miss most of these (a line is
usually several calls), and raising at an arbitrary opcode would test for points where no
signal can land (between a ``del`` and the ``append`` after it, or before a ``with``'s
``__exit__`` is called). An exception that CPython raises there and one raised by the trace
function before the next instruction are the same to the code that runs. (The interpreter
cannot be asked to do it itself: an asynchronous exception scheduled from a trace function is
raised inside the trace function, at its next call.)
"""

from __future__ import annotations

import ctypes
import dis
import linecache
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import hwpool

PACKAGE = Path(hwpool.__file__).parent
CORE = (str(PACKAGE / "_core"),)
LOCAL_BACKEND = (str(PACKAGE / "_core"), str(PACKAGE / "_backends" / "_local.py"))


class Injection:
    """Counts the line events in files whose path starts with one of ``where``; raises
    KeyboardInterrupt at the ``at``-th; ``place`` says where it did (file name, line)."""

    def __init__(self, at: int, where: tuple[str, ...] = CORE) -> None:
        self.at = at
        self.where = where
        self.lines = 0
        self.fired = False
        self.place = ("", 0)
        self._last: dict[FrameType, int] = {}

    def _local(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "line" and not self._with_exit(frame):
            self.lines += 1
            if self.lines == self.at:
                self.fired = True
                self.place = (Path(frame.f_code.co_filename).name, frame.f_lineno)
                raise KeyboardInterrupt(f"injected at line event {self.at}")
        return self._local

    def _with_exit(self, frame: FrameType) -> bool:
        line = frame.f_lineno
        back = line <= self._last.get(frame, 0)
        self._last[frame] = line
        return back and linecache.getline(frame.f_code.co_filename, line).lstrip().startswith(
            "with "
        )

    def _global(self, frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code.co_filename.startswith(self.where):
            return self._local
        return None

    @contextmanager
    def active(self) -> Iterator[None]:
        """Trace this thread inside the block."""
        sys.settrace(self._global)
        try:
            yield
        finally:
            sys.settrace(None)


_CALLS = frozenset(dis.opmap[name] for name in ("CALL", "CALL_FUNCTION_EX"))
_BACK_EDGES = frozenset(
    code
    for name, code in dis.opmap.items()
    if name.startswith(("JUMP_BACKWARD", "POP_JUMP_BACKWARD"))
    and name != "JUMP_BACKWARD_NO_INTERRUPT"
)
_RESUME = dis.opmap["RESUME"]


class AtSignalPoints(Injection):
    """Counts the signal points (see the module doc) of code in ``where`` and of Python
    functions it calls; raises KeyboardInterrupt at the ``at``-th, before the instruction
    that follows it (``place``: file name, line)."""

    def __init__(
        self, at: int, where: tuple[str, ...] = CORE, *, foreign_entries: bool = True
    ) -> None:
        super().__init__(at, where)
        self.foreign_entries = foreign_entries  # count the entry of a function ours call
        self._before: dict[FrameType, int] = {}  # frame -> its last instruction's opcode
        self._inline: set[FrameType] = set()  # frames in a CALL of a Python function

    def _point(self, frame: FrameType) -> None:
        self.lines += 1
        if self.lines == self.at:
            self.fired = True
            self.place = (Path(frame.f_code.co_filename).name, frame.f_lineno)
            # Keep no frame alive past the interrupt: what they hold (a lease whose exit
            # never ran) must be dropped as it would be without the injector.
            self._before.clear()
            self._last.clear()
            self._inline.clear()
            raise KeyboardInterrupt(f"injected at signal point {self.at}")

    def _local(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "opcode":
            code = frame.f_code.co_code
            before = self._before.get(frame)
            if before in _CALLS:
                if frame in self._inline:  # a Python function's return: no check there
                    self._inline.discard(frame)
                else:
                    self._point(frame)
            elif before in _BACK_EDGES and frame.f_lasti < self._last[frame]:
                self._point(frame)
            self._before[frame] = code[frame.f_lasti]
            self._last[frame] = frame.f_lasti
        elif event in ("exception", "return"):  # unwound or left: no check on the way
            self._before.pop(frame, None)
            self._inline.discard(frame)
        return self._local

    def _global(self, frame: FrameType, event: str, arg: object) -> Any:
        ours = frame.f_code.co_filename.startswith(self.where)
        caller = frame.f_back
        called = caller is not None and caller.f_code.co_filename.startswith(self.where)
        # Not a finalizer's entry: CPython reports and drops what is raised in __del__, but
        # one raised there from a trace function breaks the interpreter's state instead.
        entry = _checks_on_entry(frame) and frame.f_code.co_name != "__del__"
        if called and entry and not _is_entry(frame):
            self._inline.add(caller)  # called by the interpreter loop itself, not through C
        if (ours or (called and self.foreign_entries)) and entry:
            self._point(frame)  # the function raises on entry: its call does nothing
        if not ours:
            return None
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        self._before.pop(frame, None)
        return self._local


def _checks_on_entry(frame: FrameType) -> bool:
    """Whether CPython checks for signals as ``frame`` starts or resumes: at its RESUME on a
    call, and on resuming after a plain ``yield`` (RESUME with an argument below 2), not after
    ``await`` or ``yield from``, nor where an exception is thrown in at a ``yield``."""
    code, at = frame.f_code.co_code, frame.f_lasti
    return code[at] == _RESUME and code[at + 1] < 2


_POINTER = ctypes.sizeof(ctypes.c_void_p)
_F_FRAME = 3 * _POINTER  # PyFrameObject: refcount, type, f_back, f_frame
_F_CODE = 4 * _POINTER  # _PyInterpreterFrame: f_func, f_globals, f_builtins, f_locals, f_code
_IS_ENTRY = 8 * _POINTER + ctypes.sizeof(ctypes.c_int)  # ..., prev_instr, stacktop, is_entry


def _is_entry(frame: FrameType) -> bool:
    """Whether ``frame`` was started by C code (a type's ``__init__``, a key function, a
    generator resumed by ``next``), not by a CALL the interpreter loop runs inline: only then
    does the CALL check for signals once it returns (CPython 3.11's ``is_entry``)."""
    inner = ctypes.c_void_p.from_address(id(frame) + _F_FRAME).value
    assert inner is not None
    code = ctypes.c_void_p.from_address(inner + _F_CODE).value
    assert code == id(frame.f_code), "not CPython 3.11's frame layout"
    return bool(ctypes.c_bool.from_address(inner + _IS_ENTRY).value)


def every_line(
    run: Callable[[Injection], None], where: tuple[str, ...] = CORE, limit: int = 100_000
) -> int:
    """Call ``run`` with an injection at line event 1, 2, ... until one runs to its end with
    none fired; return how many were injected (fails past ``limit``)."""
    return _every(Injection, run, where, limit)


def every_signal_point(
    run: Callable[[Injection], None], where: tuple[str, ...] = CORE, limit: int = 200_000
) -> int:
    """Call ``run`` with an injection at signal point 1, 2, ... until one runs to its end
    with none fired; return how many were injected (fails past ``limit``)."""
    return _every(AtSignalPoints, run, where, limit)


def _every(
    kind: Callable[[int, tuple[str, ...]], Injection],
    run: Callable[[Injection], None],
    where: tuple[str, ...],
    limit: int,
) -> int:
    for at in range(1, limit):
        injection = kind(at, where)
        run(injection)
        if not injection.fired:
            return at - 1
    raise AssertionError(f"still injecting after {limit} events")
