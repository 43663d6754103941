"""``replay run``: micro-batches, exactly-once checkpoints and versioned outputs (docs/outputs.md).

A run:

1. takes the checkpoint's single-writer lock and checks the job's fingerprint;
2. restores the progress engine from the last commit's snapshot (``replay.runner.resume``): a
   bounded number of files, whatever the number of batches before it;
3. finds the files not consumed yet (or, after a crash, the interrupted run's files, from
   its intent), scans their buffers (metadata only) and deduplicates them against the
   checkpoint;
4. cuts the new buffers, in arrival order (sequence order in origin mode), into
   micro-batches of at most ``max_buffers`` buffers and ``max_tuples`` tuples, and records
   the run's files and cut in its intent (once, before its first batch);
5. per batch: feeds the engine, runs the batch's tuple work in Spark
   (``replay.engine.aggregate``), checks the ledger, stages its files, appends it to the batch
   log and commits atomically (a commit of fixed size: pointers and totals);
6. at the end of the run, writes the ``integrity`` table and a new output version.

A crash anywhere loses nothing: the next run resumes from the last commit, deletes what
uncommitted batches staged, and redoes the rest of the run with the same cut.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replay.core.config import JobConfig, lenient_change
from replay.core.errors import ConfigError, EmptyArchiveError, Location, ReplayError, storage_errors
from replay.core.paths import check_directory, default_checkpoint, local_path
from replay.core.timeutil import format_ts
from replay.engine.archive import inspect_schema, resolve_lateness, spark_schema
from replay.engine.archive_files import discover_files
from replay.engine.buffers import scan_buffers
from replay.engine.copies import Copy, cached_content_hashes
from replay.engine.file_cache import FileCache
from replay.engine.inspection import participants_of
from replay.engine.scan import event_lows
from replay.engine.scan_columns import scan_columns
from replay.engine.spark import driver_arrow_memory, job_progress
from replay.runner.batch import process
from replay.runner.context import Batch, RunContext, fault
from replay.runner.dedup import after_skip_notes, deduplicate
from replay.runner.hold import EmissionHold
from replay.runner.plan import changed_notes, cut_batches, plan_batches, plan_passes, stamped
from replay.runner.resume import intent_with_files, rebuild
from replay.runner.summary import RunSummary
from replay.store import state as _state
from replay.store.checkpoint import CheckpointStore
from replay.store.outputs import decode_schema, list_versions, read_manifest
from replay.store.records import Commit, RunIntent
from replay.store.status import output_watermarks
from replay.store.tables import write_run_version

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["RunSummary", "run"]

Event = Callable[[str, int, int], None]


# --------------------------------------------------------------------------- helpers


# --------------------------------------------------------------------------- the run


@storage_errors("nothing of the batch in progress was committed, and the next run resumes from the checkpoint")
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
    driver_arrow_memory()
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
    check_directory("output", output)
    check_directory("checkpoint", checkpoint)
    store = CheckpointStore(checkpoint)
    result_fields = config.fingerprint_fields() | {"range": [format_ts(start), format_ts(end)]}
    fingerprint = hashlib.sha256(json.dumps(result_fields, sort_keys=True).encode()).hexdigest()

    def event(step: str, done: int, total: int) -> None:
        if on_event is not None:
            on_event(step, done, total)

    with _frozen_heap() as freezing, store.lock() as stale:
        identity = store.bind(fingerprint=fingerprint, fields=result_fields, output=output, may_change=lenient_change)
        runner = _Runner(
            config=config,
            store=store,
            identity=identity,
            output=Path(output),
            range=(start, end),
            spark=spark,
            event=event,
            listened=on_event is not None,
            freezing=freezing,
        )
        summary = runner.execute()
    return replace(summary, stale_lock=stale, seconds=time.perf_counter() - began)


@contextmanager
def _frozen_heap() -> Iterator[bool]:
    """The objects alive when the run starts (the interpreter's modules, a caller's) left out of
    Python's cyclic garbage collections for the run (``gc.freeze``; ``gc.unfreeze`` after it);
    yields whether the run does so.

    Planning a batch makes several objects per buffer, and every so often the collector walks every
    object the process holds, most of which outlive the run anyway. In a warm session (the
    benchmark's process) freezing them took the planning of a 13k-buffer batch from 0.30 to
    0.24 s (medians of six pairs; docs/performance-record.md). A process that froze objects itself
    (a server that forks workers does, to keep their memory pages shared) keeps its arrangement.

    The run ends by collecting its own cyclic garbage, before the unfreeze, so that only the objects
    it made are walked (about 0.5 ms after a small run). py4j's proxy of a JVM object and its method
    handles form a cycle: a DataFrame's JVM Dataset, with its plans and the broadcast relations they
    hold (a 64 MiB page each on the driver), lives until Python's collector finds that cycle. Left in
    the oldest generation, which the unfreeze fills, the cycles outlived many runs: a session that
    ran a small job 20 times held 296 MiB of JVM heap after full collections instead of 69 MiB
    (docs/performance.md#a-session-that-runs-again-and-again)."""
    freezing = not gc.get_freeze_count()
    if freezing:
        gc.freeze()
    try:
        yield freezing
    finally:
        gc.collect()
        if freezing:
            gc.unfreeze()


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
        listened: bool,
        freezing: bool,
    ) -> None:
        self.config = config
        self._freezing = freezing  # the run freezes long-lived objects (``_frozen_heap``)
        self.store = store
        self.cid = str(identity["id"])
        self.output = output
        self.range = range
        self._spark = spark
        if spark is not None:
            from replay.engine.spark import refuse_speculation

            refuse_speculation(spark)
        self.event = event
        self._listened = listened  # someone reads the events: worth a poller of Spark's progress
        self.notes: list[str] = []
        if identity.get("rebound"):
            self.notes.append(f"the checkpoint takes this job's settings: {identity['rebound']}")
        # Commits are never changed once written: pruning after every batch reads each retained one once.
        self._records: dict[int, Commit] = {}
        self._progress: tuple[int, dict[str, Any]] | None = None  # the last batch's progress report

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            from replay.engine.spark import get_session, refuse_speculation

            self._spark = get_session(self.config.spark)
            refuse_speculation(self._spark)
            if self._freezing:  # the session's objects, and PySpark's modules, live as long as the run
                gc.freeze()
        return self._spark

    # -- the pieces ---------------------------------------------------------------------------

    def _dirs(self) -> dict[Path, str]:
        """The output table directories and the prefix of this checkpoint's entries in them."""
        prefix = f"{self.cid}-b"
        return {self.output / "data" / table: prefix for table in ("windows", "late", "progress")}

    def _listed(self, after: int) -> set[str]:
        """Output entries that output versions written after batch ``after`` list: never leftovers,
        even when the commit that staged them was set aside as corrupt and its batch is redone."""
        keep: set[str] = set()
        for version in reversed(list_versions(self.output)):
            try:
                manifest = read_manifest(self.output, version)
            except (OSError, ValueError, ReplayError):
                continue
            mine = manifest.checkpoint_id == self.cid and manifest.kind == "run"
            if mine and (manifest.batch or 0) <= after:
                break  # versions are written in batch order: the older ones list older batches
            keep |= {str(self.output / p) for p in manifest.all_entries()}
        return keep

    def execute(self) -> RunSummary:
        store, config = self.store, self.config
        point = store.resume_point(self.output, repair=True)
        commit = point.commit
        for line in point.skipped:
            self.notes.append(f"checkpoint.corrupt: {line}; set aside, its batch is redone")
        if point.skipped and commit is not None:
            self.notes.append(f"resuming from commit {commit.batch}, the newest intact one")
        after = commit.batch if commit else 0
        # The run to do: the one the last commit did not finish, or a new one. Its intent, when it
        # was written, fixes its files and its cut.
        run_number = 1 if commit is None else (commit.run if not commit.finish else commit.run + 1)
        intent = store.run_intent(run_number)
        store.drop_run_intents(after=run_number)
        removed = store.remove_leftovers(after, self._dirs(), self._listed(after))
        resumed = intent is not None or bool(removed)
        if removed:
            self.notes.append(f"removed {len(removed)} staged file(s) of an uncommitted batch")
        if temporaries := store.remove_temporaries():
            self.notes.append(f"removed {len(temporaries)} temporary file(s) a stopped writer left")

        consumed = _state.read_consumed(store.root / commit.consumed) if commit and commit.consumed else {}
        if intent is not None:
            begun = commit is not None and commit.run == intent.run
            intent = intent_with_files(store, intent, begun=begun, notes=self.notes)
        # Each file's stamp before the scan reads it (a resumed run keeps its intent's): the last
        # commit records it as consumed only if the file still has it (``replay.runner.plan.unchanged``).
        if intent is not None:
            run_files = list(intent.files)
            stamps = dict(intent.stamps) if intent.stamps is not None else stamped(run_files)
        else:
            stamps = {f: s for f, s in stamped(discover_files(config.archive)).items() if consumed.get(f) != s}
            run_files = list(stamps)
        if not run_files and commit is not None:
            return self._finish_version(commit, batches=0, buffers=0, tuples=0, resumed=resumed)
        if commit is not None and commit.finish:
            self._version_left_unwritten(commit)
        if not run_files:
            # A new checkpoint over an archive without files: let discovery raise its error.
            run_files = discover_files(config.archive)

        # The columns earlier runs read: new files must agree with them, and read a column they lack as null.
        known = decode_schema(commit.archive_schema) if commit is not None and commit.archive_schema else None
        layout = inspect_schema(config, files=run_files, known=known, on_file=lambda d, t: self.event("footers", d, t))
        mode = resolve_lateness(config, layout)
        state = rebuild(store, config, layout, mode, commit)
        self.event("scan", 0, 1)
        cache = FileCache(store.root / "scan-cache")
        seen = [0, 1]  # the scan's Spark tasks: finished, known (``job_progress``)

        def scanning(done: int, total: int) -> None:
            seen[:] = [done, total]
            self.event("scan", done, total)

        spark = self.spark
        event_times = self.range != (None, None)  # a backfill range needs every key's event times
        try:
            with job_progress(spark, scanning if self._listened else None):
                scan = scan_buffers(spark, layout, config, strict=True, event_times=event_times, cache=cache)
        except EmptyArchiveError:
            if commit is None or not commit.finish or intent is not None:
                raise
            # New files without a row (an archiver's empty file): nothing new, as with no new file.
            self.notes.append(f"the {len(run_files)} new file(s) hold no rows: nothing to replay")
            return self._finish_version(commit, batches=0, buffers=0, tuples=0, resumed=resumed)
        self.event("scan", seen[1], seen[1])
        schema = spark_schema(layout)
        state.spark_paths.update(scan.spark_paths)

        def hasher(copies: Sequence[Copy]) -> Mapping[tuple[str, int], str]:
            hashes, paths, _ = cached_content_hashes(self.spark, layout, copies, cache)
            state.spark_paths.update(paths)
            return hashes

        new, discarded = deduplicate(scan, state, store, config, mode, hasher)
        self.notes += after_skip_notes(discarded)
        del scan  # the run's buffers are ``new`` and then the batches, each let go once its pass is done

        done = 0
        if intent is None:
            plan = plan_batches(new, config, None)
            intent = RunIntent(
                run=run_number,
                first_batch=after + 1,
                files=tuple(run_files),
                cuts=tuple(len(b) for b in plan),
                stamps={f: (s[0], s[1]) for f, s in stamps.items()},
            )
            fault("before_intent", intent.first_batch)
            store.write_run_intent(intent)
            fault("after_intent", intent.first_batch)
        else:
            done = after - intent.first_batch + 1 if commit is not None and commit.run == intent.run else 0
            cut = cut_batches(new, intent.cuts[done:])
            if cut is not None:
                plan = cut
            else:
                plan = plan_batches(new, config, None)
                self.notes.append(
                    f"the archive changed while run {run_number} was interrupted; its remaining "
                    f"{len(new)} buffer(s) are cut again"
                )
        participants = participants_of(new, layout)
        new_buffers, new_tuples = len(new), int(new.column("tuples").sum())
        del new
        if done == 0:
            # The run begins: its floor of origin-mode thresholds, and the origins that take part
            # from now on (the first batch's log line names them too).
            state.engine.begin_run()
            state.engine.join({k: sorted(v) for k, v in participants.items()})
        hold = None
        if mode == "origin":
            # ``G_k`` within the run never passes where the run ends it, whatever the cuts.
            state.engine.cap_run(itertools.chain.from_iterable(plan))
            known = [events is not None for events in scan_columns(layout, event_times=event_times).events]
            hold = EmissionHold.of(
                state.engine, plan, state.pending, known, lambda files: event_lows(spark, layout, files)
            )
        ctx = RunContext(
            config=config,
            store=store,
            cid=self.cid,
            output=self.output,
            range=self.range,
            layout=layout,
            schema=schema,
            mode=mode,
            run=run_number,
            run_files=tuple(run_files),
            stamps=stamps,
            hold=hold,
        )
        batches_done = 0
        for group in plan_passes(plan, config):
            batches = [
                Batch(
                    index=index,
                    buffers=plan[index],
                    join=participants if index == 0 and done == 0 else {},
                    discarded=discarded if index == 0 else [],
                    finish=index == len(plan) - 1,
                )
                for index in group
            ]
            for commit, progress in process(ctx, state, batches, consumed, self.spark):
                self._records[commit.batch] = commit
                self._progress = (commit.batch, progress)
                store.prune(config.retain, self._records)
                self._records = {b: r for b, r in self._records.items() if b in set(store.commits())}
                batches_done += 1
                self.event("batch", batches_done, len(plan))
            for index in group:
                plan[index] = plan[index][:0]  # committed (the run's packed array stays to its end)
            del batches
        assert commit is not None
        self.notes += changed_notes(ctx.changed)
        return self._finish_version(
            commit, batches=batches_done, buffers=new_buffers, tuples=new_tuples, resumed=resumed
        )

    def _version_left_unwritten(self, commit: Commit) -> None:
        """Write the version of the run ``commit`` finished if a stop between that commit and its
        version left it unwritten: before a new run starts, which might stop on bad input."""
        progress = self.store.snapshot(commit).progress
        existing, version = write_run_version(self.output, self.store, self.cid, self.config, commit, progress)
        if existing is None and version is not None:
            self.notes.append(f"wrote version {version}: run {commit.run}'s output, which a stop had left unwritten")

    def _finish_version(self, commit: Commit, *, batches: int, buffers: int, tuples: int, resumed: bool) -> RunSummary:
        """Write the version of a finished run (once), and summarise."""
        fault("before_version", commit.batch)
        progress: Mapping[str, Any] = (
            self._progress[1]
            if self._progress is not None and self._progress[0] == commit.batch
            else self.store.snapshot(commit).progress
        )
        existing, version = write_run_version(self.output, self.store, self.cid, self.config, commit, progress)
        ledger = commit.ledger
        keys = progress["keys"]
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
            pending_tuples=commit.pending_tuples,
            duplicate_copies=ledger["discarded_copies"],
            watermarks={k["key"]: (k["global"], k["effective"]) for k in keys},
            seconds=0.0,
            notes=tuple(self.notes),
            output_watermarks=output_watermarks(self.store, commit, progress, self.config.windows),
        )
