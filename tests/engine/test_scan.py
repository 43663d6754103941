"""The metadata scan's per-copy records (``scan.scan_file``) against a row-by-row model: a copy is a
run of consecutive rows of one identity, and its record holds its identity, rows, tuples, row range
and, per metadata and event time column, the smallest and largest non-null value (and how many)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.engine import scan
from replay.engine.scan import scan_file
from replay.engine.scan_columns import ScanColumns

_COLUMNS = ScanColumns(
    origin="origin_id",
    sequence="sequence_number",
    chunk="chunk_number",
    key="key",
    meta=(("last_chunk", "last_chunk", None), ("ingest", "ingest_ts", "ms"), ("wm0", "watermark_ts", "ns")),
    events=(("event_time", "us"), None),
    tuple_times=("event_time",),
)
# A run whose keys take their watermarks from a watermark column reads no event time, but a row
# with a null key and an event time is still a tuple.
_NO_EVENTS = dataclasses.replace(_COLUMNS, events=(None, None))
_TYPES = {
    "origin_id": pa.int64(),
    "sequence_number": pa.int32(),
    "chunk_number": pa.int16(),
    "last_chunk": pa.bool_(),
    "ingest_ts": pa.timestamp("ms", tz="UTC"),
    "watermark_ts": pa.timestamp("ns", tz="UTC"),
    "event_time": pa.timestamp("us", tz="UTC"),
    "key": pa.int64(),
}
_MICROS = {"ingest_ts": lambda v: v * 1000, "watermark_ts": lambda v: v // 1000}


def _maybe(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), values) | values


@st.composite
def _rows(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Runs of rows of a few identities (nulls included), so that identities repeat, and
    metadata and event times that may be null on any row."""
    rows: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 8))):
        identity = {
            "origin_id": draw(_maybe(st.integers(0, 2))),
            "sequence_number": draw(st.integers(0, 2)),
            "chunk_number": draw(_maybe(st.integers(0, 1))),
        }
        for _ in range(draw(st.integers(1, 5))):
            rows.append(
                identity
                | {
                    "last_chunk": draw(_maybe(st.booleans())),
                    "ingest_ts": draw(_maybe(st.integers(-(10**6), 10**6))),
                    "watermark_ts": draw(_maybe(st.integers(-(10**12), 10**12))),
                    "event_time": draw(_maybe(st.integers(-(10**9), 10**9))),
                    "key": draw(_maybe(st.integers(0, 3))),
                }
            )
    return rows


def _model(rows: list[dict[str, Any]], path: str, columns: ScanColumns = _COLUMNS) -> list[dict[str, Any]]:
    """The records, row by row."""
    records: list[dict[str, Any]] = []
    previous: tuple[Any, ...] | None = None
    for index, row in enumerate(rows):
        identity = (row["origin_id"], row["sequence_number"], row["chunk_number"])
        if identity != previous:
            records.append({"_file": path, "_rows": []})
            previous = identity
        records[-1]["_rows"].append((index, row))
    out = []
    for record in records:
        members = record.pop("_rows")
        first = members[0][1]
        got: dict[str, Any] = {
            "_file": path,
            "origin": first["origin_id"],
            "sequence": first["sequence_number"],
            "chunk": first["chunk_number"],
            "rows": len(members),
            "tuples": sum(1 for _, r in members if r["key"] is not None or r["event_time"] is not None),
            "row_min": members[0][0],
            "row_max": members[-1][0],
        }
        for name, column, _ in _COLUMNS.meta:
            values = [int(r[column]) for _, r in members if r[column] is not None]
            micros = _MICROS.get(column, lambda v: v)
            got[f"{name}_min"] = micros(min(values)) if values else None
            got[f"{name}_max"] = micros(max(values)) if values else None
            got[f"{name}_n"] = len(values)
        events = [r["event_time"] for _, r in members if r["event_time"] is not None]
        read = columns.events[0] is not None
        got["ev0_min"] = min(events) if events and read else None
        got["ev0_max"] = max(events) if events and read else None
        got["ev1_min"] = got["ev1_max"] = None
        out.append(got)
    return out


@settings(max_examples=60, deadline=None)
@given(rows=_rows(), batch_rows=st.one_of(st.integers(1, 12), st.just(65_536)))
def test_a_files_records_are_its_runs_of_rows_of_one_identity(
    tmp_path_factory: Any, rows: list[dict[str, Any]], batch_rows: int
) -> None:
    """Read ``batch_rows`` rows at a time: a copy that a batch's edge cuts is one record."""
    path = Path(tmp_path_factory.mktemp("scan")) / "part-00000.parquet"
    table = pa.table({name: pa.array([r[name] for r in rows], kind) for name, kind in _TYPES.items()})
    pq.write_table(table, path, row_group_size=7)  # copies across row groups too
    with patch.object(scan, "_BATCH_ROWS", batch_rows):
        assert scan_file(str(path), _COLUMNS).to_pylist() == _model(rows, str(path))
        assert scan_file(str(path), _NO_EVENTS).to_pylist() == _model(rows, str(path), _NO_EVENTS)
