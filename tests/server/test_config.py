"""``hwpool serve --config``: the TOML file, checked whole before anything starts (issue 23)."""

from __future__ import annotations

import grp
import os
import pwd
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hostserver import BOUND, ENV, Server, run_cli
from hwpool._core._limits import OwnerLimits
from hwpool._server._config import ConfigError, parse_config, read_config
from rawpeers import Pair

StartServer = Callable[..., Server]

GOOD = """\
# a machine-wide server
half_life = "30m"
gpus = 3
policy = "reserve-all"
grace = 2.5
max_requests_per_user = 100
hello_timeout = "1m"

[shares]
root = 3
"uid:4242" = 0.5
"""


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_good_file_gives_every_setting_checked() -> None:
    settings = parse_config(GOOD, "serve.toml")
    assert settings == {
        "half_life": 1800.0, "gpus": 3, "policy": "reserve-all", "grace": 2.5,
        "max_requests_per_user": 100, "hello_timeout": 60.0,
        "shares": {pwd.getpwnam("root").pw_uid: 3.0, 4242: 0.5},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('gpus = 2\ncolour = "red"\n', "line 2: colour: unknown key"),
        ('gpus = "two"\n', "line 1: gpus: must be an integer >= 1, got 'two'"),
        ("gpus = true\n", "line 1: gpus: must be an integer"),
        ("gpus = 0\n", "line 1: gpus: must be an integer >= 1"),
        ("\nhalf_life = -3\n", "line 2: half_life: must be a number of seconds > 0"),
        ('half_life = "1 fortnight"\n', "line 1: half_life: must be a duration"),
        ('half_life = "0s"\n', "line 1: half_life: must be a duration > 0"),
        ('policy = "fifo"\n', "line 1: policy: must be one of 'easy', 'reserve-all'"),
        ('group = "no-such-group-hwp"\n', "line 1: group: no group named"),
        ("memory = 1\n", "line 1: memory: must be true or false"),
        ('gpu_memory = ["80GiB", "lots"]\n', "line 1: gpu_memory: GPU 1's memory"),
        ("[shares]\nroot = 1\nno-such-user-hwp = 2\n", "line 3: shares.no-such-user-hwp: no user"),
        ('[shares]\n"uid:x" = 2\n', "line 2: shares.uid:x: 'uid:x' is not uid:N"),
        ("[shares]\nroot = 0\n", "line 2: shares.root: must be a finite number > 0"),
        ('[shares]\nroot = "2"\n', "line 2: shares.root: must be a number > 0"),
        ('[shares]\nroot = 1\n"uid:0" = 2\n', "line 3: shares.uid:0: names uid 0 twice"),
        ("shares = 5\n", "line 1: shares: must be a table"),
        ("gpus = [\n", "not valid TOML"),
        ("gpus = 2\ngpus = 3\n", "not valid TOML"),
    ],
)
def test_each_kind_of_bad_file_is_an_error_naming_the_key_and_line(text: str, named: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "serve.toml")
    assert str(info.value).startswith("serve.toml")
    assert named in str(info.value)


def test_a_syntax_error_names_the_line_tomllib_gives() -> None:
    with pytest.raises(ConfigError, match=r"line 3"):
        parse_config("gpus = 2\n\npolicy = \n", "serve.toml")


# ----------------------------------------------------------------- whose file it is
def test_a_file_writable_by_others_is_refused(tmp_path: Path) -> None:
    for mode in (0o666, 0o664):
        path = write(tmp_path / "serve.toml", "gpus = 2\n", mode)
        with pytest.raises(ConfigError, match=rf"writable by others \(mode 0{mode:o}\)"):
            read_config(path, {0, os.geteuid()})


def test_a_file_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file to another user")
    path = write(tmp_path / "serve.toml", "gpus = 2\n")
    os.chown(path, 65534, -1)
    with pytest.raises(ConfigError, match=r"belongs to uid 65534 .*not to uid 0 \(root\)"):
        read_config(path, {0})
    assert read_config(path, {0, 65534}) == {"gpus": 2}  # the server's own user's is fine


def test_a_link_a_fifo_a_directory_and_a_missing_file_are_refused(tmp_path: Path) -> None:
    real = write(tmp_path / "real.toml", "gpus = 2\n")
    (tmp_path / "link.toml").symlink_to(real)
    os.mkfifo(tmp_path / "fifo.toml", 0o600)
    (tmp_path / "dir.toml").mkdir(mode=0o755)
    problems = {"link.toml": "symbolic link", "fifo.toml": "not a regular file",
                "dir.toml": "not a regular file", "none.toml": "does not exist"}  # fmt: skip
    for name, problem in problems.items():
        with pytest.raises(ConfigError, match=problem):
            read_config(tmp_path / name, {0, os.geteuid()})


# ----------------------------------------------------------------- hwpool serve
def test_check_config_prints_the_effective_settings_flags_first(tmp_path: Path) -> None:
    path = write(tmp_path / "serve.toml", GOOD)
    code, out, err = run_cli("serve", "--socket", str(tmp_path / "d" / "s.sock"),
                             "--config", str(path), "--check-config", "--grace", "9")  # fmt: skip
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"# config file: {path}"
    wanted = ["gpus = 3", "grace = 9.0", 'policy = "reserve-all"', "half_life = 1800.0",
              "max_requests_per_user = 100", "max_connections = 64",
              '"uid:4242" = 0.5  # 4242']  # fmt: skip
    assert [line for line in wanted if line not in lines] == []
    assert not (tmp_path / "d").exists()  # nothing started


def test_check_config_of_a_bad_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = write(tmp_path / "serve.toml", "gpus = 2\ncolour = 1\n")
    code, out, err = run_cli("serve", "--config", str(path), "--check-config")
    assert (code, out) == (2, "")
    assert err.startswith(f"hwpool: error: {path}, line 2: colour: unknown key")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("text", ["gpus = 0\n", "[shares]\nno-such-user-hwp = 1\n"])
def test_serve_with_a_bad_file_starts_nothing(tmp_path: Path, text: str) -> None:
    path = write(tmp_path / "serve.toml", text)
    socket = tmp_path / "d" / "s.sock"
    code, _, err = run_cli("serve", "--socket", str(socket), "--config", str(path))
    assert code == 2 and str(path) in err
    assert not (tmp_path / "d").exists()


def test_serve_with_an_unsafe_file_starts_nothing(tmp_path: Path) -> None:
    path = write(tmp_path / "serve.toml", "gpus = 2\n", 0o646)
    code, _, err = run_cli("serve", "--socket", str(tmp_path / "d" / "s.sock"),
                           "--config", str(path))  # fmt: skip
    assert code == 2 and "writable by others" in err
    assert not (tmp_path / "d").exists()


def test_a_real_server_runs_with_the_files_settings(
    start_server: StartServer, tmp_path: Path
) -> None:
    text = 'gpus = 3\npolicy = "reserve-all"\nhalf_life = "2h"\n[shares]\n"uid:4242" = 2\n'
    path = write(tmp_path / "serve.toml", text)
    server = start_server("--config", str(path), "--gpus", "2")  # the flag wins
    server.wait_for("serving 2 GPUs on")
    server.wait_for("policy reserve-all, half-life 7200 s, uid 4242 share 2")


def test_the_default_file_is_read_only_by_the_machine_wide_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path / "serve.toml", "gpus = 5\n")
    machine_wide = tmp_path / "run" / "hwpool.sock"
    monkeypatch.setenv("HWPOOL_CONFIG", str(path))
    monkeypatch.setenv("HWPOOL_SYSTEM_SOCKET", str(machine_wide))
    code, out, _ = run_cli("serve", "--socket", str(machine_wide), "--check-config")
    assert code == 0 and f"# config file: {path}" in out and "gpus = 5" in out
    code, out, _ = run_cli("serve", "--socket", str(tmp_path / "me.sock"), "--check-config")
    assert code == 0 and "# config file: none" in out and "# gpus: not set" in out
    path.unlink()  # a missing default file is no error
    code, out, _ = run_cli("serve", "--socket", str(machine_wide), "--check-config")
    assert code == 0 and "# config file: none" in out


def test_hwpool_config_empty_names_no_file_and_relative_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine_wide = tmp_path / "run" / "hwpool.sock"
    monkeypatch.setenv("HWPOOL_SYSTEM_SOCKET", str(machine_wide))
    monkeypatch.setenv("HWPOOL_CONFIG", "")
    code, out, _ = run_cli("serve", "--socket", str(machine_wide), "--check-config")
    assert code == 0 and "# config file: none" in out
    monkeypatch.setenv("HWPOOL_CONFIG", "etc/serve.toml")
    code, out, err = run_cli("serve", "--socket", str(machine_wide), "--check-config")
    assert code == 2 and out == ""
    assert "HWPOOL_CONFIG must be an absolute path, got 'etc/serve.toml'" in err


# ----------------------------------------------------------------- [limits] (rule 11)
LIMITS = """\
[limits.default]
gpus = 2
running = 4
queued = 20

[limits.users.root]
gpus = 0.5
mode = "refuse"

[limits.users."uid:4242"]
queued = 0
"""


def test_limits_give_the_default_and_each_users_limits() -> None:
    settings = parse_config(LIMITS, "serve.toml")
    assert settings == {
        "default_limits": OwnerLimits(gpus=2.0, running=4, queued=20),
        "limits": {
            pwd.getpwnam("root").pw_uid: OwnerLimits(gpus=0.5, mode="refuse"),
            4242: OwnerLimits(queued=0),
        },
    }
    assert parse_config("[limits.users.root]\nrunning = 1\n", "s") == {
        "default_limits": None, "limits": {0: OwnerLimits(running=1)},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("limits = 3\n", "line 1: limits: must be a table"),
        ("[limits.default]\ngpus = -1\n", "line 2: limits.default.gpus: must be a finite number"),
        ('[limits.default]\ngpus = "2"\n', "line 2: limits.default.gpus: must be a number of GPUs"),
        ("[limits.default]\ngpus = true\n", "line 2: limits.default.gpus: must be a number of"),
        ("[limits.default]\nrunning = 0\n", "line 2: limits.default.running: must be an integer"),
        ("[limits.default]\nrunning = 1.5\n", "line 2: limits.default.running: must be an int"),
        ("[limits.default]\nqueued = -1\n", "line 2: limits.default.queued: must be an integer >="),
        (
            '[limits.default]\nmode = "drop"\n',
            "line 2: limits.default.mode: must be one of 'wait',",
        ),
        ("[limits.default]\ncolour = 1\n", "line 2: limits.default.colour: unknown key (the keys"),
        ('[limits.default]\nmemory = "lots"\n', "line 2: limits.default.memory: memory must be"),
        (
            "[limits.default]\nmemory = 0\n",
            "line 2: limits.default.memory: memory must be between 1 and",
        ),
        ("[limits.default]\nmemory = 1.5\n", "line 2: limits.default.memory: memory must be"),
        (
            "[limits.users.no-such-user-hwp]\ngpus = 1\n",
            "line 1: limits.users.no-such-user-hwp: no",
        ),
        ("[limits.users.root]\n\ngpus = 0\n", "line 3: limits.users.root.gpus: must be a finite"),
        ('[limits.users."uid:0"]\n\nqueued = "x"\n', "line 3: limits.users.uid:0.queued: must"),
        (
            "[limits.groups.no-such-group-hwp]\n",
            "line 1: limits.groups.no-such-group-hwp: no group",
        ),
        ('[limits.groups."gid:x"]\n', "line 1: limits.groups.gid:x: 'gid:x' is not gid:N"),
        ("[limits.groups.root]\nqueued = 1.5\n", "line 2: limits.groups.root.queued: must be"),
        ("[limits]\ngroups = 2\n", "line 2: limits.groups: must be a table of groups"),
        ("[limits.colours]\n", "line 1: limits.colours: unknown table (the tables are: default,"),
        ("[limits]\ndefault = 2\n", "line 2: limits.default: must be a table of limits"),
        ("[limits]\nusers = 2\n", "line 2: limits.users: must be a table of users"),
        (
            '[limits.users.root]\ngpus = 1\n[limits.users."uid:0"]\ngpus = 2\n',
            "limits.users.uid:0: names uid 0 twice",
        ),
    ],
)
def test_each_bad_limit_is_an_error_naming_the_key_and_line(text: str, named: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "serve.toml")
    assert str(info.value).startswith("serve.toml")
    assert named in str(info.value)


def test_check_config_prints_the_limits(tmp_path: Path) -> None:
    path = write(tmp_path / "serve.toml", LIMITS)
    code, out, err = run_cli("serve", "--socket", str(tmp_path / "d" / "s.sock"),
                             "--config", str(path), "--check-config")  # fmt: skip
    assert (code, err) == (0, "")
    text = out[out.index("[limits.default]") :]
    assert text.splitlines() == [
        "[limits.default]", "gpus = 2", "# memory: not set", "running = 4", "queued = 20",
        'mode = "wait"',
        '[limits.users."uid:0"]  # root', "gpus = 0.5", "# memory: not set",
        "# running: not set", "# queued: not set", 'mode = "refuse"',
        '[limits.users."uid:4242"]  # 4242', "# gpus: not set", "# memory: not set",
        "# running: not set", "queued = 0", 'mode = "wait"',
    ]  # fmt: skip


def test_check_config_without_limits_says_so(tmp_path: Path) -> None:
    path = write(tmp_path / "serve.toml", "gpus = 2\n")
    code, out, _ = run_cli("serve", "--socket", str(tmp_path / "d" / "s.sock"),
                           "--config", str(path), "--check-config")  # fmt: skip
    assert code == 0
    assert "# limits.default: not set (users not named have no limits)" in out.splitlines()


def test_a_groups_limits_are_each_members_and_a_users_own_come_first() -> None:
    root = pwd.getpwnam("root").pw_uid  # its primary group is root
    assert parse_config("[limits.groups.root]\ngpus = 1\n", "s")["limits"] == {
        root: OwnerLimits(gpus=1.0)
    }
    text = "[limits.groups.root]\ngpus = 1\n[limits.users.root]\nrunning = 2\n"
    assert parse_config(text, "s")["limits"] == {root: OwnerLimits(running=2)}


def test_a_groups_members_are_those_it_names(pair: Pair) -> None:
    text = f'[limits.groups."gid:{pair.gid}"]\ngpus = 0.5\n[limits.groups.root]\ngpus = 3\n'
    assert parse_config(text, "s")["limits"] == {
        pair.alice: OwnerLimits(gpus=0.5), pair.bob: OwnerLimits(gpus=0.5),
        pwd.getpwnam("root").pw_uid: OwnerLimits(gpus=3.0),
    }  # fmt: skip


def test_a_memory_limit_is_mib_and_needs_a_server_sized_in_memory(tmp_path: Path) -> None:
    text = '[limits.default]\nmemory = "24GiB"\n[limits.users.root]\nmemory = 512\n'
    settings = parse_config(text, "s")
    assert settings["default_limits"] == OwnerLimits(units=24 * 1024)
    assert settings["limits"] == {0: OwnerLimits(units=512)}
    path = write(tmp_path / "serve.toml", text)
    socket = str(tmp_path / "d" / "s.sock")
    code, out, err = run_cli("serve", "--socket", socket, "--config", str(path), "--check-config")
    assert (code, out) == (2, "")
    assert "[limits]: a memory limit needs a server sized in memory (--memory or" in err
    code, out, err = run_cli("serve", "--socket", socket, "--config", str(path),
                             "--gpu-memory", "80GiB", "--check-config")  # fmt: skip
    assert (code, err) == (0, "")
    assert "memory = 24576" in out.splitlines() and "memory = 512" in out.splitlines()


# ----------------------------------------------------------------- [accounts]
ACCOUNTS = """\
[shares]
ml = 3              # an account's share: its members' together
"uid:4242" = 2

[accounts]
ml = ["root", "uid:4243"]
ops = ["uid:4244", "uid:4244"]

[limits.accounts.ml]
gpus = 2
"""


def test_accounts_give_each_accounts_members_and_its_share_and_limits() -> None:
    settings = parse_config(ACCOUNTS, "serve.toml")
    assert settings == {
        "accounts": {"ml": frozenset({0, 4243}), "ops": frozenset({4244})},
        "shares": {"ml": 3.0, 4242: 2.0},
        "default_limits": None,
        "limits": {"ml": OwnerLimits(gpus=2.0)},
    }


def test_an_accounts_group_member_is_each_user_of_the_group(pair: Pair) -> None:
    text = f'[accounts]\nteam = ["@gid:{pair.gid}"]\n'
    assert parse_config(text, "s")["accounts"] == {"team": frozenset({pair.alice, pair.bob})}
    name = grp.getgrgid(pair.gid).gr_name
    text = f'[accounts]\nteam = ["@{name}"]\n[limits.groups."gid:{pair.gid}"]\ngpus = 1\n'
    settings = parse_config(text, "s")
    assert settings["accounts"] == {"team": frozenset({pair.alice, pair.bob})}
    assert settings["limits"] == {}  # the group's limits are each member's: theirs is team's


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("accounts = 3\n", "line 1: accounts: must be a table: [accounts] with lines like"),
        ("[accounts]\nml = []\n", "line 2: accounts.ml: must be a non-empty list of users"),
        ('[accounts]\nml = "root"\n', "line 2: accounts.ml: must be a non-empty list"),
        ("[accounts]\nml = [0]\n", 'line 2: accounts.ml: a member must be a user, "uid:N"'),
        ('[accounts]\nml = ["no-such-user-hwp"]\n', "line 2: accounts.ml: no user named"),
        ('[accounts]\nml = ["@no-such-group-hwp"]\n', "line 2: accounts.ml: no group named"),
        ('[accounts]\nml = ["uid:x"]\n', "line 2: accounts.ml: 'uid:x' is not uid:N"),
        ('[accounts]\nml = ["@gid:x"]\n', "line 2: accounts.ml: 'gid:x' is not gid:N"),
        ('[accounts]\nroot = ["uid:7"]\n', "line 2: accounts.root: 'root' is a user's name"),
        ('[accounts]\n"uid:7" = ["uid:7"]\n', "line 2: accounts.uid:7: an account's name must"),
        ('[accounts]\n"@ml" = ["uid:7"]\n', "line 2: accounts.@ml: an account's name must"),
        ('[accounts]\n"a b" = ["uid:7"]\n', "line 2: accounts.a b: an account's name must be"),
        (
            '[accounts]\nml = ["root"]\nops = ["uid:5", "uid:0"]\n',
            "line 3: accounts.ops: root (uid 0) is in accounts 'ml' and 'ops': a user may be in",
        ),
        (
            '[accounts]\nml = ["uid:4245"]\nops = ["uid:4245"]\n',
            "line 3: accounts.ops: uid 4245 is in accounts 'ml' and 'ops'",
        ),
        (
            '[shares]\nroot = 2\n[accounts]\nml = ["root"]\n',
            "line 2: shares.root: 'root' is in account 'ml', which is scheduled as one owner: "
            "set the account's share instead",
        ),
        (
            '[accounts]\nml = ["uid:7"]\n[shares]\n"uid:7" = 2\n',
            "line 4: shares.uid:7: 'uid:7' is in account 'ml'",
        ),
        (
            '[accounts]\nml = ["root"]\n[limits.users.root]\ngpus = 1\n',
            "line 3: limits.users.root: 'root' is in account 'ml', which is scheduled as one "
            "owner: set the account's limits ([limits.accounts.NAME]) instead",
        ),
        (
            '[accounts]\nml = ["root"]\n[limits.accounts.ops]\ngpus = 1\n',
            "line 3: limits.accounts.ops: no account named 'ops' in [accounts] (it has: 'ml')",
        ),
        (
            "[limits.accounts.ml]\ngpus = 1\n",
            "line 1: limits.accounts.ml: no account named 'ml' in [accounts] (it has: none)",
        ),
        (
            '[accounts]\nml = ["root"]\n[limits.accounts.ml]\ngpus = 0\n',
            "line 4: limits.accounts.ml.gpus: must be a finite number of GPUs > 0",
        ),
        ("[limits]\naccounts = 1\n", "line 2: limits.accounts: must be a table of accounts"),
        (
            '[accounts]\nml = ["uid:7"]\n[shares]\nml = 1\n"uid:8" = 1\nml = 2\n',
            "not valid TOML",
        ),
    ],
)
def test_each_bad_account_is_an_error_naming_the_key_and_line(text: str, named: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "serve.toml")
    assert str(info.value).startswith("serve.toml")
    assert named in str(info.value)


def test_check_config_prints_the_accounts_their_shares_and_limits(tmp_path: Path) -> None:
    path = write(tmp_path / "serve.toml", ACCOUNTS)
    code, out, err = run_cli("serve", "--socket", str(tmp_path / "d" / "s.sock"),
                             "--config", str(path), "--check-config")  # fmt: skip
    assert (code, err) == (0, "")
    lines = out.splitlines()
    start = lines.index(
        "[accounts]  # each account's members, as resolved now: scheduled as one owner"
    )
    assert lines[start + 1 : start + 3] == [
        'ml = ["uid:0", "uid:4243"]  # root, 4243', 'ops = ["uid:4244"]  # 4244',
    ]  # fmt: skip
    assert lines[start + 4 : start + 6] == ['"uid:4242" = 2  # 4242', "ml = 3"]
    assert "[limits.accounts.ml]" in lines


def test_check_config_without_accounts_says_so(tmp_path: Path) -> None:
    path = write(tmp_path / "serve.toml", "gpus = 2\n")
    code, out, _ = run_cli("serve", "--socket", str(tmp_path / "d" / "s.sock"),
                           "--config", str(path), "--check-config")  # fmt: skip
    assert code == 0
    assert "# accounts: none (each user is its own owner)" in out.splitlines()


def test_a_real_server_says_its_accounts_when_it_starts(
    start_server: StartServer, tmp_path: Path
) -> None:
    path = write(tmp_path / "serve.toml", ACCOUNTS)
    server = start_server("--config", str(path), "--gpus", "2")
    server.wait_for(
        "account ml share 3, uid 4242 share 2, limits: account ml gpus=2 mode=wait, "
        "accounts: ml (uids 0, 4243), ops (uids 4244)"
    )


# ----------------------------------------------------------------- values out of range
def serve(*args: str) -> tuple[int, str, str]:
    """``hwpool serve ARGS`` as a child process: its exit status, stdout and stderr. Bounded:
    a server that starts instead of refusing is killed at ``BOUND`` and fails the test."""
    done = subprocess.run(
        [sys.executable, "-m", "hwpool", "serve", *args], capture_output=True, text=True,
        env=ENV, timeout=BOUND, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("watch_interval = 1e12\n", "watch_interval: must be at most 3600, got 1000000000000.0"),
        ("watch_interval = 0.001\n",
         "watch_interval: must be 0 (off) or at least 0.01 s, got 0.001"),
        ("grace = 1e12\n", "grace: must be at most 3600, got 1000000000000.0"),
        ('half_life = "1000d"\n', "half_life: must be at most 31622400, got 86400000.0"),
        ("hello_timeout = 1e9\n", "hello_timeout: must be at most 3600, got 1000000000.0"),
        ("idle_timeout = 1e12\n", "idle_timeout: must be at most 31622400, got 1000000000000.0"),
        ("over_lease_grace = 1e12\n",
         "over_lease_grace: must be at most 86400, got 1000000000000.0"),
        ("max_connections = 0\n", "max_connections: must be an integer >= 1, got 0"),
        ("max_connections = 100000000\n", "max_connections: must be at most 4096, got 100000000"),
        ("max_control_connections = -1\n", "max_control_connections: must be an integer >= 1"),
        ("max_requests_per_user = 2147483648\n",
         "max_requests_per_user: must be at most 1000000, got 2147483648"),
        ('gpu_memory = ["80GiB", "90TiB"]\n',
         "gpu_memory: GPU 1's memory must be at most 16777216 MiB (16 TiB), got 94371840 MiB"),
        ("metrics_max_connections = 100000\n",
         "metrics_max_connections: must be at most 4096, got 100000"),
        ("metrics_timeout = 1e9\n", "metrics_timeout: must be at most 3600, got 1000000000.0"),
        ("[shares]\nroot = 1e300\n", "shares.root: must be at most 1000000 (shares are relative)"),
        ("[limits.default]\ngpus = -1\n",
         "limits.default.gpus: must be a finite number of GPUs > 0, got -1"),
        ("[limits.default]\ngpus = 1e9\n",
         "limits.default.gpus: must be at most 4096, got 1000000000.0"),
        ("[limits.default]\nrunning = 1000000000\n",
         "limits.default.running: must be at most 1000000, got 1000000000"),
        ("[limits.default]\nqueued = 1000000000\n",
         "limits.default.queued: must be at most 1000000, got 1000000000"),
    ],
)  # fmt: skip
def test_serve_refuses_a_value_out_of_range_naming_the_key_and_the_value(
    tmp_path: Path, text: str, named: str
) -> None:
    """Negative, zero where it makes no sense, absurdly large: exit 2, nothing started."""
    path = write(tmp_path / "serve.toml", text)
    socket = tmp_path / "d" / "s.sock"
    code, out, err = serve("--socket", str(socket), "--config", str(path))
    assert (code, out) == (2, "")
    assert named in err and str(path) in err
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--watch-interval", "1e12", "--watch-interval: must be at most 3600, got 1000000000000.0"),
        ("--grace", "1e12", "--grace: must be at most 3600, got 1000000000000.0"),
        ("--hello-timeout", "1e9", "--hello-timeout: must be at most 3600, got 1000000000.0"),
        ("--max-connections",
         "100000000", "--max-connections: must be at most 4096, got 100000000"),
        ("--max-connections", "0", "--max-connections: must be an integer >= 1, got 0"),
        ("--gpus", "100000", "--gpus: must be at most 4096, got 100000"),
        ("--metrics-timeout", "1e9", "--metrics-timeout: must be at most 3600, got 1000000000.0"),
        ("--metrics-max-connections", "100000",
         "--metrics-max-connections: must be at most 4096, got 100000"),
        ("--gpu-memory", "80GiB,90TiB",
         "--gpu-memory: GPU 1's memory must be at most 16777216 MiB (16 TiB), got 94371840 MiB"),
    ],
)  # fmt: skip
def test_serve_refuses_a_flag_out_of_range_naming_it_and_the_value(
    tmp_path: Path, flag: str, value: str, named: str
) -> None:
    socket = tmp_path / "d" / "s.sock"
    code, out, err = serve("--socket", str(socket), "--gpus", "1", flag, value)
    assert (code, out) == (2, "")
    assert named in err
    assert not (tmp_path / "d").exists()


def test_a_config_file_in_a_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    """The config file's directory and those above it are checked as the socket's are: a
    file others could replace is refused (exit 2, naming the directory), nothing started."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    inner = shared / "inner"
    inner.mkdir(mode=0o755)
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    write(real / "serve.toml", "gpus = 2\n")
    (tmp_path / "link").symlink_to(real)
    socket = tmp_path / "d" / "s.sock"
    for path, problem in (
        (write(shared / "serve.toml", "gpus = 2\n"), f"{str(shared)!r} is writable by everyone"),
        (tmp_path / "link" / "serve.toml",
         f"{str(tmp_path / 'link')!r} is a symbolic link: the config file's directory"),
        (write(inner / "serve.toml", "gpus = 2\n"),
         f"{str(shared)!r} (above the config file) is writable by others without the sticky"),
    ):  # fmt: skip
        code, _, err = serve("--socket", str(socket), "--config", str(path))
        assert code == 2 and problem in err, err
        assert not (tmp_path / "d").exists()
