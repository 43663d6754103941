"""Reading an archive for the reference model: docs/archive.md, the naive way.

Private to the reference model (``replay.reference.model`` and ``replay.reference.progress``).
Every Parquet file is read whole into Python rows (timestamps as int microseconds), cut into
copies (maximal runs of one buffer identity within one file), and deduplicated: each identity
keeps its first copy, identical copies are counted, different ones are conflicts.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from replay.core.config import JobConfig
from replay.core.errors import (
    ArchiveReadError,
    ConfigError,
    ConflictingDuplicateError,
    EmptyArchiveError,
    Location,
)
from replay.core.timeutil import MICROS_PER_MS

__all__ = ["Buffer", "Identity", "LoadedArchive", "ResolvedKey", "Row", "load_archive", "run_finder"]

Row = Mapping[str, object]  # physical column name -> Python value (timestamps as int microseconds)
Identity = tuple[int, int, int]  # (origin, sequence, chunk)


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedKey:
    """A watermark key resolved against the archive: physical columns, lateness in microseconds."""

    name: str
    event_time: str
    watermark: str | None  # None: event-time watermarks
    allowed_lateness: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Buffer:
    """A kept buffer (the first copy of its identity), with what progress needs from it."""

    origin: int
    sequence: int
    chunk: int
    last_chunk: bool
    idle: bool
    ingest_ts: int | None
    watermarks: dict[str, int | None]  # key -> this buffer's k-watermark (None: no new promise)
    tuples: tuple[Row, ...]  # its non-punctuation rows, in row order
    file: str = ""  # the file of the kept copy

    @property
    def identity(self) -> Identity:
        return (self.origin, self.sequence, self.chunk)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadedArchive:
    """The archive after section 1: kept buffers (sorted by identity) and the duplicate report."""

    lateness: str  # the resolved mode, "origin" or "arrival"
    keys: dict[str, ResolvedKey]
    buffers: tuple[Buffer, ...]
    payload_columns: tuple[str, ...]  # non-metadata columns, in archive column order
    tuples_read: int
    duplicate_copies: dict[int, int]
    duplicate_tuples: dict[int, int]
    conflicts: frozenset[Identity]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Copy:
    """A maximal run of consecutive rows of one buffer identity within one file."""

    identity: Identity
    file: str
    position: int  # row position of the run's first row in its file
    ingest_ts: int | None
    rows: tuple[Row, ...]


def _python_values(column: pa.ChunkedArray, *, time_column: bool, time_unit: str) -> list[object]:
    """A column as Python values; timestamps (any unit, tz or naive = UTC) as int microseconds."""
    kind = column.type
    if pa.types.is_timestamp(kind):
        ints = column.cast(pa.int64()).to_pylist()
        if kind.unit == "ns":
            return [None if v is None else v // 1000 for v in ints]  # floor to the microsecond
        factor = {"s": 1_000_000, "ms": MICROS_PER_MS, "us": 1}[kind.unit]
        return [None if v is None else v * factor for v in ints]
    if time_column and time_unit == "ms" and pa.types.is_integer(kind):
        return [None if v is None else v * MICROS_PER_MS for v in column.to_pylist()]
    values: list[object] = column.to_pylist()
    return values


def _read_copies(files: Sequence[Path], *, config: JobConfig, time_columns: set[str]) -> tuple[list[str], list[_Copy]]:
    """Every copy in the archive, in (file, row position) order, and the archive's column order."""
    cols = config.columns
    origin_c, seq_c, chunk_c = cols.resolve("origin_id"), cols.resolve("sequence_number"), cols.resolve("chunk_number")
    ingest_c = cols.resolve("ingest_ts")
    column_order: list[str] = []
    copies: list[_Copy] = []
    for path in files:
        table = pq.read_table(path)
        column_order += [name for name in table.column_names if name not in column_order]
        values = {
            name: _python_values(table.column(name), time_column=name in time_columns, time_unit=config.time_unit)
            for name in table.column_names
        }
        rows = [{name: values[name][i] for name in table.column_names} for i in range(table.num_rows)]
        ids = [(r[origin_c], r[seq_c], r[chunk_c]) for r in rows]
        start = 0
        for i in range(1, len(rows) + 1):
            if i == len(rows) or ids[i] != ids[start]:  # a run of one identity ends before row i
                copies.append(
                    _Copy(
                        identity=ids[start],  # type: ignore[arg-type]
                        file=str(path),
                        position=start,
                        ingest_ts=rows[start].get(ingest_c),  # type: ignore[arg-type]
                        rows=tuple(rows[start:i]),
                    )
                )
                start = i
    # A column that a file lacks reads as null there, as Spark reads it with merged schemas.
    for index, copy in enumerate(copies):
        if any(len(row) < len(column_order) for row in copy.rows):
            filled = tuple({name: row.get(name) for name in column_order} for row in copy.rows)
            copies[index] = dataclasses.replace(copy, rows=filled)
    return column_order, copies


def _content(copy: _Copy, ingest_column: str) -> Counter[tuple[tuple[str, str], ...]]:
    """The copy's content as a multiset of rows, every column but ``ingest_ts``.

    Every row of a copy carries the same metadata, so this is the multiset of its rows
    plus its metadata: the content hash of docs/archive.md#copies-duplicates-and-conflicts, compared directly.
    """
    return Counter(
        tuple(sorted((name, repr(value)) for name, value in row.items() if name != ingest_column)) for row in copy.rows
    )


def _dedupe(
    copies: Sequence[_Copy],
    *,
    on_conflict: str,
    ingest_column: str,
    has_ingest: bool,
    run_of: Callable[[str], int] = lambda file: 0,
) -> tuple[dict[Identity, _Copy], list[_Copy], set[Identity]]:
    """Each identity's first copy, the discarded identical copies, and the conflicting identities.

    First is the smallest by (``ingest_ts``, file path, row position), or by (file path,
    row position) without an ``ingest_ts`` column, among the copies of the first run that
    finds the identity (``run_of``: the run a file is first read in): a later run compares
    its copies with the one the checkpoint already consumed, whatever their order. Raises
    ``ConflictingDuplicateError`` on the first conflict (by identity, then copy order) under
    ``on_conflict == "fail"``; under ``keep_first`` a conflicting copy is discarded (and not
    counted as a duplicate).
    """
    by_identity: dict[Identity, list[_Copy]] = defaultdict(list)
    for copy in copies:
        by_identity[copy.identity].append(copy)
    kept: dict[Identity, _Copy] = {}
    identical: list[_Copy] = []
    conflicts: set[Identity] = set()
    for identity in sorted(by_identity):
        if has_ingest:
            ordered = sorted(by_identity[identity], key=lambda c: (run_of(c.file), c.ingest_ts, c.file, c.position))
        else:
            ordered = sorted(by_identity[identity], key=lambda c: (run_of(c.file), c.file, c.position))
        first = kept[identity] = ordered[0]
        for other in ordered[1:]:
            if _content(other, ingest_column) == _content(first, ingest_column):
                identical.append(other)
                continue
            if on_conflict == "fail":
                raise ConflictingDuplicateError(
                    what=(
                        f"buffer (origin {identity[0]}, sequence {identity[1]}, chunk {identity[2]}) "
                        "was archived twice with different content"
                    ),
                    todo="remove the wrong copy from the archive, or set on_conflict: keep_first",
                    where=Location(
                        origin=identity[0],
                        sequence=identity[1],
                        chunk=identity[2],
                        file=first.file,
                        extra={"other_file": other.file},
                    ),
                )
            conflicts.add(identity)
    return kept, identical, conflicts


def _resolve_keys(config: JobConfig, archive_columns: Sequence[str]) -> dict[str, ResolvedKey]:
    """The watermark keys with physical column names; the implicit key uses ``watermark_ts`` if present."""
    cols = config.columns
    keys: dict[str, ResolvedKey] = {}
    for name, key in config.watermark_keys.items():
        if config.watermarks is None:
            watermark = cols.resolve("watermark_ts") if cols.resolve("watermark_ts") in archive_columns else None
        elif key.watermark is None:
            watermark = None
        else:
            watermark = cols.resolve(key.watermark)
            if watermark not in archive_columns:
                raise ConfigError(
                    what=f"watermark key {name!r} names the watermark column {watermark!r}, which the archive lacks",
                    todo="name a column the archive has, or leave 'watermark' out for event-time watermarks",
                    where=Location(column=watermark, field=f"watermarks.{name}.watermark"),
                    code="config.unknown_column",
                )
        keys[name] = ResolvedKey(
            name=name,
            event_time=cols.resolve(key.event_time),
            watermark=watermark,
            allowed_lateness=key.allowed_lateness,
        )
    for spec in config.windows:  # docs/errors.md#bad-input: an unknown column is a configuration error
        for agg in spec.aggregations:
            if agg.column is not None and cols.resolve(agg.column) not in archive_columns:
                raise ConfigError(
                    what=f"window {spec.name!r} aggregates column {agg.column!r}, which the archive lacks",
                    todo="name one of the archive's columns",
                    where=Location(column=agg.column, field=f"windows[{spec.name}].aggregations"),
                    code="config.unknown_column",
                )
    return keys


def _resolve_lateness(requested: str, *, has_ingest: bool, ingest_column: str) -> str:
    if requested not in ("auto", "origin", "arrival"):
        raise ConfigError(
            what=f"lateness {requested!r} is not one of auto, origin, arrival",
            todo="pass lateness='origin', 'arrival' or 'auto'",
            where=Location(field="lateness"),
        )
    if requested == "auto":
        return "arrival" if has_ingest else "origin"
    if requested == "arrival" and not has_ingest:
        raise ConfigError(
            what=f"lateness: arrival orders buffers by {ingest_column!r}, which the archive lacks",
            todo="use lateness: origin (or auto), or archive the ingest time",
            where=Location(column=ingest_column, field="lateness"),
            code="config.unknown_column",
        )
    return requested


def run_finder(earlier: Sequence[Collection[str | Path]]) -> Callable[[str], int]:
    """The run (0, 1, ...) that first reads a file, given the files each earlier run read; a file
    none of them read is the last run's."""
    runs = [{str(Path(f).resolve()) for f in files} for files in earlier]

    def run_of(file: str) -> int:
        resolved = str(Path(file).resolve())
        return next((i for i, files in enumerate(runs) if resolved in files), len(runs))

    return run_of


def load_archive(
    archive: str | Path, config: JobConfig, *, lateness: str | None, earlier: Sequence[Collection[str | Path]] = ()
) -> LoadedArchive:
    """Read, cut into copies and deduplicate every ``*.parquet`` file under ``archive``.

    ``earlier``: the files each earlier run of an incremental replay read, in run order; a copy
    in a later run's file never displaces the copy an earlier run kept (``_dedupe``).

    Raises:
        ArchiveReadError: ``archive`` does not exist.
        EmptyArchiveError: no Parquet file under ``archive``.
        ConfigError: unknown watermark column, or ``arrival`` lateness without ``ingest_ts``.
        ConflictingDuplicateError: two copies of a buffer differ under ``on_conflict: fail``.
    """
    cols = config.columns
    if not Path(archive).exists():
        raise ArchiveReadError(
            "the archive does not exist",
            where=Location(file=str(archive)),
            todo="point at an existing directory",
            code="archive.not_found",
        )
    files = sorted(Path(archive).rglob("*.parquet"))
    if not files:
        raise EmptyArchiveError(
            what="the archive holds no Parquet file",
            todo="point at a directory with *.parquet files",
            where=Location(file=str(archive)),
        )
    ingest_c, idle_c, key_c = cols.resolve("ingest_ts"), cols.resolve("idle"), cols.resolve("key")
    declared = config.watermark_keys.values()
    time_columns = {ingest_c, cols.resolve("watermark_ts")}
    time_columns |= {cols.resolve(k.event_time) for k in declared}
    time_columns |= {cols.resolve(k.watermark) for k in declared if k.watermark}
    column_order, copies = _read_copies(files, config=config, time_columns=time_columns)
    has_ingest = ingest_c in column_order
    keys = _resolve_keys(config, column_order)
    mode = _resolve_lateness(lateness or config.lateness, has_ingest=has_ingest, ingest_column=ingest_c)

    metadata = {cols.resolve(r) for r in ("origin_id", "sequence_number", "chunk_number", "last_chunk")}
    metadata |= {cols.resolve("watermark_ts"), ingest_c, idle_c} | {k.watermark for k in keys.values() if k.watermark}
    event_columns = {k.event_time for k in keys.values()}

    def tuples_of(copy: _Copy) -> tuple[Row, ...]:
        # A punctuation row has a null key and null event times: it carries only metadata.
        return tuple(
            r for r in copy.rows if r.get(key_c) is not None or any(r.get(c) is not None for c in event_columns)
        )

    kept, identical, conflicts = _dedupe(
        copies,
        on_conflict=config.on_conflict,
        ingest_column=ingest_c,
        has_ingest=has_ingest,
        run_of=run_finder(earlier),
    )
    duplicate_copies: Counter[int] = Counter()
    duplicate_tuples: Counter[int] = Counter()
    for copy in identical:
        duplicate_copies[copy.identity[0]] += 1
        duplicate_tuples[copy.identity[0]] += len(tuples_of(copy))

    buffers = []
    for identity, copy in sorted(kept.items()):
        head = copy.rows[0]
        tuples = tuples_of(copy)
        marks: dict[str, int | None] = {}
        for k, key in keys.items():
            if key.watermark is not None:
                marks[k] = head.get(key.watermark)  # type: ignore[assignment]
            else:
                event_times = [r[key.event_time] for r in tuples if r.get(key.event_time) is not None]
                marks[k] = max(event_times, default=None)  # type: ignore[type-var,assignment]
        buffers.append(
            Buffer(
                origin=identity[0],
                sequence=identity[1],
                chunk=identity[2],
                last_chunk=bool(head[cols.resolve("last_chunk")]),
                idle=bool(head.get(idle_c)),
                ingest_ts=copy.ingest_ts,
                watermarks=marks,
                tuples=tuples,
                file=copy.file,
            )
        )
    return LoadedArchive(
        lateness=mode,
        keys=keys,
        buffers=tuple(buffers),
        payload_columns=tuple(c for c in column_order if c not in metadata),
        tuples_read=sum(len(tuples_of(copy)) for copy in copies),
        duplicate_copies=dict(sorted(duplicate_copies.items())),
        duplicate_tuples=dict(sorted(duplicate_tuples.items())),
        conflicts=frozenset(conflicts),
    )
