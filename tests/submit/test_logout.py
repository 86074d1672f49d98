"""Whether ``hwpool submit`` warns that logging out would end the jobs (systemd-logind's
``KillUserProcesses``), read from a file tree laid out as ``/etc`` and ``/var`` are."""

from __future__ import annotations

from pathlib import Path

import pytest

from hwpool._jobs._start import logout_warning


def _tree(root: Path, conf: str | None = None, dropin: str | None = None) -> Path:
    etc = root / "etc" / "systemd"
    (etc / "logind.conf.d").mkdir(parents=True)
    if conf is not None:
        (etc / "logind.conf").write_text(conf)
    if dropin is not None:
        (etc / "logind.conf.d" / "50-kill.conf").write_text(dropin)
    return root


@pytest.mark.parametrize(
    ("conf", "dropin", "warns"),
    [
        (None, None, False),  # systemd's default: processes stay
        ("[Login]\n#KillUserProcesses=yes\n", None, False),  # a comment
        ("[Login]\nKillUserProcesses=yes\n", None, True),
        ("[Login]\nKillUserProcesses = yes\n", None, True),
        ("[Login]\nKillUserProcesses=yes\n", "[Login]\nKillUserProcesses=no\n", False),
        ("[Login]\nKillUserProcesses=no\n", "[Login]\nKillUserProcesses=yes\n", True),
    ],
)
def test_it_warns_only_when_logind_kills_user_processes(
    tmp_path: Path, conf: str | None, dropin: str | None, warns: bool
) -> None:
    warning = logout_warning("ada", _tree(tmp_path, conf, dropin))
    assert (warning is not None) is warns
    if warns:
        assert warning is not None and "loginctl enable-linger" in warning


def test_a_lingering_user_is_not_warned(tmp_path: Path) -> None:
    root = _tree(tmp_path, "[Login]\nKillUserProcesses=yes\n")
    (root / "var" / "lib" / "systemd" / "linger").mkdir(parents=True)
    (root / "var" / "lib" / "systemd" / "linger" / "ada").touch()
    assert logout_warning("ada", root) is None
    assert logout_warning("bob", root) is not None
