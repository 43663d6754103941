"""Windows and mergeable partial aggregates in Spark (docs/semantics.md#windows, #aggregates).

A window aggregation (``WindowSpec``) is computed in three steps that keep every
per-tuple operation inside Spark:

1. ``partials``: the on-time tuples of one micro-batch are assigned to their
   windows (``[start, start + size)``, starts ``offset + j * slide``: the formulas of
   ``replay.core.window_kinds``, here on Spark Columns) and reduced
   to one partial row per (grouping key, window start);
2. ``merge``: partials of earlier batches (the open-window state carried in the
   checkpoint) and of this batch are merged per (key, start);
3. ``window_values``: a window whose end the effective watermark has reached becomes
   one row of the ``windows`` table.

Every partial is exactly mergeable, so results do not depend on how a run was
cut into batches; what each aggregation function carries, merges and emits is
its entry in the registry ``replay.engine.aggregations.FUNCTIONS`` (see docs/semantics.md).

Two bookkeeping partials are always present: ``_rows`` (on-time tuples in the
window; every window in the state has at least one, so a window with no on-time
tuple never exists) and ``_owned`` (tuples whose latest window this is: every
on-time tuple is owned by exactly one window, which is what the ledger counts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replay.core.config import Aggregation, WindowSpec
from replay.core.errors import CheckpointStateError, Location
from replay.core.window_kinds import shape_of
from replay.engine.aggregations import FLOAT_SUM_TYPE, FUNCTIONS

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType

__all__ = [
    "FLOAT_SUM_TYPE",
    "PUNCTUATION_START",
    "REST_START",
    "WindowColumns",
    "aggregated_types",
    "check_open_state",
    "merge",
    "output_columns",
    "owner_start",
    "owns_its_members",
    "partial_columns",
    "partials",
    "window_end",
    "window_values",
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


#: The window start of ``partials``' group of rows that enter no window: below any window start an
#: event time can have (timestamps reach back to year 1, about -6.2e16 microseconds).
REST_START = -(2**63)
#: The window start of ``partials``' group of punctuation rows (``tuple_flag``), one above ``REST_START``.
PUNCTUATION_START = REST_START + 1


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
            exprs += FUNCTIONS[agg.fn].partial(i, value, cols.types[agg.column], agg.column)
    return exprs


def partial_columns_of(i: int, spec: WindowSpec, cols: WindowColumns) -> list[str]:
    """The partial columns of ``spec``'s aggregation ``i`` (none for a plain ``count``)."""
    agg = spec.aggregations[i]
    return FUNCTIONS[agg.fn].columns(i, cols.types[agg.column]) if agg.column is not None else []


def partial_columns(spec: WindowSpec, cols: WindowColumns) -> list[str]:
    """The names of ``spec``'s aggregation partials (``partials``' columns after ``_rows``, ``_owned``)."""
    return [name for i in range(len(spec.aggregations)) for name in partial_columns_of(i, spec, cols)]


def check_open_state(schema: StructType, spec: WindowSpec, cols: WindowColumns, directory: str) -> None:
    """Refuse open windows carried in (their file's Spark ``schema``) without every partial column
    this version of Replay merges for ``spec``, or with a partial of the column's values in another
    type: a checkpoint written by a version that carried other partials (the float sums' earlier
    two-integer form; a nanosecond payload column's ``min`` as raw integers) cannot be continued exactly."""
    from pyspark.sql.types import ArrayType

    carried = {field.name: field.dataType for field in schema.fields}
    missing = [name for name in partial_columns(spec, cols) if name not in carried]
    retyped = []
    for i, agg in enumerate(spec.aggregations):
        kind = cols.types[agg.column] if agg.column is not None else None
        for name in partial_columns_of(i, spec, cols):
            suffix, found = name.rsplit("_", 1)[-1], carried.get(name)
            if kind is None or found is None or suffix not in ("min", "max", "lo", "hi", "set"):
                continue  # only these hold the column's own values
            held = found.elementType if suffix == "set" and isinstance(found, ArrayType) else found
            if held != kind:
                retyped.append(f"{name} holds {held.simpleString()}, not {kind.simpleString()}")
    if missing or retyped:
        what = [f"missing {', '.join(missing)}"] if missing else []
        raise CheckpointStateError(
            f"the open windows of window aggregation '{spec.name}' were written by another version of "
            f"Replay, with other partial aggregates ({'; '.join(what + retyped)}), so they cannot be merged",
            where=Location(file=directory),
            todo="replay from scratch with a new --checkpoint directory (and a new --output), or finish this "
            "checkpoint with the version of Replay that wrote it",
            code="checkpoint.state",
        )


def _merge_exprs(spec: WindowSpec, cols: WindowColumns) -> list[Column]:
    from pyspark.sql import functions as F

    exprs = [F.sum("_rows").cast("long").alias("_rows"), F.sum("_owned").cast("long").alias("_owned")]
    for i, agg in enumerate(spec.aggregations):
        if agg.column is not None:
            exprs += FUNCTIONS[agg.fn].merge(i, cols.types[agg.column])
    return exprs


class _ColumnOps:
    """``replay.core.window_kinds``' arithmetic on Spark Columns."""

    def lit(self, value: int) -> Column:
        from pyspark.sql import functions as F

        return F.lit(value)

    def pmod(self, value: Column, divisor: int) -> Column:
        from pyspark.sql import functions as F

        return F.pmod(value, F.lit(divisor))

    def least(self, a: Column, b: Column) -> Column:
        from pyspark.sql import functions as F

        return F.least(a, b)


COLUMN_OPS = _ColumnOps()


def owner_start(t: Column, spec: WindowSpec, cols: WindowColumns) -> Column:
    """The start of the window that owns event time ``t`` (``WindowShape.owner``)."""
    start: Column = shape_of(spec).owner(t, cols.range_end, COLUMN_OPS)
    return start


def owns_its_members(spec: WindowSpec, cols: WindowColumns) -> bool:
    """Whether every window of ``spec`` owns each tuple it holds: a tumbling window (one window
    per event time) without a backfill end, which could cap the owner at an earlier window."""
    return shape_of(spec).per_tuple == 1 and cols.range_end is None


def window_end(start: Column, spec: WindowSpec) -> Column:
    """The end of the window of ``spec`` starting at ``start`` (``WindowShape.end``)."""
    end: Column = shape_of(spec).end(start, COLUMN_OPS)
    return end


def partials(
    rows: DataFrame,
    spec: WindowSpec,
    cols: WindowColumns,
    *,
    on_time: Column | None = None,
    extra: Sequence[Column] = (),
    first_batch: str | int | None = None,
    rest_group: bool = False,
    late: Column | None = None,
    rest_by: str | None = None,
    tuple_flag: str | None = None,
) -> DataFrame:
    """One partial row per (key, window start) over ``rows``.

    Columns: ``key``, ``window_start`` (long microseconds), ``_rows``, ``_owned``, the
    aggregation partials, then ``extra``. Only rows where ``on_time`` holds (all, by
    default) enter windows; with a backfill range only windows inside it are kept, and a
    tuple is owned by the latest of its windows that is kept. The other rows still go
    through the aggregation, so ``extra`` aggregates can count every row in the same
    pass: each row appears once with ``_first`` true (sliding windows repeat rows). Groups
    with ``_rows == 0`` hold no window: callers drop them before merging. ``first_batch``: a
    column whose smallest value over the window's member tuples becomes ``_fb``, or the batch
    that decided every row (``_fb`` on each window group, no aggregate). With
    ``rest_group`` the rows that are members of no window go to one group of their own (a null
    key, window start ``REST_START``, ``_rows == 0``) instead of one group per (key, start): a
    pass counts every row in its ``extra`` aggregates at the cost of one more group. ``late``
    (with ``rest_group``): per row, a struct of what the ``late`` table keeps of it when the row
    is a late tuple, else null. It is one more grouping column, ``_late``: each distinct late
    tuple is a group of its own (``_rows == 0``) with ``_late_n``, how many times it occurs, so
    the late tuples leave the pass's one read through this aggregation and no second read of
    the rows is needed; the other groups have a null ``_late``. ``rest_by`` (with ``rest_group``):
    a column whose value splits the rest group (one group per value, in column ``_rb``; null on
    every other group), so that ``extra`` aggregates count the rows outside every window per value
    of it (a pass of several batches: per batch). ``tuple_flag`` (with ``rest_group``, for windows
    that own their members, every row's ``_first`` true; with or without ``late``): the column that
    is false on a punctuation row; each group then counts all its rows in ``_all``, and the
    punctuation rows outside every window are a rest group of their own (window start
    ``PUNCTUATION_START``), so that a pass's rows and tuples are sums over the groups instead of
    aggregates over every row.
    """
    from pyspark.sql import functions as F

    shape = shape_of(spec)
    t = F.col(_q(cols.event_micros))
    member = F.lit(True) if on_time is None else on_time
    if shape.per_tuple == 1:
        assigned = rows.withColumns({"_start": shape.last_start(t, COLUMN_OPS), "_first": F.lit(True)})
    else:
        assigned = rows.withColumn("_j", F.explode(F.sequence(F.lit(0), F.lit(shape.per_tuple - 1)))).withColumns(
            {"_start": shape.start(t, F.col("_j"), COLUMN_OPS), "_first": F.col("_j") == 0}
        )
        member = member & shape.holds(F.col("_start"), t, COLUMN_OPS)
    if cols.range_start is not None:
        member = member & (F.col("_start") >= F.lit(cols.range_start))
    if cols.range_end is not None:
        member = member & (shape.end(F.col("_start"), COLUMN_OPS) <= F.lit(cols.range_end))
    # Said so, Spark does not compute the owner's start again per row.
    owned = F.lit(True) if owns_its_members(spec, cols) else F.col("_start") == owner_start(t, spec, cols)
    first = [F.min(F.when(member, F.col(_q(first_batch)))).alias("_fb")] if isinstance(first_batch, str) else []
    key, start = F.col(_q(cols.key)), F.col("_start")
    if rest_group:
        rest_start = F.lit(REST_START)
        if tuple_flag is not None:
            rest_start = F.when(F.col(_q(tuple_flag)), rest_start).otherwise(F.lit(PUNCTUATION_START))
        key, start = F.when(member, key), F.when(member, start).otherwise(rest_start)
    keys = [key.alias("key"), start.alias("window_start")]
    if rest_by is not None:
        rest = ~member if late is None else ~member & late.isNull()
        rest_key = [F.when(rest, F.col(_q(rest_by))).alias("_rb")]
    else:
        rest_key = []
    exprs = _partial_exprs(spec, cols, member, owned)
    if late is None and tuple_flag is None:
        return _first_batch(assigned.groupBy(*keys, *rest_key).agg(*exprs, *first, *extra), first_batch)
    # A late tuple is never a member of a window, so a group holds members or late tuples: one count
    # of both (``_n``) is its ``_rows`` or its ``_late_n``, and where every window owns its members
    # its ``_owned`` too (an aggregate or two less per group, updated on every row). Without
    # ``late`` (no row of the pass can be late) a group holds members only, or no member at all.
    each = owns_its_members(spec, cols)
    if tuple_flag is not None:
        counted_rows = F.lit(1)
    else:
        assert late is not None  # the early return above
        counted_rows = F.when(member | (F.col("_first") & late.isNotNull()), F.lit(1))
    late_key = [] if late is None else [late.alias("_late")]
    grouped = assigned.groupBy(*keys, *late_key, *rest_key).agg(
        F.count(counted_rows).alias("_n"), *exprs[2 if each else 1 :], *first, *extra
    )
    is_late = F.lit(False) if late is None else F.col("_late").isNotNull()
    not_members = is_late if tuple_flag is None else is_late | (F.col("window_start") <= F.lit(PUNCTUATION_START))
    members = F.when(not_members, F.lit(0).cast("long")).otherwise(F.col("_n"))
    late_n = [] if late is None else [F.when(is_late, F.col("_n")).otherwise(F.lit(0).cast("long")).alias("_late_n")]
    # The columns in the order without ``late``: ``_n`` becomes ``_rows`` (and ``_owned``), and
    # ``_late_n`` comes before ``extra``.
    names = grouped.columns
    at, end = names.index("_n"), len(names) - len(extra)
    counted = [members.alias("_rows"), members.alias("_owned")] if each else [members.alias("_rows")]
    every = [F.col("_n").alias("_all")] if tuple_flag is not None else []
    # ``_first_batch``'s column in the same projection (one analysis of the plan less).
    fb = [F.when(members > 0, F.lit(first_batch).cast("long")).alias("_fb")] if isinstance(first_batch, int) else []
    return grouped.select(*names[:at], *counted, *names[at + 1 : end], *late_n, *names[end:], *every, *fb)


def _first_batch(grouped: DataFrame, first_batch: str | int | None) -> DataFrame:
    """``grouped`` with ``_fb`` on each window group (``_rows > 0``) when every row was decided by
    batch ``first_batch``."""
    from pyspark.sql import functions as F

    if not isinstance(first_batch, int):
        return grouped
    return grouped.withColumn("_fb", F.when(F.col("_rows") > 0, F.lit(first_batch).cast("long")))


def merge(
    parts: Sequence[DataFrame],
    spec: WindowSpec,
    cols: WindowColumns,
    *,
    extra: Sequence[Column] = (),
    by: Sequence[str] = (),
) -> DataFrame:
    """Merge partial frames (same columns as ``partials``) per (key, window start) and the
    columns ``by``; ``extra``: more aggregates over the partials' own columns."""
    frames = list(parts)
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union.groupBy("key", "window_start", *by).agg(*_merge_exprs(spec, cols), *extra)


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


def window_values(
    spec: WindowSpec, cols: WindowColumns, columns: Sequence[tuple[str, DataType]], key_type: DataType
) -> tuple[list[tuple[str, Column, DataType]], dict[str, str | None]]:
    """A ``windows`` table row from a merged partial row of ``spec``: the columns computed per window
    (``key``, of ``key_type``; ``window_start`` and ``window_end`` as timestamps, and ``spec``'s
    aggregations of ``columns``, cast to their type), each with its type, and the ones equal on
    every row of ``spec`` (``window``, ``wm_key``, and null for the aggregations of ``columns``
    that ``spec`` does not have)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    mine = {agg.output_name: _final(agg, i, cols) for i, agg in enumerate(spec.aggregations)}
    values = [
        ("key", F.col("key"), key_type),
        ("window_start", F.timestamp_micros("window_start"), TimestampType()),
        ("window_end", F.timestamp_micros(window_end(F.col("window_start"), spec)), TimestampType()),
        *[(name, mine[name].cast(data_type), data_type) for name, data_type in columns if name in mine],
    ]
    constants: dict[str, str | None] = {"window": spec.name, "wm_key": spec.wm_key}
    constants |= {name: None for name, _ in columns if name not in mine}
    return values, constants
