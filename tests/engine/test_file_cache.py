"""The per-file scan cache on its own (no Spark): what a file's entry is keyed by. A run through
the cache (a known file skipped, a rewritten one scanned again, an entry cut short) is tested in
``test_buffers.py``."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replay.core.config import parse_config
from replay.engine import copies, scan
from replay.engine.archive import inspect_schema
from replay.engine.file_cache import FileCache, footer_digest
from replay.engine.scan import scan_file, scan_records
from replay.engine.scan_columns import ScanColumns, scan_columns


def _archive_file(path: Path, values: list[int]) -> None:
    pq.write_table(
        pa.table(
            {
                "origin_id": pa.array([1] * len(values), pa.int64()),
                "sequence_number": pa.array([1] * len(values), pa.int64()),
                "chunk_number": pa.array([0] * len(values), pa.int64()),
                "last_chunk": pa.array([True] * len(values)),
                "watermark_ts": pa.array([0] * len(values), pa.timestamp("us", tz="UTC")),
                "event_time": pa.array(values, pa.timestamp("us", tz="UTC")),
                "key": pa.array(["k"] * len(values)),
                "value": pa.array(values, pa.int64()),
            }
        ),
        path,
    )


@pytest.fixture
def scanned(tmp_path: Path) -> tuple[Path, ScanColumns, pa.Table]:
    """A one-file archive, the columns its scan reads and the file's records."""
    archive = tmp_path / "archive"
    archive.mkdir()
    _archive_file(archive / "a.parquet", [1, 2, 3])
    layout = inspect_schema(parse_config({"archive": str(archive)}))
    columns = scan_columns(layout, event_times=False)
    path = str(archive / "a.parquet")
    return archive / "a.parquet", columns, scan_file(path, columns)


def test_an_entry_is_given_back_for_the_same_file_and_columns(
    tmp_path: Path, scanned: tuple[Path, ScanColumns, pa.Table]
) -> None:
    file, columns, records = scanned
    cache = FileCache(tmp_path / "cache")
    assert cache.get(str(file), columns) is None
    cache.put(str(file), columns, records, FileCache.key(str(file), columns))
    assert cache.get(str(file), columns) == records
    assert FileCache(tmp_path / "cache").get(str(file), columns) == records  # kept on disk


def test_an_entry_that_cannot_be_written_leaves_no_temporary_file(
    tmp_path: Path, scanned: tuple[Path, ScanColumns, pa.Table]
) -> None:
    """The entry's name taken by a directory: the write fails with the OS's error, and neither
    the records nor the hashes leave a temporary file behind; the cache still answers ``None``."""
    file, columns, records = scanned
    cache = FileCache(tmp_path / "cache")
    for suffix in (".arrow", ".hashes.json"):
        blocked = cache.root / (hashlib.sha256(str(file).encode()).hexdigest()[:32] + suffix)
        (blocked / "inside").mkdir(parents=True)
    with pytest.raises(OSError):
        cache.put(str(file), columns, records, FileCache.key(str(file), columns))
    with pytest.raises(OSError):
        cache.put_hashes(str(file), "d1", str(file), {0: "h"}, FileCache.key_of(str(file), "d1"))
    assert sorted(p.name for p in cache.root.iterdir()) == sorted(
        hashlib.sha256(str(file).encode()).hexdigest()[:32] + s for s in (".arrow", ".hashes.json")
    )
    assert cache.get(str(file), columns) is None


def test_an_entry_is_not_given_for_other_columns_or_a_changed_file(
    tmp_path: Path, scanned: tuple[Path, ScanColumns, pa.Table]
) -> None:
    file, columns, records = scanned
    cache = FileCache(tmp_path / "cache")
    cache.put(str(file), columns, records, FileCache.key(str(file), columns))
    # The same file scanned for its event times as well: other records, another key.
    with_events = dataclasses.replace(columns, events=(("event_time", "us"),))
    assert with_events.digest() != columns.digest()
    assert cache.get(str(file), with_events) is None
    # The same content, touched: its modification time is part of the key.
    stat = file.stat()
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert cache.get(str(file), columns) is None
    cache.put(str(file), columns, records, FileCache.key(str(file), columns))
    assert cache.get(str(file), columns) == records
    # Rewritten in place with other values but the same size and time: the footer tells them apart.
    before = footer_digest(str(file))
    stat = file.stat()
    _archive_file(file, [4, 5, 6])
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert file.stat().st_size == stat.st_size and file.stat().st_mtime_ns == stat.st_mtime_ns
    assert footer_digest(str(file)) != before
    assert cache.get(str(file), columns) is None


def test_content_hashes_are_kept_per_hash_digest_until_the_file_changes(
    tmp_path: Path, scanned: tuple[Path, ScanColumns, pa.Table]
) -> None:
    file, _, _ = scanned
    cache = FileCache(tmp_path / "cache")
    assert cache.get_hashes(str(file), "d1") is None
    cache.put_hashes(str(file), "d1", "file:/x/a.parquet", {0: "h0", 3: "h3"}, FileCache.key_of(str(file), "d1"))
    assert cache.get_hashes(str(file), "d1") == ("file:/x/a.parquet", {0: "h0", 3: "h3"})
    assert cache.get_hashes(str(file), "d2") is None  # hashes of other columns
    _archive_file(file, [7, 8, 9, 10])
    assert cache.get_hashes(str(file), "d1") is None


def test_a_remote_file_is_never_cached(tmp_path: Path, scanned: tuple[Path, ScanColumns, pa.Table]) -> None:
    _, columns, records = scanned
    cache = FileCache(tmp_path / "cache")
    remote = "s3a://bucket/archive/a.parquet"
    assert FileCache.key(remote, columns) is None and footer_digest(remote) is None
    cache.put(remote, columns, records, None)
    cache.put_hashes(remote, "d1", remote, {0: "h0"}, None)
    assert cache.get(remote, columns) is None and cache.get_hashes(remote, "d1") is None
    assert not (tmp_path / "cache").exists()


def _rewritten_after(read: object, file: Path, values: list[int]) -> object:
    """``read`` (the scan, or the hashing), after which ``file`` is rewritten with ``values``: as
    when an archiver rewrites a file while a run reads it."""

    def wrapper(*args: object, **kwargs: object) -> object:
        out = read(*args, **kwargs)  # type: ignore[operator]
        _archive_file(file, values)
        return out

    return wrapper


def test_records_of_a_file_rewritten_while_it_is_scanned_are_not_kept(
    tmp_path: Path, scanned: tuple[Path, ScanColumns, pa.Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key is taken before the scan: an entry put under the key the file has afterwards
    would give the old records for the new content, and the next run would miss the new rows."""
    file, columns, old = scanned
    cache = FileCache(tmp_path / "cache")
    monkeypatch.setattr(scan, "scan_files", _rewritten_after(scan.scan_files, file, [1, 2, 3, 4, 5]))
    records, scanned_files = scan_records(None, [str(file)], columns, cache, threads=1)
    assert scanned_files == 1 and records.num_rows == old.num_rows == 1
    assert cache.get(str(file), columns) is None  # nothing kept: the next run scans the new content
    monkeypatch.undo()
    records, scanned_files = scan_records(None, [str(file)], columns, cache, threads=1)
    assert scanned_files == 1 and records["rows"].to_pylist() == [5]
    assert cache.get(str(file), columns) == records  # an unchanged file is kept
    assert scan_records(None, [str(file)], columns, cache, threads=1) == (records, 0)


def test_content_hashes_of_a_file_rewritten_while_it_is_hashed_are_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "archive"
    archive.mkdir()
    file = archive / "a.parquet"
    _archive_file(file, [1, 2, 3])
    layout = inspect_schema(parse_config({"archive": str(archive)}))
    cache = FileCache(tmp_path / "cache")
    hashing = copies.content_hashes

    def with_paths(*args: Any, **kwargs: Any) -> Any:  # the path Spark reports, as Spark gives it
        hashes, _ = hashing(*args, **kwargs)
        return hashes, {f: f"file:{f}" for f, _ in hashes}

    monkeypatch.setattr(copies, "content_hashes", _rewritten_after(with_paths, file, [4, 5, 6, 7]))
    old, _, read = copies.cached_content_hashes(None, layout, [(str(file), 1, 1, 0, 0, 3)], cache, threads=1)
    assert read == 1 and list(old) == [(str(file), 0)]
    assert cache.get_hashes(str(file), copies.hash_digest(layout)) is None  # not kept: the new content's key
    monkeypatch.setattr(copies, "content_hashes", with_paths)
    again, _, read = copies.cached_content_hashes(None, layout, [(str(file), 1, 1, 0, 0, 4)], cache, threads=1)
    assert read == 1 and again[(str(file), 0)] != old[(str(file), 0)]  # hashed again: the new content's
    assert copies.cached_content_hashes(None, layout, [(str(file), 1, 1, 0, 0, 4)], cache, threads=1) == (
        again,
        {str(file): f"file:{file}"},
        0,
    )
