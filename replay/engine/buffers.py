"""The archive's buffers (docs/archive.md#buffers-and-punctuation-rows): each buffer identity's copies
checked, deduplicated and made one ``Buffer`` (``scan_buffers``).

The metadata scan (``replay.engine.scan``) gives one record per copy of a buffer, read from
the metadata columns only, so driver memory grows with buffers, not tuples. On the driver the
copies are checked (identities, chunk numbering, last chunks: ``replay.engine.copy_checks``),
deduplicated (identical copies, told apart from conflicting ones by ``replay.engine.copies``'
content hashes) and conflicts handled per ``on_conflict``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from replay.core.buffer import Buffer, Conflict, DuplicateCopy
from replay.core.errors import ConflictingDuplicateError, EmptyArchiveError, Location
from replay.engine.archive import ArchiveLayout
from replay.engine.copies import content_hashes, record_watermarks
from replay.engine.copy_checks import check_copy, check_sequences
from replay.engine.scan import FileCache, scan_columns, scan_records

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from replay.core.config import JobConfig

__all__ = ["Buffer", "BufferScan", "Conflict", "DuplicateCopy", "scan_buffers"]


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


def _to_buffer(rec: dict[str, Any], layout: ArchiveLayout, content_hash: str = "") -> Buffer:
    watermarks = record_watermarks(rec, layout)
    return Buffer(
        origin=rec["origin"],
        sequence=rec["sequence"],
        chunk=rec["chunk"],
        last_chunk=bool(rec["last_chunk_min"]),
        watermarks=tuple(watermarks),
        min_event=tuple(rec[f"ev{i}_min"] for i in range(len(layout.keys))),
        max_event=tuple(rec[f"ev{i}_max"] for i in range(len(layout.keys))),
        ingest=rec.get("ingest_min"),
        idle=bool(rec.get("idle_min") or False),
        tuples=rec["tuples"],
        rows=rec["rows"],
        file=rec["_file"],
        row_start=rec["row_min"],
        content_hash=content_hash,
    )


def _first_key(buf: Buffer) -> tuple[int, str, int]:
    # Earliest by (ingest_ts, file path, row position); without ingest_ts, by path and position.
    return (buf.ingest if buf.ingest is not None else 0, buf.file, buf.row_start)


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
    if not records:
        raise EmptyArchiveError(
            f"the archive's {len(layout.files)} Parquet file(s) hold no rows",
            where=Location(file=layout.root),
            todo="point 'archive' at the directory the archiver writes to, or wait until it has written data",
        )
    for rec in records:
        check_copy(rec, layout, config.chunk_base)
    by_identity: dict[tuple[int, int, int], list[dict[str, Any]]] = defaultdict(list)
    rows_read = tuples_read = 0
    for rec in records:
        by_identity[(rec["origin"], rec["sequence"], rec["chunk"])].append(rec)
        rows_read += rec["rows"]
        tuples_read += rec["tuples"]
    repeated = [
        (rec["_file"], rec["origin"], rec["sequence"], rec["chunk"], rec["row_min"])
        for recs in by_identity.values()
        if len(recs) > 1
        for rec in recs
    ]
    hashes, spark_paths = content_hashes(spark, layout, repeated)
    copies: dict[tuple[int, int, int], list[Buffer]] = {
        identity: [_to_buffer(rec, layout, hashes.get((rec["_file"], rec["row_min"]), "")) for rec in recs]
        for identity, recs in by_identity.items()
    }

    kept: list[Buffer] = []
    duplicates: list[DuplicateCopy] = []
    conflicts: list[Conflict] = []
    for identity in sorted(copies):
        ordered = sorted(copies[identity], key=_first_key)
        first = ordered[0]
        kept.append(first)
        for other in ordered[1:]:
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
