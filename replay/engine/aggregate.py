"""The tuple work of a pass in Spark: lateness, late rows, window partials, emission.

A pass is one or more consecutive micro-batches of a run (``replay.runner.batch``). The
driver decides everything from buffer metadata (``replay.core.progress``): which buffer
copies each batch reads and the lateness threshold of each one's tuples per key. This
module turns that into one Spark action over the archive's rows, without a tuple
reaching the driver:

- the pass's rows, with their copies' decisions (``replay.engine.rows``): every row
  carries the batch that decided it (``d_batch``; 0 for a carried copy, whose tuples
  only rebuild open windows); what the pass is asked and reports back are the values of
  ``replay.engine.passes``;
- per key, a tuple is late (``event_time < threshold``), on time, or has no event
  time for the key (or, in a backfill, one outside the range);
- late tuples are written to the ``late`` table, in the directory of the batch that
  decided them; on-time ones are reduced to window partials and merged with the open
  windows carried in. With one watermark key the late tuples travel through the first window
  aggregation as groups of their own (``windows.partials``' ``late``), so the rows are read
  once; with several, a tuple late for one key may be on time for another, and the late
  tuples come from a second read of the rows;
- a window is written to the ``windows`` table in the directory of the first batch of
  the pass whose effective watermark reached its end; the others become the open-window
  state the pass carries out;
- all of it is one union, written by one ``mapInArrow`` (``replay.engine.sink``) whose
  collected result is the pass's only Spark action. The ledger's counts ride along as observed
  metrics: per batch in a pass of one batch; in a pass of several, for the whole pass, with one
  group per batch of the rows outside every window, from which each batch's counts follow
  (``pass_counts.derives``, ``pass_counts.derived``); where they do not follow (several keys, sliding windows, a
  backfill range), per batch in one more branch. Without carried copies, with one key and
  tumbling windows, all but the copy checksum are sums over the first aggregation's groups, not
  its rows. A row of the union goes to one destination, so
  the destinations share its value columns (``routing.Shared``).

What comes back to the driver is small: per batch its row and tuple counts, a checksum
of its copy ids and per-key late/on-time counts (which the ledger checks), and per window
aggregation the number of windows emitted and left open and the tuples they own.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replay.core.config import JobConfig, WindowSpec
from replay.engine import pass_counts
from replay.engine.archive import ArchiveLayout
from replay.engine.archive_rows import time_value
from replay.engine.passes import PassWork, SpecCounts, WorkResult
from replay.engine.routing import Shared, Value, batch_part, due_part, fields_of
from replay.engine.rows import late_reason, pass_rows, q
from replay.engine.schemas import table_structs
from replay.engine.sink import RESULT_SCHEMA, Part, Written, keep_only, sink
from replay.engine.spark import follow_cores
from replay.engine.windows import (
    PUNCTUATION_START,
    WindowColumns,
    aggregated_types,
    merge,
    output_columns,
    partials,
    window_end,
    window_values,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["read_open", "run_pass"]

_ADAPTIVE = "spark.sql.adaptive.enabled"
_TIMES = "_times"  # a late group's value: how many times its tuple occurs (``Part.repeat``)


def run_pass(
    spark: SparkSession,
    *,
    config: JobConfig,
    layout: ArchiveLayout,
    schema: StructType,
    spark_paths: Mapping[str, str],
    work: PassWork,
) -> dict[int, WorkResult]:
    """Do the tuple work of one or more consecutive micro-batches in Spark (see the module
    docstring) in one Spark action; returns each batch's result, by batch number.

    A window is emitted at the first batch of the pass whose ``E_k`` reaches its end: every
    tuple decided in a later batch has a threshold at or above that batch's ``E_k``
    (``replay.core.progress``), so no later on-time tuple can enter it, and its aggregate over the
    whole pass is the one the batch would have emitted alone. Every destination's rows (per
    window aggregation its due windows, per batch, and its open windows; the late tuples, per
    batch; the per-batch counts) are branches of one union, written by ``replay.engine.sink``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import Observation
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    if "ns" in layout.time_columns.values():
        spark.conf.set("spark.sql.legacy.parquet.nanosAsLong", "true")
    nkeys = len(layout.keys)
    key_index = {k.name: i for i, k in enumerate(layout.keys)}
    specs: list[WindowSpec] = list(config.windows)
    agg_types = aggregated_types(specs, schema)
    columns = output_columns(specs, agg_types)
    windows_struct, late_struct = table_structs(config, schema, layout)
    range_start, range_end = work.range
    steps = list(work.steps)
    reads = work.reads
    carried = bool((reads.batches == 0).any())

    branches: list[DataFrame] = []
    parts: dict[str, Part] = {}
    # Each destination's number in the union's ``_part`` column.
    names = [f"windows:{s}:{step.batch}" for s in range(len(specs)) for step in steps]
    names += [f"open:{s}" for s in range(len(specs))] + [f"late:{step.batch}" for step in steps] + ["counts"]
    ids = {name: number for number, name in enumerate(names)}
    late_part = {step.batch: ids[f"late:{step.batch}"] for step in steps}
    shared = Shared()
    rows_frame = pass_rows(spark, work, layout, schema, spark_paths) if len(reads) else None
    spec_cols = {
        s: WindowColumns(
            event_micros=f"_ev{key_index[spec.wm_key]}",
            key=layout.key,
            types=agg_types,
            range_start=range_start,
            range_end=range_end,
        )
        for s, spec in enumerate(specs)
    }
    # Only copies whose smallest event time is below their threshold can hold a late tuple (a copy
    # whose event times the scan did not read may); the late rows come from the pass's rows.
    candidates = bool(reads.may_hold_late().any())
    # Decided by a batch of the pass (not carried): every row, when the pass carries no copies.
    # Said so, Spark tests nothing per row.
    decided = F.col("d_batch") > 0 if carried else F.lit(True)
    late_names = [f.name for f in late_struct.fields]
    late_columns: list[tuple[str, str]] = []  # where the union has a late tuple's values
    late_repeat: str | None = None  # the union's column of how many times a late row occurs (else once)
    late_rows: list[Column] = []  # per key: the row's ``late`` table values where it is late for it, else null
    if candidates and rows_frame is not None:
        for i, key in enumerate(layout.keys):
            values = [
                F.lit(key.name),
                q(layout.origin_id).cast("long"),
                q(layout.sequence_number).cast("long"),
                q(layout.chunk_number).cast("long"),
                *[
                    time_value(rows_frame, name, layout.time_columns[name]) if name in layout.time_columns else q(name)
                    for name in layout.payload
                ],
                F.timestamp_micros(F.col(f"d_thr{i}")),
                late_reason(reads, i),
            ]
            late_rows.append(
                F.when(
                    F.col(f"_late{i}") & decided,
                    F.struct(
                        *[v.alias(n) for n, v in zip(late_names, values, strict=True)],
                        F.col("d_batch").alias("_batch"),
                    ),
                )
            )
    # With one watermark key, the late tuples ride through the first window aggregation as groups
    # of their own (``windows.partials``' ``late``): one read of the rows instead of two.
    late_in_windows = bool(late_rows) and nkeys == 1 and bool(specs)
    # Each batch's counts for the ledger. In a pass of one batch they ride with the first window
    # aggregation's partials: every row goes through its aggregation (the rows that enter no window
    # in one extra group), each count is one more sum there, and only the groups' sums are observed
    # (``DataFrame.observe``). Observing every row instead cost about 1 s of a 10M-tuple pass: Spark
    # observes rows outside its generated code. Without a window aggregation the rows are observed.
    # A pass of several batches groups them by batch in a branch of their own, a second read of the
    # rows' metadata columns (observing every batch's sums on every row cost more: 10M tuples in
    # 20 batches, 24 s against 13 to 15 s; so did grouping the partials by batch as well, whose
    # two consumers Spark did not compute once: docs/performance.md).
    bounded = range_start is not None or range_end is not None
    terms, same = pass_counts.count_terms(specs, spec_cols, key_index, nkeys, bounded=bounded)
    terms = terms if rows_frame is not None else []
    follows = pass_counts.derives(specs, spec_cols, nkeys)
    # A pass of several batches whose batches' counts follow from the pass's totals (``pass_counts.derives``)
    # counts like a pass of one batch, and splits the rows outside every window by batch.
    derive = rows_frame is not None and len(steps) > 1 and follows
    # In a pass that carries no copies, with one key whose late tuples ride in the first window
    # aggregation and whose windows own every on-time tuple they hold (tumbling, no range), the
    # late and on-time counts are the groups' own: a late group counts its late tuples, a window
    # group its on-time members, and every row is the pass's. They are summed over the groups when
    # observed, not over the rows in one more aggregate. In a pass of several batches the rows
    # outside every window are then no late and no on-time tuple of any batch (a row is a window's
    # member exactly when it is on time, and a late group's when it is late), so what
    # ``pass_counts.derived`` takes from a batch's groups outside every window is their rows.
    # The same holds when no copy of the pass can hold a late tuple (no late group, every late count
    # 0), so whether the pass has late rows does not matter.
    from_groups = rows_frame is not None and nkeys == 1 and bool(specs) and not carried and not bounded and follows
    if from_groups:
        # The copy checksum is the one count left over the rows; the rows and tuples are the
        # groups' counts of all their rows, less the punctuation rows' group for the tuples
        # (``windows.partials``' ``tuple_flag``).
        terms = [(name, value) for name, value in terms if name not in ("rows", "tuples", "late0", "on0")]
    terms = pass_counts.packed(terms, int(reads.column("rows").sum()))
    # A counts row: the batch, then its sums; by name, the column holding each on a batch's groups
    # outside every window (``derive``), where they are merged by sum. With the counts from the
    # groups, those groups give their rows as well (``_all``).
    count_columns = {name: f"_c_{name}" for name, _ in terms} | ({"rows": "_all"} if derive and from_groups else {})
    counted = ["batch", *count_columns]
    metrics: Observation | None = None
    observed: DataFrame | None = None  # the rows with the batch's counts attached: in the plan exactly once
    ride: list[Column] = []  # the counts as extra aggregates of the first window aggregation's partials
    if rows_frame is not None and (len(steps) == 1 or derive):
        metrics = Observation(f"pass_{uuid.uuid4().hex[:8]}")
        suffix = str(steps[0].batch) if len(steps) == 1 else pass_counts.PASS
        # Not the carried copies (batch 0): counted when decided.
        mine = F.col("d_batch") == F.lit(steps[0].batch) if len(steps) == 1 and carried else decided
        if specs:
            # ``_first``: a row once, though a sliding window's partials see it once per window.
            ride = [F.sum(F.when(F.col("_first") & mine, value)).alias(f"_c_{name}") for name, value in terms]
        else:
            observed = rows_frame.observe(
                metrics,
                *[F.coalesce(F.sum(F.when(mine, value)), F.lit(0)).alias(f"{name}_{suffix}") for name, value in terms],
            )
    elif rows_frame is not None:
        grouped = (
            rows_frame.where(F.col("d_batch") > 0)
            .groupBy(F.col("d_batch").alias("c_batch"))
            .agg(*[F.coalesce(F.sum(value), F.lit(0)).alias(f"c_{name}") for name, value in terms])
        )
        counts_struct = grouped.schema
        selected, (placed,) = shared.select(
            [(None, [(n, F.col(f"c_{n}"), counts_struct[f"c_{n}"].dataType) for n in counted])]
        )
        branches.append(grouped.select(F.lit(ids["counts"]).alias("_part"), *selected))
        parts["counts"] = Part(
            work.counts_dir, placed, bytes(pa.schema([(n, pa.int64()) for n in counted]).serialize())
        )
    # A window's first batch with a tuple in it (``_fb``), a minimum per window; in a pass of one
    # batch without carried copies it is that batch (one aggregate less per window group).
    first_batch: str | int = "d_batch" if len(steps) > 1 or carried else steps[0].batch
    for s, spec in enumerate(specs):
        i = key_index[spec.wm_key]
        cols = spec_cols[s]
        pieces: list[DataFrame] = []
        previous = work.open_state.get(spec.name)
        spent: list[str] = []  # the first aggregation's columns for the observed counts only
        late_here = late_in_windows and s == 0 and rows_frame is not None  # late tuples ride in these partials
        if previous is not None:
            pieces.append(read_open(spark, previous).withColumn("_fb", F.lit(0).cast("long")))
        if rows_frame is not None and s == 0 and (ride or late_in_windows):
            # Every row through this aggregation: the ledger's counts ride in it (one batch), the
            # late tuples in groups of their own (one key), the other rows in the rest group.
            fresh = partials(
                rows_frame,
                spec,
                cols,
                on_time=F.col(f"_on{i}"),
                first_batch=first_batch,
                extra=ride,
                rest_group=True,
                late=late_rows[0] if late_here else None,
                rest_by="d_batch" if derive else None,
                tuple_flag="_tuple" if from_groups else None,
            )
            if ride:
                assert metrics is not None
                # Sums over the groups, as SQL text: one py4j call each instead of six or seven
                # (``docs/performance.md``: building the query's expressions is mostly py4j calls).
                summed = [(name, f"`_c_{name}`") for name, _ in terms]
                if from_groups:
                    punctuation = f"CASE WHEN window_start = {PUNCTUATION_START}L THEN _all END"
                    summed += [
                        ("rows", "_all"),
                        ("tuples", f"_all - coalesce({punctuation}, 0L)"),
                        ("late0", "_late_n" if late_here else "0L"),
                        ("on0", "_rows"),
                    ]
                fresh = fresh.observe(
                    metrics,
                    *[
                        F.expr(f"CAST(coalesce(sum({value}), 0L) AS BIGINT) AS `{name}_{suffix}`")
                        for name, value in summed
                    ],
                )
                if not derive:
                    # Spent once observed: hidden from the open state, and dropped where the open
                    # windows carried in (which lack them) are merged in.
                    spent = [f"_c_{name}" for name, _ in terms] + (["_all"] if from_groups else [])
                    if previous is not None:
                        fresh = fresh.drop(*spent)
            kept = F.col("_rows") > 0
            if late_here:
                kept = kept | F.col("_late").isNotNull()
            if derive:
                kept = kept | (F.col("_rb") > 0)  # a batch's rows outside every window: its counts
            pieces.append(fresh.where(kept))
        elif rows_frame is not None:
            fresh = partials(rows_frame.where(F.col(f"_on{i}")), spec, cols, first_batch=first_batch)
            pieces.append(fresh.where(F.col("_rows") > 0))
        if not pieces:
            continue
        rest = derive and s == 0  # this aggregation's groups carry each batch's counts
        counts_of = list(count_columns.values()) if rest else []
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
        if previous is not None or carried:
            # Windows ending by the floor were emitted by committed batches (their partials came
            # back with the carried copies' tuples or the open state): never again.
            after_floor = end > F.lit(work.floor[i])
            if late_here:
                after_floor = after_floor | F.col("_late").isNotNull()
            if rest:
                after_floor = after_floor | F.col("_rb").isNotNull()
            merged = merged.where(after_floor)
        due = due_part(end, steps, i, {step.batch: ids[f"windows:{s}:{step.batch}"] for step in steps})
        if len(steps) > 1:
            # Computed once per row: a pass of many batches makes it a long ``CASE``, and every shared
            # value column tests it. A pass of one batch tests one window end, in the branch's own
            # projection (one analysis of the plan less).
            merged = merged.withColumn("_due", due)
            due = F.col("_due")
        hidden = ("_fb", "_late", "_late_n", "_rb", "_due", *counts_of, *spent)
        merged_struct = merged.schema  # the types of the values below (no projection analysed for them)
        state_fields = [f for f in merged_struct.fields if f.name not in hidden]
        part = F.coalesce(due, F.lit(ids[f"open:{s}"]))
        window_row, constants = window_values(spec, cols, columns, merged_struct["key"].dataType)
        kinds: list[tuple[Column | None, Sequence[Value]]] = [
            (due.isNotNull(), window_row),
            (due.isNull(), fields_of(StructType(state_fields))),
        ]
        if late_here:
            # A late tuple's group is one row, with how many times the tuple occurs (``_late_n``):
            # the sink writes it that many times (``Part.repeat``), so no row is repeated in Spark.
            is_late = F.col("_late").isNotNull()
            part = F.when(is_late, batch_part(F.col("_late._batch"), late_part)).otherwise(part)
            times: Value = (_TIMES, F.col("_late_n"), merged_struct["_late_n"].dataType)
            kinds.insert(0, (is_late, [*_late_values(merged_struct, late_names, "_late"), times]))
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
                        *[(n, F.col(c), merged_struct[c].dataType) for n, c in count_columns.items()],
                    ],
                ),
            )
        selected, by_kind = shared.select(kinds)
        branch = merged.select(
            part.alias("_part"),
            F.col("_owned"),
            # The sink counts windows by the first batch with a tuple in them (0: carried in), so
            # that each batch's open windows are known without another pass over them.
            F.col("_fb").alias("_first"),
            *selected,
        )
        branches.append(branch)
        if rest:
            parts["counts"] = Part(
                work.counts_dir, by_kind.pop(0), bytes(pa.schema([(n, pa.int64()) for n in counted]).serialize())
            )
        if late_here:
            *late_columns, (late_repeat, _) = by_kind.pop(0)  # the count is the last value
        window_columns, state_columns = by_kind
        for step in steps:
            parts[f"windows:{s}:{step.batch}"] = Part(
                step.windows_dir,
                window_columns,
                _arrow_schema(windows_struct),
                tuple(constants.items()),
            )
        parts[f"open:{s}"] = Part(work.state_dirs[spec.name], state_columns, _arrow_schema(StructType(state_fields)))

    if observed is not None:
        # No window aggregation reads the rows: count them in a branch of their own.
        branches.append(
            observed.groupBy().agg(F.count(F.lit(1)).alias("_owned")).select(F.lit(-1).alias("_part"), "_owned")
        )

    if late_rows:
        if not late_in_windows:
            # A second read of the rows (several keys: a tuple late for one key can be on time for another).
            assert rows_frame is not None  # late rows are made from it
            for late in late_rows:
                tuples = rows_frame.where(late.isNotNull()).select(late.alias("_l"))
                selected, (placed,) = shared.select([(None, _late_values(tuples.schema, late_names, "_l"))])
                late_columns = list(placed)  # a row per late tuple: each written once
                branches.append(tuples.select(batch_part(F.col("_l._batch"), late_part).alias("_part"), *selected))
        for step in steps:
            parts[f"late:{step.batch}"] = Part(
                step.late_dir, tuple(late_columns), _arrow_schema(late_struct), repeat=late_repeat
            )

    if not branches:
        return {step.batch: WorkResult(specs={spec.name: SpecCounts() for spec in specs}) for step in steps}
    union = branches[0]
    for frame in branches[1:]:
        union = union.unionByName(frame, allowMissingColumns=True)
    with _static_plan(spark):
        written = [Written.from_row(r.asDict()) for r in union.mapInArrow(sink(parts, ids), RESULT_SCHEMA).collect()]
    keep_only([p.directory for p in parts.values()], written)
    observed_counts: dict[str, Any] = dict(metrics.get) if metrics is not None else {}
    by_batch: dict[str, Any] = {}  # the counts rows: per batch, its sums (``derive``: of its rows outside every window)
    for w in written:
        if w.part == "counts":
            for row in pq.read_table(w.file).to_pylist():
                for name, value in row.items():
                    at = f"{name}_{row['batch']}"
                    by_batch[at] = by_batch.get(at, 0) + value if name != "batch" else row["batch"]
    shutil.rmtree(work.counts_dir, ignore_errors=True)

    def taken_apart(raw: Mapping[str, Any]) -> dict[str, Any]:
        return pass_counts.filled(pass_counts.unpacked(raw), same)

    if derive:  # each batch's counts from the pass's totals and its rows outside every window
        counts = pass_counts.derived(work, specs, written, taken_apart(observed_counts), taken_apart(by_batch))
    else:
        counts = taken_apart(observed_counts | by_batch)
    return pass_counts.results(work, specs, nkeys, written, counts)


@contextmanager
def _static_plan(spark: SparkSession) -> Iterator[None]:
    """Adaptive execution off for the pass's action, as it was after it.

    The pass's plan is known before it starts: the driver decided every copy, the decisions are a
    broadcast (``F.broadcast``) and the rest is one aggregation into one writer. Adaptive execution
    re-planned the whole query after each of its stages (the broadcast, the aggregation's map side)
    and had nothing to change: 0.1 to 0.15 s of a 10M-tuple pass (docs/performance.md). Without it
    the shuffle has ``spark.sql.shuffle.partitions`` partitions exactly (one per core by default,
    counted now: ``replay.engine.spark.follow_cores``), and the observed counts of a stage that
    produced no rows stay (adaptive execution replaced such a stage by an empty relation, its
    metrics with it)."""
    follow_cores(spark)  # one shuffle partition per core the cluster has now
    before = spark.conf.get(_ADAPTIVE, None)
    spark.conf.set(_ADAPTIVE, "false")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(_ADAPTIVE)
        else:
            spark.conf.set(_ADAPTIVE, before)


def _late_values(struct: StructType, names: Sequence[str], column: str) -> list[Value]:
    """A late tuple's values in the ``late`` table's order, from the struct column ``column`` of a
    frame of ``struct`` (which also carries the batch that decided the tuple)."""
    from pyspark.sql.types import StructType

    late = struct[column].dataType
    assert isinstance(late, StructType)
    return fields_of(StructType([late[n] for n in names]), f"{column}.")


def _arrow_schema(struct: StructType) -> bytes:
    from pyspark.sql.pandas.types import to_arrow_schema

    return bytes(to_arrow_schema(struct, timezone="UTC").serialize())


def read_open(spark: SparkSession, directory: str) -> DataFrame:
    """The open windows a batch carried out, read with the schema of their own files (no Spark
    schema-inference job)."""
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_schema

    first = min(p for p in Path(directory).iterdir() if p.suffix == ".parquet")
    return spark.read.schema(from_arrow_schema(pq.read_schema(first))).parquet(directory)
