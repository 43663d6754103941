"""The query of a pass: one union of every destination's rows, and where each row goes.

``build`` turns a pass's work (``replay.engine.passes.PassWork``) into a ``PassQuery``: the union
``replay.engine.aggregate.run_pass`` writes in its one Spark action, the destinations (``Part``)
its ``_part`` numbers name, and the ledger's counts observed on the way. The union's branches:

- per window aggregation, its merged partials: due windows (per batch, ``routing.due_part``)
  and open ones. Through the first aggregation ride, where they can, the late tuples (one
  watermark key: a group of their own) and the ledger's counts (sums over its groups; in a pass
  of several batches, one group per batch of the rows outside every window);
- the late tuples read a second time when they cannot ride (several keys);
- the ledger's counts per batch in a branch of their own when they do not follow from the pass's
  totals (``pass_counts.derives``);
- the rows' count when no window aggregation reads them.

A row of the union goes to one destination, so the destinations share its value columns
(``routing.Shared``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from replay.core.config import JobConfig, WindowSpec
from replay.engine.archive import ArchiveLayout
from replay.engine.count_plan import plan_counts, suffix
from replay.engine.passes import PassWork
from replay.engine.routing import Shared, Value, batch_part, due_part, fields_of
from replay.engine.rows import late_rows, late_values, pass_rows
from replay.engine.schemas import table_structs, value_struct
from replay.engine.sink import Part
from replay.engine.windows import (
    PUNCTUATION_START,
    WindowColumns,
    aggregated_types,
    check_open_state,
    merge,
    output_columns,
    partials,
    window_end,
    window_values,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pyspark.sql import Column, DataFrame, Observation, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["PassQuery", "build", "read_open"]

_TIMES = "_times"  # a late group's value: how many times its tuple occurs (``Part.repeat``)


@dataclass(frozen=True, slots=True)
class PassQuery:
    """What a pass's action runs and how its results are read.

    ``union``: every destination's rows, ``None`` when the pass has nothing to compute; ``parts``
    and ``ids``: the destinations and their numbers in the union's ``_part`` column; ``metrics``:
    the ledger's counts observed on the way (``None``: none observed); ``derive``: each batch's
    counts follow from the pass's totals and its rows outside every window
    (``pass_counts.derived``); ``same``: the counts equal to another (``pass_counts.filled``);
    ``rows`` and ``windows``: the pass's rows (``rows.pass_rows``) the union reads and each window
    aggregation's columns in them (by its index in the job), for questions asked after a failure
    (``replay.engine.unsummable``)."""

    union: DataFrame | None
    parts: dict[str, Part]
    ids: dict[str, int]
    metrics: Observation | None
    derive: bool
    same: Any
    rows: DataFrame | None
    windows: dict[int, WindowColumns]


def build(
    spark: SparkSession,
    *,
    config: JobConfig,
    layout: ArchiveLayout,
    schema: StructType,
    spark_paths: Mapping[str, str],
    work: PassWork,
) -> PassQuery:
    """The query of ``work`` (see the module docstring). Builds the plan only: no Spark job runs."""
    if "ns" in layout.time_columns.values():
        spark.conf.set("spark.sql.legacy.parquet.nanosAsLong", "true")
    builder = _Builder(spark, config, layout, schema, spark_paths, work)
    for s, spec in enumerate(builder.specs):
        builder.windows(s, spec)
    builder.rest()
    if not builder.branches:
        union = None
    else:
        union = builder.branches[0]
        for frame in builder.branches[1:]:
            union = union.unionByName(frame, allowMissingColumns=True)
    b, counts = builder, builder.counts
    return PassQuery(union, b.parts, b.ids, counts.metrics, counts.derive, counts.same, b.rows_frame, b.spec_cols)


class _Builder:
    """The pass's query as it is built, step by step (``build``): what every step shares."""

    def __init__(
        self,
        spark: SparkSession,
        config: JobConfig,
        layout: ArchiveLayout,
        schema: StructType,
        spark_paths: Mapping[str, str],
        work: PassWork,
    ) -> None:
        from pyspark.sql import functions as F

        self.work = work
        nkeys = len(layout.keys)
        self.key_index = layout.key_index
        self.specs: list[WindowSpec] = list(config.windows)
        agg_types = aggregated_types(self.specs, value_struct(schema, layout))  # as ``pass_rows`` gives them
        self.columns = output_columns(self.specs, agg_types)
        self.windows_struct, self.late_struct = table_structs(config, schema, layout)
        range_start, range_end = work.range
        self.steps = list(work.steps)
        reads = work.reads
        self.carried = bool((reads.batches == 0).any())
        self.branches: list[DataFrame] = []
        self.parts: dict[str, Part] = {}
        # Each destination's number in the union's ``_part`` column.
        names = [f"windows:{s}:{step.batch}" for s in range(len(self.specs)) for step in self.steps]
        names += [f"open:{s}" for s in range(len(self.specs))]
        names += [f"late:{step.batch}" for step in self.steps] + ["counts"]
        self.ids = {name: number for number, name in enumerate(names)}
        self.late_part = {step.batch: self.ids[f"late:{step.batch}"] for step in self.steps}
        self.shared = Shared()
        self.rows_frame = pass_rows(spark, work, layout, schema, spark_paths) if len(reads) else None
        self.spark = spark
        self.spec_cols = {
            s: WindowColumns(
                event_micros=f"_ev{self.key_index[spec.wm_key]}",
                key=layout.key,
                types=agg_types,
                range_start=range_start,
                range_end=range_end,
            )
            for s, spec in enumerate(self.specs)
        }
        # Decided by a batch of the pass (not carried): every row, when the pass carries no copies.
        # Said so, Spark tests nothing per row.
        self.decided = F.col("d_batch") > 0 if self.carried else F.lit(True)
        self.late_names = [f.name for f in self.late_struct.fields]
        self.late_columns: list[tuple[str, str]] = []  # where the union has a late tuple's values
        self.late_repeat: str | None = None  # the union's column of how many times a late row occurs (else once)
        # Per key: the row's ``late`` table values where it is late for it, else null. Only copies
        # whose smallest event time is below their threshold can hold a late tuple (a copy whose
        # event times the scan did not read may).
        self.late_rows_of: list[Column] = []
        if self.rows_frame is not None and reads.may_hold_late().any():
            self.late_rows_of = late_rows(self.rows_frame, layout, reads, self.decided, self.late_names)
        # With one watermark key, the late tuples ride through the first window aggregation as groups
        # of their own (``windows.partials``' ``late``): one read of the rows instead of two.
        self.late_in_windows = bool(self.late_rows_of) and nkeys == 1 and bool(self.specs)
        self.counts = plan_counts(
            self.rows_frame,
            work,
            self.specs,
            self.spec_cols,
            self.key_index,
            carried=self.carried,
            decided=self.decided,
        )
        if self.counts.grouped is not None:
            self._counts_branch(self.counts.grouped)

    def _counts_branch(self, grouped: DataFrame) -> None:
        """Each batch's counts as a branch of their own (``CountPlan.grouped``)."""
        import pyarrow as pa
        from pyspark.sql import functions as F

        counted, struct = self.counts.counted, grouped.schema
        selected, (placed,) = self.shared.select(
            [(None, [(n, F.col(f"c_{n}"), struct[f"c_{n}"].dataType) for n in counted])]
        )
        self.branches.append(grouped.select(F.lit(self.ids["counts"]).alias("_part"), *selected))
        self.parts["counts"] = Part(
            self.work.counts_dir, placed, bytes(pa.schema([(n, pa.int64()) for n in counted]).serialize())
        )

    def windows(self, s: int, spec: WindowSpec) -> None:
        """The branch of window aggregation ``s``: its partials (and what rides with them) merged
        with the open windows carried in, each window due at a batch of the pass or kept open."""
        from pyspark.sql import functions as F

        work, steps, rows_frame = self.work, self.steps, self.rows_frame
        i = self.key_index[spec.wm_key]
        cols = self.spec_cols[s]
        # A window's first batch with a tuple in it (``_fb``), a minimum per window; in a pass of one
        # batch without carried copies it is that batch (one aggregate less per window group).
        first_batch: str | int = "d_batch" if len(steps) > 1 or self.carried else steps[0].batch
        pieces: list[DataFrame] = []
        previous = work.open_state.get(spec.name)
        spent: list[str] = []  # the first aggregation's columns for the observed counts only
        late_here = self.late_in_windows and s == 0 and rows_frame is not None  # late tuples ride in these partials
        if previous is not None:
            carried = read_open(self.spark, previous)
            check_open_state(carried.schema, spec, cols, previous)
            pieces.append(carried.withColumn("_fb", F.lit(0).cast("long")))
        counts = self.counts
        if rows_frame is not None and s == 0 and (counts.ride or self.late_in_windows):
            # Every row through this aggregation: the ledger's counts ride in it (one batch), the
            # late tuples in groups of their own (one key), the other rows in the rest group.
            fresh = partials(
                rows_frame,
                spec,
                cols,
                on_time=F.col(f"_on{i}"),
                first_batch=first_batch,
                extra=counts.ride,
                rest_group=True,
                late=self.late_rows_of[0] if late_here else None,
                rest_by="d_batch" if counts.derive else None,
                tuple_flag="_tuple" if counts.from_groups else None,
            )
            if counts.ride:
                fresh, spent = self._observed_groups(fresh, late_here, previous is not None)
            kept = F.col("_rows") > 0
            if late_here:
                kept = kept | F.col("_late").isNotNull()
            if counts.derive:
                kept = kept | (F.col("_rb") > 0)  # a batch's rows outside every window: its counts
            pieces.append(fresh.where(kept))
        elif rows_frame is not None:
            fresh = partials(rows_frame.where(F.col(f"_on{i}")), spec, cols, first_batch=first_batch)
            pieces.append(fresh.where(F.col("_rows") > 0))
        if not pieces:
            return
        rest = counts.derive and s == 0  # this aggregation's groups carry each batch's counts
        counts_of = list(counts.columns.values()) if rest else []
        if late_here and previous is not None:
            late_type = pieces[-1].schema["_late"].dataType
            pieces[0] = pieces[0].withColumns({"_late": F.lit(None).cast(late_type), "_late_n": F.lit(0).cast("long")})
        if rest and previous is not None:
            pieces[0] = pieces[0].select(
                "*", F.lit(None).cast("long").alias("_rb"), *[F.lit(0).cast("long").alias(c) for c in counts_of]
            )
        extra = [F.min("_fb").alias("_fb")] + ([F.sum("_late_n").alias("_late_n")] if late_here else [])
        merged = (
            pieces[0]
            if len(pieces) == 1 and previous is None
            else merge(
                pieces,
                spec,
                cols,
                extra=extra + [F.sum(c).alias(c) for c in counts_of],
                by=(["_late"] if late_here else []) + (["_rb"] if rest else []),
            )
        )
        end = window_end(F.col("window_start"), spec)
        if previous is not None or self.carried:
            # Windows ending by the floor were emitted by committed batches (their partials came
            # back with the carried copies' tuples or the open state): never again.
            after_floor = end > F.lit(work.floor[i])
            if late_here:
                after_floor = after_floor | F.col("_late").isNotNull()
            if rest:
                after_floor = after_floor | F.col("_rb").isNotNull()
            merged = merged.where(after_floor)
        self._window_branch(s, spec, merged, end, late_here=late_here, rest=rest, hidden=(*counts_of, *spent))

    def _observed_groups(self, fresh: DataFrame, late_here: bool, carried_in: bool) -> tuple[DataFrame, list[str]]:
        """``fresh`` (the first aggregation's partials, the counts riding in them) with the counts
        summed over its groups as observed metrics; and the columns spent once observed."""
        from pyspark.sql import functions as F

        counts = self.counts
        assert counts.metrics is not None
        # Sums over the groups, as SQL text: one py4j call each instead of six or seven
        # (``docs/performance-record.md``: building the query's expressions is mostly py4j calls).
        summed = [(name, f"`_c_{name}`") for name, _ in counts.terms]
        if counts.from_groups:
            punctuation = f"CASE WHEN window_start = {PUNCTUATION_START}L THEN _all END"
            summed += [
                ("rows", "_all"),
                ("tuples", f"_all - coalesce({punctuation}, 0L)"),
                ("late0", "_late_n" if late_here else "0L"),
                ("on0", "_rows"),
            ]
        end = suffix(self.steps)
        fresh = fresh.observe(
            counts.metrics,
            *[F.expr(f"CAST(coalesce(sum({value}), 0L) AS BIGINT) AS `{name}_{end}`") for name, value in summed],
        )
        spent: list[str] = []
        if not counts.derive:
            # Spent once observed: hidden from the open state, and dropped where the open
            # windows carried in (which lack them) are merged in.
            spent = [f"_c_{name}" for name, _ in counts.terms] + (["_all"] if counts.from_groups else [])
            if carried_in:
                fresh = fresh.drop(*spent)
        return fresh, spent

    def _window_branch(
        self,
        s: int,
        spec: WindowSpec,
        merged: DataFrame,
        end: Column,
        *,
        late_here: bool,
        rest: bool,
        hidden: Sequence[str],
    ) -> None:
        """The union's branch of ``merged`` (window aggregation ``s``'s groups): each row's
        destination and values, and the destinations' ``Part``s."""
        import pyarrow as pa
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructType

        steps, ids = self.steps, self.ids
        i = self.key_index[spec.wm_key]
        due = due_part(end, steps, i, {step.batch: ids[f"windows:{s}:{step.batch}"] for step in steps})
        if len(steps) > 1:
            # Computed once per row: a pass of many batches makes it a long ``CASE``, and every shared
            # value column tests it. A pass of one batch tests one window end, in the branch's own
            # projection (one analysis of the plan less).
            merged = merged.withColumn("_due", due)
            due = F.col("_due")
        hidden = ("_fb", "_late", "_late_n", "_rb", "_due", *hidden)
        merged_struct = merged.schema  # the types of the values below (no projection analysed for them)
        state_fields = [f for f in merged_struct.fields if f.name not in hidden]
        part = F.coalesce(due, F.lit(ids[f"open:{s}"]))
        window_row, constants = window_values(spec, self.spec_cols[s], self.columns, merged_struct["key"].dataType)
        kinds: list[tuple[Column | None, Sequence[Value]]] = [
            (due.isNotNull(), window_row),
            (due.isNull(), fields_of(StructType(state_fields))),
        ]
        if late_here:
            # A late tuple's group is one row, with how many times the tuple occurs (``_late_n``):
            # the sink writes it that many times (``Part.repeat``), so no row is repeated in Spark.
            is_late = F.col("_late").isNotNull()
            part = F.when(is_late, batch_part(F.col("_late._batch"), self.late_part)).otherwise(part)
            times: Value = (_TIMES, F.col("_late_n"), merged_struct["_late_n"].dataType)
            kinds.insert(0, (is_late, [*late_values(merged_struct, self.late_names, "_late"), times]))
        if rest:
            # A batch's rows outside every window (a group of their own, ``_rb``: the batch) are its counts.
            is_rest = F.col("_rb").isNotNull()
            part = F.when(is_rest, F.lit(ids["counts"])).otherwise(part)
            kinds.insert(
                0,
                (
                    is_rest,
                    [
                        ("batch", F.col("_rb"), merged_struct["_rb"].dataType),
                        *[(n, F.col(c), merged_struct[c].dataType) for n, c in self.counts.columns.items()],
                    ],
                ),
            )
        selected, by_kind = self.shared.select(kinds)
        branch = merged.select(
            part.alias("_part"),
            F.col("_owned"),
            # The sink counts windows by the first batch with a tuple in them (0: carried in), so
            # that each batch's open windows are known without another pass over them.
            F.col("_fb").alias("_first"),
            *selected,
        )
        self.branches.append(branch)
        if rest:
            self.parts["counts"] = Part(
                self.work.counts_dir,
                by_kind.pop(0),
                bytes(pa.schema([(n, pa.int64()) for n in self.counts.counted]).serialize()),
            )
        if late_here:
            *late_columns, (self.late_repeat, _) = by_kind.pop(0)  # the count is the last value
            self.late_columns = list(late_columns)
        window_columns, state_columns = by_kind
        for step in steps:
            self.parts[f"windows:{s}:{step.batch}"] = Part(
                step.windows_dir,
                window_columns,
                _arrow_schema(self.windows_struct),
                tuple(constants.items()),
            )
        self.parts[f"open:{s}"] = Part(
            self.work.state_dirs[spec.name], state_columns, _arrow_schema(StructType(state_fields))
        )

    def rest(self) -> None:
        """The branches that follow the window aggregations': the rows' count when no window
        aggregation reads them, and the late tuples (read a second time when they could not ride
        in the first aggregation: with several keys a tuple late for one key can be on time for
        another), with their destinations."""
        from pyspark.sql import functions as F

        if self.counts.observed is not None:
            # No window aggregation reads the rows: count them in a branch of their own.
            self.branches.append(
                self.counts.observed.groupBy()
                .agg(F.count(F.lit(1)).alias("_owned"))
                .select(F.lit(-1).alias("_part"), "_owned")
            )
        if not self.late_rows_of:
            return
        if not self.late_in_windows:
            assert self.rows_frame is not None  # late rows are made from it
            for late in self.late_rows_of:
                tuples = self.rows_frame.where(late.isNotNull()).select(late.alias("_l"))
                selected, (placed,) = self.shared.select([(None, late_values(tuples.schema, self.late_names, "_l"))])
                self.late_columns = list(placed)  # a row per late tuple: each written once
                self.branches.append(
                    tuples.select(batch_part(F.col("_l._batch"), self.late_part).alias("_part"), *selected)
                )
        for step in self.steps:
            self.parts[f"late:{step.batch}"] = Part(
                step.late_dir, tuple(self.late_columns), _arrow_schema(self.late_struct), repeat=self.late_repeat
            )


def _arrow_schema(struct: StructType) -> bytes:
    from pyspark.sql.pandas.types import to_arrow_schema

    return bytes(to_arrow_schema(struct, timezone="UTC").serialize())


def read_open(spark: SparkSession, directory: str) -> DataFrame:
    """The open windows a batch carried out, read with the schema of their own files (no Spark
    schema-inference job)."""
    from pathlib import Path

    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_schema

    from replay.store.listing import listed

    files = listed(Path(directory), checkpoint=True)  # only what the batch's successful attempts wrote
    if files is None:  # a directory an earlier Replay wrote: all of it
        files = sorted(p for p in Path(directory).iterdir() if p.suffix == ".parquet" and p.name[0] not in "._")
    reader = spark.read.schema(from_arrow_schema(pq.read_schema(files[0])))
    return reader.parquet(*[str(f) for f in files])
