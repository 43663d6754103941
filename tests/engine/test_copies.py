"""A copy's content hash, as the hashing tasks compute it (pyarrow only, no Spark): order-free over a
copy's rows, sensitive to every value and to nulls, independent of the file's row groups, and given
only to a row range that still holds its copy."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.core.config import parse_config
from replay.engine.archive import inspect_schema
from replay.engine.copies import _Columns, hash_file_copies, same_content
from tests._archives import SHORT_COLUMNS

SECOND = 1_000_000

# Payload values chosen to collide under a careless encoding: separators, the null mark, empty text.
_texts = st.one_of(st.none(), st.sampled_from(["", "N", "|", ":", "1:a", "a|b", "0:"]), st.text(max_size=4))
_floats = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True, width=64))
_row = st.tuples(_texts, _floats, st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)))


def _write(path: Path, copies: list[list[tuple[str | None, float | None, int | None]]], group: int) -> None:
    """One buffer per copy (sequences 1, 2, ...; the same watermark and event times), each copy's rows in
    order, row groups of ``group`` rows."""
    rows = [(s, r) for s, copy in enumerate(copies, start=1) for r in copy]
    n = len(rows)
    table = pa.table(
        {
            "o": pa.array([1] * n, pa.int64()),
            "s": pa.array([s for s, _ in rows], pa.int64()),
            "c": pa.array([1] * n, pa.int64()),
            "l": [True] * n,
            "wm": pa.array([SECOND] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            "t": pa.array([SECOND] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            "k": pa.array([r[0] for _, r in rows], pa.string()),
            "x": pa.array([r[1] for _, r in rows], pa.float64()),
            "v": pa.array([r[2] for _, r in rows], pa.int64()),
        }
    )
    pq.write_table(table, path, row_group_size=group)


def _hashes(tmp: Path, copies: list[list[tuple[str | None, float | None, int | None]]], group: int) -> list[str]:
    archive = tmp / f"archive-{group}"
    archive.mkdir(exist_ok=True)
    path = archive / "a.parquet"
    _write(path, copies, group)
    layout = inspect_schema(parse_config({"archive": str(archive)} | SHORT_COLUMNS))
    starts, at = [], 0
    for copy in copies:
        starts.append(at)
        at += len(copy)
    ranges = [(start, len(copy), 1, s, 1) for s, (start, copy) in enumerate(zip(starts, copies, strict=True), start=1)]
    found = hash_file_copies(str(path), ranges, _Columns.of(layout))
    return [found[start] for start in starts]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_row, min_size=1, max_size=12), data=st.data())
def test_the_hash_ignores_row_order_and_row_groups_and_sees_every_value(tmp_path: Path, rows: list, data) -> None:
    shuffled = data.draw(st.permutations(rows))
    at = data.draw(st.integers(0, len(rows) - 1))
    column = data.draw(st.integers(0, 2))
    other = data.draw(_row)[column]
    changed = list(rows)
    changed[at] = tuple(other if i == column else v for i, v in enumerate(rows[at]))
    group = data.draw(st.integers(1, 7))

    same, permuted, edited = _hashes(tmp_path, [rows, shuffled, changed], group)
    assert same == permuted
    assert (same == edited) == (sorted(map(repr, rows)) == sorted(map(repr, changed)))
    # Row groups cut elsewhere do not change a copy's hash.
    assert _hashes(tmp_path, [rows, shuffled, changed], 64) == [same, permuted, edited]


def test_a_range_that_no_longer_holds_its_copy_gets_no_hash(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    archive.mkdir()
    path = archive / "a.parquet"
    _write(path, [[("a", 1.0, 1), ("b", 2.0, 2)], [("c", 3.0, 3)]], 2)
    columns = _Columns.of(inspect_schema(parse_config({"archive": str(archive)} | SHORT_COLUMNS)))
    assert set(hash_file_copies(str(path), [(0, 2, 1, 1, 1), (2, 1, 1, 2, 1)], columns)) == {0, 2}
    assert hash_file_copies(str(path), [(0, 1, 1, 1, 1)], columns) == {}  # the copy goes on past the range
    assert hash_file_copies(str(path), [(1, 2, 1, 1, 1)], columns) == {}  # a row of another buffer inside
    assert hash_file_copies(str(path), [(2, 5, 1, 2, 1)], columns) == {}  # past the file's end
    assert hash_file_copies(str(path), [(0, 2, 9, 1, 1)], columns) == {}  # another origin


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=5), group=st.integers(1, 7), data=st.data())
def test_a_copy_given_without_its_rows_is_hashed_over_the_rows_of_its_identity(
    tmp_path: Path, sizes: list[int], group: int, data: st.DataObject
) -> None:
    """A copy whose row count is unknown (-1: a copy the checkpoint recorded without it) gets the hash
    of the rows of its identity from its first row on, whatever the row groups; a first row of another
    identity, or past the file's end, gets none."""
    archive = tmp_path / "extent"
    archive.mkdir(exist_ok=True)
    path = archive / "a.parquet"
    copies = [[(f"{s}-{i}", float(i), i) for i in range(size)] for s, size in enumerate(sizes, start=1)]
    _write(path, copies, group)
    columns = _Columns.of(inspect_schema(parse_config({"archive": str(archive)} | SHORT_COLUMNS)))
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    s = data.draw(st.integers(1, len(sizes)))
    known = hash_file_copies(str(path), [(starts[s - 1], sizes[s - 1], 1, s, 1)], columns)
    assert hash_file_copies(str(path), [(starts[s - 1], -1, 1, s, 1)], columns) == known
    assert known  # the range holds its copy
    assert hash_file_copies(str(path), [(starts[s - 1], -1, 1, s + 1, 1)], columns) == {}
    assert hash_file_copies(str(path), [(sum(sizes), -1, 1, s, 1)], columns) == {}


def test_hashes_of_different_versions_are_never_compared() -> None:
    assert same_content("v2:ab", "v2:ab") is True
    assert same_content("v2:ab", "v2:cd") is False
    assert same_content("v2:ab", "0123abcd") is None  # a hash from before the version prefix
    assert same_content("v2:ab", "") is None


def _time_copies(path: Path, copies: list[tuple[int, int]]) -> None:
    """One buffer per copy ``(p, wm)`` of ``copies`` (sequences 1, 2, ...), two rows each: a payload
    timestamp ``p`` in nanoseconds (``p`` on the first row, ``p + 1`` on the second), and the
    archive's watermark column ``wm`` in nanoseconds, which a key on event-time watermarks does not read."""
    ns = pa.timestamp("ns", tz="UTC")
    n = 2 * len(copies)
    pq.write_table(
        pa.table(
            {
                "o": pa.array([1] * n, pa.int64()),
                "s": pa.array([s for s in range(1, len(copies) + 1) for _ in range(2)], pa.int64()),
                "c": pa.array([1] * n, pa.int64()),
                "l": [True] * n,
                "wm": pa.array([wm for _, wm in copies for _ in range(2)], pa.int64()).cast(ns),
                "t": pa.array([SECOND] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                "k": pa.array(["a"] * n, pa.string()),
                "p": pa.array([p + i for p, _ in copies for i in range(2)], pa.int64()).cast(ns),
            }
        ),
        path,
    )


def test_times_are_hashed_at_microseconds_and_watermark_ts_as_metadata(tmp_path: Path) -> None:
    """Replay keeps times at microseconds: two copies whose nanosecond payload times truncate to the
    same microseconds (toward minus infinity) are the same content, as the reference model finds;
    a microsecond apart, they differ. The archive's ``watermark_ts`` is metadata even when the
    key reads event times instead: in the hash (at microseconds), not among the payload."""
    archive = tmp_path / "archive"
    archive.mkdir()
    path = archive / "a.parquet"
    copies = [
        (-1_000, 5_000),  # payload -1000 and -999 ns: -1 us both; the watermark 5000 ns is 5 us
        (-2, 5_999),  # -2 and -1 ns: -1 us both (not 0: toward minus infinity); 5999 ns is 5 us
        (-1_001, 5_000),  # -1001 and -1000 ns: -2 us and -1 us
        (-1_000, 6_000),  # the watermark a microsecond later
    ]
    _time_copies(path, copies)
    settings = {"archive": str(archive), "watermarks": {"default": {"event_time": "t"}}} | SHORT_COLUMNS
    layout = inspect_schema(parse_config(settings))
    assert layout.payload == ("t", "k", "p") and layout.metadata_watermark == "wm"
    assert layout.time_columns == {"t": "us", "wm": "ns", "p": "ns"}
    ranges = [(2 * i, 2, 1, i + 1, 1) for i in range(len(copies))]
    hashes = hash_file_copies(str(path), ranges, _Columns.of(layout))
    first, below_a_micro, other_micro, later_watermark = (hashes[2 * i] for i in range(len(copies)))
    assert first == below_a_micro
    assert first != other_micro
    assert first != later_watermark
