"""The Spark buffer scan: time units, column mapping, keyed event-time watermarks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replay.archive import inspect_schema
from replay.buffers import scan_buffers
from replay.config import parse_config

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


MAPPING = {
    "columns": {
        "origin_id": "o",
        "sequence_number": "s",
        "chunk_number": "c",
        "last_chunk": "l",
        "watermark_ts": "wm",
        "event_time": "t",
        "key": "k",
    }
}


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
    config = parse_config({"archive": str(tmp_path)} | MAPPING | settings)
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
