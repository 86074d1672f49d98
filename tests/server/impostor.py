"""A fake hwpool server that another user runs, to show what a client would send it.

``python impostor.py SOCKET`` makes SOCKET's directory (0755) if missing, binds SOCKET (0777)
and listens; ``python impostor.py --fd N`` listens on the bound socket it inherits as fd N.
It prints ``listening``, then ``got LINE`` for every line any client sends, answering a hello
with a welcome as the real server would; it runs until it is killed.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._host._detect import GPUInfo
from hwpool._wire._protocol import PROTOCOL_VERSION, Welcome, encode


def listener(args: list[str]) -> socket.socket:
    if args[0] == "--fd":
        sock = socket.socket(fileno=int(args[1]))
    else:
        path = Path(args[0])
        path.parent.mkdir(mode=0o755, exist_ok=True)
        os.chmod(path.parent, 0o755)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        os.chmod(path, 0o777)
    sock.listen(8)
    return sock


def serve(sock: socket.socket) -> None:
    welcome = encode(
        Welcome(PROTOCOL_VERSION, "hwpool fake", os.getpid(), os.getuid(), UNITS_PER_GPU,
                (GPUInfo(0, "0"),), False)
    )  # fmt: skip
    while True:
        conn, _ = sock.accept()
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                print("got", line.decode(errors="replace").rstrip("\n"), flush=True)
                if b'"hello"' in line:
                    conn.sendall(welcome)


if __name__ == "__main__":
    server = listener(sys.argv[1:])
    print("listening", flush=True)
    serve(server)
