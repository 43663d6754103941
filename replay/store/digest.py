"""Canonical rows, table digests and the ``show`` listing (docs/cli.md#replay-digest, docs/cli.md#replay-show).

A table's canonical form is one JSON object per row, keys in column order, rows
sorted by all columns in column order with nulls first. Its digest is a sha256
over the schema (column names and types) and those rows, so two outputs with
equal digests hold the same columns and the same multiset of rows, whatever the
row order, the split into Parquet files or the micro-batch plan that wrote them.

Value forms (the same in ``show`` and in the digest, except for timestamps):

- timestamps (any unit; a naive timestamp is read as UTC) are ISO 8601 UTC text
  ending in ``Z``. ``show`` writes milliseconds, ``2026-01-01T00:01:00.000Z``,
  and more digits only when sub-millisecond ones are present (as
  ``replay.core.timeutil.format_ts`` does, so nothing is silently rounded); the digest
  always writes microseconds, ``2026-01-01T00:01:00.000000Z`` (nine digits when
  nanoseconds are present). The int64 minimum, ``timeutil.NEG_INF`` ("no
  watermark yet"), is written ``"-inf"``;
- floats as JSON numbers (Python's shortest round-trip form), NaN and the
  infinities as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``;
- decimals as strings, dates as ``YYYY-MM-DD``, times of day as
  ``HH:MM:SS.fff``, durations as integers in their type's unit, binary as hex;
- lists as JSON arrays (element order kept), structs as JSON objects, maps as
  arrays of ``{"key": ..., "value": ...}`` objects; dictionary-encoded columns as
  their values.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa

from replay.core.errors import ConfigError, Location
from replay.core.timeutil import NEG_INF, from_datetime
from replay.store.outputs import TABLES, read_table, resolve_version

__all__ = ["FORMATS", "canonical_lines", "digest", "show_lines", "table_digest"]

#: The formats ``show_lines`` writes.
FORMATS = ("jsonl", "csv")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NANOS_PER_UNIT = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
_NANOS_PER_SECOND = 1_000_000_000


def _dumps(value: Any) -> str:
    # allow_nan=False: NaN and the infinities are written as strings before this point.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# --- value forms -------------------------------------------------------------------------------------------------


def _fraction(nanos: int, *, precise: bool) -> str:
    """``nanos`` (0 to 10**9 - 1) as 3, 6 or 9 digits: the fewest that are exact, at least 6 when ``precise``."""
    if nanos % 1_000:
        digits = 9
    elif precise or nanos % 1_000_000:
        digits = 6
    else:
        digits = 3
    return f"{nanos:09d}"[:digits]


def _format_instant(value: int, unit: str, *, precise: bool) -> str:
    """A timestamp of ``unit`` since the epoch, UTC, as ISO 8601 text ending in ``Z``."""
    if value == NEG_INF:
        return "-inf"
    seconds, nanos = divmod(value * _NANOS_PER_UNIT[unit], _NANOS_PER_SECOND)
    try:
        moment = _EPOCH + timedelta(seconds=seconds)
    except OverflowError:  # outside years 1 to 9999: keep the exact number rather than fail
        return f"{value}{unit}"
    return (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}"
        f"T{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}.{_fraction(nanos, precise=precise)}Z"
    )


def _format_time_of_day(value: int, unit: str, *, precise: bool) -> str:
    seconds, nanos = divmod(value * _NANOS_PER_UNIT[unit], _NANOS_PER_SECOND)
    hours, rest = divmod(seconds, 3600)
    return f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}.{_fraction(nanos, precise=precise)}"


def _float(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _py_json(value: Any, *, precise: bool) -> Any:
    """A Python value from ``to_pylist`` of a type without a dedicated path, in the forms above."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return _format_instant(from_datetime(aware), "us", precise=precise)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, time):
        micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
        return _format_time_of_day(micros, "us", precise=precise)
    if isinstance(value, timedelta):
        return (value.days * 86400 + value.seconds) * 1_000_000 + value.microseconds
    if isinstance(value, dict):
        return {str(k): _py_json(v, precise=precise) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_py_json(v, precise=precise) for v in value]
    return str(value)


def _plain(array: pa.Array) -> pa.Array:
    """The array without dictionary encoding or extension wrapping."""
    while True:
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        elif isinstance(array.type, pa.ExtensionType):
            array = array.storage
        else:
            return array


def _plain_type(data_type: pa.DataType) -> pa.DataType:
    return data_type.value_type if pa.types.is_dictionary(data_type) else data_type


def _json_values(array: pa.Array, *, precise: bool) -> list[Any]:
    """The values of ``array`` in the forms above, ``None`` for null."""
    array = _plain(array)
    t = array.type
    if pa.types.is_null(t):
        return [None] * len(array)
    if pa.types.is_timestamp(t):
        unit = t.unit
        return [
            None if v is None else _format_instant(v, unit, precise=precise) for v in array.cast(pa.int64()).to_pylist()
        ]
    if pa.types.is_duration(t):
        return list(array.cast(pa.int64()).to_pylist())
    if pa.types.is_time(t):
        unit = t.unit
        ints = array.cast(pa.int32() if pa.types.is_time32(t) else pa.int64()).to_pylist()
        return [None if v is None else _format_time_of_day(v, unit, precise=precise) for v in ints]
    if pa.types.is_floating(t):
        return [_float(v) for v in array.to_pylist()]
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return [None if v is None else v.hex() for v in array.to_pylist()]
    if pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
        return list(array.to_pylist())
    if pa.types.is_map(t):
        entries = pa.list_(pa.struct([t.key_field, t.item_field]))
        return _json_values(array.cast(entries), precise=precise)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        # flatten() drops the slots behind null lists, so the lengths below walk it exactly.
        flat = _json_values(array.flatten(), precise=precise)
        out: list[Any] = []
        position = 0
        for length in array.value_lengths().to_pylist():
            if length is None:
                out.append(None)
            else:
                out.append(flat[position : position + length])
                position += length
        return out
    if pa.types.is_struct(t):
        names = [t.field(i).name for i in range(t.num_fields)]
        children = [_json_values(child, precise=precise) for child in array.flatten()]
        return [
            None if null else {name: child[row] for name, child in zip(names, children, strict=True)}
            for row, null in enumerate(array.is_null().to_pylist())
        ]
    # decimals, dates and anything rarer go through Python values
    return [_py_json(v, precise=precise) for v in array.to_pylist()]


def _sort_keys(array: pa.Array, values: list[Any]) -> list[tuple[Any, ...]]:
    """One key per value: nulls first, then the values in their natural order.

    Keys of one column all have the same shape, so they compare without mixing
    types. Nested and rare types sort by their JSON text.
    """
    array = _plain(array)
    t = array.type
    raw: list[Any]
    if pa.types.is_floating(t):
        # NaN sorts after every number (it does not compare, so it gets a key of its own).
        raw = [None if v is None else (True, 0.0) if math.isnan(v) else (False, v) for v in array.to_pylist()]
    elif pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_time64(t) or pa.types.is_date64(t):
        raw = array.cast(pa.int64()).to_pylist()
    elif pa.types.is_time32(t) or pa.types.is_date32(t):
        raw = array.cast(pa.int32()).to_pylist()
    elif (
        pa.types.is_null(t)
        or pa.types.is_boolean(t)
        or pa.types.is_integer(t)
        or pa.types.is_decimal(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
    ):
        raw = array.to_pylist()
    else:
        raw = [None if v is None else _dumps(v) for v in values]
    return [(0,) if v is None else (1, v) for v in raw]


# --- canonical rows ----------------------------------------------------------------------------------------------


def _sorted_rows(table: pa.Table, *, precise: bool) -> list[tuple[list[Any], str]]:
    """The rows of ``table`` as (values, JSON line), sorted by all columns in column order, nulls first."""
    names = table.column_names
    if len(set(names)) != len(names):
        duplicated = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"columns {duplicated} appear more than once; a canonical row needs unique column names")
    columns: list[list[Any]] = []
    keys: list[list[tuple[Any, ...]]] = []
    for index in range(table.num_columns):
        column_values: list[Any] = []
        column_keys: list[tuple[Any, ...]] = []
        for chunk in table.column(index).chunks:
            chunk_values = _json_values(chunk, precise=precise)
            column_values += chunk_values
            column_keys += _sort_keys(chunk, chunk_values)
        columns.append(column_values)
        keys.append(column_keys)
    rows = []
    for row in range(table.num_rows):
        values = [column[row] for column in columns]
        line = _dumps(dict(zip(names, values, strict=True)))
        rows.append((tuple(column_keys[row] for column_keys in keys), line, values))
    # The line breaks ties between rows whose keys are equal but whose text is not (0.0 and -0.0),
    # so the order never depends on the order the rows came in.
    rows.sort(key=lambda item: (item[0], item[1]))
    return [(values, line) for _, line, values in rows]


def canonical_lines(table: pa.Table, *, precise: bool) -> list[str]:
    """One compact JSON object per row of ``table``, keys in column order, rows sorted.

    Rows are sorted by all columns in column order, nulls first, NaN after every
    number; ties left by that order (``0.0`` and ``-0.0``) are broken by the line's
    text. Values take the forms in the module docstring; ``precise`` selects the
    timestamp form: microseconds (``True``, for the digest) or milliseconds
    (``False``, for ``show``).

    Raises:
        ValueError: two columns share a name.
    """
    return [line for _, line in _sorted_rows(table, precise=precise)]


def _schema_line(schema: pa.Schema) -> str:
    # Nullability, field metadata and dictionary encoding are storage details, not content: left out.
    return _dumps([[field.name, str(_plain_type(field.type))] for field in schema])


def table_digest(table: pa.Table) -> str:
    """The sha256 (hex) of ``table``'s schema line and its canonical precise lines, each followed by ``\\n``.

    The schema line lists every column's name and Arrow type in order. Equal
    digests therefore mean the same column names and types in the same order and
    the same multiset of rows (timestamps compared to the microsecond), whatever
    the row order or the split into files or batches.

    Raises:
        ValueError: two columns share a name.
    """
    hasher = hashlib.sha256()
    hasher.update(_schema_line(table.schema).encode() + b"\n")
    for line in canonical_lines(table, precise=True):
        hasher.update(line.encode() + b"\n")
    return hasher.hexdigest()


def digest(output: str | Path, version: int | None = None) -> dict[str, str]:
    """The digest of every table of one version of ``output``, in ``replay.store.outputs.TABLES`` order.

    ``version`` defaults to the published version, or the newest one when none is
    published; it is resolved once, so every table comes from the same version.

    Raises:
        ConfigError: the output has no versions, or not the one asked for.
    """
    resolved = resolve_version(output, version)
    return {name: table_digest(read_table(output, name, resolved)) for name in TABLES}


# --- show --------------------------------------------------------------------------------------------------------


def _csv_field(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return _dumps(value)  # numbers, booleans (true/false), lists and objects as JSON text


def _csv_lines(names: list[str], rows: list[tuple[list[Any], str]]) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="")
    for record in [names, *([_csv_field(v) for v in values] for values, _ in rows)]:
        writer.writerow(record)
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()


def show_lines(output: str | Path, table: str, *, fmt: str = "jsonl", version: int | None = None) -> Iterator[str]:
    """The rows of one table of ``output`` as text lines (without line terminators), sorted like the digest.

    ``jsonl`` gives the canonical lines with millisecond timestamps. ``csv`` gives
    a header of column names, then one record per row: the same value forms, null
    as an empty field, lists and structs as their JSON text, booleans as
    ``true``/``false``. A field holding a line break is quoted and so spans lines.
    ``version`` defaults as in :func:`digest`. The table is read before this
    returns, so every error is raised here rather than while iterating.

    Raises:
        ConfigError: an unknown format (code ``output.bad_format``) or table, or no such version.
    """
    if fmt not in FORMATS:
        raise ConfigError(
            f"unknown format {fmt!r}",
            where=Location(field="format"),
            todo=f"use one of: {', '.join(FORMATS)}",
            code="output.bad_format",
        )
    data = read_table(output, table, version)
    rows = _sorted_rows(data, precise=False)
    if fmt == "csv":
        return _csv_lines(data.column_names, rows)
    return iter([line for _, line in rows])
