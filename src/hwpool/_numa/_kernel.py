"""The few Linux calls NUMA placement needs, behind a small interface that tests replace.

``LinuxKernel`` calls libc through ctypes (no compiled code): ``mincore(2)``, a query-only
``move_pages(2)`` (``nodes = NULL``) through ``syscall(2)``, and ``madvise(2)``; the rest comes
from :mod:`os` (``sched_setaffinity``, ``posix_fadvise``) and procfs (pages are touched by
reading ``/proc/self/mem``, which reports a bad page as EIO where a load would die of SIGBUS).
Anything that is missing on this platform raises ``OSError`` (``ENOSYS``), which the callers
treat as "unknown".
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import platform
import sys
from collections.abc import Iterable, Sequence
from typing import Protocol

__all__ = ["MOVE_PAGES_SYSCALL", "Kernel", "LinuxKernel", "buffer_span"]

# move_pages(2) has no glibc wrapper; its number per architecture (asm-generic where absent).
MOVE_PAGES_SYSCALL = {"x86_64": 279, "aarch64": 239, "riscv64": 239, "ppc64le": 301, "s390x": 310}
MADV_DONTNEED = 4
# The pages handed to one move_pages call: bounded so the status array stays small.
MOVE_PAGES_BATCH = 1024


class Kernel(Protocol):
    """What the NUMA code asks of the operating system; see :class:`LinuxKernel`."""

    page_size: int

    def resident(self, addr: int, length: int) -> bytes:
        """One byte per page of ``[addr, addr + length)``, bit 0 set where the page is resident."""
        ...

    def touch(self, addrs: Sequence[int]) -> list[int]:
        """Map each address's page into this process by reading it, never with a signal.

        Returns the addresses that could be read; a page that cannot (past the end of a file
        truncated after it was mapped, where a plain load would raise SIGBUS) is left out.
        """
        ...

    def page_nodes(self, addrs: Sequence[int]) -> list[int]:
        """The node of each page, or a negative errno; PermissionError where refused."""
        ...

    def read_proc(self, name: str) -> str | None:
        """The text of ``/proc/self/<name>``, or None when it is missing or unreadable."""
        ...

    def set_affinity(self, cpus: Iterable[int]) -> None:
        """Restrict the calling thread to ``cpus``."""
        ...

    def drop_cached(self, fd: int, offset: int, length: int) -> None:
        """Ask the page cache to drop a file range (``POSIX_FADV_DONTNEED``)."""
        ...

    def unmap_pages(self, addr: int, length: int) -> None:
        """Drop this process's page-table entries of a range (``MADV_DONTNEED``)."""
        ...

    def read_range(self, fd: int, offset: int, length: int) -> None:
        """Read a file range into the page cache from the calling thread, readahead off."""
        ...


class _PyBuffer(ctypes.Structure):
    _fields_ = (
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.py_object),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    )


# PyBUF_ANY_CONTIGUOUS (0x80 | PyBUF_STRIDES): C or Fortran order. Without PyBUF_STRIDES (0x10)
# an exporter may only hand out C-contiguous memory, which rejects ``W.T`` of a C matrix.
_PyBUF_ANY_CONTIGUOUS = 0x0080 | 0x0010 | 0x0008


def buffer_span(buffer: object, name: str = "buffer") -> tuple[int, int]:
    """The start address and byte length of a contiguous buffer-protocol object.

    Works for read-only buffers too (numpy memmaps opened ``r``, ``mmap.ACCESS_READ``, bytes).
    Raises TypeError naming ``name`` for a non-buffer, ValueError for a non-contiguous one.
    """
    try:
        view = memoryview(buffer)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{name} must support the buffer protocol, got {type(buffer).__name__}"
        ) from None
    with view:
        if not view.contiguous:
            raise ValueError(f"{name} must be a contiguous buffer, got a strided {view!r}")
        if view.nbytes == 0:
            return 0, 0
        return _address_of(view), view.nbytes


def _address_of(view: memoryview) -> int:
    """The address of a contiguous view's first byte, through PyObject_GetBuffer."""
    api = ctypes.pythonapi
    info = _PyBuffer()
    api.PyObject_GetBuffer(ctypes.py_object(view), ctypes.byref(info), _PyBUF_ANY_CONTIGUOUS)
    try:
        return int(info.buf or 0)
    finally:
        api.PyBuffer_Release(ctypes.byref(info))


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    libc.syscall.restype = ctypes.c_long
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc


def _readable(fd: int, addr: int) -> bool:
    try:
        return len(os.pread(fd, 1, addr)) == 1
    except OSError:
        return False


def _raise_errno(what: str) -> None:
    code = ctypes.get_errno()
    raise OSError(code, f"{what}: {os.strerror(code)}")


class LinuxKernel:
    """The real kernel, through libc; every method raises OSError where unavailable."""

    def __init__(self) -> None:
        self.page_size = mmap.PAGESIZE
        self._libc = _load_libc()
        self._move_pages = MOVE_PAGES_SYSCALL.get(platform.machine())

    def _need_libc(self) -> ctypes.CDLL:
        if self._libc is None:
            raise OSError(errno.ENOSYS, "libc is not available on this platform")
        return self._libc

    def resident(self, addr: int, length: int) -> bytes:
        libc = self._need_libc()
        start = addr - addr % self.page_size
        count = -(-(addr + length - start) // self.page_size)
        vec = ctypes.create_string_buffer(count)
        if libc.mincore(start, addr + length - start, vec) != 0:
            _raise_errno("mincore")
        return vec.raw

    def touch(self, addrs: Sequence[int]) -> list[int]:
        # Read through /proc/self/mem, not with a load: the kernel faults the page in for this
        # process as a load would, but a fault that would be SIGBUS (a page past the end of a
        # truncated file, which mincore may still call resident) comes back as EIO. Opened per
        # call: an fd kept across fork(2) would read the parent's memory.
        try:
            fd = os.open("/proc/self/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return list(addrs)  # nothing touched: pages not mapped here just stay unknown
        try:
            return [addr for addr in addrs if _readable(fd, addr)]
        finally:
            os.close(fd)

    def page_nodes(self, addrs: Sequence[int]) -> list[int]:
        libc = self._need_libc()
        if self._move_pages is None:
            raise OSError(errno.ENOSYS, f"move_pages: unknown on {platform.machine()}")
        out: list[int] = []
        for first in range(0, len(addrs), MOVE_PAGES_BATCH):
            batch = addrs[first : first + MOVE_PAGES_BATCH]
            pages = (ctypes.c_void_p * len(batch))(*batch)
            status = (ctypes.c_int * len(batch))()
            rc = libc.syscall(
                ctypes.c_long(self._move_pages), ctypes.c_int(0), ctypes.c_ulong(len(batch)),
                pages, None, status, ctypes.c_int(0),
            )  # fmt: skip
            if rc < 0:
                _raise_errno("move_pages")
            out.extend(status)
        return out

    def read_proc(self, name: str) -> str | None:
        try:
            with open(f"/proc/self/{name}", encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return None

    def set_affinity(self, cpus: Iterable[int]) -> None:
        if not hasattr(os, "sched_setaffinity"):
            raise OSError(errno.ENOSYS, "sched_setaffinity is not available on this platform")
        os.sched_setaffinity(0, set(cpus))

    def drop_cached(self, fd: int, offset: int, length: int) -> None:
        if not hasattr(os, "posix_fadvise"):
            raise OSError(errno.ENOSYS, "posix_fadvise is not available on this platform")
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)

    def unmap_pages(self, addr: int, length: int) -> None:
        if self._need_libc().madvise(addr, length, MADV_DONTNEED) != 0:
            _raise_errno("madvise")

    def read_range(self, fd: int, offset: int, length: int) -> None:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        chunk = 1 << 20
        end = offset + length
        while offset < end:
            got = os.pread(fd, min(chunk, end - offset), offset)
            if not got:
                break
            offset += len(got)
