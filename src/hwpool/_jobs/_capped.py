"""A job's output copied into its logs, up to a cap, with a marker where output was dropped.

The launcher gives the job a pipe for its stdout and one for its stderr, never the log files
themselves: one thread copies what arrives into each log (opened for appending by the
launcher, never truncated) until the log holds ``cap`` bytes, counting what it held already.
At the cap it writes one marker line and drops the rest, reading on, so that the job never
blocks on a full pipe; when the job has ended, a last line says how many bytes were dropped.
A write the disk refuses (ENOSPC: the disk is full; EDQUOT, EFBIG, EIO) drops that output too:
the next write that goes through is preceded by a marker saying how much was lost there and
why. A log may so exceed its cap by its markers only (a few hundred bytes).

The copy ends at the end of both pipes (every process that held them is gone), or, once the
job has ended (:meth:`LogCopy.finish`), after ``linger_s``: a process that left the job's
process group and kept its output open then writes into a closed pipe (EPIPE, SIGPIPE).
"""

from __future__ import annotations

import os
import selectors
import threading
from dataclasses import dataclass

__all__ = ["DEFAULT_LOG_CAP", "LogCopy"]

DEFAULT_LOG_CAP = 1 << 30  # bytes per log (stdout and stderr each): 1 GiB
CHUNK = 1 << 16


@dataclass
class _Sink:
    """One log: where it goes, how full it is, and what was dropped (and why)."""

    log: int
    what: str  # "stdout", "stderr"
    held: int
    dropped: int = 0  # bytes dropped in all
    pending: int = 0  # dropped since the last marker, for a reason to say
    why: str = ""
    capped: bool = False  # the cap's marker is written (or was tried)

    def put(self, data: bytes, cap: int, cap_text: str) -> None:
        """Write ``data`` as far as the cap allows; note what is dropped."""
        room = max(cap - self.held, 0)
        kept, rest = data[:room], data[room:]
        if kept and self._write(kept):
            self.held += len(kept)
        if rest:
            if not self.capped:  # the cap, reached now
                self.capped = True
                self._say(f"this log reached its cap of {cap_text}: the rest of the job's "
                          f"{self.what} is dropped")  # fmt: skip
            self.dropped += len(rest)

    def _write(self, data: bytes) -> bool:
        """Write all of ``data`` after any marker owed; False (counted dropped) if refused."""
        if self.pending and self.why:
            if not self._say(f"{self.pending} bytes of the job's {self.what} were dropped "
                             f"here: {self.why}"):  # fmt: skip
                return self._refused(len(data), self.why)
            self.pending, self.why = 0, ""
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.log, view) :]
            except OSError as exc:
                return self._refused(len(view), f"the disk refused it ({exc.strerror})")
        return True

    def _refused(self, size: int, why: str) -> bool:
        self.dropped += size
        self.pending += size
        self.why = why
        return False

    def _say(self, text: str) -> bool:
        """A marker line of hwpool's in the log (whole, or not at all as far as it can)."""
        line = f"\n[hwpool: {text}]\n".encode()
        try:
            return os.write(self.log, line) == len(line)
        except OSError:
            return False

    def close(self) -> None:
        """The last line: how much was dropped in all, if anything."""
        if self.dropped:
            self._say(f"{self.dropped} bytes of the job's {self.what} were dropped in all")


class LogCopy:
    """Copies a job's stdout and stderr (the pipes' write ends: :attr:`job_fds`) into the
    ``logs`` descriptors, up to ``cap`` bytes each (None: no cap), in a thread."""

    def __init__(self, logs: tuple[int, int], cap: int | None, cap_text: str) -> None:
        self._cap = (1 << 62) if cap is None else cap
        self._cap_text = cap_text
        self._stop = threading.Event()
        self._selector = selectors.DefaultSelector()
        write_ends = []
        for log, what in zip(logs, ("stdout", "stderr"), strict=True):
            read, write = os.pipe()
            write_ends.append(write)
            self._selector.register(read, selectors.EVENT_READ, _Sink(log, what, _size(log)))
        self.job_fds = (write_ends[0], write_ends[1])
        self._thread = threading.Thread(target=self._run, name="hwpool log copy", daemon=True)
        self._thread.start()

    def finish(self, linger_s: float = 5.0) -> None:
        """The job has ended: close this process's write ends, copy what is left (until the
        pipes end, or ``linger_s`` more), then write the last markers."""
        for fd in self.job_fds:
            os.close(fd)
        self._thread.join(linger_s)
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        selector = self._selector
        try:
            while selector.get_map() and not self._stop.is_set():
                for key, _ in selector.select(timeout=0.2):
                    data = os.read(key.fd, CHUNK)
                    if data:
                        key.data.put(data, self._cap, self._cap_text)
                    else:
                        self._close(key)
        finally:
            for key in list(selector.get_map().values()):
                self._close(key)
            selector.close()

    def _close(self, key: selectors.SelectorKey) -> None:
        self._selector.unregister(key.fd)
        os.close(key.fd)
        key.data.close()


def _size(fd: int) -> int:
    return os.fstat(fd).st_size
