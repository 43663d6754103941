"""Windows and mergeable partial aggregates in Spark (docs/semantics.md#windows, #aggregates).

A window aggregation (``WindowSpec``) is computed in three steps that keep every
per-tuple operation inside Spark:

1. ``partials``: the on-time tuples of one micro-batch are assigned to their
   windows (``[start, start + size)``, starts ``offset + j * slide``) and reduced
   to one partial row per (grouping key, window start);
2. ``merge``: partials of earlier batches (the open-window state carried in the
   checkpoint) and of this batch are merged per (key, start);
3. ``finalize``: a window whose end the effective watermark has reached becomes
   one row of the ``windows`` table.

Every partial is exactly mergeable, so results do not depend on how a run was
cut into batches; what each aggregation function carries, merges and emits is
its entry in the registry ``replay._aggregations.FUNCTIONS`` (see docs/semantics.md).

Two bookkeeping partials are always present: ``_rows`` (on-time tuples in the
window; every window in the state has at least one, so a window with no on-time
tuple never exists) and ``_owned`` (tuples whose latest window this is: every
on-time tuple is owned by exactly one window, which is what the ledger counts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replay._aggregations import FLOAT_SUM_TYPE, FUNCTIONS
from replay.config import Aggregation, WindowSpec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType

__all__ = [
    "FLOAT_SUM_TYPE",
    "WindowColumns",
    "aggregated_types",
    "final_columns",
    "finalize",
    "merge",
    "output_columns",
    "owner_start",
    "partials",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowColumns:
    """The physical inputs of one window aggregation.

    ``event_micros``: the name of a long column holding the event time in microseconds;
    ``key``: the grouping key column; ``types``: Spark type of every aggregated column.
    ``range_start``/``range_end``: with a backfill range, only windows entirely inside
    ``[range_start, range_end)`` are produced (microseconds; ``None``: unbounded).
    """

    event_micros: str
    key: str
    types: dict[str, DataType]
    range_start: int | None = None
    range_end: int | None = None


def _q(name: str) -> str:
    return f"`{name}`"


def aggregated_types(specs: Sequence[WindowSpec], schema: StructType) -> dict[str, DataType]:
    """The Spark type of every column the window aggregations ``specs`` aggregate, from ``schema``."""
    return {a.column: schema[a.column].dataType for spec in specs for a in spec.aggregations if a.column is not None}


def _partial_exprs(spec: WindowSpec, cols: WindowColumns, member: Column, owned: Column) -> list[Column]:
    from pyspark.sql import functions as F

    exprs = [
        F.count(F.when(member, F.lit(1))).alias("_rows"),
        F.count(F.when(member, F.when(owned, 1))).alias("_owned"),
    ]
    for i, agg in enumerate(spec.aggregations):
        if agg.column is not None:
            value = F.when(member, F.col(_q(agg.column)))
            exprs += FUNCTIONS[agg.fn].partial(i, value, cols.types[agg.column])
    return exprs


def _merge_exprs(spec: WindowSpec, cols: WindowColumns) -> list[Column]:
    from pyspark.sql import functions as F

    exprs = [F.sum("_rows").cast("long").alias("_rows"), F.sum("_owned").cast("long").alias("_owned")]
    for i, agg in enumerate(spec.aggregations):
        if agg.column is not None:
            exprs += FUNCTIONS[agg.fn].merge(i, cols.types[agg.column])
    return exprs


def owner_start(t: Column, spec: WindowSpec, cols: WindowColumns) -> Column:
    """The start of the window that owns event time ``t``: its latest window, or with a backfill
    range the latest one ending by ``range_end`` (which may not hold ``t``: a tuple near a range
    edge may have no window inside the range, and then no window owns it)."""
    from pyspark.sql import functions as F

    slide, offset = spec.effective_slide, spec.offset
    last = t - F.pmod(t - F.lit(offset), F.lit(slide))  # the latest start <= t
    if cols.range_end is None:
        return last
    capped = F.least(last, F.lit(cols.range_end - spec.size))
    return capped - F.pmod(capped - F.lit(offset), F.lit(slide))


def partials(
    rows: DataFrame,
    spec: WindowSpec,
    cols: WindowColumns,
    *,
    on_time: Column | None = None,
    extra: Sequence[Column] = (),
) -> DataFrame:
    """One partial row per (key, window start) over ``rows``.

    Columns: ``key``, ``window_start`` (long microseconds), ``_rows``, ``_owned``, the
    aggregation partials, then ``extra``. Only rows where ``on_time`` holds (all, by
    default) enter windows; with a backfill range only windows inside it are kept, and a
    tuple is owned by the latest of its windows that is kept. The other rows still go
    through the aggregation, so ``extra`` aggregates can count every row in the same
    pass: each row appears once with ``_first`` true (sliding windows repeat rows). Groups
    with ``_rows == 0`` hold no window: callers drop them before merging.
    """
    from pyspark.sql import functions as F

    size, slide, offset = spec.size, spec.effective_slide, spec.offset
    t = F.col(_q(cols.event_micros))
    last = t - F.pmod(t - F.lit(offset), F.lit(slide))  # the latest start <= t
    count = -(-size // slide)  # windows per tuple at most: ceil(size / slide)
    member = F.lit(True) if on_time is None else on_time
    if count == 1:
        assigned = rows.withColumn("_start", last).withColumn("_first", F.lit(True))
    else:
        assigned = (
            rows.withColumn("_j", F.explode(F.sequence(F.lit(0), F.lit(count - 1))))
            .withColumn("_start", last - F.col("_j") * F.lit(slide))
            .withColumn("_first", F.col("_j") == 0)
        )
        member = member & (F.col("_start") + F.lit(size) > t)
    if cols.range_start is not None:
        member = member & (F.col("_start") >= F.lit(cols.range_start))
    if cols.range_end is not None:
        member = member & (F.col("_start") + F.lit(size) <= F.lit(cols.range_end))
    owned = F.col("_start") == owner_start(t, spec, cols)
    return assigned.groupBy(F.col(_q(cols.key)).alias("key"), F.col("_start").alias("window_start")).agg(
        *_partial_exprs(spec, cols, member, owned), *extra
    )


def merge(parts: Sequence[DataFrame], spec: WindowSpec, cols: WindowColumns) -> DataFrame:
    """Merge partial frames (same columns as ``partials``) per (key, window start)."""
    frames = list(parts)
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union.groupBy("key", "window_start").agg(*_merge_exprs(spec, cols))


def _final(agg: Aggregation, i: int, cols: WindowColumns) -> Column:
    from pyspark.sql import functions as F

    if agg.column is None:
        return F.col("_rows")  # count of rows: every window carries it
    return FUNCTIONS[agg.fn].final(i, cols.types[agg.column])


def output_columns(specs: Sequence[WindowSpec], types: dict[str, DataType]) -> list[tuple[str, DataType]]:
    """The aggregation columns of the ``windows`` table: the union over ``specs``, in first-seen order."""
    from pyspark.sql.types import LongType

    out: dict[str, DataType] = {}
    for spec in specs:
        for agg in spec.aggregations:
            if agg.output_name not in out:
                out[agg.output_name] = (
                    LongType() if agg.column is None else FUNCTIONS[agg.fn].output_type(types[agg.column])
                )
    return list(out.items())


def final_columns(spec: WindowSpec, cols: WindowColumns, columns: Sequence[tuple[str, DataType]]) -> list[Column]:
    """The ``windows`` table's columns computed from a merged partial row of ``spec``: ``window,
    wm_key, key, window_start, window_end`` (timestamps) and ``columns`` (null where ``spec`` has
    no such aggregation)."""
    from pyspark.sql import functions as F

    mine = {agg.output_name: _final(agg, i, cols) for i, agg in enumerate(spec.aggregations)}
    return [
        F.lit(spec.name).alias("window"),
        F.lit(spec.wm_key).alias("wm_key"),
        F.col("key"),
        F.timestamp_micros("window_start").alias("window_start"),
        F.timestamp_micros(F.col("window_start") + F.lit(spec.size)).alias("window_end"),
        *[(mine[name] if name in mine else F.lit(None)).cast(data_type).alias(name) for name, data_type in columns],
    ]


def finalize(
    merged: DataFrame, spec: WindowSpec, cols: WindowColumns, columns: Sequence[tuple[str, DataType]]
) -> DataFrame:
    """Rows of the ``windows`` table from merged partials (``final_columns``)."""
    return merged.select(*final_columns(spec, cols, columns))
