"""The archive's layout: column mapping and schema validation (docs/archive.md#columns).

Only Parquet footers are read here (pyarrow, one footer per file, ``replay.engine.archive_files``);
the tuples are read by Spark (``replay.engine.archive_rows``). A file that cannot be opened, is
truncated or is not Parquet fails here, named, before any Spark job starts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from replay.core.errors import ArchiveSchemaError, ConfigError, Location
from replay.core.vocabulary import Lateness
from replay.engine.aggregations import FUNCTIONS
from replay.engine.archive_files import discover_files, read_schema

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from replay.core.config import JobConfig

__all__ = [
    "ArchiveLayout",
    "ResolvedKey",
    "inspect_schema",
    "resolve_lateness",
    "spark_schema",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedKey:
    """A watermark key bound to physical archive columns.

    ``watermark`` is ``None`` for event-time watermarks (the max event time of a
    buffer's tuples is its watermark).
    """

    name: str
    event_time: str
    watermark: str | None
    allowed_lateness: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ArchiveLayout:
    """What the archive holds, checked against the job: files, roles and types.

    ``time_columns`` maps each physical time column to its Parquet unit (``"ms"``, ``"us"``,
    ``"ns"``, or ``"epoch_ms"`` for int64 under ``time_unit: ms``): every Parquet timestamp
    column of the archive whatever its role (payload included: a timestamp is read, hashed,
    aggregated and written at microseconds like the key time columns), and the int64 time
    columns of the keys, ``ingest_ts`` and ``watermark_ts`` under ``time_unit: ms`` (an int64
    payload column is a number, not a time). ``watermark_ts``: the archive's ``watermark_ts``
    column (as mapped), buffer metadata whether or not a watermark key uses it, or ``None``
    when the archive has none. ``payload`` lists every column that is not buffer metadata, in
    archive order: the tuple's columns, which the content hash and the ``late`` table cover.
    """

    root: str
    files: tuple[str, ...]
    origin_id: str
    sequence_number: str
    chunk_number: str
    last_chunk: str
    ingest_ts: str | None
    idle: str | None
    watermark_ts: str | None = None
    key: str
    key_type: str
    keys: tuple[ResolvedKey, ...]
    time_columns: dict[str, str]
    payload: tuple[str, ...]
    schema: pa.Schema = dataclasses.field(default_factory=lambda: pa.schema([]))  # the files' columns, merged

    @property
    def has_ingest(self) -> bool:
        return self.ingest_ts is not None

    @property
    def key_index(self) -> dict[str, int]:
        """Each watermark key's position: the ``i`` of the pass's per-key columns (``_on<i>``, ``_ev<i>``)."""
        return {k.name: i for i, k in enumerate(self.keys)}

    @property
    def metadata_columns(self) -> tuple[str, ...]:
        cols = [self.origin_id, self.sequence_number, self.chunk_number, self.last_chunk]
        cols += [k.watermark for k in self.keys if k.watermark is not None]
        cols += [c for c in (self.watermark_ts, self.ingest_ts, self.idle) if c is not None]
        return tuple(dict.fromkeys(cols))

    @property
    def metadata_watermark(self) -> str | None:
        """``watermark_ts`` when no watermark key reads it: metadata all the same (one value per
        buffer, checked and hashed as such), never a tuple's column."""
        if self.watermark_ts is None or any(k.watermark == self.watermark_ts for k in self.keys):
            return None
        return self.watermark_ts


def _time_kind(field: pa.Field, *, time_unit: str) -> str | None:
    if pa.types.is_timestamp(field.type):
        return str(field.type.unit)
    if time_unit == "ms" and pa.types.is_integer(field.type):
        return "epoch_ms"
    return None


def _type_error(
    path: str, column: str, role: str, found: pa.DataType, wanted: str, hint: str = ""
) -> ArchiveSchemaError:
    return ArchiveSchemaError(
        f"column '{column}' ({role}) has type {found}, expected {wanted}",
        where=Location(file=path, column=column),
        todo=hint
        or f"rewrite the file with {wanted} in '{column}', or map the role to another column under 'columns:'",
        code="archive.wrong_type",
    )


def _is_number(kind: pa.DataType) -> bool:
    return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind))


def _missing_error(path: str, column: str, role: str, names: Sequence[str]) -> ArchiveSchemaError:
    return ArchiveSchemaError(
        f"required column '{column}' ({role}) is missing; the file has {sorted(names)}",
        where=Location(file=path, column=column),
        todo=f"map the role to the right column, e.g. 'columns: {{{role}: <name>}}', or fix the archiver",
        code="archive.missing_column",
    )


def _check_time(path: str, schema: pa.Schema, column: str, role: str, time_unit: str) -> str:
    kind = _time_kind(schema.field(column), time_unit=time_unit)
    if kind is None:
        hint = (
            "set 'time_unit: ms' if the column holds int64 epoch milliseconds"
            if pa.types.is_integer(schema.field(column).type)
            else ""
        )
        raise _type_error(path, column, role, schema.field(column).type, "a Parquet timestamp", hint)
    return kind


def inspect_schema(
    config: JobConfig,
    files: Sequence[str] | None = None,
    *,
    known: pa.Schema | None = None,
    on_file: Callable[[int, int], None] | None = None,
) -> ArchiveLayout:
    """Check every file's schema against the job's column mapping and resolve the roles.

    Reads one footer per file. ``known``: the columns of the files earlier runs read (an
    incremental run's), which ``files`` must agree with as the archive's files agree with each
    other; a column they lack reads as null, as in an archive whose files differ in their optional
    columns. ``on_file(done, total)`` reports progress.

    Raises:
        ArchiveReadError: a file is unreadable or truncated.
        ArchiveSchemaError: a required column is missing or mistyped, or files disagree on a type.
        ConfigError: a column the job names explicitly (watermark, aggregation) is absent.
        EmptyArchiveError: no Parquet file.
    """
    files = list(files) if files is not None else discover_files(config.archive)
    cols = config.columns
    # The union of the files' columns, each with the first file that has it (for messages).
    earlier = "the files earlier runs of this checkpoint read"
    merged: dict[str, tuple[pa.Field, str]] = {field.name: (field, earlier) for field in known or ()}
    for index, path in enumerate(files):
        schema = read_schema(path)
        for field in schema:
            seen = merged.setdefault(field.name, (field, path))
            if not field.type.equals(seen[0].type):
                raise ArchiveSchemaError(
                    f"column '{field.name}' is {field.type} here but {seen[0].type} in {seen[1]}",
                    where=Location(file=path, column=field.name),
                    todo="rewrite the odd file with the archive's type for this column"
                    + (", then run again: nothing of it was read" if seen[1] == earlier else ""),
                    code="archive.type_mismatch",
                )
        names = schema.names
        for role in ("origin_id", "sequence_number", "chunk_number", "last_chunk", "event_time", "key"):
            if cols.resolve(role) not in names:
                raise _missing_error(path, cols.resolve(role), role, names)
        if on_file is not None:
            on_file(index + 1, len(files))
    schema = pa.schema([field for field, _ in merged.values()])
    path = files[0]

    def file_of(column: str) -> str:
        return merged[column][1] if column in merged else path

    for role in ("origin_id", "sequence_number", "chunk_number"):
        field = schema.field(cols.resolve(role))
        if not pa.types.is_integer(field.type):
            raise _type_error(file_of(field.name), field.name, role, field.type, "an integer type (int64)")
    for role in ("last_chunk", "idle"):
        name = cols.resolve(role)
        if name in schema.names and not pa.types.is_boolean(schema.field(name).type):
            raise _type_error(file_of(name), name, role, schema.field(name).type, "bool")
    key_field = schema.field(cols.resolve("key"))
    if pa.types.is_integer(key_field.type):
        key_type = "int64"
    elif pa.types.is_string(key_field.type) or pa.types.is_large_string(key_field.type):
        key_type = "string"
    else:
        raise _type_error(file_of(key_field.name), key_field.name, "key", key_field.type, "string or int64")

    time_columns: dict[str, str] = {}
    ingest = cols.resolve("ingest_ts") if cols.resolve("ingest_ts") in schema.names else None
    if ingest is not None:
        time_columns[ingest] = _check_time(file_of(ingest), schema, ingest, "ingest_ts", config.time_unit)

    keys = []
    for name, spec in config.watermark_keys.items():
        event = cols.resolve(spec.event_time)
        if event not in schema.names:
            raise ConfigError(
                f"watermark key '{name}' names event-time column '{event}', which the archive does not have",
                where=Location(file=path, column=event, field=f"watermarks.{name}.event_time"),
                todo=f"name one of the archive's columns {sorted(schema.names)}",
                code="config.unknown_column",
            )
        time_columns[event] = _check_time(file_of(event), schema, event, f"event time of key {name}", config.time_unit)
        watermark: str | None
        if config.watermarks is None:
            candidate = cols.resolve("watermark_ts")
            watermark = candidate if candidate in schema.names else None
        else:
            watermark = cols.resolve(spec.watermark) if spec.watermark else None
            if watermark is not None and watermark not in schema.names:
                raise ConfigError(
                    f"watermark key '{name}' names watermark column '{watermark}', which the archive does not have",
                    where=Location(file=path, column=watermark, field=f"watermarks.{name}.watermark"),
                    todo="remove 'watermark:' from the key for event-time watermarks, or name an existing column",
                    code="config.unknown_column",
                )
        if watermark is not None:
            time_columns[watermark] = _check_time(
                file_of(watermark), schema, watermark, f"watermark of key {name}", config.time_unit
            )
        keys.append(
            ResolvedKey(name=name, event_time=event, watermark=watermark, allowed_lateness=spec.allowed_lateness)
        )

    for window in config.windows:
        for agg in window.aggregations:
            if agg.column is not None and agg.column not in schema.names:
                # An aggregation names the archive's own column; the ``columns`` mapping is for roles.
                mapped = cols.resolve(agg.column)
                hint = f"'{agg.column}' is a role the job maps to '{mapped}': " if mapped in schema.names else ""
                raise ConfigError(
                    f"window '{window.name}' aggregates column '{agg.column}', which the archive does not have",
                    where=Location(column=agg.column, field=f"windows[{window.name}].aggregations"),
                    todo=f"{hint}name one of the archive's columns {sorted(schema.names)}",
                    code="config.unknown_column",
                )
            found = schema.field(agg.column).type if agg.column is not None else None
            if FUNCTIONS[agg.fn].sums and found is not None and not _is_number(found):
                # SQL sums numbers only: a time, a string or a bool has no sum Replay could agree on.
                raise _type_error(
                    file_of(str(agg.column)),
                    str(agg.column),
                    f"{agg.fn} of window {window.name}",
                    found,
                    "a number (integer, floating point or decimal)",
                    f"aggregate a numeric column with {agg.fn}, or use min, max or count on '{agg.column}'",
                )

    # The archive's watermark_ts is buffer metadata even when no key reads it (a declared key on
    # event-time watermarks): checked as a time column, and never a tuple's column.
    watermark_ts = cols.resolve("watermark_ts") if cols.resolve("watermark_ts") in schema.names else None
    if watermark_ts is not None and watermark_ts not in time_columns:
        time_columns[watermark_ts] = _check_time(
            file_of(watermark_ts), schema, watermark_ts, "watermark_ts", config.time_unit
        )
    # Every other Parquet timestamp (payload included) is a time too: read at microseconds, a
    # nanosecond one truncated toward minus infinity, and written as a timestamp, never as raw integers.
    for field in schema:
        if field.name not in time_columns and pa.types.is_timestamp(field.type):
            time_columns[field.name] = str(field.type.unit)

    idle = cols.resolve("idle") if cols.resolve("idle") in schema.names else None
    layout = ArchiveLayout(
        root=config.archive,
        files=tuple(files),
        origin_id=cols.resolve("origin_id"),
        sequence_number=cols.resolve("sequence_number"),
        chunk_number=cols.resolve("chunk_number"),
        last_chunk=cols.resolve("last_chunk"),
        ingest_ts=ingest,
        idle=idle,
        watermark_ts=watermark_ts,
        key=cols.resolve("key"),
        key_type=key_type,
        keys=tuple(keys),
        time_columns=time_columns,
        payload=(),
    )
    metadata = set(layout.metadata_columns)
    payload = tuple(n for n in schema.names if n not in metadata)
    return dataclasses.replace(layout, payload=payload, schema=schema)


def spark_schema(layout: ArchiveLayout) -> Any:
    """The archive's Spark schema from its footers (no Spark job): what Spark infers when it
    merges the files' schemas, nanosecond timestamps as int64 (they are read as such)."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import LongType, StructField, StructType

    fields = []
    for column in layout.schema:
        if pa.types.is_timestamp(column.type) and column.type.unit == "ns":
            fields.append(StructField(column.name, LongType(), True))
        else:
            fields.append(from_arrow_schema(pa.schema([column])).fields[0])
    return StructType(fields)


def resolve_lateness(config: JobConfig, layout: ArchiveLayout) -> Lateness:
    """``origin`` or ``arrival``: ``auto`` picks arrival when the archive has ``ingest_ts``.

    Raises:
        ConfigError: ``lateness: arrival`` on an archive without an ``ingest_ts`` column.
    """
    if config.lateness == Lateness.AUTO:
        return Lateness.ARRIVAL if layout.has_ingest else Lateness.ORIGIN
    if config.lateness == Lateness.ARRIVAL and not layout.has_ingest:
        raise ConfigError(
            f"lateness: arrival needs the ingest_ts column ('{config.columns.ingest_ts}'), which the archive lacks",
            where=Location(field="lateness", column=config.columns.ingest_ts),
            todo="use 'lateness: origin' (or auto), or map 'columns: {ingest_ts: <name>}'",
            code="config.arrival_without_ingest",
        )
    return config.lateness
