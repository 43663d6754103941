"""Buffer metadata persisted in a checkpoint: written by one function, read by one function.

Each batch writes the metadata of the buffers it fed to the progress engine (in feed order)
and of the buffers the engine still holds, as Parquet through pyarrow on the driver: metadata
only, never tuples. A batch that discards copies (duplicates and conflicting copies) writes the
list of every copy discarded so far, and a batch that ends a run the list of every archive file
consumed. A run resumes from the engine snapshot and these lists (``replay.runner.resume``); the
buffers fed by earlier batches are read back only when one of them arrives again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from replay.core.buffer import Buffer

__all__ = [
    "Discarded",
    "read_buffers",
    "read_consumed",
    "read_discarded",
    "read_reads",
    "write_buffers",
    "write_consumed",
    "write_discarded",
    "write_reads",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Discarded:
    """A copy that was read but not kept: ``kind`` is ``duplicate`` or ``conflict``."""

    kind: str
    origin: int
    sequence: int
    chunk: int
    file: str
    row_start: int
    tuples: int
    kept_file: str


def _optional_list(values: Sequence[int | None]) -> pa.Array:
    return pa.array(values, type=pa.int64())


def write_buffers(path: Path, buffers: Sequence[Buffer], nkeys: int) -> None:
    """Write ``buffers`` (their order is kept) to a Parquet file at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(_buffer_columns(buffers, nkeys)), path)


def _buffer_columns(buffers: Sequence[Buffer], nkeys: int) -> dict[str, pa.Array]:
    columns: dict[str, pa.Array] = {
        "origin": pa.array([b.origin for b in buffers], type=pa.int64()),
        "sequence": pa.array([b.sequence for b in buffers], type=pa.int64()),
        "chunk": pa.array([b.chunk for b in buffers], type=pa.int64()),
        "last_chunk": pa.array([b.last_chunk for b in buffers], type=pa.bool_()),
        "ingest": _optional_list([b.ingest for b in buffers]),
        "idle": pa.array([b.idle for b in buffers], type=pa.bool_()),
        "tuples": pa.array([b.tuples for b in buffers], type=pa.int64()),
        "rows": pa.array([b.rows for b in buffers], type=pa.int64()),
        "file": pa.array([b.file for b in buffers], type=pa.string()),
        "row_start": pa.array([b.row_start for b in buffers], type=pa.int64()),
        "content_hash": pa.array([b.content_hash for b in buffers], type=pa.string()),
    }
    for i in range(nkeys):
        columns[f"wm{i}"] = _optional_list([b.watermarks[i] for b in buffers])
        columns[f"ev{i}_min"] = _optional_list([b.min_event[i] for b in buffers])
        columns[f"ev{i}_max"] = _optional_list([b.max_event[i] for b in buffers])
    return columns


def write_reads(path: Path, reads: Sequence[tuple[Buffer, Sequence[int], Sequence[str]]], nkeys: int) -> None:
    """Write the copies a batch read with their decisions (thresholds and reasons per key), in order."""
    columns = _buffer_columns([buf for buf, _, _ in reads], nkeys)
    for i in range(nkeys):
        columns[f"thr{i}"] = pa.array([thresholds[i] for _, thresholds, _ in reads], type=pa.int64())
        columns[f"reason{i}"] = pa.array([reasons[i] for _, _, reasons in reads], type=pa.string())
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


def read_reads(path: Path, nkeys: int) -> list[tuple[Buffer, tuple[int, ...], tuple[str, ...]]]:
    """The copies and decisions (thresholds, reasons) ``write_reads`` wrote to ``path``, in the same order."""
    with open(path, "rb") as handle:
        table = pq.read_table(handle).to_pydict()
    buffers = _buffers_of(table, nkeys)
    return [
        (
            buf,
            tuple(table[f"thr{k}"][n] for k in range(nkeys)),
            tuple(table[f"reason{k}"][n] for k in range(nkeys)),
        )
        for n, buf in enumerate(buffers)
    ]


def read_buffers(path: Path, nkeys: int) -> list[Buffer]:
    """The buffers ``write_buffers`` wrote to ``path``, in the same order."""
    with open(path, "rb") as handle:  # through Python's open: resume tests count the files a run opens
        table = pq.read_table(handle).to_pydict()
    return _buffers_of(table, nkeys)


def _buffers_of(table: Mapping[str, list[Any]], nkeys: int) -> list[Buffer]:
    out = []
    files: dict[str, str] = {}  # one string per file, shared by its buffers
    for i in range(len(table["origin"])):
        out.append(
            Buffer(
                origin=table["origin"][i],
                sequence=table["sequence"][i],
                chunk=table["chunk"][i],
                last_chunk=table["last_chunk"][i],
                watermarks=tuple(table[f"wm{k}"][i] for k in range(nkeys)),
                min_event=tuple(table[f"ev{k}_min"][i] for k in range(nkeys)),
                max_event=tuple(table[f"ev{k}_max"][i] for k in range(nkeys)),
                ingest=table["ingest"][i],
                idle=table["idle"][i],
                tuples=table["tuples"][i],
                rows=table["rows"][i],
                file=files.setdefault(table["file"][i], table["file"][i]),
                row_start=table["row_start"][i],
                content_hash=table["content_hash"][i],
            )
        )
    return out


def write_discarded(path: Path, copies: Sequence[Discarded]) -> None:
    """Write discarded copies to a Parquet file at ``path``."""
    names = ("kind", "origin", "sequence", "chunk", "file", "row_start", "tuples", "kept_file")
    types = (pa.string(), pa.int64(), pa.int64(), pa.int64(), pa.string(), pa.int64(), pa.int64(), pa.string())
    table = pa.table({n: pa.array([getattr(c, n) for c in copies], type=t) for n, t in zip(names, types, strict=True)})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def read_discarded(path: Path) -> list[Discarded]:
    """The copies ``write_discarded`` wrote to ``path``."""
    with open(path, "rb") as handle:
        return [Discarded(**row) for row in pq.read_table(handle).to_pylist()]


def write_consumed(path: Path, consumed: Mapping[str, Sequence[int]]) -> None:
    """Write the archive files finished runs consumed, with the ``[size, mtime_ns]`` they had."""
    names = sorted(consumed)
    table = pa.table(
        {
            "file": pa.array(names, type=pa.string()),
            "size": pa.array([consumed[n][0] for n in names], type=pa.int64()),
            "mtime_ns": pa.array([consumed[n][1] for n in names], type=pa.int64()),
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def read_consumed(path: Path) -> dict[str, list[int]]:
    """The files ``write_consumed`` wrote to ``path``, each with its ``[size, mtime_ns]``."""
    with open(path, "rb") as handle:
        table = pq.read_table(handle).to_pydict()
    return {f: [s, m] for f, s, m in zip(table["file"], table["size"], table["mtime_ns"], strict=True)}
