"""Impersonation and tampering through paths (issue 22, items 8-10), with real users.

Another user may make the per-user directory in /tmp first and serve a fake server there,
listen on a socket in a directory a client trusts, write a machine-wide server's directory,
or plant a link, a FIFO or a file of their own where a side file will be opened. A client
must refuse an untrusted server before it sends anything (tests/server/impostor.py prints
whatever reaches it); the server must refuse untrusted directories and side files.
"""

from __future__ import annotations

import os
import select
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hostserver import BOUND, ENV, Server, run_cli
from hwpool._backends._unix import UnixBackend
from users import User, Users, readable

StartServer = Callable[..., Server]
IMPOSTOR = str(Path(__file__).parent / "impostor.py")
SECRET = "token=s3cret-in-argv"


def first_line(proc: subprocess.Popen[str]) -> str:
    """The next line ``proc`` prints (bounded)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], BOUND)
    assert ready, "the process printed nothing"
    return proc.stdout.readline().rstrip("\n")


@pytest.fixture
def impostor(users: Users) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """``impostor(user, *args)``: tests/server/impostor.py run as ``user``, listening."""
    procs: list[subprocess.Popen[str]] = []

    def start(user: User, *args: str, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            users.command(user, [str(readable(Path(IMPOSTOR))), *args]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=users.env(),
            pass_fds=pass_fds,
        )  # fmt: skip
        procs.append(proc)
        assert first_line(proc) == "listening", proc.stderr
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.communicate(timeout=BOUND)


def heard(proc: subprocess.Popen[str]) -> str:
    """Everything the impostor printed after ``listening`` (it is stopped first)."""
    proc.kill()
    out, _ = proc.communicate(timeout=BOUND)
    return out


# ----------------------------------------------------------------- item 8: clients verify
def test_a_run_refuses_a_per_user_directory_another_user_made_first(
    users: Users, impostor: Callable[..., subprocess.Popen[str]]
) -> None:
    victim, mallory = users.user(), users.user()
    directory = Path(f"/tmp/hwpool-{victim.uid}")  # the default without XDG_RUNTIME_DIR
    shutil.rmtree(directory, ignore_errors=True)
    try:
        fake = impostor(mallory, str(directory / "hwpool.sock"))
        env = users.env(HWPOOL_SYSTEM_SOCKET="")  # no XDG_RUNTIME_DIR, no HWPOOL_SOCKET
        argv = [users.python(victim), "-m", "hwpool", "run", "--", "/bin/echo", SECRET]
        run = subprocess.run(
            users.argv(victim, argv), capture_output=True, text=True, env=env, timeout=BOUND,
            check=False,
        )  # fmt: skip
        told = heard(fake)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert told == "", f"the impostor heard: {told}"  # not even a hello
    assert run.returncode == 125, run.stderr
    assert "refusing the hwpool server on" in run.stderr and "nothing was sent" in run.stderr
    assert f"belongs to uid {mallory.uid} ({mallory.name})" in run.stderr
    assert "anyone can create entries" in run.stderr
    assert SECRET not in run.stdout


def test_a_client_refuses_a_server_run_by_another_user(
    users: Users, impostor: Callable[..., subprocess.Popen[str]], sockdir: Path
) -> None:
    # The directory is root's and safe; only the process listening belongs to someone else.
    mallory = users.user()
    os.chmod(sockdir, 0o755)
    path = sockdir / "s.sock"
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(str(path))
    os.chmod(path, 0o777)
    try:
        fake = impostor(mallory, "--fd", str(bound.fileno()), pass_fds=(bound.fileno(),))
    finally:
        bound.close()
    with pytest.raises(ConnectionError) as caught:
        UnixBackend(path, reconnect_timeout=0, command=SECRET)
    code, _, err = run_cli("status", "--socket", str(path))
    assert heard(fake) == ""
    assert f"runs as uid {mallory.uid} ({mallory.name})" in str(caught.value)
    assert "impersonating" in str(caught.value) and "nothing was sent" in str(caught.value)
    assert code == 1 and f"runs as uid {mallory.uid}" in err


def test_a_client_refuses_a_socket_in_a_directory_others_may_write(
    start_server: StartServer, sockdir: Path
) -> None:
    server = start_server("--gpus", "1")
    os.chmod(sockdir, 0o777)  # anyone could now replace the socket
    code, _, err = run_cli("status", "--socket", str(server.socket))
    assert code == 1 and "is writable by everyone" in err and "chmod go-w" in err
    os.chmod(sockdir, 0o700)
    assert run_cli("status", "--socket", str(server.socket))[0] == 0


# ----------------------------------------------------------------- item 9: the machine-wide server
TAMPER = """
import os, sys
socket = sys.argv[1]
for attempt in (lambda: os.rename(socket, socket + ".moved"),
                lambda: open(socket + ".journal.tmp", "x").close()):
    try:
        attempt()
        print("done")
    except PermissionError:
        print("refused")
"""


def test_group_members_may_connect_but_not_write_the_directory(
    users: Users, start_server: StartServer, sockdir: Path
) -> None:
    gid = users.group()
    member = users.user(groups=[gid])
    os.chmod(sockdir, 0o755)
    path = sockdir / "shared" / "s.sock"
    start_server("--gpus", "1", "--group", str(gid), socket=path)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o750
    assert stat.S_IMODE(path.stat().st_mode) == 0o660
    python = users.python(member)
    status = subprocess.run(
        users.argv(member, [python, "-m", "hwpool", "status", "--socket", str(path)]),
        capture_output=True, text=True, env=users.env(), timeout=BOUND, check=False,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    tamper = subprocess.run(
        users.argv(member, [python, "-c", TAMPER, str(path)]),
        capture_output=True, text=True, env=users.env(), timeout=BOUND, check=False,
    )  # fmt: skip
    assert tamper.stdout.split() == ["refused", "refused"], tamper.stderr
    assert path.exists()


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hwpool", "serve", *args],
        capture_output=True, text=True, env=ENV, timeout=BOUND, check=False,
    )  # fmt: skip


def plant(kind: str, path: Path, precious: Path, request: pytest.FixtureRequest) -> None:
    """Put something untrustworthy at ``path``."""
    if kind == "symlink":
        path.symlink_to(precious)
    elif kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "hard link":
        os.link(precious, path)
    elif kind == "group-writable":
        path.write_text("")
        os.chmod(path, 0o660)
    else:
        user: User = request.getfixturevalue("users").user()
        path.write_text("")
        os.chown(path, user.uid, user.gid)


PLANTED = {
    "symlink": "is a symbolic link",
    "fifo": "is not a regular file",
    "hard link": "has 2 hard links",
    "group-writable": "is writable by others (mode 0660)",
    "another user's": "belongs to uid",
}


@pytest.mark.parametrize("kind", list(PLANTED))
def test_the_server_refuses_an_untrusted_lock_file(
    kind: str, sockdir: Path, request: pytest.FixtureRequest
) -> None:
    precious = sockdir / "precious"
    precious.write_text("keep me")
    plant(kind, sockdir / "s.sock.lock", precious, request)
    proc = serve("--socket", str(sockdir / "s.sock"), "--gpus", "1")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"hwpool: error: the lock file '{sockdir}/s.sock.lock' ")
    assert PLANTED[kind] in proc.stderr and "refusing to use it" in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    assert precious.read_text() == "keep me"
    assert not (sockdir / "s.sock").exists()


def test_an_idle_server_does_not_follow_a_planted_start_lock(sockdir: Path) -> None:
    precious = sockdir / "precious"
    precious.write_text("keep me")
    (sockdir / "s.sock.start").symlink_to(precious)
    server = Server(sockdir / "s.sock", "--gpus", "1", "--idle-timeout", "0.1")
    try:
        server.ready()
        line = server.wait_for("not stopping when idle")
        assert "start lock" in line and "is a symbolic link" in line
        assert server.proc.poll() is None
        assert precious.read_text() == "keep me"
    finally:
        server.kill()


# ----------------------------------------------------------------- item 10: shared directories
def test_a_socket_directly_in_a_sticky_shared_directory_is_refused(sockdir: Path) -> None:
    os.chmod(sockdir, 0o1777)  # like /tmp
    proc = serve("--socket", str(sockdir / "gpu.sock"), "--gpus", "1")
    assert proc.returncode == 2
    assert "is a shared directory (writable by everyone, sticky)" in proc.stderr
    assert f"such as '{sockdir}/hwpool'" in proc.stderr
    assert os.listdir(sockdir) == []


def test_a_directory_writable_by_its_group_is_refused(sockdir: Path) -> None:
    os.chmod(sockdir, 0o770)
    proc = serve("--socket", str(sockdir / "gpu.sock"), "--gpus", "1")
    assert proc.returncode == 2 and "is writable by its group" in proc.stderr
    assert os.listdir(sockdir) == []
