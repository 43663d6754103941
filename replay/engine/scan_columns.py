"""What the metadata scan reads of each file (``ScanColumns``): the columns it aggregates per copy of
a buffer, and their roles. Its digest keys the per-file cache (``replay.engine.file_cache``): a
file's records are reused only by a scan that reads the same columns the same way."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import pyarrow as pa

from replay.engine.archive import ArchiveLayout

__all__ = ["ScanColumns", "scan_columns"]


@dataclass(frozen=True, slots=True)
class ScanColumns:
    """What the scan reads of each file: the role of each column it aggregates per copy.

    ``meta``: (record name, column, time kind or ``None``) of every metadata value checked to be
    constant per buffer; ``events``: per watermark key, its event time column and kind, or
    ``None`` when the scan does not read it. ``tuple_times``: every key's event time column: a row
    is punctuation, not a tuple, only when its key and all of them are null, so a file whose key
    column may hold a null (by its footer's statistics) is read with them too.
    """

    origin: str
    sequence: str
    chunk: str
    key: str
    meta: tuple[tuple[str, str, str | None], ...]
    events: tuple[tuple[str, str] | None, ...]
    tuple_times: tuple[str, ...] = ()

    def digest(self) -> str:
        return hashlib.sha256(
            json.dumps(
                [self.origin, self.sequence, self.chunk, self.key, self.meta, self.events, self.tuple_times]
            ).encode()
        ).hexdigest()[:16]

    def record_schema(self) -> pa.Schema:
        fields = [pa.field("_file", pa.string())]
        fields += [
            pa.field(n, pa.int64()) for n in ("origin", "sequence", "chunk", "rows", "tuples", "row_min", "row_max")
        ]
        for name, _, _ in self.meta:
            fields += [pa.field(f"{name}_{s}", pa.int64()) for s in ("min", "max", "n")]
        for index in range(len(self.events)):
            fields += [pa.field(f"ev{index}_{s}", pa.int64()) for s in ("min", "max")]
        return pa.schema(fields)


def scan_columns(layout: ArchiveLayout, *, event_times: bool) -> ScanColumns:
    """The columns the scan of ``layout`` reads; event time columns only with ``event_times`` or
    where a key's watermark is the max event time of its buffer."""
    meta: list[tuple[str, str, str | None]] = [("last_chunk", layout.last_chunk, None)]
    if layout.ingest_ts is not None:
        meta.append(("ingest", layout.ingest_ts, layout.time_columns[layout.ingest_ts]))
    if layout.idle is not None:
        meta.append(("idle", layout.idle, None))
    for index, key in enumerate(layout.keys):
        if key.watermark is not None:
            meta.append((f"wm{index}", key.watermark, layout.time_columns[key.watermark]))
    if layout.metadata_watermark is not None:  # no key reads it, but it is metadata all the same
        meta.append(("wm_ts", layout.metadata_watermark, layout.time_columns[layout.metadata_watermark]))
    events = tuple(
        (key.event_time, layout.time_columns[key.event_time]) if event_times or key.watermark is None else None
        for key in layout.keys
    )
    return ScanColumns(
        origin=layout.origin_id,
        sequence=layout.sequence_number,
        chunk=layout.chunk_number,
        key=layout.key,
        meta=tuple(meta),
        events=events,
        tuple_times=tuple(dict.fromkeys(key.event_time for key in layout.keys)),
    )
