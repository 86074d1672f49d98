"""A job for ``hwpool run`` in the tests: says what it sees, waits for files, exits as told.

``job.py DIR NAME [wait=FILE]... [exit=N] [kill] [sleep] [grandchild] [stubborn]``: writes
DIR/NAME.started (JSON: its environment's GPU variables and JAX's memory knobs, its pid and
process group, and which files of DIR existed then), waits for each ``wait=`` file (30 s at
most), writes DIR/NAME.done, then exits N (``kill``: SIGKILLs itself; ``sleep``: sleeps 60 s
first; ``grandchild``: leaves a child in its process group that writes DIR/NAME.grandchild and
sleeps 60 s; ``stubborn``: that grandchild ignores SIGTERM; ``stopped``: it handles SIGTERM and
stops itself, SIGSTOP, before the job exits; ``trap``: on SIGTERM it writes DIR/NAME.term and
goes on, as a job that saves its work in its grace does).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BOUND = 30.0


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + BOUND
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"job: {path} never appeared")
        time.sleep(0.01)


def write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.rename(path)  # whole, or not at all


def main() -> None:
    directory, name, *words = sys.argv[1:]
    root = Path(directory)
    seen = {
        "pid": os.getpid(), "pgid": os.getpgrp(), "files": sorted(os.listdir(root)),
        **{k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
                                          "HWPOOL_LEASE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                                          "XLA_PYTHON_CLIENT_PREALLOCATE")},
    }  # fmt: skip
    if "trap" in words:
        signal.signal(signal.SIGTERM, lambda *_: write(root / f"{name}.term", ""))
    write(root / f"{name}.started", json.dumps(seen))
    if "grandchild" in words:
        ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN); " if "stubborn" in words else ""
        stop = ""
        if "stopped" in words:  # a SIGTERM handler runs only once the process is continued
            stop = "signal.signal(signal.SIGTERM, lambda *_: os._exit(0)); "
            stop += "os.kill(os.getpid(), signal.SIGSTOP); "
        target = str(root / f"{name}.grandchild")
        code = (  # written whole, or not at all, as write() does: the pid is never read half
            f"import os, signal, time; {ignore}"
            f"open({target + '.tmp'!r}, 'w').write(str(os.getpid())); "
            f"os.rename({target + '.tmp'!r}, {target!r}); {stop}time.sleep(60)"
        )
        grandchild = subprocess.Popen([sys.executable, "-c", code])
        wait_for(root / f"{name}.grandchild")
        if stop:
            stat = Path(f"/proc/{grandchild.pid}/stat")
            deadline = time.monotonic() + BOUND
            while stat.read_text().rsplit(")", 1)[1].split()[0] != "T":
                if time.monotonic() > deadline:
                    sys.exit("job: the grandchild never stopped")
                time.sleep(0.01)
    for word in words:
        if word.startswith("wait="):
            wait_for(root / word.removeprefix("wait="))
    write(root / f"{name}.done", "")
    if "sleep" in words:
        time.sleep(60)
    if "kill" in words:
        os.kill(os.getpid(), signal.SIGKILL)
    codes = [int(w.removeprefix("exit=")) for w in words if w.startswith("exit=")]
    sys.exit(codes[0] if codes else 0)


if __name__ == "__main__":
    main()
