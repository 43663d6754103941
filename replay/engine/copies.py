"""A copy's content hash (docs/archive.md#copies-duplicates-and-conflicts): equal for identical copies
of a buffer, different for conflicting ones.

One Spark aggregation turns the rows of chosen copies (a *copy* is a contiguous run of rows of one
buffer identity in one file) into one record per copy: row and tuple counts, the metadata values,
per-key event time bounds and sums of the rows' 64-bit hashes, a hash over the multiset of rows.
Only these records reach the driver, never tuples. The payload is read only here, and only for
identities with more than one copy: the metadata scan (``replay.engine.scan``) reads the other
columns, and ``replay.engine.buffers`` deduplicates by the hashes ``content_hashes`` gives.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from replay.core.paths import local_path
from replay.engine.archive import ArchiveLayout
from replay.engine.archive_rows import read_rows, time_micros

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from replay.engine.scan import FileCache

__all__ = ["cached_content_hashes", "content_hashes", "hash_digest", "record_watermarks"]

_MASK32 = 0xFFFFFFFF


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
    watermarks = record_watermarks(rec, layout)
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


def record_watermarks(rec: dict[str, Any], layout: ArchiveLayout) -> list[int | None]:
    """A copy's watermark per key from its record (this module's or the metadata scan's): the
    watermark column's value, or the copy's largest event time for an event-time key."""
    watermarks: list[int | None] = []
    for index, key in enumerate(layout.keys):
        watermarks.append(rec[f"wm{index}_min"] if key.watermark is not None else rec[f"ev{index}_max"])
    return watermarks


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


def hash_digest(layout: ArchiveLayout) -> str:
    """What a content hash covers under ``layout`` (payload, metadata and time columns, their
    units), as a short digest: cached hashes made under another one are not used."""
    covered = [
        layout.payload,
        layout.key,
        layout.last_chunk,
        layout.idle,
        [(k.event_time, k.watermark) for k in layout.keys],
        sorted(layout.time_columns.items()),
        _HASH_VERSION,
    ]
    return hashlib.sha256(json.dumps(covered).encode()).hexdigest()[:16]


_HASH_VERSION = 1  # bump when ``_content_hash`` changes what it hashes


def cached_content_hashes(
    spark: SparkSession,
    layout: ArchiveLayout,
    copies: Sequence[tuple[str, int, int, int, int]],
    cache: FileCache | None,
) -> tuple[dict[tuple[str, int], str], dict[str, str], int]:
    """``content_hashes``, taking from ``cache`` the hashes of copies in files it already hashed
    (a file changed since is hashed again) and adding the ones computed; also returns how many
    copies had their payload read."""
    if cache is None or not copies:
        return (*content_hashes(spark, layout, copies), len(copies))
    digest = hash_digest(layout)
    hashes: dict[tuple[str, int], str] = {}
    spark_paths: dict[str, str] = {}
    missing: list[tuple[str, int, int, int, int]] = []
    known: dict[str, tuple[str, dict[int, str]] | None] = {}
    for copy in copies:
        file, row = copy[0], copy[4]
        if file not in known:
            known[file] = cache.get_hashes(file, digest)
        entry = known[file]
        if entry is not None and row in entry[1]:
            hashes[(file, row)] = entry[1][row]
            spark_paths[file] = entry[0]
        else:
            missing.append(copy)
    fresh, paths = content_hashes(spark, layout, missing)
    hashes.update(fresh)
    spark_paths.update(paths)
    by_file: dict[str, dict[int, str]] = {}
    for (file, row), value in fresh.items():
        entry = known.get(file)
        by_file.setdefault(file, dict(entry[1]) if entry is not None else {})[row] = value
    for file, values in by_file.items():
        if file in paths:
            cache.put_hashes(file, digest, paths[file], values)  # the cached hashes and the new ones
    return hashes, spark_paths, len(missing)
