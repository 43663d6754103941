"""The metadata scan: one record per copy of a buffer, read from the files' metadata columns.

A buffer's metadata (origin, sequence, chunk, last chunk, watermark, ingest and idle
columns) is the same on each of its rows, so Parquet stores those columns dictionary- and
run-length-encoded in a small fraction of a file's bytes. The scan reads only them, plus
the key column (a null key marks a punctuation row) and, where they are needed, the event
time columns (event-time watermarks, a backfill's bounds), never the payload.

Where the files are read is ``replay.engine.readers``' choice: a run reads in Spark tasks
(pyarrow inside ``mapInArrow``), so on a cluster only the per-copy records reach the driver;
``replay inspect`` with a local master reads in the driver's threads. A file is read in
batches of ``_BATCH_ROWS`` rows. A *copy* is a maximal run of consecutive rows of one buffer
identity in one file.

``scan_records`` takes a file's records from the per-file cache (``replay.engine.file_cache``)
where it holds them, so a file already scanned is never read again, and a file rewritten in
place is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from replay.core.paths import local_path
from replay.engine.readers import read_in_tasks
from replay.engine.scan_columns import ScanColumns, scan_columns

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from replay.engine.archive import ArchiveLayout
    from replay.engine.file_cache import FileCache

__all__ = [
    "as_int64",
    "event_lows",
    "micros_array",
    "open_parquet",
    "raw_micros",
    "scan_file",
    "scan_files",
    "scan_records",
]

# Rows of a file the scan decodes at a time: its metadata columns take some 40 bytes a row, so a
# batch holds about 10 MiB per reading thread whatever the file's size (a 30M-tuple archive's
# files are 750k rows each, one row group). Smaller batches cost CPU: the 10M-tuple benchmark's
# 40 files took 1.2 to 1.4 s in batches of 65,536 rows, 0.64 to 0.74 s in batches of 262,144
# (warm, 2 threads; each file whole: 0.65 to 0.69 s).
_BATCH_ROWS = 262_144


def raw_micros(value: int | None, kind: str | None) -> int | None:
    """A time column's raw int64 as microseconds (floor for nanoseconds, exact integers only)."""
    if value is None or kind is None:
        return value
    if kind in ("ms", "epoch_ms"):
        return value * 1000
    if kind == "ns":
        return value // 1000
    return value


def micros_array(array: pa.ChunkedArray | pa.Array, kind: str) -> pa.ChunkedArray | pa.Array:
    """A time column's values as int64 microseconds (``raw_micros`` on every value, exact integer
    arithmetic: nanoseconds truncated toward minus infinity, never through a double)."""
    import pyarrow.compute as pc

    values = as_int64(array)
    if kind in ("ms", "epoch_ms"):
        return pc.multiply_checked(values, 1000)
    if kind != "ns":
        return values
    # Arrow's integer division truncates toward zero: below the epoch a remainder means one less.
    toward_zero = pc.divide(values, 1000)
    below = pc.less(pc.subtract(values, pc.multiply(toward_zero, 1000)), 0)
    return pc.subtract(toward_zero, pc.cast(below, pa.int64()))


def as_int64(array: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """An identity, flag or time column's values as int64 (a time in its own unit: ``raw_micros``)."""
    import pyarrow.compute as pc

    if pa.types.is_timestamp(array.type):
        return array.cast(pa.int64())
    if pa.types.is_boolean(array.type):
        return pc.cast(array, pa.int64())
    return array.cast(pa.int64())


def open_parquet(path: str) -> Any:
    """A ``pyarrow.parquet.ParquetFile`` of a local path, a ``file:`` URI or a remote URI pyarrow knows."""
    import pyarrow.parquet as pq

    local = local_path(path)
    if local is not None:
        return pq.ParquetFile(local)
    from pyarrow import fs

    filesystem, inner = fs.FileSystem.from_uri(path)
    return pq.ParquetFile(filesystem.open_input_file(inner))


def _per_copy(values: pa.ChunkedArray, starts: Any, rows: Any) -> tuple[list[int | None], list[int | None], Any]:
    """Per copy (its ``rows`` rows from each of ``starts``): the smallest and largest non-null
    int64 value (``None`` when all are null) and how many are not null. Over consecutive rows, as
    ``numpy.*.reduceat``: a hash aggregation over the copies (pyarrow's ``group_by``) took 2.5 times as
    long on the 10M-tuple benchmark's files."""
    import numpy as np

    if values.null_count == 0:
        data = values.to_numpy()
        low, high = np.minimum.reduceat(data, starts), np.maximum.reduceat(data, starts)
        return low.tolist(), high.tolist(), rows
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    count = np.add.reduceat(valid.astype(np.int64), starts)
    data = values.fill_null(0).to_numpy()
    info = np.iinfo(np.int64)
    low = np.minimum.reduceat(np.where(valid, data, info.max), starts)
    high = np.maximum.reduceat(np.where(valid, data, info.min), starts)
    seen = count > 0
    return (
        [int(v) if s else None for v, s in zip(low.tolist(), seen.tolist(), strict=True)],
        [int(v) if s else None for v, s in zip(high.tolist(), seen.tolist(), strict=True)],
        count,
    )


def scan_file(path: str, columns: ScanColumns) -> pa.Table:
    """The per-copy records of one file (see the module docstring), read ``_BATCH_ROWS`` rows at a
    time; a copy that a batch's edge cuts in two is joined again (``_joined``)."""
    parquet = open_parquet(path)
    names = [columns.origin, columns.sequence, columns.chunk, columns.key]
    names += [c for _, c, _ in columns.meta]
    names += [e[0] for e in columns.events if e is not None]
    if any(c not in names for c in columns.tuple_times) and _may_hold_null(parquet, columns.key):
        names += columns.tuple_times  # a null key: punctuation only where the event times are null too
    parts, offset = [], 0
    for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, columns=list(dict.fromkeys(names)), use_threads=False):
        parts.append(_scan_rows(pa.Table.from_batches([batch]), columns, path, offset))
        offset += batch.num_rows
    return _joined(parts, columns)


def _may_hold_null(parquet: Any, column: str) -> bool:
    """Whether ``column`` of a file may hold a null: not when every row group's statistics count
    none (a file without statistics may)."""
    metadata = parquet.metadata
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for index in range(row_group.num_columns):
            chunk = row_group.column(index)
            if chunk.path_in_schema != column:
                continue
            stats = chunk.statistics
            if stats is None or not stats.has_null_count or stats.null_count > 0:
                return True
    return False


def _joined(parts: Sequence[pa.Table], columns: ScanColumns) -> pa.Table:
    """The records of consecutive parts of one file, a copy cut by a part's edge made one record
    again: the last record of a part and the first of the next are one copy when their identity
    is the same (a copy is a maximal run of one identity)."""
    schema = columns.record_schema()
    parts = [part for part in parts if part.num_rows]
    if len(parts) <= 1:
        return parts[0] if parts else schema.empty_table()
    out: list[pa.Table] = []
    carry: dict[str, Any] | None = None  # the previous part's last record, which the next may continue
    for part in parts:
        first = part.slice(0, 1).to_pylist()[0]
        if carry is not None and all(carry[k] == first[k] for k in ("origin", "sequence", "chunk")):
            first = _merged(carry, first, columns)
            part = part.slice(1)
            out.append(pa.Table.from_pylist([first], schema))
        elif carry is not None:
            out.append(pa.Table.from_pylist([carry], schema))
        if part.num_rows:
            carry = part.slice(part.num_rows - 1).to_pylist()[0]
            out.append(part.slice(0, part.num_rows - 1))
        else:  # the part was that one copy's rest: it may go on in the next part
            carry = out.pop().to_pylist()[0]
    if carry is not None:
        out.append(pa.Table.from_pylist([carry], schema))
    return pa.concat_tables(out)


def _merged(head: dict[str, Any], tail: dict[str, Any], columns: ScanColumns) -> dict[str, Any]:
    """One copy's record from the records of its two halves (``head``'s rows come first)."""

    def low(a: int | None, b: int | None) -> int | None:
        return b if a is None else a if b is None else min(a, b)

    def high(a: int | None, b: int | None) -> int | None:
        return b if a is None else a if b is None else max(a, b)

    out = dict(head, rows=head["rows"] + tail["rows"], tuples=head["tuples"] + tail["tuples"])
    out["row_max"] = tail["row_max"]
    names = [name for name, _, _ in columns.meta] + [f"ev{i}" for i in range(len(columns.events))]
    for name in names:
        out[f"{name}_min"] = low(head[f"{name}_min"], tail[f"{name}_min"])
        out[f"{name}_max"] = high(head[f"{name}_max"], tail[f"{name}_max"])
    for name, _, _ in columns.meta:
        out[f"{name}_n"] = head[f"{name}_n"] + tail[f"{name}_n"]
    return out


def _scan_rows(table: pa.Table, columns: ScanColumns, path: str, offset: int) -> pa.Table:
    """The per-copy records of ``table``, rows of the file at ``path`` from row ``offset`` on."""
    import numpy as np
    import pyarrow.compute as pc

    schema = columns.record_schema()
    n = table.num_rows
    if n == 0:
        return schema.empty_table()
    ids = [as_int64(table.column(c)) for c in (columns.origin, columns.sequence, columns.chunk)]
    # A new copy starts wherever the identity (or its nullness) changes from the previous row.
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for array in ids:
        if array.null_count == 0:
            values = array.to_numpy()
            change[1:] |= values[1:] != values[:-1]
            continue
        values = array.fill_null(0).to_numpy()
        valid = array.is_valid().to_numpy(zero_copy_only=False)
        change[1:] |= (values[1:] != values[:-1]) | (valid[1:] != valid[:-1])
    starts = np.flatnonzero(change)  # each copy's first row: a copy's rows are consecutive
    rows = np.diff(np.append(starts, n))
    punctuation = table.column(columns.key).is_null()
    times = [e[0] for e in columns.events if e is not None] + list(columns.tuple_times)
    for name in dict.fromkeys(times):
        if name in table.column_names:  # not read: the file's key column holds no null
            punctuation = pc.and_(punctuation, table.column(name).is_null())
    tuples = np.add.reduceat(pc.invert(punctuation).to_numpy(zero_copy_only=False).astype(np.int64), starts)
    out: dict[str, Any] = {
        "_file": pa.array([path] * len(starts), pa.string()),
        # A copy's rows share its identity (a new copy starts where it changes): its first row's.
        "origin": ids[0].take(starts),
        "sequence": ids[1].take(starts),
        "chunk": ids[2].take(starts),
        "rows": pa.array(rows),
        "tuples": pa.array(tuples),
        "row_min": pa.array(starts + offset),
        "row_max": pa.array(starts + offset + rows - 1),
    }
    for name, column, kind in columns.meta:
        low, high, count = _per_copy(as_int64(table.column(column)), starts, rows)
        out[f"{name}_min"] = pa.array([raw_micros(v, kind) for v in low], pa.int64())
        out[f"{name}_max"] = pa.array([raw_micros(v, kind) for v in high], pa.int64())
        out[f"{name}_n"] = pa.array(count)
    for index, event in enumerate(columns.events):
        if event is None:
            for stat in ("min", "max"):
                out[f"ev{index}_{stat}"] = pa.nulls(len(starts), pa.int64())
            continue
        low, high, _ = _per_copy(as_int64(table.column(event[0])), starts, rows)
        out[f"ev{index}_min"] = pa.array([raw_micros(v, event[1]) for v in low], pa.int64())
        out[f"ev{index}_max"] = pa.array([raw_micros(v, event[1]) for v in high], pa.int64())
    return pa.table(out).cast(schema)


def scan_files(
    spark: SparkSession | None, files: Sequence[str], columns: ScanColumns, *, threads: int | None = None
) -> pa.Table:
    """The per-copy records of ``files`` (one row each, ``columns.record_schema()``), read as
    ``read_in_tasks`` reads. They stay columnar: the driver turns them into ``Buffer`` records
    without a Python object per field (``replay.engine.buffers``)."""
    return read_in_tasks(
        spark,
        [(path, columns) for path in files],
        scan_file,
        columns.record_schema(),
        failure="cannot read the file's metadata columns",
        threads=threads,
    )


def scan_records(
    spark: SparkSession | None,
    files: Sequence[str],
    columns: ScanColumns,
    cache: FileCache | None,
    *,
    threads: int | None = None,
) -> tuple[pa.Table, int]:
    """The per-copy records of ``files``, in ``files`` order: from ``cache`` where it holds them,
    else scanned (``scan_files``; ``spark`` may be ``None`` with ``threads``) and cached. Also
    returns how many files were scanned.

    The scanned records are put in file order once (no copy when Spark returned them so, as it
    does); each file's records are then a slice of them, not a copy."""
    import numpy as np
    import pyarrow.compute as pc

    found: dict[str, pa.Table] = {}
    missing: list[str] = []
    for path in files:
        cached = cache.get(path, columns) if cache is not None else None
        if cached is None:
            missing.append(path)
        else:
            found[path] = cached
    # Each file's key before the scan reads it: an entry is kept only under the content it read.
    before = {path: cache.key(path, columns) for path in missing} if cache is not None else {}
    fresh = scan_files(spark, missing, columns, threads=threads)
    if missing:
        # Each record's file as its position in ``missing`` (records of another file, which the
        # scan never gives, go last and belong to none).
        position = pc.index_in(fresh["_file"], value_set=pa.array(missing, pa.string()))
        index = position.fill_null(len(missing)).to_numpy()
        order = np.argsort(index, kind="stable")
        if (order != np.arange(len(order))).any():
            fresh, index = fresh.take(order), index[order]
        del position, order
        bounds = np.searchsorted(index, np.arange(len(missing) + 1))
        for at, path in enumerate(missing):
            found[path] = fresh.slice(int(bounds[at]), int(bounds[at + 1] - bounds[at]))
            if cache is not None:
                cache.put(path, columns, found[path], before[path])
    schema = columns.record_schema()
    return pa.concat_tables([found[path] for path in files] or [schema.empty_table()]), len(missing)


def event_lows(
    spark: SparkSession | None, layout: ArchiveLayout, files: Sequence[str]
) -> dict[tuple[str, int], tuple[int | None, ...]]:
    """Every copy's smallest event time per key (``None``: none) in ``files``, by ``(file, first
    row)``: the scan with every key's event time column, for a run whose own scan read none
    (``replay.runner.hold``). Not cached: the file cache keeps the records of the run's own columns."""
    if not files:
        return {}
    columns = scan_columns(layout, event_times=True)
    records = scan_files(spark, files, columns)
    names = ["_file", "row_min", *(f"ev{k}_min" for k in range(len(columns.events)))]
    file, row, *lows = (records[name].to_pylist() for name in names)
    return {(f, r): tuple(low) for f, r, *low in zip(file, row, *lows, strict=True)}
