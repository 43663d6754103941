"""docs/errors.md#bad-input for the archive: every bad input stops with an error naming where and what to do."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replay.core import errors
from replay.core.config import parse_config
from replay.core.errors import (
    ArchiveReadError,
    ArchiveSchemaError,
    BadBufferError,
    ConfigError,
    ConflictingDuplicateError,
    EmptyArchiveError,
    ReplayError,
)
from replay.engine.archive import inspect_schema, resolve_lateness
from replay.engine.archive_files import discover_files
from replay.engine.buffers import scan_buffers

pytestmark = pytest.mark.spark

TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema(
    [
        ("origin_id", pa.int64()),
        ("sequence_number", pa.int64()),
        ("chunk_number", pa.int32()),
        ("last_chunk", pa.bool_()),
        ("watermark_ts", TS),
        ("ingest_ts", TS),
        ("event_time", TS),
        ("key", pa.int64()),
        ("value", pa.float64()),
    ]
)


def row(
    origin: int = 1,
    seq: int = 1,
    chunk: int = 1,
    last: bool = True,
    wm: int | None = 10,
    ingest: int | None = 0,
    t: int | None = 5,
    key: int | None = 1,
    value: float | None = 1.0,
) -> dict[str, Any]:
    return {
        "origin_id": origin,
        "sequence_number": seq,
        "chunk_number": chunk,
        "last_chunk": last,
        "watermark_ts": wm,
        "ingest_ts": ingest,
        "event_time": t,
        "key": key,
        "value": value,
    }


def write(path: Path, rows: list[dict[str, Any]], schema: pa.Schema = SCHEMA) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def scan(spark: Any, archive: Path, **settings: Any) -> Any:
    config = parse_config({"archive": str(archive)} | settings)
    return scan_buffers(spark, inspect_schema(config), config)


def test_empty_archives(tmp_path: Path, spark: Any) -> None:
    (tmp_path / "none").mkdir()
    with pytest.raises(EmptyArchiveError, match="no Parquet file") as err:
        discover_files(str(tmp_path / "none"))
    assert err.value.file == str(tmp_path / "none")
    write(tmp_path / "zero" / "a.parquet", [])
    with pytest.raises(EmptyArchiveError, match="hold no rows"):
        scan(spark, tmp_path / "zero")
    with pytest.raises(ArchiveReadError, match="does not exist"):
        discover_files(str(tmp_path / "nowhere"))


def test_truncated_and_non_parquet_files_are_named(tmp_path: Path) -> None:
    good = write(tmp_path / "a" / "part-0.parquet", [row()])
    data = good.read_bytes()
    bad = tmp_path / "a" / "part-1.parquet"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArchiveReadError, match="truncated") as err:
        inspect_schema(parse_config({"archive": str(tmp_path / "a")}))
    assert err.value.file == str(bad)
    assert "What to do" in str(err.value) and str(bad) in str(err.value)


@pytest.mark.parametrize("missing", ["origin_id", "sequence_number", "chunk_number", "last_chunk", "event_time", "key"])
def test_missing_column(tmp_path: Path, missing: str) -> None:
    schema = pa.schema([f for f in SCHEMA if f.name != missing])
    path = write(tmp_path / "a.parquet", [{k: v for k, v in row().items() if k != missing}], schema)
    with pytest.raises(ArchiveSchemaError, match=f"required column '{missing}'") as err:
        inspect_schema(parse_config({"archive": str(tmp_path)}))
    assert (err.value.file, err.value.column, err.value.code) == (str(path), missing, "archive.missing_column")


@pytest.mark.parametrize(
    ("column", "bad_type", "value", "hint"),
    [
        ("sequence_number", pa.string(), "1", "integer"),
        ("last_chunk", pa.int64(), 1, "bool"),
        ("event_time", pa.int64(), 5, "time_unit: ms"),
        ("key", pa.float64(), 1.0, "string or int64"),
        ("watermark_ts", pa.string(), "x", "timestamp"),
    ],
)
def test_mistyped_column(tmp_path: Path, column: str, bad_type: pa.DataType, value: Any, hint: str) -> None:
    schema = pa.schema([pa.field(column, bad_type) if f.name == column else f for f in SCHEMA])
    write(tmp_path / "a.parquet", [row() | {column: value}], schema)
    with pytest.raises(ArchiveSchemaError, match=hint) as err:
        inspect_schema(parse_config({"archive": str(tmp_path)}))
    assert err.value.column == column
    if column == "watermark_ts":  # buffer metadata, checked whether or not a key reads it
        event_time_key = {"watermarks": {"default": {"event_time": "event_time"}}}
        with pytest.raises(ArchiveSchemaError, match=hint) as err:
            inspect_schema(parse_config({"archive": str(tmp_path)} | event_time_key))
        assert (err.value.column, err.value.code) == (column, "archive.wrong_type")


def test_files_disagreeing_on_a_type(tmp_path: Path) -> None:
    write(tmp_path / "a.parquet", [row()])
    schema = pa.schema([pa.field("value", pa.string()) if f.name == "value" else f for f in SCHEMA])
    odd = write(tmp_path / "b.parquet", [row() | {"value": "x"}], schema)
    with pytest.raises(ArchiveSchemaError, match=r"in .*a\.parquet") as err:
        inspect_schema(parse_config({"archive": str(tmp_path)}))
    assert (err.value.file, err.value.column) == (str(odd), "value")


def test_configuration_against_archive(tmp_path: Path) -> None:
    write(tmp_path / "a.parquet", [row()], SCHEMA.remove(SCHEMA.get_field_index("ingest_ts")))
    with pytest.raises(ConfigError, match="'nope'") as err:
        inspect_schema(
            parse_config(
                {
                    "archive": str(tmp_path),
                    "windows": [{"name": "w", "size": "1m", "aggregations": [{"fn": "sum", "column": "nope"}]}],
                }
            )
        )
    assert err.value.column == "nope" and err.value.exit_code == 2
    assert err.value.file is None and err.value.where.field == "windows[w].aggregations"  # the job's, not a file's
    with pytest.raises(ConfigError, match="watermark column 'wm2'"):
        inspect_schema(parse_config({"archive": str(tmp_path), "watermarks": {"default": {"watermark": "wm2"}}}))
    config = parse_config({"archive": str(tmp_path), "lateness": "arrival"})
    with pytest.raises(ConfigError, match="needs the ingest_ts column"):
        resolve_lateness(config, inspect_schema(config))


def test_an_aggregation_names_the_archives_own_column_not_a_role(tmp_path: Path) -> None:
    """With ``columns: {event_time: ts}`` the archive has ``ts``: an aggregation over ``event_time``
    is a configuration error that names the column to use (exit 2), not a failure in Spark."""
    renamed = SCHEMA.set(SCHEMA.get_field_index("event_time"), pa.field("ts", TS))
    write(tmp_path / "a.parquet", [row()], renamed)
    settings = {"archive": str(tmp_path), "columns": {"event_time": "ts"}}
    windows = [{"name": "w", "size": "1m", "aggregations": [{"fn": "max", "column": "event_time"}]}]
    with pytest.raises(ConfigError) as err:
        inspect_schema(parse_config(settings | {"windows": windows}))
    assert err.value.code == "config.unknown_column" and err.value.exit_code == 2
    assert "maps to 'ts'" in err.value.todo
    windows[0]["aggregations"] = [{"fn": "max", "column": "ts"}]
    assert inspect_schema(parse_config(settings | {"windows": windows})).keys[0].event_time == "ts"


@pytest.mark.parametrize(
    ("fn", "column", "kind"),
    [
        ("sum", "event_time", "timestamp"),
        ("mean", "ingest_ts", "timestamp"),
        ("sum", "tag", "string"),
        ("mean", "flag", "bool"),
    ],
)
def test_sum_and_mean_take_numbers_only(tmp_path: Path, fn: str, column: str, kind: str) -> None:
    """``sum``/``mean`` over a time, a string or a bool has no sum SQL defines (the engine and the
    reference would disagree on one): ``archive.wrong_type`` naming the column, before any Spark job;
    ``min``, ``max`` and ``count`` over the same column are fine."""
    schema = SCHEMA.append(pa.field("tag", pa.string())).append(pa.field("flag", pa.bool_()))
    write(tmp_path / "a.parquet", [row() | {"tag": "x", "flag": True}], schema)
    windows = [{"name": "w", "size": "1m", "aggregations": [{"fn": fn, "column": column}]}]
    with pytest.raises(ArchiveSchemaError) as err:
        inspect_schema(parse_config({"archive": str(tmp_path), "windows": windows}))
    assert err.value.code == "archive.wrong_type" and err.value.where.column == column
    assert kind in str(err.value) and f"{fn} of window w" in str(err.value) and "min, max or count" in err.value.todo
    windows[0]["aggregations"] = [{"fn": other, "column": column} for other in ("min", "max", "count")]
    inspect_schema(parse_config({"archive": str(tmp_path), "windows": windows}))
    windows[0]["aggregations"] = [{"fn": fn, "column": "value"}]
    inspect_schema(parse_config({"archive": str(tmp_path), "windows": windows}))


@pytest.mark.parametrize(
    ("rows", "settings", "code", "where"),
    [
        ([row(seq=0)], {}, "archive.bad_sequence", {"origin": 1, "sequence": 0}),
        ([row(origin=0)], {}, "archive.bad_origin", {"origin": 0}),
        ([row(chunk=0)], {}, "archive.bad_chunk", {"chunk": 0}),
        ([row(chunk=0)], {"chunk_base": 0}, None, {}),
        ([row(chunk=1, last=True), row(chunk=2, last=True)], {}, "archive.two_last_chunks", {"sequence": 1}),
        ([row(chunk=2, last=True), row(chunk=3, last=False)], {}, "archive.chunk_beyond_last", {"chunk": 3}),
        ([row(), row(wm=11)], {}, "archive.metadata_disagrees", {"column": "watermark_ts"}),
        ([row(), row(wm=None)], {}, "archive.metadata_disagrees", {"column": "watermark_ts"}),
        # watermark_ts is buffer metadata even where the key reads event times instead.
        (
            [row(), row(wm=11)],
            {"watermarks": {"default": {"event_time": "event_time"}}},
            "archive.metadata_disagrees",
            {"column": "watermark_ts"},
        ),
        ([row(), row(last=False)], {}, "archive.metadata_disagrees", {"column": "last_chunk"}),
        ([row(), row(ingest=1)], {}, "archive.metadata_disagrees", {"column": "ingest_ts"}),
        ([row(ingest=None)], {}, "archive.null_metadata", {"column": "ingest_ts"}),
        ([row(last=None)], {}, "archive.null_metadata", {"column": "last_chunk"}),  # type: ignore[arg-type]
        ([row(seq=None)], {}, "archive.null_identity", {"column": "sequence_number"}),  # type: ignore[arg-type]
        # The rules are tested on the scan's columns first: a bad buffer after many good ones is
        # still the one named, and a watermark null on every row of a buffer is no disagreement.
        (
            [row(seq=s, wm=10 * s) for s in range(1, 30)] + [row(seq=30, wm=1), row(seq=30, wm=2)],
            {},
            "archive.metadata_disagrees",
            {"sequence": 30, "column": "watermark_ts"},
        ),
        ([row(wm=None), row(wm=None)], {}, None, {}),
    ],
)
def test_bad_buffers(
    tmp_path: Path,
    spark: Any,
    rows: list[dict[str, Any]],
    settings: dict[str, Any],
    code: str | None,
    where: dict[str, Any],
) -> None:
    path = write(tmp_path / "a.parquet", rows)
    if code is None:
        assert len(scan(spark, tmp_path, **settings).buffers) == len(
            {(r["origin_id"], r["sequence_number"]) for r in rows}
        )
        return
    with pytest.raises(BadBufferError) as err:
        scan(spark, tmp_path, **settings)
    assert err.value.code == code
    assert err.value.file == str(path)
    for name, value in where.items():
        assert getattr(err.value, name) == value, (name, str(err.value))
    assert "What to do" in str(err.value)


def test_disagreeing_time_metadata_is_shown_as_timestamps(tmp_path: Path) -> None:
    from replay.engine.copy_checks import check_copy

    write(tmp_path / "a.parquet", [row()])
    layout = inspect_schema(parse_config({"archive": str(tmp_path)}))
    t = 1_767_225_616_003_146  # 2026-01-01T00:00:16.003146Z
    rec: dict[str, Any] = {"_file": "a.parquet", "origin": 1, "sequence": 1, "chunk": 1, "rows": 2}
    for name, low, high in (("last_chunk", 1, 1), ("ingest", 0, 0), ("wm0", t, t + 1000)):
        rec |= {f"{name}_n": 2, f"{name}_min": low, f"{name}_max": high}
    shown = "values from 2026-01-01T00:00:16.003146Z to 2026-01-01T00:00:16.004146Z,"
    with pytest.raises(BadBufferError, match=re.escape(shown)):
        check_copy(rec, layout, 1)
    rec |= {"wm0_max": t, "last_chunk_min": 0}  # not a time column: its values as they are
    with pytest.raises(BadBufferError, match="'last_chunk' \\(values from 0 to 1,"):
        check_copy(rec, layout, 1)


def test_conflicting_duplicate_names_both_files(tmp_path: Path, spark: Any) -> None:
    first = write(tmp_path / "a.parquet", [row(ingest=0), row(t=6, ingest=0)])
    second = write(tmp_path / "b.parquet", [row(ingest=9), row(t=7, ingest=9)])
    with pytest.raises(ConflictingDuplicateError) as err:
        scan(spark, tmp_path)
    assert (err.value.origin, err.value.sequence, err.value.chunk) == (1, 1, 1)
    assert str(first) in str(err.value) and str(second) in str(err.value)
    kept = scan(spark, tmp_path, on_conflict="keep_first")
    assert [(c.kept_file, c.other_file) for c in kept.conflicts] == [(str(first), str(second))]
    assert kept.buffers[0].file == str(first)


def test_identical_duplicates_are_counted_and_first_arrival_kept(tmp_path: Path, spark: Any) -> None:
    # The same buffer, rows in another order, archived later; and a second copy inside one file.
    write(
        tmp_path / "a.parquet",
        [row(t=6, ingest=5), row(t=7, ingest=5), row(seq=2, wm=20), row(t=7, ingest=5), row(t=6, ingest=5)],
    )
    write(tmp_path / "b.parquet", [row(t=7, ingest=3), row(t=6, ingest=3)])
    result = scan(spark, tmp_path)
    assert [b.identity for b in result.buffers] == [(1, 1, 1), (1, 2, 1)]
    kept = result.buffers[0]
    assert (kept.file, kept.ingest) == (str(tmp_path / "b.parquet"), 3)
    assert sorted((d.file, d.row_start) for d in result.duplicates) == [
        (str(tmp_path / "a.parquet"), 0),
        (str(tmp_path / "a.parquet"), 3),
    ]
    assert result.tuples_read == 7 and sum(d.tuples for d in result.duplicates) == 4


def test_every_error_class_is_a_replay_error_with_its_own_code() -> None:
    classes = [getattr(errors, name) for name in errors.__all__ if isinstance(getattr(errors, name), type)]
    exceptions = [c for c in classes if issubclass(c, Exception)]
    assert exceptions and all(issubclass(c, ReplayError) for c in exceptions)
    codes = [c.code for c in exceptions]
    assert len(set(codes)) == len(codes)
