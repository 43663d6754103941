"""Buffer metadata persisted in a checkpoint: written by one function, read by one function.

Each batch writes the metadata of the buffers it fed to the progress engine (in feed order)
and of the buffers the engine still holds, as Parquet through pyarrow on the driver: metadata
only, never tuples. A batch that discards copies (duplicates and conflicting copies) writes the
list of every copy discarded so far, and a batch that ends a run the list of every archive file
consumed. A run resumes from the engine snapshot and these lists (``replay.runner.resume``); the
buffers fed by earlier batches are read back only when one of them arrives again.

Each file is written atomically and fsynced (``write_parquet_atomic``) before the commit that
points at it; the caller makes their directory entries durable with one fsync of ``state/`` (the
engine snapshot's rename, written after them, does it). A file that does not read back whole is
``checkpoint.corrupt``, naming it, never a raw Arrow error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from replay.core.buffer import NULL_TIME, Buffer, PackedBuffers
from replay.store.durable import corrupt, write_parquet_atomic

__all__ = [
    "Discarded",
    "read_buffers",
    "read_consumed",
    "read_discarded",
    "read_reads",
    "readable",
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


def write_buffers(path: Path, buffers: Sequence[Buffer], nkeys: int) -> None:
    """Write ``buffers`` (their order is kept) to a Parquet file at ``path``."""
    write_parquet_atomic(pa.table(_buffer_columns(buffers, nkeys)), path, sync_dir=False)


def _ints(values: npt.NDArray[np.int64]) -> pa.Array:
    """A packed field (a strided view into the records) as an int64 column."""
    return pa.array(np.ascontiguousarray(values), type=pa.int64())


def _times(values: npt.NDArray[np.int64]) -> pa.Array:
    """Packed times as an int64 column, ``NULL_TIME`` as null."""
    return pa.array(np.ascontiguousarray(values), type=pa.int64(), mask=values == NULL_TIME)


def _buffer_columns(buffers: Sequence[Buffer], nkeys: int) -> dict[str, pa.Array]:
    """The columns of ``buffers``, built from their packed arrays (``PackedBuffers``): no Python
    object per value. A batch writes every buffer it fed (a whole run's in one batch)."""
    packed = buffers if isinstance(buffers, PackedBuffers) else PackedBuffers.of(buffers, nkeys)
    hash_of = packed.hash_of
    columns: dict[str, pa.Array] = {
        "origin": _ints(packed.column("origin")),
        "sequence": _ints(packed.column("sequence")),
        "chunk": _ints(packed.column("chunk")),
        "last_chunk": pa.array(packed.last_chunks()),
        "ingest": _times(packed.column("ingest")),
        "idle": pa.array(packed.idles()),
        "tuples": _ints(packed.column("tuples")),
        "rows": _ints(packed.column("rows")),
        "file": pa.DictionaryArray.from_arrays(
            pa.array(packed.file_of, pa.int32()), pa.array(packed.files or [""], pa.string())
        ).cast(pa.string()),
        "row_start": _ints(packed.column("row_start")),
        "content_hash": pa.DictionaryArray.from_arrays(
            pa.array(np.where(hash_of < 0, 0, hash_of + 1), pa.int32()),
            pa.array(["", *packed.hashes], pa.string()),
        ).cast(pa.string()),
    }
    for i in range(nkeys):
        columns[f"wm{i}"] = _times(packed.watermark_column(i))
        columns[f"ev{i}_min"] = _times(packed.min_event_column(i))
        columns[f"ev{i}_max"] = _times(packed.max_event_column(i))
    return columns


def write_reads(
    path: Path,
    buffers: PackedBuffers,
    thresholds: npt.NDArray[np.int64],
    reasons: npt.NDArray[np.object_],
    nkeys: int,
) -> None:
    """Write the copies a batch read (``buffers``) with their decisions, in order: per copy and key
    its threshold and reason (``thresholds`` and ``reasons``, one row per copy)."""
    columns = _buffer_columns(buffers, nkeys)
    for i in range(nkeys):
        columns[f"thr{i}"] = pa.array(np.ascontiguousarray(thresholds[:, i]), type=pa.int64())
        columns[f"reason{i}"] = pa.array(reasons[:, i].tolist(), type=pa.string())
    write_parquet_atomic(pa.table(columns), path, sync_dir=False)


def read_reads(path: Path, nkeys: int) -> list[tuple[Buffer, tuple[int, ...], tuple[str, ...]]]:
    """The copies and decisions (thresholds, reasons) ``write_reads`` wrote to ``path``, in the same order."""
    table = _read(path)
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
    return _buffers_of(_read(path), nkeys)


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
    write_parquet_atomic(table, path, sync_dir=False)


def read_discarded(path: Path) -> list[Discarded]:
    """The copies ``write_discarded`` wrote to ``path``."""
    table = _read(path)
    return [Discarded(**dict(zip(table, row, strict=True))) for row in zip(*table.values(), strict=True)]


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
    write_parquet_atomic(table, path, sync_dir=False)


def read_consumed(path: Path) -> dict[str, list[int]]:
    """The files ``write_consumed`` wrote to ``path``, each with its ``[size, mtime_ns]``."""
    table = _read(path)
    return {f: [s, m] for f, s, m in zip(table["file"], table["size"], table["mtime_ns"], strict=True)}


def _read(path: Path) -> dict[str, list[Any]]:
    """A state file's columns.

    Raises:
        CheckpointCorruptError: it is missing or does not read back whole (truncated, overwritten).
    """
    try:
        with open(path, "rb") as handle:  # through Python's open: resume tests count the files a run opens
            return pq.read_table(handle).to_pydict()  # type: ignore[no-any-return]
    except FileNotFoundError:
        raise corrupt(path, "is missing") from None
    except (OSError, pa.ArrowException) as exc:
        raise corrupt(path, f"does not read back whole (truncated or overwritten): {exc}") from exc


def readable(path: Path) -> bool:
    """Whether a state file's Parquet footer reads (a file cut short, empty after a power loss, or
    overwritten does not): what ``CheckpointStore.resume_point`` checks of a commit's state files
    before it trusts the commit."""
    try:
        pq.read_metadata(path)
    except (OSError, pa.ArrowException):
        return False
    return True
