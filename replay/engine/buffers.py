"""Per-buffer metadata, extracted with Spark (docs/archive.md#buffers-and-punctuation-rows).

One Spark aggregation turns the archive's rows into one row per *copy* (a
contiguous run of rows of one buffer identity in one file): row and tuple
counts, the metadata values (with a check that every row agrees), per-key event
time bounds and a content hash over the multiset of rows. Only these rows reach
the driver, never tuples, so driver memory grows with buffers, not tuples.

On the driver the copies are checked (identities, chunk numbering, last chunks),
deduplicated (identical copies) and conflicts handled per ``on_conflict``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from replay.core.buffer import Buffer, Conflict, DuplicateCopy
from replay.core.errors import ConflictingDuplicateError, EmptyArchiveError, Location
from replay.core.paths import local_path
from replay.engine.archive import ArchiveLayout
from replay.engine.copy_checks import check_copy, check_sequences
from replay.engine.scan import FileCache, scan_columns, scan_records

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from replay.core.config import JobConfig

__all__ = [
    "Buffer",
    "BufferScan",
    "Conflict",
    "DuplicateCopy",
    "content_hashes",
    "read_rows",
    "scan_buffers",
    "time_micros",
    "time_value",
]

_MASK32 = 0xFFFFFFFF
_CHUNK = 512  # records turned into Python objects at a time


@dataclass(frozen=True, slots=True, kw_only=True)
class BufferScan:
    """The archive's buffers after deduplication, with what was discarded and why."""

    layout: ArchiveLayout
    buffers: tuple[Buffer, ...]
    duplicates: tuple[DuplicateCopy, ...]
    conflicts: tuple[Conflict, ...]
    rows_read: int
    tuples_read: int
    spark_paths: dict[str, str] = field(default_factory=dict)  # Buffer.file -> the path Spark reports
    files_scanned: int = 0  # files read by the metadata scan (the others came from the file cache)


def _sql_name(column: str) -> str:
    """``column`` quoted for a Spark SQL expression."""
    return "`" + column.replace("`", "``") + "`"


def time_micros(df: DataFrame, column: str, kind: str) -> Column:
    """A Spark expression for ``column`` as int64 microseconds since the epoch (UTC).

    ``kind`` is the column's entry in ``ArchiveLayout.time_columns``. Nanoseconds (read as
    int64 under ``spark.sql.legacy.parquet.nanosAsLong``) are truncated toward minus infinity
    in exact 64-bit integer arithmetic: ``-1 ns`` is ``-1 us``, ``999 ns`` is ``0 us``. They
    never go through a double, which holds epoch nanoseconds of this century only to the
    nearest 256 ns and would put a tuple on the wrong side of a watermark.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampNTZType

    col = F.col(_sql_name(column))
    if kind == "epoch_ms":
        return col.cast("long") * 1000
    if kind == "ns":
        nanos = col.cast("long")
        # SQL's integral ``div`` truncates toward zero; below the epoch a remainder means one less.
        toward_zero = F.expr(f"CAST({_sql_name(column)} AS BIGINT) div 1000")
        return F.when(nanos % 1000 < 0, toward_zero - 1).otherwise(toward_zero)
    if isinstance(df.schema[column].dataType, TimestampNTZType):
        col = col.cast("timestamp")  # wall clock taken as UTC (the session time zone)
    return F.unix_micros(col)


def time_value(df: DataFrame, column: str, kind: str) -> Column:
    """``column`` as it appears in output tables: a timestamp (microseconds, UTC) for a Parquet
    timestamp of any unit, the int64 epoch milliseconds unchanged under ``time_unit: ms``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    if kind == "epoch_ms" or isinstance(df.schema[column].dataType, TimestampType):
        return F.col(_sql_name(column))
    return F.timestamp_micros(time_micros(df, column, kind))


def read_rows(spark: SparkSession, layout: ArchiveLayout, files: Sequence[str] | None = None) -> DataFrame:
    """The rows of ``files`` (default: the archive's) with ``_file`` and ``_row`` (position within
    the file) attached."""
    from pyspark.sql import functions as F

    if "ns" in layout.time_columns.values():
        spark.conf.set("spark.sql.legacy.parquet.nanosAsLong", "true")
    # Files may differ in optional columns: merge the footers' schemas (types were checked to agree),
    # so that a column one file lacks reads as null instead of vanishing from the others.
    if len(layout.schema):
        from replay.engine.archive import spark_schema

        df = spark.read.schema(spark_schema(layout)).parquet(*(files or layout.files))
    else:
        df = spark.read.option("mergeSchema", "true").parquet(*(files or layout.files))
    return df.select("*", F.col("_metadata.file_path").alias("_file"), F.col("_metadata.row_index").alias("_row"))


def _copies_frame(df: DataFrame, layout: ArchiveLayout, group_extra: list[str]) -> DataFrame:
    from pyspark.sql import functions as F

    payload_hash_inputs: list[Column] = []
    for name in layout.payload:
        payload_hash_inputs += [F.col(f"`{name}`"), F.col(f"`{name}`").isNull()]
    row_hash = F.xxhash64(*payload_hash_inputs)
    punctuation = F.col(f"`{layout.key}`").isNull()
    for key in layout.keys:
        punctuation = punctuation & F.col(f"`{key.event_time}`").isNull()

    group = [
        F.col("_file"),
        F.col(f"`{layout.origin_id}`").cast("long").alias("origin"),
        F.col(f"`{layout.sequence_number}`").cast("long").alias("sequence"),
        F.col(f"`{layout.chunk_number}`").cast("long").alias("chunk"),
        *[F.col(c) for c in group_extra],
    ]
    aggs: list[Column] = [
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.when(punctuation, 0).otherwise(1)).alias("tuples"),
        F.min("_row").alias("row_min"),
        F.max("_row").alias("row_max"),
        F.sum(row_hash.bitwiseAND(F.lit(_MASK32))).alias("hash_lo"),
        F.sum(F.shiftrightunsigned(row_hash, 32)).alias("hash_hi"),
    ]
    meta: list[tuple[str, Column]] = [("last_chunk", F.col(f"`{layout.last_chunk}`"))]
    if layout.ingest_ts is not None:
        meta.append(("ingest", time_micros(df, layout.ingest_ts, layout.time_columns[layout.ingest_ts])))
    if layout.idle is not None:
        meta.append(("idle", F.col(f"`{layout.idle}`")))
    for index, key in enumerate(layout.keys):
        if key.watermark is not None:
            meta.append((f"wm{index}", time_micros(df, key.watermark, layout.time_columns[key.watermark])))
    for name, expr in meta:
        aggs += [F.min(expr).alias(f"{name}_min"), F.max(expr).alias(f"{name}_max"), F.count(expr).alias(f"{name}_n")]
    for index, key in enumerate(layout.keys):
        event = time_micros(df, key.event_time, layout.time_columns[key.event_time])
        aggs += [F.min(event).alias(f"ev{index}_min"), F.max(event).alias(f"ev{index}_max")]
    return df.groupBy(*group).agg(*aggs)


def _collect(frame: DataFrame) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = frame.toArrow().to_pylist()
    return rows


def _runs_frame(df: DataFrame, layout: ArchiveLayout, scattered: list[dict[str, Any]]) -> DataFrame:
    """Rows of identities that appear more than once in a file, with a run number per copy."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    spark = df.sparkSession
    targets = spark.createDataFrame(
        [(r["_file"], r["origin"], r["sequence"], r["chunk"]) for r in scattered],
        "t_file string, t_origin long, t_sequence long, t_chunk long",
    )
    joined = df.join(
        F.broadcast(targets),
        (df["_file"] == targets["t_file"])
        & (F.col(f"`{layout.origin_id}`").cast("long") == targets["t_origin"])
        & (F.col(f"`{layout.sequence_number}`").cast("long") == targets["t_sequence"])
        & (F.col(f"`{layout.chunk_number}`").cast("long") == targets["t_chunk"]),
    ).drop("t_file", "t_origin", "t_sequence", "t_chunk")
    # Gaps and islands: positions p1 < p2 < ... of one identity; p_i - i is constant
    # exactly along a run of consecutive rows.
    order = Window.partitionBy("_file", layout.origin_id, layout.sequence_number, layout.chunk_number).orderBy("_row")
    return joined.withColumn("_run", F.col("_row") - F.row_number().over(order))


def _copy_records(df: DataFrame, layout: ArchiveLayout) -> list[dict[str, Any]]:
    """Per copy, the full record with the content hash's sums (one Spark aggregation over the rows)."""
    records = _collect(_copies_frame(df, layout, []))
    scattered = [r for r in records if r["row_max"] - r["row_min"] + 1 != r["rows"]]
    if scattered:
        ids = {(r["_file"], r["origin"], r["sequence"], r["chunk"]) for r in scattered}
        records = [r for r in records if (r["_file"], r["origin"], r["sequence"], r["chunk"]) not in ids]
        records += _collect(_copies_frame(_runs_frame(df, layout, scattered), layout, ["_run"]))
    return records


def _display_path(spark_path: str, layout: ArchiveLayout, files: Sequence[str] = ()) -> str:
    """Spark's ``file:`` URI of a local file as the plain path the user gave."""
    local = local_path(spark_path)
    if local is None:
        return spark_path
    for given in (*files, *layout.files):
        if given == local or local_path(given) == local:
            return given
    return local


def _content_hash(rec: dict[str, Any], layout: ArchiveLayout) -> str:
    """A copy's content hash from its full record (``_copy_records``): equal for identical copies."""
    watermarks = _watermarks(rec, layout)
    content = hashlib.blake2b(digest_size=16)
    parts = [
        rec["rows"],
        rec["tuples"],
        rec["hash_lo"],
        rec["hash_hi"],
        rec["last_chunk_min"],
        rec.get("idle_min"),
        *watermarks,
    ]
    content.update(repr(parts).encode())
    return content.hexdigest()


def _watermarks(rec: dict[str, Any], layout: ArchiveLayout) -> list[int | None]:
    watermarks: list[int | None] = []
    for index, key in enumerate(layout.keys):
        watermarks.append(rec[f"wm{index}_min"] if key.watermark is not None else rec[f"ev{index}_max"])
    return watermarks


class _Shared:
    """Equal values the driver keeps once across ``Buffer`` records: file paths, and the per-key
    tuples of event-time bounds the scan did not read (all ``None``)."""

    def __init__(self, nkeys: int) -> None:
        self.files: dict[str, str] = {}
        self.unknown: tuple[None, ...] = (None,) * nkeys

    def file(self, path: str) -> str:
        return self.files.setdefault(path, path)

    def times(self, values: tuple[int | None, ...]) -> tuple[int | None, ...]:
        return self.unknown if values == self.unknown else values


def _to_buffer(
    rec: dict[str, Any], layout: ArchiveLayout, content_hash: str = "", shared: _Shared | None = None
) -> Buffer:
    watermarks = _watermarks(rec, layout)
    shared = shared or _Shared(len(layout.keys))
    return Buffer(
        origin=rec["origin"],
        sequence=rec["sequence"],
        chunk=rec["chunk"],
        last_chunk=bool(rec["last_chunk_min"]),
        watermarks=tuple(watermarks),
        min_event=shared.times(tuple(rec[f"ev{i}_min"] for i in range(len(layout.keys)))),
        max_event=shared.times(tuple(rec[f"ev{i}_max"] for i in range(len(layout.keys)))),
        ingest=rec.get("ingest_min"),
        idle=bool(rec.get("idle_min") or False),
        tuples=rec["tuples"],
        rows=rec["rows"],
        file=shared.file(rec["_file"]),
        row_start=rec["row_min"],
        content_hash=content_hash,
    )


def _by_identity(records: pa.Table, layout: ArchiveLayout) -> pa.Table:
    """``records`` sorted by identity and, within one, first copy first: by ingest time (0 without
    one), file path and row position; ``_repeated`` marks the copies of identities with several."""
    import numpy as np

    ingest = records["ingest_min"].fill_null(0) if layout.ingest_ts is not None else pa.repeat(0, records.num_rows)
    ordered = records.append_column("_ingest", ingest).sort_by(
        [(name, "ascending") for name in ("origin", "sequence", "chunk", "_ingest", "_file", "row_min")]
    )
    same = np.zeros(ordered.num_rows, dtype=bool)  # the same identity as the previous copy
    if ordered.num_rows > 1:
        same[1:] = True
        for name in ("origin", "sequence", "chunk"):
            values = ordered[name].to_numpy()
            same[1:] &= values[1:] == values[:-1]
    repeated = same.copy()
    repeated[:-1] |= same[1:]
    return ordered.append_column("_repeated", pa.array(repeated))


def content_hashes(
    spark: SparkSession, layout: ArchiveLayout, copies: Sequence[tuple[str, int, int, int, int]]
) -> tuple[dict[tuple[str, int], str], dict[str, str]]:
    """The content hash of each copy ``(file, origin, sequence, chunk, row_start)``, by ``(file,
    row_start)``, from one Spark aggregation over those copies' rows (the payload is read only
    here, and only for buffers that have more than one copy); and the path Spark reports for
    each file read. A copy whose file no longer holds it gets no hash."""
    from pyspark.sql import functions as F

    if not copies:
        return {}, {}
    files = sorted({c[0] for c in copies})
    df = read_rows(spark, layout, files)
    targets = spark.createDataFrame(
        [(c[1], c[2], c[3]) for c in copies], "t_origin long, t_sequence long, t_chunk long"
    ).distinct()
    df = df.join(
        F.broadcast(targets),
        (F.col(f"`{layout.origin_id}`").cast("long") == targets["t_origin"])
        & (F.col(f"`{layout.sequence_number}`").cast("long") == targets["t_sequence"])
        & (F.col(f"`{layout.chunk_number}`").cast("long") == targets["t_chunk"]),
        "left_semi",
    )
    wanted = {(c[0], c[4]) for c in copies}
    hashes: dict[tuple[str, int], str] = {}
    spark_paths: dict[str, str] = {}
    for rec in _copy_records(df, layout):
        shown = _display_path(rec["_file"], layout, files)
        spark_paths[shown] = rec["_file"]
        if (shown, rec["row_min"]) in wanted:
            hashes[(shown, rec["row_min"])] = _content_hash(rec, layout)
    return hashes, spark_paths


def scan_buffers(
    spark: SparkSession,
    layout: ArchiveLayout,
    config: JobConfig,
    *,
    strict: bool = True,
    event_times: bool = True,
    cache: FileCache | None = None,
) -> BufferScan:
    """Extract, check and deduplicate the archive's buffers.

    The metadata scan (``replay.engine.scan``) reads the metadata columns only; event time columns
    with ``event_times`` (else only where a key's watermark is its buffers' max event time, and
    the buffers' event time bounds are ``None``). The payload is read only for identities with
    more than one copy, to tell duplicates from conflicts. ``cache`` keeps per-file records.
    With ``strict`` (a run), a conflicting duplicate under ``on_conflict: fail`` raises;
    without it (``replay inspect``) it is reported and the first copy is kept.

    Raises:
        BadBufferError: a null or out-of-range identity, metadata that differs within a buffer,
            two last chunks in a sequence, or a chunk beyond the last one.
        ConflictingDuplicateError: copies of one identity differ, under ``on_conflict: fail``.
    """
    columns = scan_columns(layout, event_times=event_times)
    records, scanned = scan_records(spark, layout.files, columns, cache)
    if not records.num_rows:
        raise EmptyArchiveError(
            f"the archive's {len(layout.files)} Parquet file(s) hold no rows",
            where=Location(file=layout.root),
            todo="point 'archive' at the directory the archiver writes to, or wait until it has written data",
        )
    # The records stay columnar; Python sees them a chunk at a time (the driver's memory is one
    # ``Buffer`` per kept copy, not one dict per field of every record).
    for chunk in records.to_batches(max_chunksize=_CHUNK):
        for rec in chunk.to_pylist():
            check_copy(rec, layout, config.chunk_base)
    rows_read = int(pc.sum(records["rows"]).as_py() or 0)
    tuples_read = int(pc.sum(records["tuples"]).as_py() or 0)
    ordered = _by_identity(records, layout)
    repeated = [
        (rec["_file"], rec["origin"], rec["sequence"], rec["chunk"], rec["row_min"])
        for rec in ordered.filter(ordered["_repeated"]).to_pylist()
    ]
    del records
    hashes, spark_paths = content_hashes(spark, layout, repeated)
    shared = _Shared(len(layout.keys))

    kept: list[Buffer] = []
    duplicates: list[DuplicateCopy] = []
    conflicts: list[Conflict] = []
    first: Buffer | None = None
    for chunk in ordered.to_batches(max_chunksize=_CHUNK):
        for rec in chunk.to_pylist():
            other = _to_buffer(rec, layout, hashes.get((rec["_file"], rec["row_min"]), ""), shared)
            if first is None or other.identity != first.identity:
                first = other  # the first copy of an identity: by ingest time, file and row
                kept.append(first)
                continue
            if other.content_hash == first.content_hash:
                duplicates.append(
                    DuplicateCopy(
                        origin=other.origin,
                        sequence=other.sequence,
                        chunk=other.chunk,
                        file=other.file,
                        row_start=other.row_start,
                        tuples=other.tuples,
                        kept_file=first.file,
                    )
                )
                continue
            conflict = Conflict(
                origin=other.origin,
                sequence=other.sequence,
                chunk=other.chunk,
                kept_file=first.file,
                kept_row=first.row_start,
                other_file=other.file,
                other_row=other.row_start,
                other_tuples=other.tuples,
            )
            if strict and config.on_conflict == "fail":
                raise ConflictingDuplicateError(
                    f"buffer archived twice with different content: in {first.file} (row {first.row_start}) "
                    f"and {other.file} (row {other.row_start})",
                    where=Location(
                        origin=other.origin,
                        sequence=other.sequence,
                        chunk=other.chunk,
                        file=first.file,
                        extra={"other_file": other.file},
                    ),
                    todo="find out which copy is right and remove the other, or set 'on_conflict: keep_first' "
                    "to keep the earliest copy (the conflict is still reported)",
                )
            conflicts.append(conflict)
    check_sequences(kept)
    return BufferScan(
        layout=layout,
        buffers=tuple(kept),
        duplicates=tuple(duplicates),
        conflicts=tuple(conflicts),
        rows_read=rows_read,
        tuples_read=tuples_read,
        spark_paths=spark_paths,
        files_scanned=scanned,
    )
