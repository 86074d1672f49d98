"""Durations as hwpool reads them everywhere (``--time``, ``wait --timeout``, config keys):
bare seconds, units largest first, and Slurm's clock forms; everything else refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hostserver import run_cli
from hwpool._check import duration_from_text


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),  # a bare number stays seconds (Slurm would read minutes)
        ("1.5", 1.5),
        ("90s", 90.0),
        ("250ms", 0.25),
        ("30m", 1800.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        ("1.5h", 5400.0),
        ("1d2h3m4s", 93784.0),
        (" 45 ", 45.0),
        ("05:30", 330.0),  # MM:SS
        ("90:00", 5400.0),  # the first field is unbounded
        ("1:30:00", 5400.0),  # HH:MM:SS
        ("2-12", 216000.0),  # D-HH
        ("2-12:30", 217800.0),  # D-HH:MM
        ("1-00:00:01", 86401.0),  # D-HH:MM:SS
    ],
)
def test_each_form_reads_as_its_seconds(text: str, seconds: float) -> None:
    assert duration_from_text(text) == seconds


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("0", "> 0, got '0'"),
        ("0:00", "> 0, got '0:00'"),
        ("0-0", "> 0, got '0-0'"),
        ("-5", "got '-5'"),
        ("1m30h", "largest first"),
        ("1h1h", "got '1h1h'"),
        ("1:60", "below its bound"),
        ("1-24", "below its bound"),
        ("1-23:60", "below its bound"),
        ("1:2:3:4", "got '1:2:3:4'"),
        ("1-2:3:4:5", "got '1-2:3:4:5'"),
        ("1e3", "got '1e3'"),
        ("inf", "got 'inf'"),
        ("nan", "got 'nan'"),
        ("", "got ''"),
        ("h", "got 'h'"),
        ("9" * 400, "..."),
    ],
)
def test_a_bad_duration_is_refused_quoting_it(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match="must be a duration") as caught:
        duration_from_text(text)
    assert fragment in str(caught.value)
    assert len(str(caught.value)) < 300


@given(
    days=st.integers(0, 30),
    hours=st.integers(0, 23),
    minutes=st.integers(0, 59),
    seconds=st.integers(0, 59),
)
def test_the_unit_and_clock_forms_agree(days: int, hours: int, minutes: int, seconds: int) -> None:
    total = days * 86400 + hours * 3600 + minutes * 60 + seconds
    if total == 0:
        return
    assert duration_from_text(f"{days}d{hours}h{minutes}m{seconds}s") == total
    assert duration_from_text(f"{days}-{hours:02}:{minutes:02}:{seconds:02}") == total
    assert duration_from_text(f"{days * 24 + hours}:{minutes:02}:{seconds:02}") == total
    assert duration_from_text(str(total)) == total


@pytest.mark.parametrize("value", ["1:30:00", "1h30m", "0-01:30"])
def test_run_time_takes_slurm_and_compound_forms(value: str) -> None:
    """The command line's --time reads the same forms (checked before any server is asked:
    --help after a valid --time exits 0; an invalid one exits 2)."""
    code, _, err = run_cli("run", "--time", value, "--help")
    assert code == 0, err
    code, _, err = run_cli("run", "--time", value + ":99", "--help")
    assert code == 2 and "--time:" in err and "must be a duration" in err
