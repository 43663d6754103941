"""One micro-batch's tuple work in Spark: lateness, late rows, window partials, emission.

The driver decides everything from buffer metadata (``replay.progress``): which
buffer copies the batch reads and the lateness threshold of each one's tuples per
key. This module turns that into Spark work over the archive's rows, without a
Python UDF and without a tuple reaching the driver:

- the batch's copies join the rows by identity; a buffer with discarded copies
  also by file, and by row range when a copy shares its file, so a discarded
  duplicate copy is never read as data;
- per key, a tuple is late (``event_time < threshold``), on time, or has no event
  time for the key (or, in a backfill, one outside the range);
- late tuples are written to the ``late`` table; on-time ones are reduced to
  window partials and merged with the open windows carried from the previous batch;
- windows whose end the effective watermark has reached are written to the
  ``windows`` table, the others become the next open-window state.

What comes back to the driver is small: the batch's row and tuple counts, a
checksum of its copy ids and per-key late/on-time counts (which the ledger
checks), and per window aggregation the number of windows emitted and kept open
and the tuples they own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from replay.archive import ArchiveLayout
from replay.buffers import Buffer, time_micros, time_value
from replay.config import JobConfig, WindowSpec
from replay.progress import Decision
from replay.windows import WindowColumns, aggregated_types, finalize, merge, output_columns, partials

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["BatchWork", "Counts", "SpecCounts", "WorkResult", "buffer_copy_id", "copy_id", "run_batch"]

_MASK63 = (1 << 63) - 1


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
    """Do one batch's tuple work in Spark (see the module docstring); return the small summary.

    One pass over the batch's rows computes the first window aggregation's partials and the
    batch's counts together; each further window aggregation is one more pass, and the late
    rows (when there are any) one more.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    # Readers outside Spark (pyarrow, the digest) expect standard UTC microsecond timestamps, not INT96.
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    nkeys = len(layout.keys)
    key_index = {k.name: i for i, k in enumerate(layout.keys)}
    specs: list[WindowSpec] = list(config.windows)
    agg_types = aggregated_types(specs, schema)
    columns = output_columns(specs, agg_types)
    range_start, range_end = work.range

    def cols_for(spec: WindowSpec) -> WindowColumns:
        return WindowColumns(
            event_micros=f"_ev{key_index[spec.wm_key]}",
            key=layout.key,
            types=agg_types,
            range_start=range_start,
            range_end=range_end,
        )

    def as_int(flag: Column) -> Column:
        return F.count(F.when(F.col("_first") & flag, 1))

    def build(reads: Sequence[tuple[Buffer, Decision]]) -> DataFrame:
        """The rows of ``reads`` with their decision, event times in microseconds and per-key flags."""
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

    joined = build(work.reads) if work.reads else None
    counts: Counts | None = None

    spec_counts: dict[str, SpecCounts] = {}
    emitted_frames: list[DataFrame] = []
    persisted: list[DataFrame] = []
    for s, spec in enumerate(specs):
        i = key_index[spec.wm_key]
        cols = cols_for(spec)
        parts: list[DataFrame] = []
        previous = work.open_state.get(spec.name)
        if previous is not None:
            parts.append(spark.read.parquet(previous))
        windowed = 0
        if joined is not None:
            extra: list[Column] = []
            if s == 0:
                # The batch's counts ride along with the first aggregation's pass over the rows.
                lo = F.col("d_cid").bitwiseAND(F.lit(0xFFFFFFFF))
                hi = F.shiftrightunsigned(F.col("d_cid"), 32)
                extra = [
                    F.count(F.when(F.col("_first"), 1)).alias("_c_rows"),
                    as_int(F.col("_tuple")).alias("_c_tuples"),
                    F.sum(F.when(F.col("_first"), lo)).alias("_c_cid_lo"),
                    F.sum(F.when(F.col("_first"), hi)).alias("_c_cid_hi"),
                ]
                for k in range(nkeys):
                    extra += [as_int(F.col(f"_{name}{k}")).alias(f"_c_{name}{k}") for name in ("late", "on", "out")]
            source = joined if s == 0 else joined.where(F.col(f"_on{i}"))
            fresh = partials(source, spec, cols, on_time=F.col(f"_on{i}"), extra=extra)
            fresh = fresh.persist(StorageLevel.MEMORY_AND_DISK)
            persisted.append(fresh)
            sums = [F.sum("_owned").alias("owned")]
            if s == 0:
                sums += [F.sum(c).alias(c) for c in fresh.columns if c.startswith("_c_")]
            total = fresh.agg(*sums).collect()[0]
            windowed = int(total["owned"] or 0)
            if s == 0:
                counts = Counts(
                    rows=int(total["_c_rows"] or 0),
                    tuples=int(total["_c_tuples"] or 0),
                    cid_lo=int(total["_c_cid_lo"] or 0),
                    cid_hi=int(total["_c_cid_hi"] or 0),
                    late=tuple(int(total[f"_c_late{k}"] or 0) for k in range(nkeys)),
                    on_time=tuple(int(total[f"_c_on{k}"] or 0) for k in range(nkeys)),
                    outside=tuple(int(total[f"_c_out{k}"] or 0) for k in range(nkeys)),
                )
            parts.append(fresh.where(F.col("_rows") > 0).drop(*[c for c in fresh.columns if c.startswith("_c_")]))
        if not parts:
            spec_counts[spec.name] = SpecCounts()
            continue
        if len(parts) == 1 and previous is None:
            merged = parts[0]  # nothing carried in: this batch's partials are already one row per window
        else:
            merged = merge(parts, spec, cols).persist(StorageLevel.MEMORY_AND_DISK)
            persisted.append(merged)
        due = F.col("window_start") + F.lit(spec.size) <= F.lit(work.effective[i])
        stats = {
            bool(r["due"]): r
            for r in merged.groupBy(due.alias("due"))
            .agg(F.count(F.lit(1)).alias("n"), F.sum("_owned").alias("owned"))
            .collect()
        }
        emitted, still_open = stats.get(True), stats.get(False)
        open_dir = None
        if still_open is not None:
            open_dir = work.state_dirs[spec.name]
            merged.where(~due).write.parquet(open_dir)
        if emitted is not None:
            emitted_frames.append(finalize(merged.where(due), spec, cols, columns))
        spec_counts[spec.name] = SpecCounts(
            windowed=windowed,
            emitted=int(emitted["n"]) if emitted else 0,
            emitted_owned=int(emitted["owned"]) if emitted else 0,
            open=int(still_open["n"]) if still_open else 0,
            open_owned=int(still_open["owned"]) if still_open else 0,
            open_dir=open_dir,
        )

    late_written = False
    if counts is not None and any(n > 0 for n in counts.late):
        # Only copies whose smallest event time is below their threshold can hold a late tuple.
        candidates = [
            (buf, d)
            for buf, d in work.reads
            if any(lo is not None and lo < thr for lo, thr in zip(buf.min_event, d.thresholds, strict=True))
        ]
        source = build(candidates)
        late_frames = []
        for i, key in enumerate(layout.keys):
            late_frames.append(
                source.where(F.col(f"_late{i}")).select(
                    F.lit(key.name).alias("wm_key"),
                    _q(layout.origin_id).cast("long").alias("origin_id"),
                    _q(layout.sequence_number).cast("long").alias("sequence_number"),
                    _q(layout.chunk_number).cast("long").alias("chunk_number"),
                    *[
                        time_value(source, name, layout.time_columns[name]).alias(name)
                        if name in layout.time_columns
                        else _q(name)
                        for name in layout.payload
                    ],
                    F.timestamp_micros(F.col(f"d_thr{i}")).alias("violated_watermark"),
                    F.col(f"d_reason{i}").alias("reason"),
                )
            )
        late = late_frames[0]
        for frame in late_frames[1:]:
            late = late.unionByName(frame)
        late.write.parquet(work.late_dir)
        late_written = True

    windows_written = False
    if emitted_frames:
        out = emitted_frames[0]
        for frame in emitted_frames[1:]:
            out = out.unionByName(frame)
        out.write.parquet(work.windows_dir)
        windows_written = True
    for frame in persisted:
        frame.unpersist()
    return WorkResult(counts=counts, specs=spec_counts, windows_written=windows_written, late_written=late_written)
