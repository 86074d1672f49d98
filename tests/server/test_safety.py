"""The path rules of ``hwpool._wire._safety`` on their own: directories, side files, peers.

The end-to-end cases (real servers, real users) are in test_paths.py; these pin down each
rule and its message, fast and without other users.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from hwpool._wire._safety import (
    UnsafePathError,
    UntrustedServerError,
    check_directory,
    create_side_file,
    open_side_file,
    peer_of,
    server_uids,
    verify_peer,
)

ME = os.geteuid()


def test_a_private_directory_passes(sockdir: Path) -> None:
    assert check_directory(sockdir, {ME, 0}).st_uid == ME


@pytest.mark.parametrize(
    ("mode", "fragment"),
    [
        (0o777, "is writable by everyone"),
        (0o770, "is writable by its group"),
        (0o1777, "is a shared directory (writable by everyone, sticky)"),
    ],
)
def test_a_directory_others_may_write_is_refused(sockdir: Path, mode: int, fragment: str) -> None:
    os.chmod(sockdir, mode)
    with pytest.raises(UnsafePathError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        check_directory(sockdir, {ME, 0})


def test_a_symbolic_link_as_the_directory_is_refused(sockdir: Path) -> None:
    (sockdir / "real").mkdir(mode=0o700)
    (sockdir / "link").symlink_to(sockdir / "real")
    with pytest.raises(UnsafePathError, match="is a symbolic link"):
        check_directory(sockdir / "link", {ME, 0})


def test_a_writable_directory_above_is_refused(sockdir: Path) -> None:
    (sockdir / "below").mkdir(mode=0o700)
    os.chmod(sockdir, 0o777)
    with pytest.raises(UnsafePathError, match="writable by others without the sticky bit"):
        check_directory(sockdir / "below", {ME, 0})


def test_open_side_file_creates_a_private_regular_file(sockdir: Path) -> None:
    path = sockdir / "side"
    fd = open_side_file(path, os.O_RDWR | os.O_CREAT)
    try:
        assert os.fstat(fd).st_mode & 0o777 == 0o600
        assert not os.get_inheritable(fd)
        os.write(fd, b"x")
    finally:
        os.close(fd)
    fd = open_side_file(path, os.O_RDWR | os.O_TRUNC)  # the same file, now truncated
    try:
        assert os.fstat(fd).st_size == 0
    finally:
        os.close(fd)


@pytest.mark.parametrize("flags", [os.O_RDONLY, os.O_WRONLY, os.O_RDWR])
def test_a_fifo_never_blocks_the_opener(sockdir: Path, flags: int) -> None:
    path = sockdir / "side"
    os.mkfifo(path, 0o600)
    with pytest.raises(UnsafePathError, match="is not a regular file"):
        open_side_file(path, flags)  # a test timeout, not an error, if it blocked


def test_a_truncating_open_checks_before_it_truncates(sockdir: Path) -> None:
    precious = sockdir / "precious"
    precious.write_text("keep me")
    os.link(precious, sockdir / "side")
    with pytest.raises(UnsafePathError, match="has 2 hard links"):
        open_side_file(sockdir / "side", os.O_WRONLY | os.O_TRUNC)
    assert precious.read_text() == "keep me"


def test_a_missing_side_file_without_create_is_file_not_found(sockdir: Path) -> None:
    with pytest.raises(FileNotFoundError):
        open_side_file(sockdir / "missing", os.O_RDONLY)


def test_create_side_file_replaces_a_planted_link_not_its_target(sockdir: Path) -> None:
    precious = sockdir / "precious"
    precious.write_text("keep me")
    temporary = sockdir / "journal.tmp"
    temporary.symlink_to(precious)
    fd = create_side_file(temporary, os.O_WRONLY)
    try:
        os.write(fd, b"new")
    finally:
        os.close(fd)
    assert precious.read_text() == "keep me"
    assert not temporary.is_symlink() and temporary.read_text() == "new"


def test_a_side_file_of_another_owner_is_refused(sockdir: Path) -> None:
    path = sockdir / "side"
    path.write_text("")
    with pytest.raises(UnsafePathError, match=f"not to the server's uid {ME + 1}"):
        open_side_file(path, os.O_RDONLY, owner=ME + 1)


def test_the_peer_of_a_socket_pair_is_this_process() -> None:
    left, right = socket.socketpair()
    with left, right:
        peer = peer_of(left)
        assert (peer.pid, peer.uid, peer.gid) == (os.getpid(), ME, os.getegid())
        assert verify_peer(left, Path("/x.sock"), {ME}) == peer
        with pytest.raises(UntrustedServerError, match="impersonating"):
            verify_peer(left, Path("/x.sock"), {ME + 1})


def test_server_uids_refuses_what_is_not_a_socket(sockdir: Path) -> None:
    (sockdir / "s.sock").write_text("")
    with pytest.raises(UntrustedServerError, match="is not a socket"):
        server_uids(sockdir / "s.sock")
    (sockdir / "t.sock").symlink_to(sockdir / "s.sock")
    with pytest.raises(UntrustedServerError, match="is a symbolic link"):
        server_uids(sockdir / "t.sock")
    with pytest.raises(FileNotFoundError):
        server_uids(sockdir / "missing" / "s.sock")
