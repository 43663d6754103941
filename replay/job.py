"""``replay run``: micro-batches, exactly-once checkpoints and versioned outputs (docs/outputs.md).

A run:

1. takes the checkpoint's single-writer lock and checks the job's fingerprint;
2. rebuilds the progress engine by re-feeding the buffer metadata of every
   committed batch (the engine is deterministic, so the state is the same);
3. finds the files not consumed yet (or, after a crash, the interrupted run's
   files), scans their buffers (metadata only) and deduplicates them against the
   checkpoint;
4. cuts the new buffers, in arrival order (sequence order in origin mode), into
   micro-batches of at most ``max_buffers`` buffers and ``max_tuples`` tuples;
5. per batch: writes the intent (its cut), feeds the engine, runs the batch's
   tuple work in Spark (``replay.aggregate``), checks the ledger, and commits
   atomically: buffer metadata, open windows, output files, counts;
6. at the end of the run, writes the ``integrity`` table and a new output version.

A crash anywhere loses nothing: the next run resumes from the last commit and
redoes an uncommitted batch with the same cut, after deleting its staged files.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from replay import _state
from replay.aggregate import BatchWork, WorkResult, buffer_copy_id, copy_id, run_batch
from replay.archive import ArchiveLayout, discover_files, inspect_schema, local_path, resolve_lateness
from replay.buffers import Buffer, Conflict, DuplicateCopy, scan_buffers
from replay.checkpoint import CheckpointStore, LockInfo, read_record, write_record
from replay.config import JobConfig
from replay.errors import (
    CheckpointCorruptError,
    CheckpointStateError,
    ConfigError,
    ConflictingDuplicateError,
    LedgerError,
    Location,
    ReplayError,
)
from replay.inspection import participants_of
from replay.outputs import encode_schema, list_versions, read_manifest, write_manifest, write_parquet
from replay.progress import Decision, KeySettings, ProgressEngine, ProgressSnapshot, arrival_order
from replay.timeutil import NEG_INF, format_ts

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["RunSummary", "default_checkpoint", "run"]

Event = Callable[[str, int, int], None]


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    """What a run did. Watermarks are int microseconds (``NEG_INF``: none yet)."""

    output: str
    checkpoint: str
    version: int | None
    new_version: bool
    resumed: bool
    batches: int
    buffers: int
    tuples_read: int
    windows_emitted: int
    open_windows: int
    late_tuples: dict[str, int]
    pending_tuples: int
    duplicate_copies: int
    watermarks: dict[str, tuple[int, int]]  # key -> (G_k, E_k)
    seconds: float
    stale_lock: LockInfo | None = None
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "output": self.output,
            "checkpoint": self.checkpoint,
            "version": self.version,
            "new_version": self.new_version,
            "resumed": self.resumed,
            "batches": self.batches,
            "buffers": self.buffers,
            "tuples_read": self.tuples_read,
            "windows_emitted": self.windows_emitted,
            "open_windows": self.open_windows,
            "late_tuples": self.late_tuples,
            "pending_tuples": self.pending_tuples,
            "duplicate_copies": self.duplicate_copies,
            "watermarks": {
                k: {"global": format_ts(g), "effective": format_ts(e)} for k, (g, e) in self.watermarks.items()
            },
            "seconds": round(self.seconds, 3),
            "notes": list(self.notes),
        }


# --------------------------------------------------------------------------- helpers


def default_checkpoint(output: str, start: int | None, end: int | None) -> str:
    """Where a run keeps its checkpoint when the job names none: under the output."""
    if start is None and end is None:
        return str(Path(output) / "_checkpoints" / "full")
    lo = "inf" if start is None else format_ts(start)
    hi = "inf" if end is None else format_ts(end)
    return str(Path(output) / "_checkpoints" / f"range_{lo}_{hi}".replace(":", ""))


def _fault(point: str, batch: int) -> None:
    """Test hook: ``REPLAY_FAULT=<point>:<batch>`` kills this process with SIGKILL at that point."""
    wanted = os.environ.get("REPLAY_FAULT")
    if wanted and wanted == f"{point}:{batch}":
        os.kill(os.getpid(), signal.SIGKILL)


def _file_stamp(path: str) -> list[int]:
    local = local_path(path)
    if local is None:
        return [0, 0]
    st = os.stat(local)
    return [st.st_size, st.st_mtime_ns]


def _key_settings(layout: ArchiveLayout) -> list[KeySettings]:
    return [
        KeySettings(name=k.name, allowed_lateness=k.allowed_lateness, derived=k.watermark is None) for k in layout.keys
    ]


def _new_engine(config: JobConfig, layout: ArchiveLayout, mode: str) -> ProgressEngine:
    return ProgressEngine(
        keys=_key_settings(layout),
        mode=mode,
        participants={},
        expected_origins=config.expected_origins,
        chunk_base=config.chunk_base,
        gap_policy=config.gap_policy,
        watermark_regression=config.watermark_regression,
        idle_timeout=config.idle_timeout,
        strict=True,
    )


def _other_copies(discarded: Sequence[_state.Discarded]) -> dict[tuple[int, int, int], frozenset[str]]:
    """Per identity with discarded copies, the files those copies are in."""
    files: dict[tuple[int, int, int], set[str]] = defaultdict(set)
    for c in discarded:
        files[(c.origin, c.sequence, c.chunk)].add(c.file)
    return {identity: frozenset(f) for identity, f in files.items()}


def _discard(
    kind: str, copy: Buffer | DuplicateCopy | Conflict, file: str, row_start: int, tuples: int, kept_file: str
) -> _state.Discarded:
    """The record of a copy that was read but not kept (``kind``: duplicate or conflict)."""
    return _state.Discarded(
        kind=kind,
        origin=copy.origin,
        sequence=copy.sequence,
        chunk=copy.chunk,
        file=file,
        row_start=row_start,
        tuples=tuples,
        kept_file=kept_file,
    )


def _relevant(buf: Buffer, start: int | None, end: int | None) -> bool:
    """Whether a buffer may hold a tuple with an event time in ``[start, end)`` for some key."""
    if start is None and end is None:
        return True
    for lo, hi in zip(buf.min_event, buf.max_event, strict=True):
        if lo is None or hi is None:
            continue
        if (start is None or hi >= start) and (end is None or lo < end):
            return True
    return False


def _output_field(field: Any, kind: str | None) -> Any:
    """An archive column's field in an output table: a Parquet timestamp of any unit is a timestamp
    (microseconds; nanoseconds arrive as int64 under ``nanosAsLong``), epoch milliseconds stay int64."""
    from pyspark.sql.types import StructField, TimestampType

    if kind is None or kind == "epoch_ms":
        return field
    return StructField(field.name, TimestampType(), field.nullable)


def _ts(value: int) -> int | None:
    return None if value == NEG_INF else value


def _progress_table(batch: int, snapshot: ProgressSnapshot) -> pa.Table:
    keys = {k.key: k for k in snapshot.keys}
    rows: dict[str, list[Any]] = {
        name: []
        for name in (
            "batch",
            "wm_key",
            "origin_id",
            "complete_prefix",
            "local_watermark",
            "pending_buffers",
            "global_watermark",
            "time_window_lower",
            "time_window_upper",
            "cut_sequence",
            "cut_chunk",
        )
    }
    for o in snapshot.origins:
        cut = snapshot.stream_cut.get(o.origin)
        key = keys[o.key]
        rows["batch"].append(batch)
        rows["wm_key"].append(o.key)
        rows["origin_id"].append(o.origin)
        rows["complete_prefix"].append(o.complete_prefix)
        rows["local_watermark"].append(_ts(o.local_watermark))
        rows["pending_buffers"].append(o.pending_buffers)
        rows["global_watermark"].append(_ts(key.global_watermark))
        rows["time_window_lower"].append(_ts(key.time_window[0]) if key.time_window else None)
        rows["time_window_upper"].append(_ts(key.time_window[1]) if key.time_window else None)
        rows["cut_sequence"].append(cut[0] if cut else None)
        rows["cut_chunk"].append(cut[1] if cut else None)
    ts = pa.timestamp("us", tz="UTC")
    return pa.table(
        rows,
        schema=pa.schema(
            [
                ("batch", pa.int64()),
                ("wm_key", pa.string()),
                ("origin_id", pa.int64()),
                ("complete_prefix", pa.int64()),
                ("local_watermark", ts),
                ("pending_buffers", pa.int64()),
                ("global_watermark", ts),
                ("time_window_lower", ts),
                ("time_window_upper", ts),
                ("cut_sequence", pa.int64()),
                ("cut_chunk", pa.int64()),
            ]
        ),
    )


INTEGRITY_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("origin_id", pa.int64()),
        ("sequence_number", pa.int64()),
        ("chunk_number", pa.int64()),
        ("wm_key", pa.string()),
        ("tuples", pa.int64()),
        ("file", pa.string()),
        ("other_file", pa.string()),
        ("detail", pa.string()),
    ]
)


def _integrity_table(snapshot: ProgressSnapshot, discarded: Sequence[_state.Discarded], root: str) -> pa.Table:
    def rel(path: str) -> str:
        local, base = local_path(path), local_path(root)
        if local is not None and base is not None:
            try:
                return str(Path(local).resolve().relative_to(Path(base).resolve()))  # the archive may be relative
            except ValueError:
                return local
        return path

    rows: list[dict[str, Any]] = []
    for origin, seq in snapshot.gaps:
        rows.append({"kind": "gap", "origin_id": origin, "sequence_number": seq})
    for origin, seq in snapshot.incomplete:
        rows.append({"kind": "incomplete", "origin_id": origin, "sequence_number": seq})
    for s in snapshot.skipped:
        rows.append(
            {
                "kind": "skipped",
                "origin_id": s.origin,
                "sequence_number": s.sequence,
                "detail": "missing" if s.missing else "chunks " + ",".join(map(str, s.chunks)),
            }
        )
    for r in snapshot.regressions:
        rows.append(
            {
                "kind": "regression",
                "origin_id": r.origin,
                "sequence_number": r.sequence,
                "wm_key": r.key,
                "detail": f"{r.action}: {format_ts(r.watermark)} after {format_ts(r.previous)}",
            }
        )
    for d in discarded:
        rows.append(
            {
                "kind": d.kind,
                "origin_id": d.origin,
                "sequence_number": d.sequence,
                "chunk_number": d.chunk,
                "tuples": d.tuples,
                "file": rel(d.file),
                "other_file": rel(d.kept_file),
            }
        )
    return pa.Table.from_pylist(rows, schema=INTEGRITY_SCHEMA)


# --------------------------------------------------------------------------- state


@dataclass(slots=True, kw_only=True)
class _Ledger:
    """Cumulative counts the ledger identity is checked on (docs/outputs.md#ledger)."""

    tuples_read: int = 0
    read_xor: int = 0
    processed_xor: int = 0
    discarded_xor: int = 0
    discarded_tuples: int = 0
    discarded_copies: int = 0
    outside_skipped: int = 0  # tuples of buffers a backfill range did not need to read
    late: list[int] = field(default_factory=list)
    no_event: list[int] = field(default_factory=list)
    outside: list[int] = field(default_factory=list)
    unwindowed: dict[str, int] = field(default_factory=dict)
    windowed: dict[str, int] = field(default_factory=dict)
    emitted_owned: dict[str, int] = field(default_factory=dict)
    open_owned: dict[str, int] = field(default_factory=dict)
    emitted_windows: dict[str, int] = field(default_factory=dict)
    open_windows: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> _Ledger:
        return cls(**dict(data))


@dataclass(slots=True, kw_only=True)
class _State:
    """Everything a run continues from: the engine, pending buffers, discarded copies, the last commit.

    ``known`` and ``known_copies`` (every buffer ever fed, and every copy consumed or discarded)
    are the history: loaded from the checkpoint only when the scan meets an identity the engine
    has seen before (a re-delivered buffer, or a file that changed and was read again), so that
    resuming costs the same after ten batches as after thousands.
    """

    engine: ProgressEngine
    known: dict[tuple[int, int, int], Buffer]
    known_copies: set[tuple[str, int]]  # (file, row_start) of every copy consumed or discarded
    pending: dict[tuple[int, int, int], Buffer]
    discarded: list[_state.Discarded]
    ledger: _Ledger
    commit: dict[str, Any] | None
    history_loaded: bool = True
    nkeys: int = 1

    def load_history(self, store: CheckpointStore) -> None:
        """Read every committed batch's buffer records into ``known`` and ``known_copies``."""
        if self.history_loaded:
            return
        assert self.commit is not None
        for entry in self.commit["batches"]:
            for buf in _state.read_buffers(store.root / entry["buffers"], self.nkeys):
                self.known[buf.identity] = buf
                self.known_copies.add((buf.file, buf.row_start))
        self.known_copies |= {(c.file, c.row_start) for c in self.discarded}
        self.history_loaded = True


def _empty_state(engine: ProgressEngine, nkeys: int) -> _State:
    return _State(
        engine=engine,
        known={},
        known_copies=set(),
        pending={},
        discarded=[],
        ledger=_Ledger(late=[0] * nkeys, no_event=[0] * nkeys, outside=[0] * nkeys),
        commit=None,
        nkeys=nkeys,
    )


def _rebuild(
    store: CheckpointStore, config: JobConfig, layout: ArchiveLayout, mode: str, commit: dict[str, Any] | None
) -> _State:
    engine = _new_engine(config, layout, mode)
    nkeys = len(layout.keys)
    if commit is None:
        return _empty_state(engine, nkeys)
    if commit["lateness"] != mode:
        raise CheckpointStateError(
            f"the checkpoint replays in {commit['lateness']} mode but the archive now gives {mode}",
            where=Location(file=str(store.root)),
            todo="restore the archive's ingest_ts column, or start a new checkpoint",
        )
    state = _empty_state(engine, nkeys)
    state.commit = commit
    state.ledger = _Ledger.from_json(commit["ledger"])
    for entry in commit["batches"]:
        if entry.get("discarded"):
            state.discarded += _state.read_discarded(store.root / entry["discarded"])
    snapshot = commit.get("snapshot")
    if snapshot is not None:
        # The engine as the commit left it: one small record and the buffers in flight.
        values = read_record(store.root / snapshot["engine"])
        held = _state.read_buffers(store.root / snapshot["held"], nkeys)
        engine.restore(values["engine"], held)
        undecided = {tuple(i) for i in values["undecided"]}
        state.pending = {b.identity: b for b in held if b.identity in undecided}
        state.history_loaded = False
    else:
        # A checkpoint written before engine snapshots: re-feed every batch's buffers in order.
        for entry in commit["batches"]:
            engine.join(entry["join"])
            buffers = _state.read_buffers(store.root / entry["buffers"], nkeys)
            for buf in buffers:
                state.known[buf.identity] = buf
                state.known_copies.add((buf.file, buf.row_start))
                state.pending[buf.identity] = buf
            decisions = engine.feed(buffers)
            if entry["finish"]:
                decisions += engine.finish()
            for d in decisions:
                state.pending.pop((d.origin, d.sequence, d.chunk), None)
        state.known_copies |= {(c.file, c.row_start) for c in state.discarded}
    if len(state.pending) != commit["pending_buffers"]:
        raise CheckpointStateError(
            f"rebuilding the checkpoint gives {len(state.pending)} pending buffers, its last commit says "
            f"{commit['pending_buffers']}",
            where=Location(file=str(store.root)),
            todo="the checkpoint is damaged or was written by another replay version; start a new checkpoint",
        )
    return state


def _check_ledger(
    ledger: _Ledger,
    pending: Mapping[tuple[int, int, int], Buffer],
    config: JobConfig,
    key_index: Mapping[str, int],
    batch: int,
) -> None:
    pending_tuples = sum(b.tuples for b in pending.values())
    pending_xor = 0
    for buf in pending.values():
        pending_xor ^= buffer_copy_id(buf)
    accounted = ledger.processed_xor ^ pending_xor ^ ledger.discarded_xor
    if accounted != ledger.read_xor:
        raise LedgerError(
            "the XOR of the buffer copies read differs from the XOR of those accounted for "
            "(processed, pending, discarded): a buffer was lost or counted twice",
            where=Location(extra={"batch": batch}),
            todo="nothing was committed for this batch; report this with the archive and the checkpoint",
        )
    for spec in config.windows:
        i = key_index[spec.wm_key]
        windowed = ledger.emitted_owned.get(spec.name, 0) + ledger.open_owned.get(spec.name, 0)
        if windowed != ledger.windowed.get(spec.name, 0):
            raise LedgerError(
                f"window aggregation {spec.name!r} owns {windowed} tuples but {ledger.windowed.get(spec.name, 0)} "
                "on-time tuples entered it",
                where=Location(extra={"batch": batch, "window": spec.name}),
                todo="nothing was committed for this batch; report this with the archive and the checkpoint",
            )
        total = (
            windowed
            + ledger.unwindowed.get(spec.name, 0)
            + ledger.late[i]
            + ledger.no_event[i]
            + ledger.outside[i]
            + ledger.outside_skipped
            + pending_tuples
            + ledger.discarded_tuples
        )
        if total != ledger.tuples_read:
            raise LedgerError(
                f"tuples read ({ledger.tuples_read}) differ from tuples accounted for ({total}: windows, late, "
                f"pending, duplicates) for window aggregation {spec.name!r}",
                where=Location(extra={"batch": batch, "window": spec.name}),
                todo="nothing was committed for this batch; report this with the archive and the checkpoint",
            )


# --------------------------------------------------------------------------- the run


def _ledger_row(
    ledger: _Ledger,
    pending: Mapping[tuple[int, int, int], Buffer],
    config: JobConfig,
    key_index: Mapping[str, int],
) -> dict[str, Any]:
    """The ledger's terms after a batch, kept per batch so that validation can check the identity again.

    Every term is stored, not the verdict: the reconciliation suite adds them up itself.
    """
    pending_xor = 0
    for buf in pending.values():
        pending_xor ^= buffer_copy_id(buf)
    return {
        "tuples_read": ledger.tuples_read,
        "read_xor": ledger.read_xor,
        "processed_xor": ledger.processed_xor,
        "pending_xor": pending_xor,
        "discarded_xor": ledger.discarded_xor,
        "pending": sum(b.tuples for b in pending.values()),
        "discarded": ledger.discarded_tuples,
        "outside_skipped": ledger.outside_skipped,
        "windows": {
            spec.name: {
                "emitted": ledger.emitted_owned.get(spec.name, 0),
                "open": ledger.open_owned.get(spec.name, 0),
                "entered": ledger.windowed.get(spec.name, 0),
                "unwindowed": ledger.unwindowed.get(spec.name, 0),
                "late": ledger.late[key_index[spec.wm_key]],
                "no_event_time": ledger.no_event[key_index[spec.wm_key]],
                "outside_range": ledger.outside[key_index[spec.wm_key]],
                "emitted_windows": ledger.emitted_windows.get(spec.name, 0),
            }
            for spec in config.windows
        },
    }


def _plan(buffers: Sequence[Buffer], config: JobConfig, first: int | None) -> list[list[Buffer]]:
    """Cut ``buffers`` into batches of at most ``max_buffers`` buffers and ``max_tuples`` tuples
    (at least one buffer each); ``first`` fixes the size of the first batch (a redone intent)."""
    max_buffers = config.micro_batch.max_buffers
    max_tuples = config.micro_batch.max_tuples
    batches: list[list[Buffer]] = []
    current: list[Buffer] = []
    tuples = 0
    rest = list(buffers)
    if first is not None:
        batches.append(rest[:first])
        rest = rest[first:]
    for buf in rest:
        full = (max_buffers is not None and len(current) >= max_buffers) or (
            max_tuples is not None and current and tuples + buf.tuples > max_tuples
        )
        if full:
            batches.append(current)
            current, tuples = [], 0
        current.append(buf)
        tuples += buf.tuples
    if current or not batches:
        batches.append(current)
    return batches


def run(
    config: JobConfig,
    *,
    start: int | None = None,
    end: int | None = None,
    spark: SparkSession | None = None,
    on_event: Event | None = None,
) -> RunSummary:
    """Replay the archive into the output, resuming from the checkpoint (docs/outputs.md#exactly-once).

    ``start``/``end``: an event-time backfill range ``[start, end)`` in microseconds;
    only windows entirely inside it are produced, and only tuples inside it are written
    to ``late``. ``on_event(step, done, total)`` reports progress (``scan``, ``batch``).

    Raises:
        ConfigError: no output, an incompatible checkpoint, bad range (exit code 2).
        ConcurrentWriterError: another process holds the checkpoint.
        ReplayError: bad input (docs/errors.md#bad-input); nothing is committed for the failing batch.
    """
    began = time.perf_counter()
    if not config.output:
        raise ConfigError(
            "the job has no output location",
            where=Location(field="output"),
            todo="set 'output' in the job file or pass --output",
        )
    for name, bound in (("start", start), ("end", end)):
        if bound is not None and not -62_135_596_800_000_000 <= bound <= 253_402_300_799_999_999:
            raise ConfigError(
                f"the backfill {name} {bound} (microseconds since the epoch) is outside the years 1 to 9999",
                where=Location(field=name),
                todo=f"pass a {name} between 0001-01-01 and 9999-12-31, or none for an open range",
            )
    if start is not None and end is not None and start >= end:
        raise ConfigError(
            f"the backfill range is empty: start {format_ts(start)} is not before end {format_ts(end)}",
            where=Location(field="start"),
            todo="pass --start earlier than --end (the range is [start, end))",
        )
    output = str(Path(config.output).absolute()) if local_path(config.output) is not None else config.output
    checkpoint = config.checkpoint or default_checkpoint(output, start, end)
    store = CheckpointStore(checkpoint)
    result_fields = config.fingerprint_fields() | {"range": [format_ts(start), format_ts(end)]}
    fingerprint = hashlib.sha256(json.dumps(result_fields, sort_keys=True).encode()).hexdigest()

    def event(step: str, done: int, total: int) -> None:
        if on_event is not None:
            on_event(step, done, total)

    with store.lock() as stale:
        identity = store.bind(fingerprint=fingerprint, fields=result_fields, output=output)
        runner = _Runner(
            config=config,
            store=store,
            identity=identity,
            output=Path(output),
            range=(start, end),
            spark=spark,
            event=event,
        )
        summary = runner.execute()
    return replace(summary, stale_lock=stale, seconds=time.perf_counter() - began)


class _Runner:
    def __init__(
        self,
        *,
        config: JobConfig,
        store: CheckpointStore,
        identity: Mapping[str, Any],
        output: Path,
        range: tuple[int | None, int | None],
        spark: SparkSession | None,
        event: Event,
    ) -> None:
        self.config = config
        self.store = store
        self.cid = str(identity["id"])
        self.output = output
        self.range = range
        self._spark = spark
        self.event = event
        self.notes: list[str] = []

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            from replay.spark import get_session

            self._spark = get_session(self.config.spark)
        return self._spark

    # -- the pieces ---------------------------------------------------------------------------

    def _dirs(self) -> dict[Path, str]:
        prefix = f"{self.cid}-b"
        return {
            self.output / "data" / "windows": prefix,
            self.output / "data" / "late": prefix,
            self.output / "data" / "progress": prefix,
            self.store.root / "state": "b",
        }

    def _referenced(self, commit: Mapping[str, Any] | None) -> set[str]:
        refs: set[str] = set()
        if commit is None:
            return refs
        refs |= set(self.store.commit_files(commit, self.output))
        # open-window state of every retained commit (older ones are pruned); one that no longer
        # reads intact cannot be resumed from, so its files need no keeping
        for batch in self.store.commits():
            if batch == commit["batch"]:
                continue
            try:
                record = self.store.commit_record(batch)
            except CheckpointCorruptError:
                continue
            refs |= {str(self.store.root / d) for d in record["open_state"].values() if d}
            refs |= {str(self.store.root / f) for f in record.get("snapshot", {}).values()}
        # data files an output version already lists are never leftovers, even when the commit
        # that staged them was set aside as corrupt and its batch is redone
        for version in list_versions(self.output):
            try:
                manifest = read_manifest(self.output, version)
            except (OSError, ValueError, ReplayError):
                continue
            refs |= {str(self.output / p) for paths in manifest.get("tables", {}).values() for p in paths}
        return refs

    def execute(self) -> RunSummary:
        store, config = self.store, self.config
        point = store.resume_point(lambda c: store.missing_files(c, self.output), repair=True)
        commit = point.commit
        for line in point.skipped:
            self.notes.append(f"checkpoint.corrupt: {line}; set aside, its batch is redone")
        if point.skipped and commit is not None:
            self.notes.append(f"resuming from commit {commit['batch']}, the newest intact one")
        intent = store.pending_intent()
        removed = store.remove_unreferenced(self._referenced(commit), self._dirs())
        resumed = intent is not None or bool(removed)
        if removed:
            self.notes.append(f"removed {len(removed)} staged file(s) of an uncommitted batch")

        unfinished = commit is not None and not commit["batches"][-1]["finish"]
        consumed: dict[str, list[int]] = dict(commit["files"]) if commit else {}
        if unfinished:
            assert commit is not None
            run_files = list(commit["run_files"])
            resumed = True
        else:
            run_files = [f for f in discover_files(config.archive) if consumed.get(f) != _file_stamp(f)]
        if not run_files and commit is not None:
            return self._finish_version(commit, batches=0, buffers=0, tuples=0, resumed=resumed)
        if not run_files:
            # A new checkpoint over an archive without files: let discovery raise its error.
            run_files = discover_files(config.archive)

        layout = inspect_schema(config, files=run_files, on_file=lambda d, t: self.event("footers", d, t))
        mode = resolve_lateness(config, layout)
        state = _rebuild(store, config, layout, mode, commit)
        self.event("scan", 0, 1)
        scan = scan_buffers(self.spark, layout, config, strict=True)
        self.event("scan", 1, 1)
        schema = self.spark.read.option("mergeSchema", "true").parquet(*layout.files).schema
        spark_paths = dict(commit["spark_paths"]) if commit else {}
        spark_paths.update(scan.spark_paths)

        # Deduplicate against the checkpoint: a copy already consumed (its file was re-read) is
        # skipped; another copy of a known buffer is a duplicate, or a conflict. Only an identity
        # the engine has seen can be either, so the history is read only when the scan meets one.
        seen = state.engine.seen
        if (
            any(seen(b.identity) for b in scan.buffers)
            or any(seen((d.origin, d.sequence, d.chunk)) for d in scan.duplicates)
            or any(seen((c.origin, c.sequence, c.chunk)) for c in scan.conflicts)
        ):
            state.load_history(store)
        new: list[Buffer] = []
        discarded: list[_state.Discarded] = []
        for buf in scan.buffers:
            if (buf.file, buf.row_start) in state.known_copies:
                continue
            known = state.known.get(buf.identity)
            if known is None:
                new.append(buf)
                continue
            kind = "duplicate" if known.content_hash == buf.content_hash else "conflict"
            if kind == "conflict" and config.on_conflict == "fail":
                raise ConflictingDuplicateError(
                    f"buffer archived again with different content: in {known.file} (row {known.row_start}, "
                    f"already replayed) and {buf.file} (row {buf.row_start})",
                    where=Location(origin=buf.origin, sequence=buf.sequence, chunk=buf.chunk, file=buf.file),
                    todo="find out which copy is right and remove the other, or set 'on_conflict: keep_first' "
                    "to keep the replayed copy (the conflict is still reported)",
                )
            discarded.append(_discard(kind, buf, buf.file, buf.row_start, buf.tuples, known.file))
        for dup in scan.duplicates:
            if (dup.file, dup.row_start) not in state.known_copies:
                discarded.append(_discard("duplicate", dup, dup.file, dup.row_start, dup.tuples, dup.kept_file))
        for con in scan.conflicts:
            if (con.other_file, con.other_row) not in state.known_copies:
                discarded.append(
                    _discard("conflict", con, con.other_file, con.other_row, con.other_tuples, con.kept_file)
                )

        if mode == "arrival":
            clock = state.engine.clock
            if clock is not None:
                # Buffers that reach an incremental run with an ingest_ts before the checkpoint's
                # clock arrive now, for the replay (docs/semantics.md).
                new = [b if b.ingest is None or b.ingest >= clock else replace(b, ingest=clock) for b in new]
            new = arrival_order(new)
        else:
            new = sorted(new, key=lambda b: (b.sequence, b.origin, b.chunk))

        plan = _plan(new, config, intent["count"] if intent else None)
        run_number = (commit["run"] + (0 if unfinished else 1)) if commit else 1
        participants = participants_of(new, layout)
        batches_done = 0
        for index, batch_buffers in enumerate(plan):
            last = index == len(plan) - 1
            commit = self._batch(
                state=state,
                layout=layout,
                schema=schema,
                mode=mode,
                spark_paths=spark_paths,
                buffers=batch_buffers,
                join=participants if index == 0 and not unfinished else {},
                discarded=discarded if index == 0 else [],
                finish=last,
                run_number=run_number,
                run_files=run_files,
                consumed=consumed,
            )
            batches_done += 1
            self.event("batch", index + 1, len(plan))
        assert commit is not None
        return self._finish_version(
            commit, batches=batches_done, buffers=len(new), tuples=sum(b.tuples for b in new), resumed=resumed
        )

    def _batch(
        self,
        *,
        state: _State,
        layout: ArchiveLayout,
        schema: Any,
        mode: str,
        spark_paths: dict[str, str],
        buffers: Sequence[Buffer],
        join: Mapping[str, set[int]],
        discarded: Sequence[_state.Discarded],
        finish: bool,
        run_number: int,
        run_files: Sequence[str],
        consumed: Mapping[str, list[int]],
    ) -> dict[str, Any]:
        config, store = self.config, self.store
        previous = state.commit
        batch = (previous["batch"] + 1) if previous else 1
        token = uuid.uuid4().hex[:8]
        nkeys = len(layout.keys)
        key_index = {k.name: i for i, k in enumerate(layout.keys)}
        _fault("before_intent", batch)
        store.write_intent(
            batch,
            {
                "batch": batch,
                "run": run_number,
                "count": len(buffers),
                "first": list(buffers[0].identity) if buffers else None,
                "last": list(buffers[-1].identity) if buffers else None,
                "token": token,
            },
        )
        _fault("after_intent", batch)

        engine = state.engine
        engine.join({k: sorted(v) for k, v in join.items()})
        e_before = tuple(k.effective_watermark for k in engine.snapshot().keys)
        for buf in buffers:
            state.pending[buf.identity] = buf
        decisions: list[Decision] = engine.feed(buffers)
        if finish:
            decisions += engine.finish()
        snapshot = engine.snapshot()
        effective = tuple(k.effective_watermark for k in snapshot.keys)

        ledger = state.ledger
        for buf in buffers:
            ledger.tuples_read += buf.tuples
            ledger.read_xor ^= buffer_copy_id(buf)
        for copy in discarded:
            cid = copy_id(copy.origin, copy.sequence, copy.chunk, copy.file, copy.row_start)
            ledger.tuples_read += copy.tuples
            ledger.read_xor ^= cid
            ledger.discarded_xor ^= cid
            ledger.discarded_tuples += copy.tuples
            ledger.discarded_copies += 1

        start, end = self.range
        reads: list[tuple[Buffer, Decision]] = []
        for d in decisions:
            buf = state.pending.pop((d.origin, d.sequence, d.chunk))
            if _relevant(buf, start, end):
                reads.append((buf, d))
            else:
                ledger.outside_skipped += buf.tuples
                ledger.processed_xor ^= buffer_copy_id(buf)

        prefix = f"{self.cid}-b{batch:08d}-{token}"
        open_before = dict(previous["open_state"]) if previous else {}
        if not any(buf.tuples for buf, _ in reads) and effective == e_before:
            # Nothing to aggregate (no reads, or punctuation only) and no watermark moved: no
            # window can change, so no Spark work; the buffers still count as processed.
            result = WorkResult()
            open_after = open_before
            for buf, _ in reads:
                ledger.processed_xor ^= buffer_copy_id(buf)
        else:
            work = BatchWork(
                reads=reads,
                effective=effective,
                open_state={name: str(store.root / d) if d else None for name, d in open_before.items()},
                windows_dir=str(self.output / "data" / "windows" / prefix),
                late_dir=str(self.output / "data" / "late" / prefix),
                state_dirs={
                    s.name: str(store.root / "state" / f"b{batch:08d}-{token}-open-{s.name}") for s in config.windows
                },
                range=(start, end),
                checked=_other_copies([*state.discarded, *discarded]),
            )
            result = run_batch(
                self.spark, config=config, layout=layout, schema=schema, spark_paths=spark_paths, work=work
            )
            open_after = {
                name: (str(Path(c.open_dir).relative_to(store.root)) if c.open_dir else None)
                for name, c in result.specs.items()
            }
            self._account(ledger, reads, result, config, key_index, nkeys, batch)
        _check_ledger(ledger, state.pending, config, key_index, batch)

        progress_path = self.output / "data" / "progress" / f"{prefix}.parquet"
        write_parquet(_progress_table(batch, snapshot), progress_path)
        buffers_rel = f"state/b{batch:08d}-{token}-buffers.parquet"
        _state.write_buffers(store.root / buffers_rel, buffers, nkeys)
        discarded_rel = None
        if discarded:
            discarded_rel = f"state/b{batch:08d}-{token}-discarded.parquet"
            _state.write_discarded(store.root / discarded_rel, discarded)
        engine_values, held = engine.export_state()
        snapshot_rel = {
            "engine": f"state/b{batch:08d}-{token}-engine.json",
            "held": f"state/b{batch:08d}-{token}-held.parquet",
        }
        write_record(
            store.root / snapshot_rel["engine"],
            {"engine": engine_values, "undecided": sorted(list(i) for i in state.pending)},
        )
        _state.write_buffers(store.root / snapshot_rel["held"], held, nkeys)
        _fault("after_staging", batch)

        outputs = dict(previous["outputs"]) if previous else {"windows": [], "late": [], "progress": []}
        outputs = {k: list(v) for k, v in outputs.items()}
        if result.windows_written:
            outputs["windows"].append(f"data/windows/{prefix}")
        if result.late_written:
            outputs["late"].append(f"data/late/{prefix}")
        outputs["progress"].append(f"data/progress/{prefix}.parquet")
        files = dict(previous["files"]) if previous else {}
        if finish:
            files.update({f: _file_stamp(f) for f in run_files})
        record = {
            "batch": batch,
            "run": run_number,
            "token": token,
            "lateness": mode,
            "range": [start, end],
            "batches": [
                *(previous["batches"] if previous else []),
                {
                    "batch": batch,
                    "run": run_number,
                    "join": {k: sorted(v) for k, v in join.items()},
                    "finish": finish,
                    "buffers": buffers_rel,
                    "discarded": discarded_rel,
                    "ledger": _ledger_row(ledger, state.pending, config, key_index),
                },
            ],
            "files": files,
            "run_files": list(run_files),
            "spark_paths": spark_paths,
            "open_state": open_after,
            "outputs": outputs,
            "ledger": ledger.to_json(),
            "pending_buffers": len(state.pending),
            "pending_tuples": sum(b.tuples for b in state.pending.values()),
            "schemas": self._schemas(schema, layout, previous),
            "progress": _snapshot_json(snapshot),
            "snapshot": snapshot_rel,
        }
        _fault("during_commit", batch)
        store.commit(batch, record)
        for buf in buffers:
            state.known[buf.identity] = buf
            state.known_copies.add((buf.file, buf.row_start))
        state.discarded.extend(discarded)
        state.commit = record
        store.prune(config.retain)
        store.remove_unreferenced(self._referenced(record), {store.root / "state": "b"})
        return record

    def _account(
        self,
        ledger: _Ledger,
        reads: Sequence[tuple[Buffer, Decision]],
        result: WorkResult,
        config: JobConfig,
        key_index: Mapping[str, int],
        nkeys: int,
        batch: int,
    ) -> None:
        """Check what Spark saw against the metadata scan, then add the batch to the ledger."""
        expected_rows = sum(buf.rows for buf, _ in reads)
        expected_tuples = sum(buf.tuples for buf, _ in reads)
        expected_lo = sum(buf.rows * (buffer_copy_id(buf) & 0xFFFFFFFF) for buf, _ in reads)
        expected_hi = sum(buf.rows * (buffer_copy_id(buf) >> 32) for buf, _ in reads)
        counts = result.counts
        if reads and (
            counts is None
            or (counts.rows, counts.tuples, counts.cid_lo, counts.cid_hi)
            != (expected_rows, expected_tuples, expected_lo, expected_hi)
        ):
            seen = (counts.rows, counts.tuples) if counts else (0, 0)
            raise LedgerError(
                f"Spark read {seen[0]} rows ({seen[1]} tuples) of the batch's {len(reads)} buffer copies, whose "
                f"scan counted {expected_rows} rows ({expected_tuples} tuples), or read other copies than those",
                where=Location(file=reads[0][0].file, extra={"batch": batch}),
                todo="a file changed while the run read it: let the archiver finish writing and run again",
            )
        for buf, _ in reads:
            ledger.processed_xor ^= buffer_copy_id(buf)
        if counts is not None:
            for i in range(nkeys):
                ledger.late[i] += counts.late[i]
                ledger.outside[i] += counts.outside[i]
                ledger.no_event[i] += counts.tuples - counts.late[i] - counts.on_time[i] - counts.outside[i]
        for name, c in result.specs.items():
            i = key_index[next(spec.wm_key for spec in config.windows if spec.name == name)]
            on_time = counts.on_time[i] if counts is not None else 0
            ledger.windowed[name] = ledger.windowed.get(name, 0) + c.windowed
            ledger.unwindowed[name] = ledger.unwindowed.get(name, 0) + on_time - c.windowed
            ledger.emitted_owned[name] = ledger.emitted_owned.get(name, 0) + c.emitted_owned
            ledger.emitted_windows[name] = ledger.emitted_windows.get(name, 0) + c.emitted
            ledger.open_owned[name] = c.open_owned
            ledger.open_windows[name] = c.open

    def _schemas(self, schema: Any, layout: ArchiveLayout, previous: Mapping[str, Any] | None) -> dict[str, str]:
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

        from replay.windows import aggregated_types, output_columns

        agg_types = aggregated_types(self.config.windows, schema)
        windows = StructType(
            [
                StructField("window", StringType(), False),
                StructField("wm_key", StringType(), False),
                StructField("key", schema[layout.key].dataType, True),
                StructField("window_start", TimestampType(), True),
                StructField("window_end", TimestampType(), True),
                *[StructField(n, t, True) for n, t in output_columns(self.config.windows, agg_types)],
            ]
        )
        late = StructType(
            [
                StructField("wm_key", StringType(), False),
                StructField("origin_id", LongType(), True),
                StructField("sequence_number", LongType(), True),
                StructField("chunk_number", LongType(), True),
                *[_output_field(schema[n], layout.time_columns.get(n)) for n in layout.payload],
                StructField("violated_watermark", TimestampType(), True),
                StructField("reason", StringType(), False),
            ]
        )
        result = dict(previous["schemas"]) if previous else {}
        result["windows"] = encode_schema(to_arrow_schema(windows, timezone="UTC"))
        result["late"] = encode_schema(to_arrow_schema(late, timezone="UTC"))
        return result

    def _finish_version(
        self, commit: Mapping[str, Any], *, batches: int, buffers: int, tuples: int, resumed: bool
    ) -> RunSummary:
        """Write the version of a finished run (once), and summarise."""
        existing = None
        for v in reversed(list_versions(self.output)):
            manifest = read_manifest(self.output, v)
            if manifest.get("kind", "run") != "run":
                continue  # a publication names its source's checkpoint and batch too
            if manifest.get("checkpoint_id") == self.cid and manifest.get("batch") == commit["batch"]:
                existing = v
                break
        version = existing
        if existing is None and commit["batches"][-1]["finish"]:
            snapshot_keys = commit["progress"]["keys"]
            discarded: list[_state.Discarded] = []
            for entry in commit["batches"]:
                if entry.get("discarded"):
                    discarded += _state.read_discarded(self.store.root / entry["discarded"])
            integrity = _integrity_from_json(commit["progress"], discarded, self.config.archive)
            integrity_rel = f"data/integrity/{self.cid}-b{commit['batch']:08d}-{commit['token']}.parquet"
            write_parquet(integrity, self.output / integrity_rel)
            version = write_manifest(
                self.output,
                {
                    "checkpoint": str(self.store.root),
                    "checkpoint_id": self.cid,
                    "batch": commit["batch"],
                    "run": commit["run"],
                    "range": commit["range"],
                    "lateness": commit["lateness"],
                    "tables": {
                        "windows": commit["outputs"]["windows"],
                        "late": commit["outputs"]["late"],
                        "progress": commit["outputs"]["progress"],
                        "integrity": [integrity_rel],
                    },
                    "schemas": commit["schemas"] | {"integrity": encode_schema(INTEGRITY_SCHEMA)},
                    "watermarks": snapshot_keys,
                    "counts": commit["ledger"],
                    # What validation needs without the checkpoint (whose commits are pruned):
                    "kind": "run",
                    "config": self.config.model_dump(mode="json"),
                    "files": sorted(commit["files"]),
                    "origins": commit["progress"]["origins"],
                    "ledger_batches": [
                        {"batch": entry["batch"], **entry["ledger"]} for entry in commit["batches"] if "ledger" in entry
                    ],
                },
            )
        ledger = commit["ledger"]
        keys = commit["progress"]["keys"]
        return RunSummary(
            output=str(self.output),
            checkpoint=str(self.store.root),
            version=version,
            new_version=existing is None and version is not None,
            resumed=resumed,
            batches=batches,
            buffers=buffers,
            tuples_read=tuples,
            windows_emitted=sum(ledger["emitted_windows"].values()),
            open_windows=sum(ledger["open_windows"].values()),
            late_tuples={k["key"]: ledger["late"][i] for i, k in enumerate(keys)},
            pending_tuples=commit["pending_tuples"],
            duplicate_copies=ledger["discarded_copies"],
            watermarks={k["key"]: (k["global"], k["effective"]) for k in keys},
            seconds=0.0,
            notes=tuple(self.notes),
        )


def _snapshot_json(snapshot: ProgressSnapshot) -> dict[str, Any]:
    """The progress state a commit records (for ``replay status`` and the integrity table)."""
    return {
        "keys": [
            {
                "key": k.key,
                "global": k.global_watermark,
                "effective": k.effective_watermark,
                "time_window": list(k.time_window) if k.time_window else None,
                "participants": list(k.participants),
            }
            for k in snapshot.keys
        ],
        "origins": [
            {
                "origin": o.origin,
                "key": o.key,
                "complete_prefix": o.complete_prefix,
                "local_watermark": o.local_watermark,
                "pending_buffers": o.pending_buffers,
                "idle": o.idle,
                "counted": o.counted,
            }
            for o in snapshot.origins
        ],
        "stream_cut": {str(o): list(c) for o, c in snapshot.stream_cut.items()},
        "gaps": [list(g) for g in snapshot.gaps],
        "incomplete": [list(g) for g in snapshot.incomplete],
        "skipped": [{"origin": s.origin, "sequence": s.sequence, "chunks": list(s.chunks)} for s in snapshot.skipped],
        "regressions": [
            {
                "origin": r.origin,
                "sequence": r.sequence,
                "key": r.key,
                "watermark": r.watermark,
                "previous": r.previous,
                "action": r.action,
            }
            for r in snapshot.regressions
        ],
    }


def _integrity_from_json(progress: Mapping[str, Any], discarded: Sequence[_state.Discarded], root: str) -> pa.Table:
    from replay.progress import Regression, Skipped

    snapshot = ProgressSnapshot(
        mode="",
        origins=(),
        keys=(),
        stream_cut={},
        gaps=tuple((g[0], g[1]) for g in progress["gaps"]),
        incomplete=tuple((g[0], g[1]) for g in progress["incomplete"]),
        skipped=tuple(
            Skipped(origin=s["origin"], sequence=s["sequence"], chunks=tuple(s["chunks"])) for s in progress["skipped"]
        ),
        regressions=tuple(Regression(**r) for r in progress["regressions"]),
    )
    return _integrity_table(snapshot, discarded, root)
