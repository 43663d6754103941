"""Tiny Parquet archives for tests, written row by row.

A row is a dict keyed by the default column names (docs/archive.md#columns). Columns get
their archive types (``ARCHIVE_TYPES``): required columns are always written,
optional ones (``watermark_ts``, ``ingest_ts``, ``idle``, ``value``) only when at
least one row mentions them, so an archive "without ingest_ts" is just rows that
never set it. Timestamps may be given as int microseconds since the epoch, as
``Nanos`` (exact nanoseconds, for ``timestamp("ns")`` columns) or as aware
``datetime`` values; ``None`` is null.

    rows = [
        *buffer_rows(1, 1, watermark=10, ingest=1, events=[(5, "a", 1.0)]),
        *buffer_rows(1, 2, watermark=20, ingest=2),          # a punctuation row
    ]
    write_archive(tmp_path, rows)                            # tmp_path/part-00000.parquet

``types`` overrides a column's type (``{"key": pa.string()}``, ``{"event_time":
pa.int64()}`` for ``time_unit: ms`` archives, ``{"event_time": pa.timestamp("ns",
tz="UTC")}``) or types an extra payload column. Extra columns not in ``types``
are left to pyarrow's inference.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import strategies as st

from replay.core.buffer import Buffer
from replay.core.timeutil import from_datetime
from replay.generate_options import GenerateOptions

__all__ = [
    "ARCHIVE_TYPES",
    "FEATURED",
    "OMIT",
    "OPTIONAL_COLUMNS",
    "REQUIRED_COLUMNS",
    "TIMESTAMP",
    "Nanos",
    "archive_table",
    "buffer",
    "buffer_fields",
    "buffer_rows",
    "write_archive",
]


# -2^63 is the packed form of a missing time (``NULL_TIME``): it reads back as ``None``.
_INT64 = st.integers(min_value=-(2**63) + 1, max_value=2**63 - 1)
_TIME = st.none() | _INT64


@st.composite
def buffer_fields(draw: st.DrawFn, nkeys: int | None = None) -> dict[str, Any]:
    """A ``Buffer``'s constructor arguments, any 64-bit values (``nkeys``: 1 to 4 when ``None``)."""
    nkeys = draw(st.integers(min_value=1, max_value=4)) if nkeys is None else nkeys
    times = st.tuples(*[_TIME] * nkeys)
    return {
        "origin": draw(_INT64),
        "sequence": draw(_INT64),
        "chunk": draw(_INT64),
        "last_chunk": draw(st.booleans()),
        "watermarks": draw(times),
        "min_event": draw(times),
        "max_event": draw(times),
        "ingest": draw(_TIME),
        "idle": draw(st.booleans()),
        "tuples": draw(_INT64),
        "rows": draw(_INT64),
        "file": draw(st.text(max_size=20)),
        "row_start": draw(_INT64),
        "content_hash": draw(st.sampled_from(["", "ab" * 16])),
    }


def buffer(**fields: Any) -> Buffer:
    """A one-key buffer's metadata (``replay.core.buffer.Buffer``) for unit tests: ``fields`` over
    origin 1, sequence 1, chunk 1, a last chunk of one tuple in one row at row 0 of ``f.parquet``,
    no watermark, event times or ingest time, no content hash."""
    defaults: dict[str, Any] = {
        "origin": 1,
        "sequence": 1,
        "chunk": 1,
        "last_chunk": True,
        "watermarks": (None,),
        "min_event": (None,),
        "max_event": (None,),
        "ingest": None,
        "idle": False,
        "tuples": 1,
        "rows": 1,
        "file": "f.parquet",
        "row_start": 0,
        "content_hash": "",
    }
    return Buffer(**(defaults | fields))


#: A small generated archive (``replay.generate``) with every feature: a gap, duplicates, late
#: tuples, chunked sequences, three origins and files. Tests vary it with ``dataclasses.replace``.
FEATURED: Final = GenerateOptions(
    origins=3,
    tuples=800,
    buffer_tuples=40,
    keys=7,
    gaps=1,
    duplicates=2,
    late_fraction=0.05,
    multi_chunk_fraction=0.3,
    files=3,
)

#: The archive's timestamp type: microseconds, UTC.
TIMESTAMP: Final = pa.timestamp("us", tz="UTC")

#: Default column names and types, in the order they are written.
ARCHIVE_TYPES: Final[Mapping[str, pa.DataType]] = {
    "origin_id": pa.int64(),
    "sequence_number": pa.int64(),
    "chunk_number": pa.int32(),
    "last_chunk": pa.bool_(),
    "watermark_ts": TIMESTAMP,
    "ingest_ts": TIMESTAMP,
    "idle": pa.bool_(),
    "event_time": TIMESTAMP,
    "key": pa.int64(),
    "value": pa.float64(),
}
REQUIRED_COLUMNS: Final = ("origin_id", "sequence_number", "chunk_number", "last_chunk", "event_time", "key")
OPTIONAL_COLUMNS: Final = ("watermark_ts", "ingest_ts", "idle", "value")


class _Omit:
    """Marker for "leave this column out of the row" (``None`` writes a null)."""

    def __repr__(self) -> str:
        return "OMIT"


OMIT: Final = _Omit()

#: The job's ``columns`` for tables written by hand with one-letter column names.
SHORT_COLUMNS: Final = {
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


class Nanos(int):
    """An exact instant in nanoseconds since the epoch, written as it is (a plain int is microseconds)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Nanos({int(self)})"


def _column(name: str, values: list[Any], kind: pa.DataType | None) -> pa.Array:
    if kind is not None and pa.types.is_timestamp(kind) and any(isinstance(v, Nanos) for v in values):
        if not all(v is None or isinstance(v, Nanos) for v in values):
            raise ValueError(f"column {name!r}: mixes Nanos with other time values")
        nanos = [None if v is None else int(v) for v in values]
        return pa.array(nanos, pa.int64()).cast(pa.timestamp("ns", tz="UTC")).cast(kind)
    if kind is not None and pa.types.is_timestamp(kind):
        micros = [from_datetime(v) if isinstance(v, datetime) else v for v in values]
        # Built at microseconds, then cast: a value the target unit cannot hold exactly fails loudly.
        return pa.array(micros, pa.int64()).cast(TIMESTAMP).cast(kind)
    try:
        return pa.array(values, kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(f"column {name!r}: cannot build {kind or 'an inferred type'} from {values!r}") from exc


def archive_table(rows: Sequence[Mapping[str, Any]], *, types: Mapping[str, pa.DataType] | None = None) -> pa.Table:
    """An archive table from row dicts (see the module docstring for columns and types).

    Columns: the required ones, the optional ones some row mentions, then any extra
    column in order of first appearance. A row that lacks a column gets a null.
    """
    kinds = {**ARCHIVE_TYPES, **(types or {})}
    mentioned = {name for row in rows for name in row}
    names = [n for n in ARCHIVE_TYPES if n in REQUIRED_COLUMNS or n in mentioned]
    names += [n for row in rows for n in row if n not in names and n not in ARCHIVE_TYPES]
    names = list(dict.fromkeys(names))
    arrays = [_column(n, [row.get(n) for row in rows], kinds.get(n)) for n in names]
    return pa.Table.from_arrays(arrays, names=names)


def buffer_rows(
    origin: int,
    sequence: int,
    chunk: int = 1,
    *,
    last: bool = True,
    watermark: Any = OMIT,
    ingest: Any = OMIT,
    idle: Any = OMIT,
    events: Iterable[tuple[Any, ...] | Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """The rows of one buffer: one per event, or a single punctuation row when there are none.

    An event is ``(event_time, key)``, ``(event_time, key, value)`` or a dict of columns.
    ``watermark``, ``ingest`` and ``idle`` fill ``watermark_ts``, ``ingest_ts`` and ``idle``
    on every row (``None`` writes a null; left as ``OMIT`` the row does not mention them).
    """
    meta: dict[str, Any] = {
        "origin_id": origin,
        "sequence_number": sequence,
        "chunk_number": chunk,
        "last_chunk": last,
    }
    for name, value in (("watermark_ts", watermark), ("ingest_ts", ingest), ("idle", idle)):
        if value is not OMIT:
            meta[name] = value
    rows = []
    for event in events:
        if isinstance(event, Mapping):
            rows.append({**meta, **event})
        else:
            rows.append({**meta, **dict(zip(("event_time", "key", "value"), event, strict=False))})
    return rows or [{**meta, "event_time": None, "key": None}]


def write_archive(
    directory: str | Path,
    rows: Sequence[Mapping[str, Any]],
    *,
    name: str = "part-00000.parquet",
    types: Mapping[str, pa.DataType] | None = None,
) -> Path:
    """Write ``rows`` as one Parquet file ``directory/name`` (parents created); returns the file's path."""
    path = Path(directory) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(archive_table(rows, types=types), path)
    return path


def damage_pages(path: Path, column: str = "value") -> None:
    """Scramble the data pages of ``column`` in the file's first row group; the footer and the other
    columns stay, so the file passes a metadata scan and fails where its rows are read."""
    metadata = pq.ParquetFile(path).metadata.row_group(0).column(pq.read_schema(path).get_field_index(column))
    data = bytearray(path.read_bytes())
    start = metadata.data_page_offset + 10
    for i in range(start, start + 400):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
