"""A copy's content hash (docs/archive.md#copies-duplicates-and-conflicts): equal for identical copies
of a buffer, different for conflicting ones.

Only identities with more than one copy are hashed (a buffer archived twice, or archived again after
it was replayed); the metadata scan (``replay.engine.scan``) reads the other columns of every copy,
and ``replay.engine.buffers`` deduplicates by the hashes ``content_hashes`` gives.

The hashing runs where the scan's reading runs (``replay.engine.readers.read_in_tasks``): for a run in
Spark tasks, ``mapInArrow`` over the files that hold such copies, one file per task at a time,
pyarrow inside (only the hashes reach the driver, never tuples); for ``replay inspect`` with a local
master in the driver's threads. A reader decodes only the row groups around the copies' row ranges,
a batch at a time, keeps only the rows around each copy, checks that each range still holds its copy
(the identity on every row of it, and not on the rows next to it), and gives one hash per copy.

A copy's content is its row and tuple counts, its last-chunk and idle flags, its watermark per key
(and the archive's ``watermark_ts`` when no key reads it), and the multiset of its rows' payload
values. Each row is encoded as bytes (every value length-prefixed, a null as its own mark, so the
encoding is unambiguous; a time column as its int64 microseconds, so that two copies that differ
only below a microsecond, which Replay never sees, are the same), the rows are sorted, and the
hash covers them in that order: the order of a buffer's rows in its file does not matter.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from replay.core.paths import local_path
from replay.engine.archive import ArchiveLayout
from replay.engine.file_cache import FileCache
from replay.engine.readers import read_in_tasks
from replay.engine.scan import as_int64, micros_array, open_parquet, raw_micros

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


__all__ = ["Copy", "cached_content_hashes", "content_hashes", "hash_digest"]

#: One copy to hash: (file, origin, sequence, chunk, first row, row count; -1: the rows of its identity from
#: its first row on).
Copy = tuple[str, int, int, int, int, int]

_HASH_VERSION = 3  # bump when what ``_copy_hash`` hashes changes (3: times as microseconds, watermark_ts)
_PREFIX = f"v{_HASH_VERSION}:"  # on every hash: a hash made by another version is never compared to it


@dataclass(frozen=True, slots=True)
class _Columns:
    """What the hashing reads of a file, and each column's role (picklable, for the tasks)."""

    identity: tuple[str, str, str]
    key: str
    last_chunk: str
    idle: str | None
    watermarks: tuple[tuple[str, str] | None, ...]  # per key: its watermark column and time kind, or None
    events: tuple[tuple[str, str], ...]  # per key: its event time column and time kind
    watermark_ts: tuple[str, str] | None  # the archive's watermark_ts and its kind, when no key reads it
    payload: tuple[str, ...]
    times: tuple[str | None, ...]  # per payload column: its time kind, None for a column that is no time

    @classmethod
    def of(cls, layout: ArchiveLayout) -> _Columns:
        return cls(
            identity=(layout.origin_id, layout.sequence_number, layout.chunk_number),
            key=layout.key,
            last_chunk=layout.last_chunk,
            idle=layout.idle,
            watermarks=tuple(
                (k.watermark, layout.time_columns[k.watermark]) if k.watermark is not None else None
                for k in layout.keys
            ),
            events=tuple((k.event_time, layout.time_columns[k.event_time]) for k in layout.keys),
            watermark_ts=(
                (layout.metadata_watermark, layout.time_columns[layout.metadata_watermark])
                if layout.metadata_watermark is not None
                else None
            ),
            payload=layout.payload,
            times=tuple(layout.time_columns.get(name) for name in layout.payload),
        )

    def names(self) -> list[str]:
        names = [*self.identity, self.key, self.last_chunk]
        names += [c for c in (self.idle,) if c is not None]
        names += [w[0] for w in self.watermarks if w is not None] + [e[0] for e in self.events]
        names += [self.watermark_ts[0]] if self.watermark_ts is not None else []
        return list(dict.fromkeys([*names, *self.payload]))


def _encoded(column: pa.ChunkedArray) -> pa.Array:
    """Each value of ``column`` as bytes that tell it apart from every other value: ``N`` for a null,
    else its length, ``:`` and its text (or its bytes)."""
    import pyarrow.compute as pc

    array = column.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    kind = array.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind):
        text = array.cast(pa.large_binary())
    else:
        try:
            text = array.cast(pa.large_string()).cast(pa.large_binary())
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # nested and other types: their Python repr
            text = pa.array([None if v is None else repr(v).encode() for v in array.to_pylist()], pa.large_binary())
    length = pc.binary_length(text).cast(pa.large_string()).cast(pa.large_binary())
    value = pc.binary_join_element_wise(length, text, pa.scalar(b":", pa.large_binary()))
    return pc.if_else(pc.is_null(text), pa.scalar(b"N", pa.large_binary()), value)


def _rows_digest(part: pa.Table, payload: Sequence[str], times: Sequence[str | None]) -> str:
    """A digest of the multiset of ``part``'s rows over the ``payload`` columns (of time kinds
    ``times``: a time column's values as int64 microseconds)."""
    import numpy as np
    import pyarrow.compute as pc

    digest = hashlib.blake2b(digest_size=16)
    if not payload or part.num_rows == 0:
        digest.update(str(part.num_rows).encode())
        return digest.hexdigest()
    rows = pc.binary_join_element_wise(
        *[
            _encoded(part.column(name) if kind is None else micros_array(part.column(name), kind))
            for name, kind in zip(payload, times, strict=True)
        ],
        pa.scalar(b"|", pa.large_binary()),
    )
    ordered = rows.take(pc.sort_indices(rows))
    if isinstance(ordered, pa.ChunkedArray):
        ordered = ordered.combine_chunks()
    # Every value is self-delimiting and a row has a fixed number of them: the rows' bytes, one after
    # another, say where each row ends.
    offsets = np.frombuffer(ordered.buffers()[1], dtype=np.int64, count=len(ordered) + 1, offset=ordered.offset * 8)
    data = ordered.buffers()[2]
    if data is not None:
        digest.update(memoryview(data)[int(offsets[0]) : int(offsets[-1])])
    return digest.hexdigest()


def _copy_hash(part: pa.Table, columns: _Columns) -> str:
    """The content hash of one copy's rows (see the module docstring)."""
    import pyarrow.compute as pc

    punctuation = pc.is_null(part.column(columns.key))
    for event, _ in columns.events:
        punctuation = pc.and_(punctuation, pc.is_null(part.column(event)))
    tuples = part.num_rows - int(pc.sum(pc.cast(punctuation, pa.int64())).as_py() or 0)
    watermarks: list[int | None] = []
    for watermark, (event, event_kind) in zip(columns.watermarks, columns.events, strict=True):
        if watermark is not None:
            watermarks.append(raw_micros(as_int64(part.column(watermark[0]))[0].as_py(), watermark[1]))
        else:
            watermarks.append(raw_micros(pc.max(as_int64(part.column(event))).as_py(), event_kind))
    parts = [
        part.num_rows,
        tuples,
        _rows_digest(part, columns.payload, columns.times),
        part.column(columns.last_chunk)[0].as_py(),
        part.column(columns.idle)[0].as_py() if columns.idle is not None else None,
        *watermarks,
    ]
    if columns.watermark_ts is not None:
        column, kind = columns.watermark_ts
        parts.append(raw_micros(as_int64(part.column(column))[0].as_py(), kind))
    return _PREFIX + hashlib.blake2b(repr(parts).encode(), digest_size=16).hexdigest()


def _of_identity(rows: pa.Table | pa.RecordBatch, identity: tuple[int, int, int], columns: _Columns) -> Any:
    """Per row of ``rows``, whether it carries ``identity`` (a null in an identity column never does)."""
    import pyarrow.compute as pc

    origin, sequence, chunk = (
        pc.fill_null(pc.equal(as_int64(rows.column(name)), value), False)
        for name, value in zip(columns.identity, identity, strict=True)
    )
    return pc.and_(pc.and_(origin, sequence), chunk)


def _holds(table: pa.Table, at: int, rows: int, identity: tuple[int, int, int], columns: _Columns) -> bool:
    """Whether ``table``'s rows ``[at, at + rows)`` are exactly one copy of ``identity``: the identity
    on each of them and not on the rows just before and after."""
    if at < 0 or at + rows > table.num_rows:
        return False
    start, stop = max(at - 1, 0), min(at + rows + 1, table.num_rows)
    flags = _of_identity(table.slice(start, stop - start), identity, columns).to_pylist()
    inside = flags[at - start : at - start + rows]
    return all(inside) and not (at > start and flags[0]) and not (stop > at + rows and flags[-1])


_HASH_BATCH_ROWS = 32_768  # rows decoded at a time when reading the rows around copies to hash


def _extent(
    parquet: Any, starts: Sequence[int], row_start: int, identity: tuple[int, int, int], columns: _Columns
) -> int:
    """How many rows from ``row_start`` on carry ``identity`` (0 when that row does not): the rows of
    the copy that begins there. Reads the identity columns only, from ``row_start``'s row group on,
    until a row of another identity."""
    import bisect

    import numpy as np

    if not 0 <= row_start < starts[-1]:
        return 0
    first = bisect.bisect_right(starts, row_start) - 1
    position, rows = starts[first], 0
    groups = range(first, len(starts) - 1)
    read = list(columns.identity)
    for batch in parquet.iter_batches(batch_size=_HASH_BATCH_ROWS, row_groups=groups, columns=read, use_threads=False):
        begin = max(row_start - position, 0)
        position += batch.num_rows
        if begin >= batch.num_rows:
            continue
        flags = np.asarray(_of_identity(batch.slice(begin), identity, columns).to_numpy(zero_copy_only=False), bool)
        other = np.flatnonzero(~flags)
        if other.size:
            return rows + int(other[0])
        rows += len(flags)
    return rows


def hash_file_copies(path: str, copies: Sequence[tuple[int, int, int, int, int]], columns: _Columns) -> dict[int, str]:
    """The content hash of each copy ``(row_start, rows, origin, sequence, chunk)`` of the file at
    ``path`` that still holds it, by first row. Only the row groups around the copies are read,
    ``_HASH_BATCH_ROWS`` rows at a time and only up to the row after the last copy, and only the
    rows around each copy are kept: a file's size never shows in the reader's memory."""
    import bisect

    parquet = open_parquet(path)
    meta = parquet.metadata
    starts = [0]
    for g in range(meta.num_row_groups):
        starts.append(starts[-1] + meta.row_group(g).num_rows)
    present = set(parquet.schema_arrow.names)
    names = columns.names()
    # A copy recorded without its rows (-1: a copy discarded before the checkpoint kept them) is the
    # run of rows of its identity from its first row.
    copies = [
        (r, n if n >= 0 else _extent(parquet, starts, r, (o, q, c), columns), o, q, c) for r, n, o, q, c in copies
    ]
    # Per copy: its first row, rows and identity, and the rows around it (the row before and the
    # row after, where the file has them): the first of them, its row group, and how many.
    spans: list[tuple[int, int, int, int, int, int, int, int]] = []
    groups: set[int] = set()
    for row_start, rows, origin, sequence, chunk in copies:
        if rows <= 0 or row_start + rows > starts[-1]:
            continue
        lo, hi = max(row_start - 1, 0), min(row_start + rows + 1, starts[-1])
        first = bisect.bisect_right(starts, lo) - 1
        groups.update(range(first, bisect.bisect_right(starts, hi - 1)))
        spans.append((row_start, rows, origin, sequence, chunk, lo, first, hi - lo))
    if not spans:
        return {}
    ordered = sorted(groups)
    offset_of: dict[int, int] = {}
    position = 0
    for g in ordered:
        offset_of[g] = position
        position += starts[g + 1] - starts[g]
    # (read start, read end, row_start, rows, identity, the pieces read so far)
    pending: list[tuple[int, int, int, int, tuple[int, int, int], list[pa.RecordBatch]]] = []
    for row_start, rows, o, q, c, lo, first, size in spans:
        begin = offset_of[first] + lo - starts[first]
        pending.append((begin, begin + size, row_start, rows, (o, q, c), []))
    needed = max(end for _, end, *_ in pending)
    read = [n for n in names if n in present]
    hashes: dict[int, str] = {}
    position = 0
    for batch in parquet.iter_batches(batch_size=_HASH_BATCH_ROWS, row_groups=ordered, columns=read, use_threads=False):
        stop = position + batch.num_rows
        waiting = []
        for begin, end, row_start, rows, identity, pieces in pending:
            if begin < stop and end > position:
                pieces.append(batch.slice(max(begin, position) - position, min(end, stop) - max(begin, position)))
            if end > stop:
                waiting.append((begin, end, row_start, rows, identity, pieces))
                continue
            window = pa.Table.from_batches(pieces)
            for name in names:
                if name not in present:  # a column this file does not have: null on its rows, as Spark reads it
                    window = window.append_column(name, pa.nulls(window.num_rows))
            at = row_start - max(row_start - 1, 0)  # the copy's first row in its window
            if _holds(window, at, rows, identity, columns):
                hashes[row_start] = _copy_hash(window.slice(at, rows), columns)
        pending, position = waiting, stop
        if position >= needed or not pending:
            break
    return hashes


_RESULT = pa.schema([("file", pa.string()), ("row_start", pa.int64()), ("hash", pa.string())])


def _hashes_table(path: str, work: tuple[Sequence[tuple[int, int, int, int, int]], _Columns]) -> pa.Table:
    """``hash_file_copies`` as a table of ``_RESULT`` (what a hashing task returns)."""
    rows = sorted(hash_file_copies(path, *work).items())
    return pa.table(
        [
            pa.array([path] * len(rows), pa.string()),
            pa.array([r for r, _ in rows], pa.int64()),
            pa.array([h for _, h in rows], pa.string()),
        ],
        schema=_RESULT,
    )


def _spark_paths(spark: SparkSession, layout: ArchiveLayout, files: Sequence[str]) -> dict[str, str]:
    """The path Spark's Parquet reader reports for each of ``files`` (``_metadata.file_path``, which
    the pass matches copies by), by file. A local file's is made in the driver's JVM as Hadoop's
    local file system writes it (the absolute path as ``java.io.File`` makes it a URI, through
    Hadoop's ``Path``: ``file:/dir%20name/a%23b.parquet``), without reading the file; the others'
    come from one small Spark job that decodes no column of the files."""
    from pyspark.sql import functions as F

    from replay.engine.archive import spark_schema
    from replay.engine.archive_rows import read_parquet

    paths: dict[str, str] = {}
    remote: list[str] = []
    jvm = spark.sparkContext._jvm  # Hadoop's classes: PySpark has no public handle on them
    for given in files:
        local = local_path(given)
        if local is None or jvm is None:
            remote.append(given)
            continue
        uri = jvm.java.io.File(local).getAbsoluteFile().toURI()
        paths[given] = str(jvm.org.apache.hadoop.fs.Path(uri).toUri().toString())
    if not remote:
        return paths
    first_rows = read_parquet(spark, spark_schema(layout), remote).where(F.col("_metadata.row_index") == 0)
    for row in first_rows.select(F.col("_metadata.file_path").alias("path")).collect():
        reported = str(row["path"])
        for given in remote:
            if given == reported:
                paths[given] = reported
    return paths


def content_hashes(
    spark: SparkSession | None, layout: ArchiveLayout, copies: Sequence[Copy], *, threads: int | None = None
) -> tuple[dict[tuple[str, int], str], dict[str, str]]:
    """The content hash of each copy ``(file, origin, sequence, chunk, row_start, rows)``, by ``(file,
    row_start)``, read from those copies' files as ``read_in_tasks`` reads (see the module docstring);
    and the path Spark reports for each file (none without ``spark``: ``threads`` reads in the
    driver's threads). A copy whose file no longer holds it gets no hash.

    Raises:
        ArchiveReadError: a file could not be read.
    """
    if not copies:
        return {}, {}
    by_file: dict[str, set[tuple[int, int, int, int, int]]] = {}
    for file, origin, sequence, chunk, row_start, rows in copies:
        by_file.setdefault(file, set()).add((row_start, rows, origin, sequence, chunk))
    files = sorted(by_file)
    columns = _Columns.of(layout)
    tasks = [(local_path(f) or f, (sorted(by_file[f]), columns)) for f in files]
    shown = {task[0]: f for task, f in zip(tasks, files, strict=True)}
    result = read_in_tasks(
        spark,
        tasks,
        _hashes_table,
        _RESULT,
        failure="cannot read the rows of a buffer archived more than once",
        shown=shown,
        threads=threads,
    )
    hashes = {
        (shown[f], r): h
        for f, r, h in zip(
            result["file"].to_pylist(), result["row_start"].to_pylist(), result["hash"].to_pylist(), strict=True
        )
    }
    return hashes, _spark_paths(spark, layout, files) if spark is not None else {}


def hash_digest(layout: ArchiveLayout) -> str:
    """What a content hash covers under ``layout`` (payload, metadata and time columns, their
    units) and how it is made, as a short digest: cached hashes made under another one are not used."""
    covered = [
        layout.payload,
        layout.key,
        layout.last_chunk,
        layout.idle,
        [(k.event_time, k.watermark) for k in layout.keys],
        layout.metadata_watermark,
        sorted(layout.time_columns.items()),
        _HASH_VERSION,
        pa.__version__.split(".")[0],  # the text of a value (a float's, a time's) is pyarrow's
    ]
    return hashlib.sha256(json.dumps(covered).encode()).hexdigest()[:16]


def same_content(mine: str, kept: str) -> bool | None:
    """Whether two content hashes say the copies are equal; ``None`` when they cannot be compared (one
    is missing, or they were made by different versions of the hashing)."""
    if not mine or not kept or mine.split(":", 1)[0] != kept.split(":", 1)[0]:
        return None
    return mine == kept


def cached_content_hashes(
    spark: SparkSession | None,
    layout: ArchiveLayout,
    copies: Sequence[Copy],
    cache: FileCache | None,
    *,
    threads: int | None = None,
) -> tuple[dict[tuple[str, int], str], dict[str, str], int]:
    """``content_hashes``, taking from ``cache`` the hashes of copies in files it already hashed
    (a file changed since is hashed again) and adding the ones computed; also returns how many
    copies had their payload read."""
    if cache is None or not copies:
        return (*content_hashes(spark, layout, copies, threads=threads), len(copies))
    digest = hash_digest(layout)
    hashes: dict[tuple[str, int], str] = {}
    spark_paths: dict[str, str] = {}
    missing: list[Copy] = []
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
    before = {file: cache.key_of(file, digest) for file in {copy[0] for copy in missing}}  # as for the scan
    fresh, paths = content_hashes(spark, layout, missing, threads=threads)
    hashes.update(fresh)
    spark_paths.update(paths)
    by_file: dict[str, dict[int, str]] = {}
    for (file, row), value in fresh.items():
        entry = known.get(file)
        by_file.setdefault(file, dict(entry[1]) if entry is not None else {})[row] = value
    for file, values in by_file.items():
        if file in paths:
            cache.put_hashes(file, digest, paths[file], values, before[file])  # the cached hashes and the new ones
    return hashes, spark_paths, len(missing)
