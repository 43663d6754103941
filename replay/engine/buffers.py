"""The archive's buffers (docs/archive.md#buffers-and-punctuation-rows): each buffer identity's copies
checked, deduplicated and made one ``Buffer`` (``scan_buffers``).

The metadata scan (``replay.engine.scan``) gives one record per copy of a buffer, read from
the metadata columns only, so driver memory grows with buffers, not tuples. The records stay
an Arrow table: sorting by identity and finding the identities with several copies are Arrow
work, and Python sees the records a few hundred at a time, so what the driver keeps is one
packed ``Buffer`` per identity (``replay.core.buffer``; file paths shared). On the driver the copies are checked
(identities, chunk numbering, last chunks: ``replay.engine.copy_checks``), deduplicated
(identical copies, told apart from conflicting ones by ``replay.engine.copies``' content
hashes) and conflicts handled per ``on_conflict``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from replay.core.buffer import NULL_TIME, Buffer, PackedBuffers, pack_records
from replay.core.duplicates import Conflict, DuplicateCopy
from replay.core.errors import ConflictingDuplicateError, EmptyArchiveError, Location
from replay.engine.archive import ArchiveLayout
from replay.engine.copies import cached_content_hashes
from replay.engine.copy_checks import check_copies, check_sequences
from replay.engine.file_cache import FileCache
from replay.engine.scan import scan_records
from replay.engine.scan_columns import scan_columns

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from replay.core.config import JobConfig

__all__ = ["Buffer", "BufferScan", "Conflict", "DuplicateCopy", "release_arrow_memory", "scan_buffers"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BufferScan:
    """The archive's buffers after deduplication, with what was discarded and why."""

    layout: ArchiveLayout
    buffers: PackedBuffers  # the kept copy of each identity, in identity order
    duplicates: tuple[DuplicateCopy, ...]
    conflicts: tuple[Conflict, ...]
    rows_read: int
    tuples_read: int
    spark_paths: dict[str, str] = field(default_factory=dict)  # Buffer.file -> the path Spark reports
    files_scanned: int = 0  # files read by the metadata scan (the others came from the file cache)
    copies_hashed: int = 0  # copies whose payload was read for a content hash (the others: the file cache)


def _packed(ordered: pa.Table, layout: ArchiveLayout) -> Any:
    """The records' ``Buffer`` fields packed (``replay.core.buffer.pack_records``), from their
    columns: a key's watermark is its watermark column, or its copy's largest event time."""

    def column(name: str, null: int = NULL_TIME) -> Any:
        if name not in ordered.column_names:
            return pa.repeat(null, ordered.num_rows).to_numpy()
        return ordered[name].fill_null(null).to_numpy()

    fields = {
        "origin": column("origin"),
        "sequence": column("sequence"),
        "chunk": column("chunk"),
        "row_start": column("row_min"),
        "tuples": column("tuples"),
        "rows": column("rows"),
        "ingest": column("ingest_min"),
        "last_chunk": column("last_chunk_min", 0),
        "idle": column("idle_min", 0),
    }
    keys = range(len(layout.keys))
    return pack_records(
        fields,
        [column(f"wm{i}_min" if layout.keys[i].watermark is not None else f"ev{i}_max") for i in keys],
        [column(f"ev{i}_min") for i in keys],
        [column(f"ev{i}_max") for i in keys],
    )


def _by_identity(records: pa.Table, layout: ArchiveLayout) -> pa.Table:
    """``records`` sorted by identity and, within one, first copy first: by ingest time (0 without
    one), file path and row position; ``_repeated`` marks the copies of identities with several.

    Only the columns a ``Buffer`` is made from are kept (the checks have read the others), with
    the file paths dictionary-encoded: the sorted copy is about half the records' size."""
    import numpy as np

    ingest = records["ingest_min"].fill_null(0) if layout.ingest_ts is not None else pa.repeat(0, records.num_rows)
    keys = pa.table({name: records[name] for name in ("origin", "sequence", "chunk", "_file", "row_min")})
    order = pc.sort_indices(
        keys.append_column("_ingest", ingest),
        sort_keys=[(name, "ascending") for name in ("origin", "sequence", "chunk", "_ingest", "_file", "row_min")],
    )
    del keys, ingest
    kept = [name for name in records.column_names if name not in ("_file", "row_max")]
    kept = [name for name in kept if not name.endswith(("_n", "_max")) or name.startswith("ev")]
    narrow = pa.table({"_file": pc.dictionary_encode(records["_file"]), **{name: records[name] for name in kept}})
    ordered = narrow.take(order)
    del narrow, order
    same = np.zeros(ordered.num_rows, dtype=bool)  # the same identity as the previous copy
    if ordered.num_rows > 1:
        same[1:] = True
        for name in ("origin", "sequence", "chunk"):
            values = ordered[name].to_numpy()
            same[1:] &= values[1:] == values[:-1]
    repeated = same.copy()
    repeated[:-1] |= same[1:]
    return ordered.append_column("_repeated", pa.array(repeated))


def release_arrow_memory() -> None:
    """Give the memory Arrow freed back to the system: its allocator keeps freed pages for reuse,
    and the driver's Python objects cannot use them."""
    pa.default_memory_pool().release_unused()


def scan_buffers(
    spark: SparkSession | None,
    layout: ArchiveLayout,
    config: JobConfig,
    *,
    strict: bool = True,
    event_times: bool = True,
    cache: FileCache | None = None,
    threads: int | None = None,
) -> BufferScan:
    """Extract, check and deduplicate the archive's buffers.

    The metadata scan (``replay.engine.scan``) reads the metadata columns only; event time columns
    with ``event_times`` (else only where a key's watermark is its buffers' max event time, and
    the buffers' event time bounds are ``None``). The payload is read only for identities with
    more than one copy, to tell duplicates from conflicts. ``cache`` keeps per-file records.
    With ``strict`` (a run), a conflicting duplicate under ``on_conflict: fail`` raises;
    without it (``replay inspect``) it is reported and the first copy is kept. ``threads``: read in
    that many of the driver's threads instead of Spark tasks (``replay.engine.readers.read_in_tasks``);
    ``spark`` may then be ``None`` (``replay inspect`` with a local master starts no session), and
    the paths Spark reports for the files (``spark_paths``) are not known.

    Raises:
        BadBufferError: a null or out-of-range identity, metadata that differs within a buffer,
            two last chunks in a sequence, or a chunk beyond the last one.
        ConflictingDuplicateError: copies of one identity differ, under ``on_conflict: fail``.
    """
    columns = scan_columns(layout, event_times=event_times)
    records, scanned = scan_records(spark, layout.files, columns, cache, threads=threads)
    if not records.num_rows:
        raise EmptyArchiveError(
            f"the archive's {len(layout.files)} Parquet file(s) hold no rows",
            where=Location(file=layout.root),
            todo="point 'archive' at the directory the archiver writes to, or wait until it has written data",
        )
    check_copies(records, layout, config.chunk_base)  # on the columns: no dict per record
    rows_read = int(pc.sum(records["rows"]).as_py() or 0)
    tuples_read = int(pc.sum(records["tuples"]).as_py() or 0)
    ordered = _by_identity(records, layout)
    repeated = [
        (rec["_file"], rec["origin"], rec["sequence"], rec["chunk"], rec["row_min"], rec["rows"])
        for rec in ordered.filter(ordered["_repeated"]).to_pylist()
    ]
    del records
    release_arrow_memory()
    hashes, spark_paths, hashed = cached_content_hashes(spark, layout, repeated, cache, threads=threads)

    # The kept copies stay packed (``PackedBuffers``: one array, file paths shared); a ``Buffer`` is
    # made only for the copies of identities with several, to compare them.
    import numpy as np

    records = _packed(ordered, layout)
    paths = ordered["_file"].combine_chunks()
    files, file_of = paths.dictionary.to_pylist(), paths.indices.to_numpy().astype(np.int32)
    several = ordered["_repeated"].to_numpy(zero_copy_only=False)
    del ordered, paths
    first_copy = np.ones(len(records), dtype=bool)  # the first copy of its identity: the one kept
    hash_of = np.full(len(records), -1, dtype=np.int32)
    hash_names: list[str] = []
    duplicates: list[DuplicateCopy] = []
    conflicts: list[Conflict] = []
    first: Buffer | None = None
    for i in np.flatnonzero(several).tolist():
        other = Buffer.from_packed(records[i].tobytes(), files[file_of[i]], "")
        content_hash = hashes.get((other.file, other.row_start), "")
        other = other.replace(content_hash=content_hash)
        if first is None or other.identity != first.identity:
            first = other  # the first copy of an identity: by ingest time, file and row
            if content_hash:
                hash_of[i] = len(hash_names)
                hash_names.append(content_hash)
            continue
        first_copy[i] = False
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
                "to keep the earliest copy (the conflict is still reported, and validation's integrity suite blocks "
                "publication beyond 'validation.max_conflicts', 0 unless raised)",
            )
        conflicts.append(conflict)
    kept = PackedBuffers(records[first_copy], file_of[first_copy], files, hash_of[first_copy], hash_names)
    del records, file_of, hash_of
    release_arrow_memory()
    check_sequences(kept)
    return BufferScan(
        layout=layout,
        buffers=kept,
        duplicates=tuple(duplicates),
        conflicts=tuple(conflicts),
        rows_read=rows_read,
        tuples_read=tuples_read,
        spark_paths=spark_paths,
        files_scanned=scanned,
        copies_hashed=hashed,
    )
