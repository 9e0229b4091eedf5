from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hutch.core.errors import InvalidInput
from hutch.core.quantities import (
    MAX_DURATION_DAYS,
    format_bytes,
    format_duration,
    format_millicores,
    parse_bytes,
    parse_duration,
    parse_millicores,
    stored_duration,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("256Mi", 256 * 2**20), ("1Gi", 2**30), ("512M", 512 * 10**6), ("1048576", 2**20), (4096, 4096), ("1.5Gi", 3 * 2**29), ("2ki", 2048)],
)
def test_parse_bytes(text: object, expected: int) -> None:
    assert parse_bytes("resources.memory", text) == expected


@pytest.mark.parametrize("bad", ["", "lots", "-1Gi", "1Xi", "0", 0, -5, True, None, [1], "1 G i"])
def test_bad_sizes_name_the_field_and_value(bad: object) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_bytes("resources.memory", bad)
    assert info.value.field == "resources.memory"
    assert "resources.memory" in info.value.message and repr(bad) in info.value.message


@pytest.mark.parametrize(("text", "expected"), [("500m", 500), ("0.5", 500), ("1", 1000), (2, 2000), ("250m", 250), (1.5, 1500)])
def test_parse_millicores(text: object, expected: int) -> None:
    assert parse_millicores("resources.cpu", text) == expected


@pytest.mark.parametrize("bad", ["", "fast", "0", "-1", "0.0001", "1.5m", True, "nan", "inf"])
def test_bad_cpu(bad: object) -> None:
    with pytest.raises(InvalidInput, match=r"resources\.cpu"):
        parse_millicores("resources.cpu", bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("30s", 30), ("5m", 300), ("1h", 3600), ("24h", 86400), ("0s", 0), ("1h30m", 5400), ("250ms", 0.25), (10, 10)],
)
def test_parse_duration(text: object, expected: float) -> None:
    assert parse_duration("timeout.idle", text) == expected


@pytest.mark.parametrize("bad", ["", "soon", "5", "5x", "m5", "-1s", -1, True, "1h 30m",
                                 # past 100 years: a deadline past any date, or infinity
                                 "36501d", "36500d1s", 36501 * 86400, float("nan"), float("inf"), "9" * 400 + "d",
                                 "9" * 1_000_001 + "d", "1d" + "9" * 1_000_001 + "d"])  # past Decimal's exponent
def test_bad_durations(bad: object) -> None:
    with pytest.raises(InvalidInput, match=r"timeout\.idle"):
        parse_duration("timeout.idle", bad)


@given(st.integers(min_value=1, max_value=2**50))
def test_bytes_round_trip(n: int) -> None:
    assert parse_bytes("x", format_bytes(n)) == n


@given(st.integers(min_value=1, max_value=10**6))
def test_millicores_round_trip(m: int) -> None:
    assert parse_millicores("x", format_millicores(m)) == m


@given(st.integers(min_value=0, max_value=10**7))
def test_whole_second_durations_round_trip(s: int) -> None:
    assert parse_duration("x", format_duration(s)) == s


@pytest.mark.parametrize("stored", ["9" * 400 + "d", "999999999999d", "3000000d", "36501d", "9" * 1_000_001 + "d"])
def test_a_stored_timeout_from_before_the_cap_reads_as_the_cap(stored: str) -> None:
    """Recorded before durations were capped: read as the cap (100 years) wherever a deadline is
    made of it, the reaper's too (its watch once retried a schedule that raised, forever)."""
    from hutch.service.timeouts import seconds

    cap = MAX_DURATION_DAYS * 86400
    assert stored_duration("timeout.idle", stored) == seconds(stored, "timeout.idle") == cap
    assert (seconds("36500d", "timeout.idle"), stored_duration("timeout.idle", "5m")) == (cap, 300)


def test_a_stored_duration_of_a_bad_form_is_still_refused() -> None:
    with pytest.raises(InvalidInput, match=r"timeout\.idle"):
        stored_duration("timeout.idle", "soon")
