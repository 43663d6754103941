"""The Spark buffer scan: time units, column mapping, keyed event-time watermarks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replay.core.config import parse_config
from replay.engine.archive import inspect_schema
from replay.engine.buffers import scan_buffers
from replay.engine.rows import reported_path
from tests._archives import SHORT_COLUMNS

pytestmark = pytest.mark.spark

SECOND = 1_000_000


def table(unit: str, *, tz: str | None = "UTC", epoch_ms: bool = False) -> pa.Table:
    seconds = [1, 2, 3]
    factor = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[unit]
    if epoch_ms:
        times = pa.array([s * 1000 for s in seconds], pa.int64())
        wm = pa.array([5000] * 3, pa.int64())
    else:
        times = pa.array([s * factor for s in seconds], pa.int64()).cast(pa.timestamp(unit, tz=tz))
        wm = pa.array([5 * factor] * 3, pa.int64()).cast(pa.timestamp(unit, tz=tz))
    return pa.table(
        {
            "o": pa.array([3, 3, 3], pa.int32()),
            "s": pa.array([1, 1, 1], pa.int32()),
            "c": pa.array([1, 1, 1], pa.int16()),
            "l": [True, True, True],
            "wm": wm,
            "t": times,
            "k": ["a", "b", None],
            "v": [1, 2, 3],
        }
    )


@pytest.mark.parametrize(
    ("data", "settings"),
    [
        (table("us"), {}),
        (table("ms"), {}),
        (table("ns"), {}),
        (table("us", tz=None), {}),
        (table("us", epoch_ms=True), {"time_unit": "ms"}),
    ],
    ids=["us", "ms", "ns", "naive-us", "epoch-ms"],
)
def test_time_units_and_mapping_give_the_same_buffer(
    tmp_path: Path, spark: Any, data: pa.Table, settings: dict[str, Any]
) -> None:
    pq.write_table(data, tmp_path / "a.parquet")
    config = parse_config({"archive": str(tmp_path)} | SHORT_COLUMNS | settings)
    layout = inspect_schema(config)
    assert layout.key_type == "string" and layout.payload == ("t", "k", "v")
    (buffer,) = scan_buffers(spark, layout, config).buffers
    assert buffer.identity == (3, 1, 1)
    assert buffer.watermarks == (5 * SECOND,)
    assert (buffer.min_event, buffer.max_event) == ((SECOND,), (3 * SECOND,))
    assert (buffer.tuples, buffer.rows, buffer.ingest) == (3, 3, None)


def test_event_time_watermarks_and_punctuation(tmp_path: Path, spark: Any) -> None:
    ts = pa.timestamp("us", tz="UTC")
    pq.write_table(
        pa.table(
            {
                "origin_id": pa.array([1, 1, 1, 1], pa.int64()),
                "sequence_number": pa.array([1, 1, 2, 3], pa.int64()),
                "chunk_number": pa.array([1, 1, 1, 1], pa.int32()),
                "last_chunk": [True, True, True, True],
                "idle": [False, False, True, False],
                "event_time": pa.array([7, 9, None, 4], ts),
                "shipped": pa.array([None, 20, None, None], ts),
                "key": pa.array([1, 1, None, 2], pa.int64()),
            }
        ),
        tmp_path / "a.parquet",
    )
    config = parse_config(
        {
            "archive": str(tmp_path),
            "watermarks": {"default": {"event_time": "event_time"}, "shipped": {"event_time": "shipped"}},
        }
    )
    layout = inspect_schema(config)
    assert [(k.name, k.watermark) for k in layout.keys] == [("default", None), ("shipped", None)]
    buffers = {b.sequence: b for b in scan_buffers(spark, layout, config).buffers}
    assert buffers[1].watermarks == (9, 20) and buffers[1].tuples == 2
    assert buffers[2].watermarks == (None, None) and buffers[2].tuples == 0 and buffers[2].idle
    assert buffers[3].watermarks == (4, None)


def test_implicit_default_key_uses_watermark_ts_only_when_present(tmp_path: Path) -> None:
    ts = pa.timestamp("us", tz="UTC")
    base = {
        "origin_id": pa.array([1], pa.int64()),
        "sequence_number": pa.array([1], pa.int64()),
        "chunk_number": pa.array([1], pa.int32()),
        "last_chunk": [True],
        "event_time": pa.array([1], ts),
        "key": pa.array([1], pa.int64()),
    }
    pq.write_table(pa.table(base), tmp_path / "a.parquet")
    assert inspect_schema(parse_config({"archive": str(tmp_path)})).keys[0].watermark is None
    pq.write_table(pa.table(base | {"watermark_ts": pa.array([1], ts)}), tmp_path / "a.parquet")
    assert inspect_schema(parse_config({"archive": str(tmp_path)})).keys[0].watermark == "watermark_ts"


def test_every_timestamp_is_a_time_column_and_watermark_ts_always_metadata(tmp_path: Path) -> None:
    """A payload column of Parquet timestamps is a time column (read, hashed and written at
    microseconds); an int64 one is a number. The archive's ``watermark_ts`` is buffer metadata
    whether a key reads it or uses event-time watermarks (never a tuple's column)."""
    ts, ns = pa.timestamp("us", tz="UTC"), pa.timestamp("ns", tz="UTC")
    pq.write_table(
        pa.table(
            {
                "origin_id": pa.array([1], pa.int64()),
                "sequence_number": pa.array([1], pa.int64()),
                "chunk_number": pa.array([1], pa.int32()),
                "last_chunk": [True],
                "watermark_ts": pa.array([1], ts),
                "event_time": pa.array([1], ts),
                "key": pa.array([1], pa.int64()),
                "created": pa.array([1], ns),
                "seen": pa.array([1], pa.timestamp("ms")),
                "count": pa.array([1], pa.int64()),
            }
        ),
        tmp_path / "a.parquet",
    )
    implicit = inspect_schema(parse_config({"archive": str(tmp_path)}))
    event_time_key = {"watermarks": {"k": {"event_time": "event_time"}}}
    declared = inspect_schema(parse_config({"archive": str(tmp_path)} | event_time_key))
    assert implicit.keys[0].watermark == "watermark_ts" and declared.keys[0].watermark is None
    for layout in (implicit, declared):
        assert layout.time_columns == {"watermark_ts": "us", "event_time": "us", "created": "ns", "seen": "ms"}
        assert layout.payload == ("event_time", "key", "created", "seen", "count")
        assert "watermark_ts" in layout.metadata_columns
    assert (implicit.metadata_watermark, declared.metadata_watermark) == (None, "watermark_ts")


def _rows(origin: int, sequences: list[int], values: list[int]) -> pa.Table:
    """One single-chunk buffer per sequence, two tuples each, payload from ``values``."""
    n = len(sequences)
    return pa.table(
        {
            "o": pa.array([origin] * 2 * n, pa.int64()),
            "s": pa.array([s for s in sequences for _ in range(2)], pa.int64()),
            "c": pa.array([1] * 2 * n, pa.int64()),
            "l": [True] * 2 * n,
            "wm": pa.array([s * SECOND for s in sequences for _ in range(2)], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
            "t": pa.array([s * SECOND + i for s in sequences for i in range(2)], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
            "k": [f"k{v}" for v in values],
            "v": values,
        }
    )


def _cached_archive(tmp_path: Path, spark: Any) -> tuple[Path, Callable[[], Any]]:
    """An archive of two files (origins 1 and 2, three buffers) and a scan of it through a file
    cache under ``tmp_path / "cache"``."""
    from replay.engine.file_cache import FileCache

    archive = tmp_path / "archive"
    archive.mkdir()
    pq.write_table(_rows(1, [1, 2], [1, 2, 3, 4]), archive / "a.parquet")
    pq.write_table(_rows(2, [1], [5, 6]), archive / "b.parquet")
    config = parse_config({"archive": str(archive)} | SHORT_COLUMNS)
    cache = FileCache(tmp_path / "cache")

    def scan() -> Any:
        return scan_buffers(spark, inspect_schema(config), config, cache=cache)

    return archive, scan


def test_the_file_cache_skips_known_files_and_rescans_a_file_rewritten_in_place(tmp_path: Path, spark: Any) -> None:
    archive, scan = _cached_archive(tmp_path, spark)
    first = scan()
    assert first.files_scanned == 2 and len(first.buffers) == 3
    again = scan()
    assert again.files_scanned == 0 and again.buffers == first.buffers

    pq.write_table(_rows(3, [1], [7, 8]), archive / "c.parquet")  # a new file: only it is read
    added = scan()
    assert added.files_scanned == 1
    assert {b.origin for b in added.buffers} == {1, 2, 3}

    # The same name with new content (another sequence): the cached records no longer apply.
    pq.write_table(_rows(2, [1, 2, 3], [5, 6, 9, 9, 9, 9]), archive / "b.parquet")
    rewritten = scan()
    assert rewritten.files_scanned == 1
    assert sorted(b.sequence for b in rewritten.buffers if b.origin == 2) == [1, 2, 3]


def test_a_cache_entry_cut_short_or_left_as_parquet_is_scanned_again(tmp_path: Path, spark: Any) -> None:
    _, scan = _cached_archive(tmp_path, spark)
    first = scan()
    entries = sorted((tmp_path / "cache").glob("*.arrow"))
    assert len(entries) == 2
    # An entry cut short (a crash while another version wrote it): that file is read again.
    entries[0].write_bytes(entries[0].read_bytes()[:100])
    again = scan()
    assert again.files_scanned == 1 and again.buffers == first.buffers
    # An entry an earlier version kept as Parquet is not read, and goes when the file is cached again.
    old = entries[1].with_suffix(".parquet")
    entries[1].rename(old)
    renewed = scan()
    assert renewed.files_scanned == 1 and renewed.buffers == first.buffers
    assert not old.exists() and entries[1].exists()
    assert scan().files_scanned == 0


def test_content_is_compared_only_for_identities_with_several_copies(tmp_path: Path, spark: Any) -> None:
    archive = tmp_path / "archive"
    archive.mkdir()
    pq.write_table(_rows(1, [1, 2], [1, 2, 3, 4]), archive / "a.parquet")
    pq.write_table(_rows(1, [2], [3, 4]), archive / "b.parquet")  # an identical copy of sequence 2
    pq.write_table(_rows(1, [3], [5, 6]), archive / "c.parquet")
    pq.write_table(_rows(1, [3], [5, 7]), archive / "d.parquet")  # sequence 3 again, other content
    config = parse_config({"archive": str(archive), "on_conflict": "keep_first"} | SHORT_COLUMNS)
    scan = scan_buffers(spark, inspect_schema(config), config)
    hashes = {b.sequence: b.content_hash for b in scan.buffers}
    assert hashes[1] == ""  # one copy: its payload is never read
    assert hashes[2] and hashes[3]
    assert [(d.sequence, d.file) for d in scan.duplicates] == [(2, str(archive / "b.parquet"))]
    assert [(c.sequence, c.other_file) for c in scan.conflicts] == [(3, str(archive / "d.parquet"))]


def test_the_file_cache_keeps_content_hashes_until_the_file_changes(tmp_path: Path, spark: Any) -> None:
    from replay.engine.file_cache import FileCache

    archive = tmp_path / "archive"
    archive.mkdir()
    pq.write_table(_rows(1, [1, 2], [1, 2, 3, 4]), archive / "a.parquet")
    pq.write_table(_rows(1, [2], [3, 4]), archive / "b.parquet")  # sequence 2 again: both copies hashed
    config = parse_config({"archive": str(archive), "on_conflict": "keep_first"} | SHORT_COLUMNS)
    cache = FileCache(tmp_path / "cache")

    def scan() -> Any:
        return scan_buffers(spark, inspect_schema(config), config, cache=cache)

    first = scan()
    assert first.copies_hashed == 2 and len(first.duplicates) == 1 and not first.conflicts
    again = scan()
    assert again.copies_hashed == 0 and again.buffers == first.buffers and again.duplicates == first.duplicates
    assert again.spark_paths == first.spark_paths  # the path Spark reports, for the pass's join

    # b.parquet rewritten in place with other content for sequence 2: its copy is hashed again, and
    # the kept copy in a.parquet comes from the cache; the copies now conflict.
    pq.write_table(_rows(1, [2], [3, 5]), archive / "b.parquet")
    changed = scan()
    assert changed.copies_hashed == 1
    assert [(c.sequence, c.other_file) for c in changed.conflicts] == [(2, str(archive / "b.parquet"))]
    assert not changed.duplicates


def test_the_scan_reads_event_times_only_where_needed(tmp_path: Path, spark: Any) -> None:
    pq.write_table(_rows(1, [1], [1, 2]), tmp_path / "a.parquet")
    config = parse_config({"archive": str(tmp_path)} | SHORT_COLUMNS)
    layout = inspect_schema(config)
    (full,) = scan_buffers(spark, layout, config).buffers
    (lean,) = scan_buffers(spark, layout, config, event_times=False).buffers
    assert (full.min_event, full.max_event) == ((SECOND,), (SECOND + 1,))
    assert (lean.min_event, lean.max_event) == ((None,), (None,))
    assert (lean.watermarks, lean.tuples, lean.rows) == (full.watermarks, full.tuples, full.rows)


def test_the_path_spark_reports_for_a_local_file_is_known_without_reading_it(tmp_path: Path, spark: Any) -> None:
    """The pass matches a copy's rows by the path Spark's reader reports (``_metadata.file_path``):
    the one Replay makes for a local file is that path, character for character, with names that URIs
    escape (a space, ``%``, ``#``, non-ASCII letters) and ones they keep (``+``, ``,``, ``;=&``, ``'``),
    given as a plain path (or, without characters to escape, as a ``file:`` URI)."""
    from pyspark.sql import functions as F

    from replay.engine.copies import _spark_paths

    archive = tmp_path / "an archive"
    archive.mkdir()
    names = ["plain", "a b", "a%20b", "é ü", "a#b", "a+b", "a,b", "a;b=c&d", "q'uote", "a%b"]
    files = []
    for name in names:
        pq.write_table(_rows(1, [1], [1, 2]), archive / f"{name}.parquet")
        files.append(str(archive / f"{name}.parquet"))
    plain = tmp_path / "plain"
    plain.mkdir()
    pq.write_table(_rows(1, [1], [1, 2]), plain / "x.parquet")
    files.append((plain / "x.parquet").as_uri())
    config = parse_config({"archive": str(archive)} | SHORT_COLUMNS)
    made = _spark_paths(spark, inspect_schema(config), files)
    for given in files:
        reported = spark.read.parquet(given).select(F.col("_metadata.file_path")).first()
        assert reported is not None and made[given] == reported[0], given
        # A pass matches rows by the task's input file name, brought to the same form.
        named = spark.read.parquet(given).select(reported_path(F.input_file_name())).first()
        assert named is not None and made[given] == named[0], given
