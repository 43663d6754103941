"""Time inside Replay: integer microseconds since the epoch, UTC.

This module owns every conversion: durations (``60s``, ``5m``, ``250ms``),
timestamps (ISO 8601 with an explicit offset; naive values are rejected), the
canonical text form (``2026-01-01T00:01:00.000Z``) and the minus-infinity
sentinel that stands for "no watermark yet".

Intervals are half-open everywhere: ``[start, end)``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

__all__ = [
    "MICROS_PER_MS",
    "MICROS_PER_SECOND",
    "NEG_INF",
    "format_duration",
    "format_ts",
    "from_datetime",
    "minus",
    "parse_duration",
    "parse_timestamp",
    "to_datetime",
]

MICROS_PER_MS = 1_000
MICROS_PER_SECOND = 1_000_000

#: "No watermark yet": below every real timestamp. It is the int64 minimum so it
#: also survives a trip through Arrow, Parquet and Spark unchanged.
NEG_INF = -(2**63)

_UNITS = {
    "us": 1,
    "ms": MICROS_PER_MS,
    "s": MICROS_PER_SECOND,
    "m": 60 * MICROS_PER_SECOND,
    "h": 3600 * MICROS_PER_SECOND,
    "d": 86400 * MICROS_PER_SECOND,
}
_DURATION = re.compile(r"^\s*(-?\d+)\s*(us|ms|s|m|h|d)\s*$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_duration(text: str | int | timedelta) -> int:
    """Parse ``"60s"``, ``"5m"``, ``"250ms"``, ``"1h"``, ``"2d"``, ``"10us"`` into microseconds.

    A ``timedelta`` is converted exactly. A bare number is refused because its unit
    would be a guess.

    Raises:
        ValueError: the text is not a whole number followed by one of us, ms, s, m, h, d.
    """
    if isinstance(text, timedelta):
        return (text.days * 86400 + text.seconds) * MICROS_PER_SECOND + text.microseconds
    if isinstance(text, bool) or not isinstance(text, str):
        raise ValueError(f"duration {text!r} has no unit; write it like 60s, 5m, 250ms, 1h or 2d")
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(
            f"duration {text!r} is not a whole number followed by a unit (us, ms, s, m, h, d), "
            "e.g. 30s for half a minute"
        )
    return int(match.group(1)) * _UNITS[match.group(2)]


def format_duration(micros: int) -> str:
    """The shortest exact text form of a duration: ``60000000`` gives ``"1m"``."""
    if micros == 0:
        return "0s"
    for unit in ("d", "h", "m", "s", "ms"):
        size = _UNITS[unit]
        if micros % size == 0:
            return f"{micros // size}{unit}"
    return f"{micros}us"


def from_datetime(value: datetime) -> int:
    """An aware ``datetime`` as microseconds since the epoch.

    Raises:
        ValueError: the datetime is naive (has no offset).
    """
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            f"timestamp {value.isoformat()} has no UTC offset; write it with one, e.g. 2026-01-01T00:00:00Z"
        )
    delta = value - _EPOCH
    return (delta.days * 86400 + delta.seconds) * MICROS_PER_SECOND + delta.microseconds


def parse_timestamp(text: str | datetime) -> int:
    """Parse an ISO 8601 timestamp with an offset (``Z`` accepted) into microseconds.

    Raises:
        ValueError: the text does not parse, or it has no offset.
    """
    if isinstance(text, datetime):
        return from_datetime(text)
    try:
        value = datetime.fromisoformat(text.strip().replace("z", "Z"))
    except ValueError as exc:
        raise ValueError(f"timestamp {text!r} is not ISO 8601 (e.g. 2026-01-01T00:00:00Z)") from exc
    return from_datetime(value)


def to_datetime(micros: int) -> datetime:
    """Microseconds since the epoch as an aware UTC ``datetime``."""
    return _EPOCH + timedelta(microseconds=micros)


def format_ts(micros: int | None) -> str | None:
    """The canonical text form with milliseconds, ``2026-01-01T00:01:00.000Z``.

    ``None`` stays ``None``; ``NEG_INF`` is written ``"-inf"``. Sub-millisecond
    digits are shown only when present, so no value is silently rounded.
    """
    if micros is None:
        return None
    if micros == NEG_INF:
        return "-inf"
    value = to_datetime(micros)
    text = value.strftime("%Y-%m-%dT%H:%M:%S")
    if micros % MICROS_PER_MS:
        return f"{text}.{value.microsecond:06d}Z"
    return f"{text}.{value.microsecond // 1000:03d}Z"


def minus(watermark: int, duration: int) -> int:
    """``watermark - duration``, keeping ``NEG_INF`` as it is."""
    if watermark == NEG_INF:
        return NEG_INF
    return max(watermark - duration, NEG_INF + 1)
