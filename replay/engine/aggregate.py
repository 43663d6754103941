"""One micro-batch's tuple work in Spark: lateness, late rows, window partials, emission.

The driver decides everything from buffer metadata (``replay.core.progress``): which
buffer copies the batch reads and the lateness threshold of each one's tuples per
key. This module turns that into one Spark action over the archive's rows, without
a tuple reaching the driver:

- the batch's rows: when the batch needs less than half of the rows of the files
  it touches, Spark tasks read exactly its copies' row ranges with their
  decisions attached (``replay.engine.slices``); otherwise Spark's Parquet reader reads
  the files and the copies join the rows by identity (a buffer with discarded
  copies also by file, and by row range when a copy shares its file). Either way
  a discarded duplicate copy is never read as data;
- per key, a tuple is late (``event_time < threshold``), on time, or has no event
  time for the key (or, in a backfill, one outside the range);
- late tuples are written to the ``late`` table; on-time ones are reduced to
  window partials and merged with the open windows carried from the previous batch;
- windows whose end the effective watermark has reached are written to the
  ``windows`` table, the others become the next open-window state;
- all of it is one union, written by one ``mapInArrow`` (``replay.engine.sink``) whose
  collected result is the batch's only Spark action; the batch's counts ride
  along as observed metrics (``DataFrame.observe``).

What comes back to the driver is small: the batch's row and tuple counts, a
checksum of its copy ids and per-key late/on-time counts (which the ledger
checks), and per window aggregation the number of windows emitted and kept open
and the tuples they own.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replay.core.config import JobConfig, WindowSpec
from replay.core.progress import Decision
from replay.engine.archive import ArchiveLayout
from replay.engine.buffers import Buffer, time_micros, time_value
from replay.engine.schemas import table_structs
from replay.engine.sink import RESULT_SCHEMA, Part, Written, keep_only, sink
from replay.engine.slices import Slice, file_rows, read_slices
from replay.engine.windows import (
    WindowColumns,
    aggregated_types,
    final_columns,
    merge,
    output_columns,
    partials,
    window_end,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["BatchWork", "Counts", "SpecCounts", "WorkResult", "buffer_copy_id", "copy_id", "run_batch"]

_MASK63 = (1 << 63) - 1
_KEEP_EMPTY_STAGES = "org.apache.spark.sql.execution.adaptive.AQEPropagateEmptyRelation"


def copy_id(origin: int, sequence: int, chunk: int, file: str, row_start: int) -> int:
    """A 63-bit hash naming one copy of a buffer (the ledger XORs these)."""
    digest = hashlib.blake2b(f"{origin}/{sequence}/{chunk}/{file}/{row_start}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & _MASK63


def buffer_copy_id(buf: Buffer) -> int:
    return copy_id(buf.origin, buf.sequence, buf.chunk, buf.file, buf.row_start)


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchWork:
    """What one batch must do in Spark.

    ``reads``: the copies whose tuples are decided in this batch, with their decision.
    ``effective``: ``E_k`` per key (layout order) after the batch; windows ending by it are emitted.
    ``open_state``: per window name, the directory of the open windows carried in, or ``None``.
    ``windows_dir``/``late_dir``: where this batch writes its rows; ``state_dirs``: per window
    name, where it writes the open windows it carries out. ``range``: a backfill's
    ``[start, end)`` in microseconds. ``checked``: identities with other (discarded) copies in
    the archive, with those copies' files. Rows are matched to a copy by identity alone, by
    identity and file when the other copies are in other files, and by file and row range
    when one shares the copy's file.
    """

    reads: Sequence[tuple[Buffer, Decision]]
    effective: tuple[int, ...]
    open_state: Mapping[str, str | None]
    windows_dir: str
    late_dir: str
    state_dirs: Mapping[str, str]
    range: tuple[int | None, int | None] = (None, None)
    checked: Mapping[tuple[int, int, int], frozenset[str]] = field(default_factory=dict)

    def check_level(self, buf: Buffer) -> int:
        """0: rows match ``buf`` by identity; 1: by identity and file; 2: and by row range too."""
        others = self.checked.get(buf.identity)
        if not others:
            return 0
        return 2 if buf.file in others else 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Counts:
    """What Spark saw of the batch's copies, summed: rows, tuples, a checksum of the copy ids
    (the sum over rows of each row's copy id, split in 32-bit halves), and per key the late,
    on-time and outside-range tuples."""

    rows: int
    tuples: int
    cid_lo: int
    cid_hi: int
    late: tuple[int, ...]
    on_time: tuple[int, ...]
    outside: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class SpecCounts:
    """Windows of one aggregation after the batch: emitted now, still open, and the tuples they own;
    ``windowed``: the batch's on-time tuples that entered one of its windows."""

    windowed: int = 0
    emitted: int = 0
    emitted_owned: int = 0
    open: int = 0
    open_owned: int = 0
    open_dir: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkResult:
    counts: Counts | None = None
    specs: dict[str, SpecCounts] = field(default_factory=dict)
    windows_written: bool = False
    late_written: bool = False
    late_rows: int = 0


def _decision_frame(
    spark: SparkSession,
    reads: Sequence[tuple[Buffer, Decision]],
    work: BatchWork,
    spark_paths: Mapping[str, str],
    nkeys: int,
) -> DataFrame:
    """One row per copy read, built as an Arrow table (no per-row Python type checks)."""
    import pyarrow as pa

    columns: dict[str, pa.Array] = {
        "d_file": pa.array([spark_paths.get(buf.file, buf.file) for buf, _ in reads], pa.string()),
        "d_origin": pa.array([buf.origin for buf, _ in reads], pa.int64()),
        "d_sequence": pa.array([buf.sequence for buf, _ in reads], pa.int64()),
        "d_chunk": pa.array([buf.chunk for buf, _ in reads], pa.int64()),
        "d_lo": pa.array([buf.row_start for buf, _ in reads], pa.int64()),
        "d_hi": pa.array([buf.row_start + buf.rows - 1 for buf, _ in reads], pa.int64()),
        "d_cid": pa.array([buffer_copy_id(buf) for buf, _ in reads], pa.int64()),
        "d_check": pa.array([work.check_level(buf) for buf, _ in reads], pa.int32()),
    }
    for i in range(nkeys):
        columns[f"d_thr{i}"] = pa.array([d.thresholds[i] for _, d in reads], pa.int64())
        columns[f"d_reason{i}"] = pa.array([d.reasons[i] for _, d in reads], pa.string())
    return spark.createDataFrame(pa.table(columns))


def _few_rows(reads: Sequence[tuple[Buffer, Decision]]) -> bool:
    """Whether the batch needs less than half of the rows of the (local) files it reads."""
    needed = sum(buf.rows for buf, _ in reads)
    total = 0
    for file in {buf.file for buf, _ in reads}:
        rows = file_rows(file)
        if rows is None:
            return False
        total += rows
    return needed * 2 < total


def _sliced(spark: SparkSession, reads: Sequence[tuple[Buffer, Decision]], schema: StructType, nkeys: int) -> DataFrame:
    """The rows of ``reads`` read by their row ranges (``replay.engine.slices``), decision columns attached."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    fields = [StructField("d_cid", LongType())]
    for i in range(nkeys):
        fields += [StructField(f"d_thr{i}", LongType()), StructField(f"d_reason{i}", StringType())]
    slices: list[Slice] = []
    for buf, d in reads:
        values: list[Any] = [buffer_copy_id(buf)]
        for i in range(nkeys):
            values += [d.thresholds[i], d.reasons[i]]
        slices.append((buf.file, buf.row_start, buf.rows, tuple(values)))
    return read_slices(spark, slices, schema, StructType(fields))


def _joined(
    spark: SparkSession,
    reads: Sequence[tuple[Buffer, Decision]],
    work: BatchWork,
    layout: ArchiveLayout,
    schema: StructType,
    spark_paths: Mapping[str, str],
    nkeys: int,
) -> DataFrame:
    """The rows of ``reads`` read by Spark's Parquet reader and joined to the batch's decisions."""
    from pyspark.sql import functions as F

    files = sorted({spark_paths.get(buf.file, buf.file) for buf, _ in reads})
    raw = spark.read.schema(schema).parquet(*files)
    decisions = _decision_frame(spark, reads, work, spark_paths, nkeys)
    on_identity = (
        (_q(layout.origin_id).cast("long") == F.col("d_origin"))
        & (_q(layout.sequence_number).cast("long") == F.col("d_sequence"))
        & (_q(layout.chunk_number).cast("long") == F.col("d_chunk"))
    )
    # A buffer with discarded copies elsewhere is matched by file too; when a copy shares its
    # file, by row range as well. Row positions are read only then.
    level = max((work.check_level(buf) for buf, _ in reads), default=0)
    located: list[Column] = []
    if level >= 1:
        located.append(F.col("_metadata.file_path").alias("_file"))
        same_copy = F.col("_file") == F.col("d_file")
    if level == 2:
        located.append(F.col("_metadata.row_index").alias("_row"))
        same_copy = same_copy & ((F.col("d_check") == 1) | F.col("_row").between(F.col("d_lo"), F.col("d_hi")))
    joined = raw.select("*", *located).join(F.broadcast(decisions), on_identity)
    if located:
        joined = joined.where((F.col("d_check") == 0) | same_copy)
    return joined


def _q(name: str) -> Column:
    from pyspark.sql import functions as F

    return F.col(f"`{name}`")


def run_batch(
    spark: SparkSession,
    *,
    config: JobConfig,
    layout: ArchiveLayout,
    schema: StructType,
    spark_paths: Mapping[str, str],
    work: BatchWork,
) -> WorkResult:
    """Do one batch's tuple work in Spark (see the module docstring) in one Spark action.

    Every destination's rows (per window aggregation its due and its open windows, and the
    late tuples) are branches of one union, written by ``replay.engine.sink`` in one job; the batch's
    counts and each aggregation's windowed tuples ride along as observed metrics.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    if "ns" in layout.time_columns.values():
        spark.conf.set("spark.sql.legacy.parquet.nanosAsLong", "true")
    # Adaptive execution replaces a stage that produced no rows by an empty relation, and the
    # observed metrics computed in that stage go with it: keep the stage (it is empty anyway).
    spark.conf.set("spark.sql.adaptive.optimizer.excludedRules", _KEEP_EMPTY_STAGES)
    nkeys = len(layout.keys)
    key_index = {k.name: i for i, k in enumerate(layout.keys)}
    specs: list[WindowSpec] = list(config.windows)
    agg_types = aggregated_types(specs, schema)
    columns = output_columns(specs, agg_types)
    windows_struct, late_struct = table_structs(config, schema, layout)
    range_start, range_end = work.range

    def build(reads: Sequence[tuple[Buffer, Decision]]) -> DataFrame:
        """The rows of ``reads`` with their decision, event times in microseconds and per-key flags."""
        joined = _sliced(spark, reads, schema, nkeys) if _few_rows(reads) else None
        if joined is None:
            joined = _joined(spark, reads, work, layout, schema, spark_paths, nkeys)
        raw = joined
        punctuation = _q(layout.key).isNull()
        for i, key in enumerate(layout.keys):
            joined = joined.withColumn(f"_ev{i}", time_micros(raw, key.event_time, layout.time_columns[key.event_time]))
            punctuation = punctuation & F.col(f"_ev{i}").isNull()
        flags: list[Column] = []
        for i in range(nkeys):
            ev = F.col(f"_ev{i}")
            inside = ev.isNotNull()
            if range_start is not None:
                inside = inside & (ev >= F.lit(range_start))
            if range_end is not None:
                inside = inside & (ev < F.lit(range_end))
            flags += [
                (inside & (ev < F.col(f"d_thr{i}"))).alias(f"_late{i}"),
                (inside & (ev >= F.col(f"d_thr{i}"))).alias(f"_on{i}"),
                (ev.isNotNull() & ~inside).alias(f"_out{i}"),
            ]
        return joined.select("*", (~punctuation).alias("_tuple"), *flags)

    branches: list[DataFrame] = []
    parts: dict[str, Part] = {}
    tag = uuid.uuid4().hex[:8]  # observation names are unique per batch
    rows_frame = build(work.reads) if work.reads else None
    observed: DataFrame | None = None  # the rows with the batch's counts attached: in the plan exactly once
    batch_metrics: Observation | None = None
    if rows_frame is not None:
        batch_metrics = Observation(f"batch_{tag}")
        lo = F.col("d_cid").bitwiseAND(F.lit(0xFFFFFFFF))
        hi = F.shiftrightunsigned(F.col("d_cid"), 32)
        flag_counts = [
            F.count(F.when(F.col(f"_{name}{k}"), 1)).alias(f"{name}{k}")
            for k in range(nkeys)
            for name in ("late", "on", "out")
        ]
        observed = rows_frame.observe(
            batch_metrics,
            F.count(F.lit(1)).alias("rows"),
            F.count(F.when(F.col("_tuple"), 1)).alias("tuples"),
            F.coalesce(F.sum(lo), F.lit(0)).alias("cid_lo"),
            F.coalesce(F.sum(hi), F.lit(0)).alias("cid_hi"),
            *flag_counts,
        )

    spec_metrics: dict[int, Observation] = {}
    final_names = ["window", "wm_key", "key", "window_start", "window_end", *[name for name, _ in columns]]
    for s, spec in enumerate(specs):
        i = key_index[spec.wm_key]
        cols = WindowColumns(
            event_micros=f"_ev{i}", key=layout.key, types=agg_types, range_start=range_start, range_end=range_end
        )
        pieces: list[DataFrame] = []
        previous = work.open_state.get(spec.name)
        if previous is not None:
            pieces.append(read_open(spark, previous))
        if rows_frame is not None:
            source, observed = (observed, None) if observed is not None else (rows_frame, None)
            spec_metrics[s] = Observation(f"windowed{s}_{tag}")
            fresh = partials(source.where(F.col(f"_on{i}")), spec, cols).where(F.col("_rows") > 0)
            pieces.append(fresh.observe(spec_metrics[s], F.coalesce(F.sum("_owned"), F.lit(0)).alias("owned")))
        if not pieces:
            continue
        merged = pieces[0] if len(pieces) == 1 and previous is None else merge(pieces, spec, cols)
        due = window_end(F.col("window_start"), spec) <= F.lit(work.effective[i])
        state_names = list(merged.columns)
        branch = merged.select(
            F.when(due, F.lit(f"windows:{s}")).otherwise(F.lit(f"open:{s}")).alias("_part"),
            F.col("_owned"),
            *[F.col(c).alias(f"s{s}_{c}") for c in state_names],
            *[e.alias(f"w_{name}") for name, e in zip(final_names, final_columns(spec, cols, columns), strict=True)],
        )
        branches.append(branch)
        parts[f"windows:{s}"] = Part(
            work.windows_dir, tuple((f"w_{n}", n) for n in final_names), _arrow_schema(windows_struct)
        )
        open_struct = merged.schema
        parts[f"open:{s}"] = Part(
            work.state_dirs[spec.name], tuple((f"s{s}_{c}", c) for c in state_names), _arrow_schema(open_struct)
        )

    if observed is not None:
        # No window aggregation reads the rows: count them in a branch of their own.
        branches.append(
            observed.groupBy().agg(F.count(F.lit(1)).alias("_owned")).select(F.lit("_counted").alias("_part"), "_owned")
        )

    # Only copies whose smallest event time is below their threshold can hold a late tuple (a copy
    # whose event times the scan did not read may); the late rows come from the batch's rows.
    candidates = [
        (buf, d)
        for buf, d in work.reads
        if buf.tuples and any(lo is None or lo < thr for lo, thr in zip(buf.min_event, d.thresholds, strict=True))
    ]
    if candidates and rows_frame is not None:
        source = rows_frame
        late_names = [f.name for f in late_struct.fields]
        for i, key in enumerate(layout.keys):
            values = [
                F.lit(key.name),
                _q(layout.origin_id).cast("long"),
                _q(layout.sequence_number).cast("long"),
                _q(layout.chunk_number).cast("long"),
                *[
                    time_value(source, name, layout.time_columns[name]) if name in layout.time_columns else _q(name)
                    for name in layout.payload
                ],
                F.timestamp_micros(F.col(f"d_thr{i}")),
                F.col(f"d_reason{i}"),
            ]
            branches.append(
                source.where(F.col(f"_late{i}")).select(
                    F.lit("late").alias("_part"),
                    *[v.alias(f"l_{n}") for n, v in zip(late_names, values, strict=True)],
                )
            )
        parts["late"] = Part(work.late_dir, tuple((f"l_{n}", n) for n in late_names), _arrow_schema(late_struct))

    if not branches:
        return WorkResult(specs={spec.name: SpecCounts() for spec in specs})
    union = branches[0]
    for frame in branches[1:]:
        union = union.unionByName(frame, allowMissingColumns=True)
    written = [
        Written(r["part"], r["file"], int(r["rows"]), int(r["owned"]))
        for r in union.mapInArrow(sink(parts), RESULT_SCHEMA).collect()
    ]
    keep_only([p.directory for p in parts.values()], written)

    totals: dict[str, tuple[int, int]] = {}
    for w in written:
        rows, owned = totals.get(w.part, (0, 0))
        totals[w.part] = (rows + w.rows, owned + w.owned)
    counts: Counts | None = None
    if batch_metrics is not None:
        m = batch_metrics.get
        counts = Counts(
            rows=int(m["rows"]),
            tuples=int(m["tuples"]),
            cid_lo=int(m["cid_lo"]),
            cid_hi=int(m["cid_hi"]),
            late=tuple(int(m[f"late{k}"]) for k in range(nkeys)),
            on_time=tuple(int(m[f"on{k}"]) for k in range(nkeys)),
            outside=tuple(int(m[f"out{k}"]) for k in range(nkeys)),
        )
    spec_counts: dict[str, SpecCounts] = {}
    for s, spec in enumerate(specs):
        emitted, emitted_owned = totals.get(f"windows:{s}", (0, 0))
        still_open, open_owned = totals.get(f"open:{s}", (0, 0))
        spec_counts[spec.name] = SpecCounts(
            windowed=int(spec_metrics[s].get["owned"]) if s in spec_metrics else 0,
            emitted=emitted,
            emitted_owned=emitted_owned,
            open=still_open,
            open_owned=open_owned,
            open_dir=work.state_dirs[spec.name] if still_open else None,
        )
    late_rows = totals.get("late", (0, 0))[0]
    return WorkResult(
        counts=counts,
        specs=spec_counts,
        windows_written=any(totals.get(f"windows:{s}", (0, 0))[0] for s in range(len(specs))),
        late_written=late_rows > 0,
        late_rows=late_rows,
    )


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
