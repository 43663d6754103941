"""Canonical rows, digests and ``show``: the same rows give the same digest, any other difference changes it."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay.core.errors import ConfigError
from replay.core.timeutil import NEG_INF, format_ts, parse_timestamp
from replay.store.digest import canonical_lines, digest, show_lines, table_digest
from replay.store.outputs import TABLES, Manifest, write_manifest

MINUTE = 60_000_000
T0 = parse_timestamp("2026-01-01T00:00:00Z")
TS = pa.timestamp("us", tz="UTC")
WINDOWS = pa.schema(
    [
        ("window", pa.string()),
        ("key", pa.int64()),
        ("window_start", TS),
        ("window_end", TS),
        ("count", pa.int64()),
        ("sum_value", pa.float64()),
    ]
)


def windows(*rows: tuple[Any, ...]) -> pa.Table:
    """A ``windows`` table from (window, key, start, end, count, sum) rows, times in microseconds."""
    return pa.Table.from_pylist([dict(zip(WINDOWS.names, row, strict=True)) for row in rows], schema=WINDOWS)


ROWS: list[tuple[Any, ...]] = [
    ("per_minute", 2, T0, T0 + MINUTE, 3, 1.5),
    ("per_minute", 1, T0 + MINUTE, T0 + 2 * MINUTE, 1, None),
    ("per_minute", 1, T0, T0 + MINUTE, 2, 0.25),
    ("per_minute", None, T0, T0 + MINUTE, 1, 7.0),
]


def parsed(table: pa.Table, *, precise: bool = False) -> list[dict[str, Any]]:
    return [json.loads(line) for line in canonical_lines(table, precise=precise)]


# --- canonical rows ------------------------------------------------------------------------------------------------


def test_rows_are_sorted_by_all_columns_in_column_order_with_nulls_first() -> None:
    rows = parsed(windows(*ROWS))
    assert [(r["key"], r["window_start"]) for r in rows] == [
        (None, "2026-01-01T00:00:00.000Z"),
        (1, "2026-01-01T00:00:00.000Z"),
        (1, "2026-01-01T00:01:00.000Z"),
        (2, "2026-01-01T00:00:00.000Z"),
    ]


def test_keys_follow_column_order_and_lines_are_compact() -> None:
    (line,) = canonical_lines(windows(("per_minute", 1, T0, T0 + MINUTE, 2, None)), precise=False)
    assert line == (
        '{"window":"per_minute","key":1,"window_start":"2026-01-01T00:00:00.000Z",'
        '"window_end":"2026-01-01T00:01:00.000Z","count":2,"sum_value":null}'
    )


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([3, None, -1, 2], [None, -1, 2, 3]),
        (["b", None, "a", "B"], [None, "B", "a", "b"]),
        ([float("nan"), None, 1.5, float("-inf"), float("inf")], [None, "-Infinity", 1.5, "Infinity", "NaN"]),
        ([True, None, False], [None, False, True]),
        ([[2], None, [1, 3], []], [None, [1, 3], [2], []]),  # lists sort by their JSON text
    ],
)
def test_one_column_sorts_nulls_first(values: list[Any], expected: list[Any]) -> None:
    assert [r["v"] for r in parsed(pa.table({"v": values}))] == expected


def test_list_elements_keep_their_order() -> None:
    assert parsed(pa.table({"v": [[3, 1, 2]]})) == [{"v": [3, 1, 2]}]


@pytest.mark.parametrize(
    ("array", "expected"),
    [
        (pa.array([Decimal("1.10")], pa.decimal128(5, 2)), "1.10"),
        (pa.array([b"\x00\xff"]), "00ff"),
        (pa.array([0], pa.date32()), "1970-01-01"),
        (pa.array([1_500], pa.duration("ms")), 1_500),
        (pa.array([{"a": 1, "b": "x"}]), {"a": 1, "b": "x"}),
        (pa.array(["x"]).dictionary_encode(), "x"),
        (pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64())), [{"key": "k", "value": 1}]),
    ],
)
def test_value_forms(array: pa.Array, expected: Any) -> None:
    assert parsed(pa.table({"v": array})) == [{"v": expected}]


# --- timestamps ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("micros", "shown", "hashed"),
    [
        (T0 + MINUTE, "2026-01-01T00:01:00.000Z", "2026-01-01T00:01:00.000000Z"),
        (T0 + 1_500, "2026-01-01T00:00:00.001500Z", "2026-01-01T00:00:00.001500Z"),  # show never rounds
        (T0 - 1, "2025-12-31T23:59:59.999999Z", "2025-12-31T23:59:59.999999Z"),
        (NEG_INF, "-inf", "-inf"),
    ],
)
def test_timestamps_show_in_milliseconds_and_hash_in_microseconds(micros: int, shown: str, hashed: str) -> None:
    table = pa.table({"t": pa.array([micros], TS)})
    assert parsed(table) == [{"t": shown}]
    assert parsed(table, precise=True) == [{"t": hashed}]
    assert shown == format_ts(micros)  # one text form with replay.core.timeutil


@pytest.mark.parametrize(
    "data_type", [pa.timestamp("s"), pa.timestamp("ms", tz="UTC"), pa.timestamp("ns", tz="+02:00")]
)
def test_timestamps_of_any_unit_and_zone_are_utc(data_type: pa.DataType) -> None:
    # Arrow stores every timestamp as an instant since the epoch in UTC; a naive one is read as UTC.
    seconds = (T0 + MINUTE) // 1_000_000
    value = pa.array([seconds], pa.timestamp("s")).cast(data_type)
    assert parsed(pa.table({"t": value})) == [{"t": "2026-01-01T00:01:00.000Z"}]


def test_nanoseconds_are_kept() -> None:
    table = pa.table({"t": pa.array([1], pa.timestamp("ns"))})
    assert parsed(table, precise=True) == [{"t": "1970-01-01T00:00:00.000000001Z"}]


# --- digests -------------------------------------------------------------------------------------------------------


def test_row_order_does_not_change_the_digest() -> None:
    assert table_digest(windows(*ROWS)) == table_digest(windows(*reversed(ROWS)))


def test_chunking_does_not_change_the_digest() -> None:
    one = windows(*ROWS)
    split = pa.concat_tables([windows(*ROWS[2:]), windows(*ROWS[:1]), windows(*ROWS[1:2])])
    assert split.column(0).num_chunks == 3
    assert table_digest(one) == table_digest(split)


@given(st.permutations(range(len(ROWS))), st.integers(min_value=0, max_value=len(ROWS)))
def test_any_order_and_split_gives_the_same_digest(order: list[int], cut: int) -> None:
    shuffled = [ROWS[i] for i in order]
    table = pa.concat_tables([windows(*shuffled[:cut]), windows(*shuffled[cut:])])
    assert table_digest(table) == table_digest(windows(*ROWS))


def test_zero_and_negative_zero_sort_deterministically() -> None:
    rows = [{"v": 0.0}, {"v": -0.0}]
    assert table_digest(pa.Table.from_pylist(rows)) == table_digest(pa.Table.from_pylist(rows[::-1]))
    assert table_digest(pa.Table.from_pylist(rows)) != table_digest(pa.Table.from_pylist([{"v": 0.0}] * 2))


def changed(index: int, column: int, delta: int) -> list[tuple[Any, ...]]:
    rows = list(ROWS)
    row = list(rows[index])
    row[column] += delta
    rows[index] = tuple(row)
    return rows


@pytest.mark.parametrize(
    "rows",
    [
        pytest.param(changed(0, 2, 1), id="one microsecond in a window start"),
        pytest.param(changed(2, 4, 1), id="one more in a count"),
        pytest.param(ROWS[:-1], id="one row fewer"),
        pytest.param([*ROWS, ROWS[0]], id="one row twice"),  # a multiset, not a set
    ],
)
def test_any_change_in_the_rows_changes_the_digest(rows: list[tuple[Any, ...]]) -> None:
    assert table_digest(windows(*rows)) != table_digest(windows(*ROWS))


def test_a_column_type_changes_the_digest() -> None:
    table = windows(*ROWS)
    as_int32 = table.cast(WINDOWS.set(4, pa.field("count", pa.int32())))
    assert canonical_lines(as_int32, precise=True) == canonical_lines(table, precise=True)
    assert table_digest(as_int32) != table_digest(table)


def test_a_column_name_changes_the_digest() -> None:
    table = windows(*ROWS)
    assert table_digest(table.rename_columns([*WINDOWS.names[:-1], "max_value"])) != table_digest(table)


def test_dictionary_encoding_does_not_change_the_digest() -> None:
    table = windows(*ROWS)
    encoded = table.set_column(0, "window", table.column("window").dictionary_encode())
    assert table_digest(encoded) == table_digest(table)


def test_empty_tables_digest_their_schema() -> None:
    assert table_digest(WINDOWS.empty_table()) == table_digest(WINDOWS.empty_table())
    assert table_digest(WINDOWS.empty_table()) != table_digest(pa.schema([]).empty_table())


def test_duplicate_column_names_are_refused() -> None:
    table = pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"])
    with pytest.raises(ValueError, match="more than once"):
        table_digest(table)


def test_nan_is_a_value() -> None:
    nan = pa.table({"v": [math.nan]})
    assert parsed(nan, precise=True) == [{"v": "NaN"}]
    assert table_digest(nan) != table_digest(pa.table({"v": [None]}, schema=nan.schema))


# --- an output directory -------------------------------------------------------------------------------------------


def write_files(root: Path, table: str, batch: str, *parts: pa.Table) -> str:
    """Parquet files of one committed batch, as a run writes them; return the manifest entry."""
    entry = f"data/{table}/x-b{batch}-abc"
    (root / entry).mkdir(parents=True)
    for number, part in enumerate(parts):
        pq.write_table(part, root / entry / f"part-{number}.parquet")
    return entry


def manifest(windows_entries: list[str], schemas: dict[str, pa.Schema] | None = None) -> Manifest:
    return Manifest(
        tables={name: () for name in TABLES} | {"windows": tuple(windows_entries)},
        schemas={name: s.serialize().to_pybytes().hex() for name, s in (schemas or {}).items()},
    )


def test_digest_of_an_output_is_one_digest_per_table(tmp_path: Path) -> None:
    entry = write_files(tmp_path, "windows", "00000001", windows(*ROWS))
    version = write_manifest(tmp_path, manifest([entry])).version
    result = digest(tmp_path, version)
    assert list(result) == list(TABLES)
    assert result["windows"] == table_digest(windows(*ROWS))
    assert digest(tmp_path) == result  # no --version: the newest one


def test_a_different_split_across_files_and_batches_gives_the_same_digest(tmp_path: Path) -> None:
    one = write_manifest(tmp_path, manifest([write_files(tmp_path, "windows", "00000001", windows(*ROWS))])).version
    first = write_files(tmp_path, "windows", "00000002", windows(ROWS[3]), windows(ROWS[1]))
    second = write_files(tmp_path, "windows", "00000003", windows(ROWS[2], ROWS[0]))
    two = write_manifest(tmp_path, manifest([second, first])).version
    assert digest(tmp_path, one) == digest(tmp_path, two)


def test_an_empty_table_with_a_stored_schema_digests_like_an_empty_file(tmp_path: Path) -> None:
    stored = write_manifest(tmp_path, manifest([], schemas={"windows": WINDOWS})).version
    empty_file = write_manifest(tmp_path, manifest([write_files(tmp_path, "windows", "00000001", windows())])).version
    no_schema = write_manifest(tmp_path, manifest([])).version
    assert digest(tmp_path, stored)["windows"] == table_digest(WINDOWS.empty_table())
    assert digest(tmp_path, stored) == digest(tmp_path, empty_file)
    assert digest(tmp_path, stored)["windows"] != digest(tmp_path, no_schema)["windows"]


def test_digest_of_a_missing_version_is_a_config_error(tmp_path: Path) -> None:
    write_manifest(tmp_path, manifest([]))
    with pytest.raises(ConfigError) as caught:
        digest(tmp_path, 7)
    assert caught.value.code == "output.no_version"


@pytest.fixture
def output(tmp_path: Path) -> Path:
    rows = [ROWS[0], ROWS[3]]
    write_manifest(tmp_path, manifest([write_files(tmp_path, "windows", "00000001", windows(*rows))]))
    return tmp_path


def test_show_jsonl_prints_sorted_rows_with_millisecond_timestamps(output: Path) -> None:
    assert list(show_lines(output, "windows")) == [
        '{"window":"per_minute","key":null,"window_start":"2026-01-01T00:00:00.000Z",'
        '"window_end":"2026-01-01T00:01:00.000Z","count":1,"sum_value":7.0}',
        '{"window":"per_minute","key":2,"window_start":"2026-01-01T00:00:00.000Z",'
        '"window_end":"2026-01-01T00:01:00.000Z","count":3,"sum_value":1.5}',
    ]


def test_show_csv_prints_a_header_then_the_same_rows(output: Path) -> None:
    assert list(show_lines(output, "windows", fmt="csv")) == [
        "window,key,window_start,window_end,count,sum_value",
        "per_minute,,2026-01-01T00:00:00.000Z,2026-01-01T00:01:00.000Z,1,7.0",
        "per_minute,2,2026-01-01T00:00:00.000Z,2026-01-01T00:01:00.000Z,3,1.5",
    ]


def test_show_csv_writes_lists_as_json_and_quotes_them(tmp_path: Path) -> None:
    entry = write_files(tmp_path, "windows", "00000001", pa.table({"v": [[1, 2]], "ok": [True]}))
    write_manifest(tmp_path, manifest([entry]))
    assert list(show_lines(tmp_path, "windows", fmt="csv")) == ["v,ok", '"[1,2]",true']


def test_show_of_an_empty_table_is_its_header(tmp_path: Path) -> None:
    write_manifest(tmp_path, manifest([], schemas={"windows": WINDOWS}))
    assert list(show_lines(tmp_path, "windows", fmt="csv")) == [",".join(WINDOWS.names)]
    assert list(show_lines(tmp_path, "windows")) == []


def test_show_refuses_an_unknown_format_before_iterating(output: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        show_lines(output, "windows", fmt="xml")
    assert caught.value.code == "output.bad_format"
    assert caught.value.exit_code == 2
    assert "jsonl, csv" in caught.value.message


def test_show_refuses_an_unknown_table(output: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        show_lines(output, "nope")
    assert caught.value.code == "output.unknown_table"
