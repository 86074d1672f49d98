"""``hwpool submit --env`` refuses what is not KEY=VALUE, naming it, before anything is queued."""

from __future__ import annotations

import pytest

from hostserver import run_cli


@pytest.mark.parametrize("value", ["NOEQUALS", "=x", "1ABC=x", "A-B=x", "A B=x", "É=x"])
def test_a_bad_env_is_one_line_naming_it_and_exits_2(value: str) -> None:
    code, out, err = run_cli("submit", "--env", value, "--", "true")
    assert code == 2, err
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "--env" in err and repr(value) in err
