"""``replay run``: micro-batches, exactly-once checkpoints and versioned outputs (docs/outputs.md).

A run:

1. takes the checkpoint's single-writer lock and checks the job's fingerprint;
2. restores the progress engine from the last commit's snapshot (``replay._resume``;
   checkpoints from before snapshots re-feed every committed batch's buffers);
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replay import _state
from replay._dedup import deduplicate, other_copies
from replay._ledger import account, check_ledger, ledger_row
from replay._plan import file_stamp, plan_batches, relevant
from replay._resume import State, rebuild
from replay._scan import FileCache
from replay._tables import progress_table, snapshot_json, table_schemas, write_run_version
from replay.aggregate import BatchWork, WorkResult, buffer_copy_id, copy_id, run_batch
from replay.archive import (
    ArchiveLayout,
    discover_files,
    inspect_schema,
    local_path,
    resolve_lateness,
    spark_schema,
)
from replay.buffers import Buffer, content_hashes, scan_buffers
from replay.checkpoint import CheckpointStore, LockInfo, write_record
from replay.config import JobConfig
from replay.errors import (
    CheckpointCorruptError,
    ConfigError,
    Location,
    ReplayError,
)
from replay.inspection import participants_of
from replay.outputs import list_versions, read_manifest, write_parquet
from replay.progress import Decision
from replay.timeutil import format_ts

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


# --------------------------------------------------------------------------- the run


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
    # Absolute for the same reason as the output: Spark writes the open-window state, and the JVM
    # resolves a relative path against its own working directory, not this process's.
    checkpoint = str(Path(checkpoint).absolute()) if local_path(checkpoint) is not None else checkpoint
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
        # Commits are never changed once written: clean-up after every batch reads each retained one once.
        self._records: dict[int, Mapping[str, Any]] = {}

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

    def _referenced(self, commit: Mapping[str, Any] | None, *, outputs: bool = True) -> set[str]:
        """Every path a retained commit (or, with ``outputs``, an output version) still needs.

        Without ``outputs`` (the clean-up after each batch, which touches only ``state/``) the
        output versions' manifests are not read: they name output data files only.
        """
        refs: set[str] = set()
        if commit is None:
            return refs
        refs |= set(self.store.commit_files(commit, self.output))
        # open-window state of every retained commit (older ones are pruned); one that no longer
        # reads intact cannot be resumed from, so its files need no keeping
        retained = self.store.commits()
        self._records = {b: r for b, r in self._records.items() if b in retained}
        for batch in retained:
            if batch == commit["batch"]:
                continue
            try:
                record = self._records.get(batch) or self.store.commit_record(batch)
                self._records[batch] = record
            except CheckpointCorruptError:
                continue
            refs |= {str(self.store.root / d) for d in record["open_state"].values() if d}
            refs |= {str(self.store.root / f) for f in record.get("snapshot", {}).values()}
        # data files an output version already lists are never leftovers, even when the commit
        # that staged them was set aside as corrupt and its batch is redone
        for version in list_versions(self.output) if outputs else ():
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
            run_files = [f for f in discover_files(config.archive) if consumed.get(f) != file_stamp(f)]
        if not run_files and commit is not None:
            return self._finish_version(commit, batches=0, buffers=0, tuples=0, resumed=resumed)
        if not run_files:
            # A new checkpoint over an archive without files: let discovery raise its error.
            run_files = discover_files(config.archive)

        layout = inspect_schema(config, files=run_files, on_file=lambda d, t: self.event("footers", d, t))
        mode = resolve_lateness(config, layout)
        state = rebuild(store, config, layout, mode, commit)
        self.event("scan", 0, 1)
        scan = scan_buffers(
            self.spark,
            layout,
            config,
            strict=True,
            event_times=self.range != (None, None),
            cache=FileCache(store.root / "scan-cache"),
        )
        self.event("scan", 1, 1)
        schema = spark_schema(layout)
        spark_paths = dict(commit["spark_paths"]) if commit else {}
        spark_paths.update(scan.spark_paths)

        def hasher(copies: Sequence[tuple[str, int, int, int, int]]) -> Mapping[tuple[str, int], str]:
            hashes, paths = content_hashes(self.spark, layout, copies)
            spark_paths.update(paths)
            return hashes

        new, discarded = deduplicate(scan, state, store, config, mode, hasher)

        plan = plan_batches(new, config, intent["count"] if intent else None)
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
        state: State,
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
            if relevant(buf, start, end):
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
                checked=other_copies([*state.discarded, *discarded]),
            )
            result = run_batch(
                self.spark, config=config, layout=layout, schema=schema, spark_paths=spark_paths, work=work
            )
            open_after = {
                name: (str(Path(c.open_dir).relative_to(store.root)) if c.open_dir else None)
                for name, c in result.specs.items()
            }
            account(ledger, reads, result, config, key_index, nkeys, batch)
        check_ledger(ledger, state.pending, config, key_index, batch)

        progress_path = self.output / "data" / "progress" / f"{prefix}.parquet"
        write_parquet(progress_table(batch, snapshot), progress_path)
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
            files.update({f: file_stamp(f) for f in run_files})
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
                    "ledger": ledger_row(ledger, state.pending, config, key_index),
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
            "schemas": table_schemas(self.config, schema, layout, previous),
            "progress": snapshot_json(snapshot),
            "snapshot": snapshot_rel,
        }
        _fault("during_commit", batch)
        store.commit(batch, record)
        self._records[batch] = record
        for buf in buffers:
            state.known[buf.identity] = buf
            state.known_copies.add((buf.file, buf.row_start))
        state.discarded.extend(discarded)
        state.commit = record
        store.prune(config.retain)
        store.remove_unreferenced(self._referenced(record, outputs=False), {store.root / "state": "b"})
        return record

    def _finish_version(
        self, commit: Mapping[str, Any], *, batches: int, buffers: int, tuples: int, resumed: bool
    ) -> RunSummary:
        """Write the version of a finished run (once), and summarise."""
        existing, version = write_run_version(self.output, self.store, self.cid, self.config, commit)
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
