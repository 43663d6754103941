"""A pass's rows: the archive rows of the copies it reads, each with its copy's decision (``d_*``
columns: the batch that decided it, its thresholds and reasons per key, its copy id), its
event times in microseconds (``_ev<k>``) and per key whether it is late, on time or outside a
backfill range (``_late<k>``, ``_on<k>``, ``_out<k>``; ``_tuple``: not a punctuation row).

When the pass needs less than half of the rows of the files it touches, Spark tasks read
exactly its copies' row ranges with the decisions attached (``replay.engine.slices``);
otherwise Spark's Parquet reader reads the files and the copies join the rows by identity (a
buffer with discarded copies also by file, and by row range when a copy shares its file).
Either way a discarded duplicate copy is never read as data.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from replay.engine.archive import ArchiveLayout
from replay.engine.archive_rows import read_parquet, time_micros
from replay.engine.buffers import release_arrow_memory
from replay.engine.passes import PassWork, Read, buffer_copy_id
from replay.engine.slices import Slice, file_rows, read_slices

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["pass_rows", "q"]


def _packing(reads: Sequence[Read]) -> tuple[int, int, int] | None:
    """Bit widths ``(origin, sequence, chunk)`` that pack every read copy's identity into one
    non-negative long (``origin << (s + c) | sequence << c | chunk``), or ``None`` when they do
    not fit in 63 bits. Spark joins on one long key (a ``LongHashedRelation``) faster than on
    three columns."""
    if not reads:
        return None
    origin = max(r.buf.origin for r in reads).bit_length()
    sequence = max(r.buf.sequence for r in reads).bit_length()
    chunk = max(r.buf.chunk for r in reads).bit_length()
    if min(min(r.buf.origin, r.buf.sequence, r.buf.chunk) for r in reads) < 0 or origin + sequence + chunk > 63:
        return None
    return origin, sequence, chunk


def _pack(origin: int, sequence: int, chunk: int, bits: tuple[int, int, int]) -> int:
    """A copy's identity packed with the widths of ``_packing`` (the decision table's ``d_id``)."""
    _, s_bits, c_bits = bits
    return (origin << (s_bits + c_bits)) | (sequence << c_bits) | chunk


def _packed(origin: Column, sequence: Column, chunk: Column, bits: tuple[int, int, int]) -> Column:
    """``_pack`` as a Spark expression over a row's identity columns; null for a row whose
    identity lies outside the bit widths (it matches no copy of the pass, whose identities all
    fit)."""
    from pyspark.sql import functions as F

    o_bits, s_bits, c_bits = bits
    o, s, c = origin.cast("long"), sequence.cast("long"), chunk.cast("long")
    fits = o.between(0, (1 << o_bits) - 1) & s.between(0, (1 << s_bits) - 1) & c.between(0, (1 << c_bits) - 1)
    return F.when(fits, F.shiftleft(o, s_bits + c_bits).bitwiseOR(F.shiftleft(s, c_bits)).bitwiseOR(c))


def _decision_frame(
    spark: SparkSession,
    reads: Sequence[Read],
    work: PassWork,
    spark_paths: Mapping[str, str],
    nkeys: int,
    bits: tuple[int, int, int] | None,
    level: int,
) -> DataFrame:
    """One row per copy read, built as an Arrow table (no per-row Python type checks, and no
    Python list per integer column: each is filled straight into a numpy array), with the columns
    the join uses only: with ``bits`` (``_packing``), its packed identity, else its identity's
    three columns; the copy's file from check ``level`` 1, its row range at level 2 (see
    ``PassWork.check_level``)."""
    import numpy as np
    import pyarrow as pa

    n = len(reads)

    def longs(values: Iterator[int]) -> pa.Array:
        return pa.array(np.fromiter(values, dtype=np.int64, count=n))

    columns: dict[str, pa.Array] = {}
    if level >= 1:
        columns["d_file"] = pa.array([spark_paths.get(r.buf.file, r.buf.file) for r in reads], pa.string())
    if bits is None:
        columns["d_origin"] = longs(r.buf.origin for r in reads)
        columns["d_sequence"] = longs(r.buf.sequence for r in reads)
        columns["d_chunk"] = longs(r.buf.chunk for r in reads)
    if level == 2:
        columns["d_lo"] = longs(r.buf.row_start for r in reads)
        columns["d_hi"] = longs(r.buf.row_start + r.buf.rows - 1 for r in reads)
    columns["d_cid"] = longs(buffer_copy_id(r.buf) for r in reads)
    if level >= 1:
        columns["d_check"] = pa.array(np.fromiter((work.check_level(r.buf) for r in reads), dtype=np.int32, count=n))
    columns["d_batch"] = longs(r.batch for r in reads)
    if bits is not None:
        columns["d_id"] = longs(_pack(r.buf.origin, r.buf.sequence, r.buf.chunk, bits) for r in reads)
    for i in range(nkeys):
        columns[f"d_thr{i}"] = pa.array([r.thresholds[i] for r in reads], pa.int64())
        columns[f"d_reason{i}"] = pa.array([r.reasons[i] for r in reads], pa.string())
    frame = spark.createDataFrame(pa.table(columns))
    del columns
    release_arrow_memory()  # Spark holds the table now: what the driver built is given back
    return frame


def _few_rows(reads: Sequence[Read]) -> bool:
    """Whether the pass needs less than half of the rows of the (local) files it reads."""
    needed = sum(r.buf.rows for r in reads)
    total = 0
    for file in {r.buf.file for r in reads}:
        rows = file_rows(file)
        if rows is None:
            return False
        total += rows
    return needed * 2 < total


def _sliced(spark: SparkSession, reads: Sequence[Read], schema: StructType, nkeys: int) -> DataFrame:
    """The rows of ``reads`` read by their row ranges (``replay.engine.slices``), decision columns attached."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    fields = [StructField("d_cid", LongType()), StructField("d_batch", LongType())]
    for i in range(nkeys):
        fields += [StructField(f"d_thr{i}", LongType()), StructField(f"d_reason{i}", StringType())]
    slices: list[Slice] = []
    for r in reads:
        values: list[Any] = [buffer_copy_id(r.buf), r.batch]
        for i in range(nkeys):
            values += [r.thresholds[i], r.reasons[i]]
        slices.append((r.buf.file, r.buf.row_start, r.buf.rows, tuple(values)))
    return read_slices(spark, slices, schema, StructType(fields))


def _joined(
    spark: SparkSession,
    reads: Sequence[Read],
    work: PassWork,
    layout: ArchiveLayout,
    schema: StructType,
    spark_paths: Mapping[str, str],
    nkeys: int,
) -> DataFrame:
    """The rows of ``reads`` read by Spark's Parquet reader and joined to the pass's decisions."""
    from pyspark.sql import functions as F

    files = sorted({spark_paths.get(r.buf.file, r.buf.file) for r in reads})
    raw = read_parquet(spark, schema, files)
    bits = _packing(reads)
    # A buffer with discarded copies elsewhere is matched by file too; when a copy shares its
    # file, by row range as well. Row positions are read only then.
    level = max((work.check_level(r.buf) for r in reads), default=0)
    decisions = _decision_frame(spark, reads, work, spark_paths, nkeys, bits, level)
    located: list[Column] = []
    if bits is not None:
        identity = _packed(q(layout.origin_id), q(layout.sequence_number), q(layout.chunk_number), bits)
        located.append(identity.alias("_id"))
        on_identity = F.col("_id") == F.col("d_id")
    else:
        on_identity = (
            (q(layout.origin_id).cast("long") == F.col("d_origin"))
            & (q(layout.sequence_number).cast("long") == F.col("d_sequence"))
            & (q(layout.chunk_number).cast("long") == F.col("d_chunk"))
        )
    if level >= 1:
        located.append(F.col("_metadata.file_path").alias("_file"))
        same_copy = F.col("_file") == F.col("d_file")
    if level == 2:
        located.append(F.col("_metadata.row_index").alias("_row"))
        same_copy = same_copy & ((F.col("d_check") == 1) | F.col("_row").between(F.col("d_lo"), F.col("d_hi")))
    joined = raw.select("*", *located).join(F.broadcast(decisions), on_identity)
    if level >= 1:
        joined = joined.where((F.col("d_check") == 0) | same_copy)
    return joined


def q(name: str) -> Column:
    """A column by name, quoted (names may hold dots)."""
    from pyspark.sql import functions as F

    return F.col(f"`{name}`")


def pass_rows(
    spark: SparkSession, work: PassWork, layout: ArchiveLayout, schema: StructType, spark_paths: Mapping[str, str]
) -> DataFrame:
    """The rows of ``work.reads`` with their decision, event times in microseconds and per-key flags."""
    from pyspark.sql import functions as F

    reads = work.reads
    nkeys = len(layout.keys)
    range_start, range_end = work.range
    joined = _sliced(spark, reads, schema, nkeys) if _few_rows(reads) else None
    if joined is None:
        joined = _joined(spark, reads, work, layout, schema, spark_paths, nkeys)
    raw = joined
    punctuation = q(layout.key).isNull()
    events = []
    for i, key in enumerate(layout.keys):
        events.append(time_micros(raw, key.event_time, layout.time_columns[key.event_time]).alias(f"_ev{i}"))
    joined = joined.select("*", *events)
    flags: list[Column] = []
    for i in range(nkeys):
        ev = F.col(f"_ev{i}")
        punctuation = punctuation & ev.isNull()
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
