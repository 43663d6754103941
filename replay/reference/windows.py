"""Windows of the reference model (docs/semantics.md#windows), the naive way.

Private to ``replay.reference.model``: every window is rebuilt from the list of on-time
tuples, with plain Python aggregates. Time is integer microseconds; windows are
half-open ``[start, end)``.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from replay.core.config import Aggregation, ColumnMapping, WindowSpec
from replay.core.errors import DataError, Location

__all__ = ["WindowRow", "aggregate", "build_windows", "window_starts"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowRow:
    """One window of one grouping key: ``[window_start, window_end)`` in microseconds.

    ``values`` holds ``(output_name, value)`` pairs in the window spec's aggregation order.
    """

    window: str
    wm_key: str
    key: object
    window_start: int
    window_end: int
    values: tuple[tuple[str, object], ...]


def window_starts(t: int, *, size: int, slide: int, offset: int) -> list[int]:
    """Starts of every window ``[start, start + size)`` holding event time ``t``, ascending.

    Starts are ``offset + j * slide`` for every integer ``j`` (all in microseconds).
    """
    last = t - (t - offset) % slide  # the largest start <= t (Python's % is a floor modulo)
    starts = []
    start = last
    while start + size > t:
        starts.append(start)
        start -= slide
    return sorted(starts)


#: A floating-point value is summed truncated toward zero to a multiple of this (2^-96).
_RESOLUTION = Fraction(1, 2**96)


def _truncated(value: float, column: str | None) -> Fraction:
    """``value`` as the exact fraction a float sum adds: truncated toward zero to a multiple of
    2^-96. NaN, infinities and values of magnitude 2^63 or more cannot be summed."""
    if not math.isfinite(value) or abs(value) >= 2.0**63:
        raise DataError(
            f"column '{column}' holds a NaN, an infinity or a value of magnitude 2^63 or more",
            where=Location(column=column),
            todo="replace those values in the archive",
            code="archive.unsummable",
        )
    return math.trunc(Fraction(value) / _RESOLUTION) * _RESOLUTION


def _limbs(value: Fraction) -> list[int]:
    """A truncated value's four limbs, each with its sign: its integer part and three 32-bit digits
    of its fraction."""
    out = [math.trunc(value)]
    rest = value - out[0]
    for _ in range(3):
        rest *= 2**32
        out.append(math.trunc(rest))
        rest -= out[-1]
    return out


def _sum(values: list[object], column: str | None) -> object:
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return sum(values)  # type: ignore[arg-type]
    decimals = [v for v in values if isinstance(v, decimal.Decimal)]
    if len(decimals) == len(values):
        with decimal.localcontext(prec=100):  # exact: a decimal(38, s) sum has at most 38 digits
            return sum(decimals, decimal.Decimal(0))
    if all(isinstance(v, float) for v in values):
        # Each value's limbs summed exactly (integers, so the order of the tuples cannot matter),
        # then ``a0 + (a1 + (a2 + a3 2^-32) 2^-32) 2^-32`` in floating point, in that order.
        sums = [sum(limbs) for limbs in zip(*(_limbs(_truncated(v, column)) for v in values), strict=True)]  # type: ignore[arg-type]
        step = 2.0**-32
        return float(sums[0]) + (float(sums[1]) + (float(sums[2]) + float(sums[3]) * step) * step) * step
    # Correctly rounded, so the reference does not depend on the order of the tuples.
    return math.fsum(values)  # type: ignore[arg-type]


def _mean(values: list[object], column: str | None) -> float:
    if not all(isinstance(v, float | decimal.Decimal) for v in values):
        return math.fsum(values) / len(values)  # type: ignore[arg-type]
    # The exact sum (a float's limbs, a decimal's digits) as the nearest double, over the count.
    mean = float(_sum(values, column)) / len(values)  # type: ignore[arg-type]
    # The exact mean lies between the smallest and the largest value: a rounding outside is taken back.
    floats = [float(v) for v in values]  # type: ignore[arg-type]
    low, high = min(floats), max(floats)
    return low if mean < low else high if mean > high else mean


def aggregate(aggregation: Aggregation, values: Sequence[object]) -> object:
    """One aggregate over a window's column values, with SQL null rules.

    ``values`` are the rows' values of ``aggregation.column`` (or one entry per row for a
    plain ``count``). ``count`` of a column counts non-null values; ``sum``, ``min``, ``max``
    and ``mean`` are ``None`` when every value is null; ``mean`` is a float; the sum of
    integers is an integer; ``approx_count_distinct`` is the exact number of distinct
    non-null values (the engine's estimate is compared with a tolerance).
    """
    if aggregation.fn == "count" and aggregation.column is None:
        return len(values)
    present = [v for v in values if v is not None]
    if aggregation.fn == "count":
        return len(present)
    if aggregation.fn == "approx_count_distinct":
        return len(set(present))
    if not present:
        return None
    if aggregation.fn == "sum":
        return _sum(present, aggregation.column)
    if aggregation.fn == "min":
        return min(present)  # type: ignore[type-var]
    if aggregation.fn == "max":
        return max(present)  # type: ignore[type-var]
    if aggregation.fn == "mean":
        return _mean(present, aggregation.column)
    raise AssertionError(f"unknown aggregation {aggregation.fn}")


def build_windows(
    specs: Iterable[WindowSpec],
    *,
    on_time: Mapping[str, Sequence[Mapping[str, object]]],
    event_time_column: Mapping[str, str],
    effective_watermark: Mapping[str, int],
    columns: ColumnMapping,
) -> tuple[tuple[WindowRow, ...], tuple[WindowRow, ...]]:
    """Every window with at least one on-time tuple, split into (emitted, open).

    ``on_time[k]`` holds the on-time tuples (physical column name -> value) of decided
    buffers for watermark key ``k``; ``event_time_column[k]`` names their event-time
    column. A window of key ``k`` is emitted iff ``window_end <= effective_watermark[k]``.
    Both tuples are sorted by (window name, ``repr`` of the grouping key, window start).
    """
    key_column = columns.resolve("key")
    emitted: list[WindowRow] = []
    still_open: list[WindowRow] = []
    for spec in specs:
        et_column = event_time_column[spec.wm_key]
        members: dict[tuple[object, int], list[Mapping[str, object]]] = {}
        for row in on_time[spec.wm_key]:
            t = row.get(et_column)
            if not isinstance(t, int):
                continue  # a null event time takes no part in this key
            starts = window_starts(t, size=spec.size, slide=spec.effective_slide, offset=spec.offset)
            for start in starts:
                members.setdefault((row.get(key_column), start), []).append(row)
        for (key, start), rows in members.items():
            values = tuple(
                (
                    agg.output_name,
                    aggregate(agg, [row.get(columns.resolve(agg.column)) if agg.column else 1 for row in rows]),
                )
                for agg in spec.aggregations
            )
            window = WindowRow(
                window=spec.name,
                wm_key=spec.wm_key,
                key=key,
                window_start=start,
                window_end=start + spec.size,
                values=values,
            )
            (emitted if window.window_end <= effective_watermark[spec.wm_key] else still_open).append(window)

    def order(w: WindowRow) -> tuple[str, str, int]:
        return (w.window, repr(w.key), w.window_start)

    return tuple(sorted(emitted, key=order)), tuple(sorted(still_open, key=order))
