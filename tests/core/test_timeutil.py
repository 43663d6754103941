"""Time as integer microseconds: durations, timestamps and their text forms, at exact edges."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from replay.core.timeutil import NEG_INF, format_duration, format_ts, minus, parse_duration, parse_timestamp


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("60s", 60_000_000),
        ("5m", 300_000_000),
        ("250ms", 250_000),
        ("1h", 3_600_000_000),
        ("2d", 172_800_000_000),
        ("10us", 10),
        ("0s", 0),
        (timedelta(seconds=1, microseconds=5), 1_000_005),
    ],
)
def test_parse_duration(text: str, micros: int) -> None:
    assert parse_duration(text) == micros


@pytest.mark.parametrize("text", ["60", 60, "1.5s", "s", "5 minutes", True, ""])
def test_parse_duration_refuses_unitless_and_garbage(text: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)  # type: ignore[arg-type]


def test_a_fractional_duration_is_refused_as_not_whole() -> None:
    with pytest.raises(ValueError, match=r"'0\.5m' is not a whole number followed by a unit \(us, ms, s, m, h, d\)"):
        parse_duration("0.5m")


@pytest.mark.parametrize("micros", [0, 1, 1000, 60_000_000, 90_000_000, 86_400_000_000, 1_500])
def test_format_duration_round_trips(micros: int) -> None:
    assert parse_duration(format_duration(micros)) == micros


def test_timestamps() -> None:
    assert parse_timestamp("1970-01-01T00:00:01Z") == 1_000_000
    assert parse_timestamp("1970-01-01T01:00:00+01:00") == 0
    assert parse_timestamp(datetime(1970, 1, 1, 0, 0, 0, 7, tzinfo=UTC)) == 7
    assert format_ts(parse_timestamp("2026-01-01T00:01:00Z")) == "2026-01-01T00:01:00.000Z"
    assert format_ts(1) == "1970-01-01T00:00:00.000001Z"
    assert format_ts(-1_000) == "1969-12-31T23:59:59.999Z"
    assert format_ts(NEG_INF) == "-inf"


@pytest.mark.parametrize("text", ["2026-01-01T00:00:00", "yesterday", datetime(2026, 1, 1)])
def test_naive_or_bad_timestamps_are_refused(text: object) -> None:
    with pytest.raises(ValueError):
        parse_timestamp(text)  # type: ignore[arg-type]


def test_minus_keeps_minus_infinity() -> None:
    assert minus(NEG_INF, 5) == NEG_INF
    assert minus(10, 5) == 5
