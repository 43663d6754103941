"""One micro-batch of ``replay run``, from feeding the engine to the commit (docs/outputs.md#exactly-once).

The steps, each a function below:

1. ``_feed``: the batch's buffers go to the progress engine, which decides some of them
   (their thresholds per key) and moves the watermarks;
2. ``_count_reads``: the ledger counts every copy read, kept or discarded;
3. ``_tuple_work``: the decided buffers' tuples are aggregated in Spark
   (``replay.engine.aggregate``), or not at all when nothing can change;
4. ``_stage``: the batch's files are written (each fsynced): progress rows, buffer records,
   the engine snapshot and the buffers it holds, the discarded and consumed lists when they
   change;
5. the batch is appended to the batch log and committed (``replay.store.checkpoint``).
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replay.core.buffer import Buffer
from replay.core.config import JobConfig
from replay.core.progress import Decision, ProgressSnapshot
from replay.engine.aggregate import BatchWork, WorkResult, buffer_copy_id, copy_id, run_batch
from replay.engine.archive import ArchiveLayout
from replay.engine.schemas import table_schemas
from replay.runner.dedup import other_copies
from replay.runner.ledger import Ledger, account, check_ledger, ledger_row
from replay.runner.plan import file_stamp, relevant
from replay.runner.resume import State
from replay.store import state as _state
from replay.store.checkpoint import CheckpointStore
from replay.store.outputs import write_parquet
from replay.store.records import Commit, EngineSnapshot, LogEntry, LogPointer
from replay.store.tables import progress_table, snapshot_json

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Batch", "RunContext", "fault", "process"]


def fault(point: str, batch: int) -> None:
    """Test hook: ``REPLAY_FAULT=<point>:<batch>`` kills this process with SIGKILL at that point."""
    wanted = os.environ.get("REPLAY_FAULT")
    if wanted and wanted == f"{point}:{batch}":
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunContext:
    """What every batch of one run shares."""

    config: JobConfig
    store: CheckpointStore
    cid: str  # the checkpoint's id: the prefix of its output entries
    output: Path
    range: tuple[int | None, int | None]
    layout: ArchiveLayout
    schema: Any  # the archive's Spark schema
    mode: str  # the lateness mode, origin or arrival
    run: int
    run_files: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    """One cut of the run: its buffers (in feed order), the origins that join the engine with it,
    the copies it discards, and whether it ends the run (the engine then decides what it holds)."""

    buffers: Sequence[Buffer]
    join: Mapping[str, set[int]]
    discarded: Sequence[_state.Discarded]
    finish: bool


def process(
    ctx: RunContext, state: State, batch_in: Batch, consumed: dict[str, list[int]], spark: SparkSession
) -> tuple[Commit, dict[str, Any]]:
    """Process and commit one batch; returns its commit and its progress report. ``state`` and
    ``consumed`` (updated when the batch ends the run) are carried to the next batch."""
    previous = state.commit
    batch = (previous.batch + 1) if previous else 1
    token = uuid.uuid4().hex[:8]
    fault("before_batch", batch)

    decisions, snapshot, moved = _feed(state, batch_in)
    _count_reads(state.ledger, batch_in)
    reads = _relevant_reads(ctx, state, decisions)
    prefix = f"{ctx.cid}-b{batch:08d}-{token}"
    stem = f"state/b{batch:08d}-{token}"
    worked, open_after = _tuple_work(ctx, state, batch_in, reads, snapshot, moved, prefix, stem, spark)
    key_index = {k.name: i for i, k in enumerate(ctx.layout.keys)}
    result = worked or WorkResult()
    if worked is not None:
        account(state.ledger, reads, worked, ctx.config, key_index, len(ctx.layout.keys), batch)
    check_ledger(state.ledger, state.pending, ctx.config, key_index, batch)

    outputs = {
        "windows": f"data/windows/{prefix}" if result.windows_written else None,
        "late": f"data/late/{prefix}" if result.late_written else None,
        "progress": f"data/progress/{prefix}.parquet",
    }
    progress = snapshot_json(snapshot)
    discarded_rel, consumed_rel = _stage(ctx, state, batch_in, batch, snapshot, progress, consumed, prefix, stem)
    fault("after_staging", batch)
    log = ctx.store.append_log(
        LogEntry(
            batch=batch,
            run=ctx.run,
            token=token,
            finish=batch_in.finish,
            join={k: tuple(sorted(v)) for k, v in batch_in.join.items()},
            buffers=f"{stem}-buffers.parquet",
            outputs=outputs,
            ledger=ledger_row(state.ledger, state.pending, ctx.config, key_index),
        ),
        previous.log if previous else LogPointer(),
    )
    record = Commit(
        batch=batch,
        run=ctx.run,
        token=token,
        finish=batch_in.finish,
        lateness=ctx.mode,
        range=ctx.range,
        log=log,
        consumed=consumed_rel,
        discarded=discarded_rel,
        engine=f"{stem}-engine.json",
        held=f"{stem}-held.parquet",
        open_state=open_after,
        outputs=outputs,
        ledger=state.ledger.to_json(),
        pending_buffers=len(state.pending),
        pending_tuples=sum(b.tuples for b in state.pending.values()),
        schemas=table_schemas(ctx.config, ctx.schema, ctx.layout, previous.schemas if previous else None),
    )
    fault("during_commit", batch)
    ctx.store.commit(record)
    for buf in batch_in.buffers:
        state.known[buf.identity] = buf
        state.known_copies.add((buf.file, buf.row_start))
    state.discarded.extend(batch_in.discarded)
    state.known_copies |= {(c.file, c.row_start) for c in batch_in.discarded}
    state.commit = record
    return record, progress


def _feed(state: State, batch_in: Batch) -> tuple[list[Decision], ProgressSnapshot, bool]:
    """Feed the batch to the engine: its decisions, its snapshot after, and whether an effective
    watermark moved."""
    engine = state.engine
    engine.join({k: sorted(v) for k, v in batch_in.join.items()})
    before = tuple(k.effective_watermark for k in engine.snapshot().keys)
    for buf in batch_in.buffers:
        state.pending[buf.identity] = buf
    decisions: list[Decision] = engine.feed(batch_in.buffers)
    if batch_in.finish:
        decisions += engine.finish()
    snapshot = engine.snapshot()
    return decisions, snapshot, tuple(k.effective_watermark for k in snapshot.keys) != before


def _count_reads(ledger: Ledger, batch_in: Batch) -> None:
    """Every copy read enters the ledger: the kept ones, and the discarded ones as discarded."""
    for buf in batch_in.buffers:
        ledger.tuples_read += buf.tuples
        ledger.read_xor ^= buffer_copy_id(buf)
    for copy in batch_in.discarded:
        cid = copy_id(copy.origin, copy.sequence, copy.chunk, copy.file, copy.row_start)
        ledger.tuples_read += copy.tuples
        ledger.read_xor ^= cid
        ledger.discarded_xor ^= cid
        ledger.discarded_tuples += copy.tuples
        ledger.discarded_copies += 1


def _relevant_reads(ctx: RunContext, state: State, decisions: Sequence[Decision]) -> list[tuple[Buffer, Decision]]:
    """The decided buffers whose tuples the batch reads; a backfill range skips the others
    (counted as processed, outside the range)."""
    start, end = ctx.range
    reads: list[tuple[Buffer, Decision]] = []
    for d in decisions:
        buf = state.pending.pop((d.origin, d.sequence, d.chunk))
        if relevant(buf, start, end):
            reads.append((buf, d))
        else:
            state.ledger.outside_skipped += buf.tuples
            state.ledger.processed_xor ^= buffer_copy_id(buf)
    return reads


def _tuple_work(
    ctx: RunContext,
    state: State,
    batch_in: Batch,
    reads: list[tuple[Buffer, Decision]],
    snapshot: ProgressSnapshot,
    moved: bool,
    prefix: str,
    stem: str,
    spark: SparkSession,
) -> tuple[WorkResult | None, dict[str, str | None]]:
    """The batch's Spark work (``None``: none needed) and the open-window state it leaves (paths
    under the checkpoint)."""
    store = ctx.store
    open_before = dict(state.commit.open_state) if state.commit else {}
    if not any(buf.tuples for buf, _ in reads) and not moved:
        # Nothing to aggregate (no reads, or punctuation only) and no watermark moved: no window
        # can change, so no Spark work; the buffers still count as processed.
        for buf, _ in reads:
            state.ledger.processed_xor ^= buffer_copy_id(buf)
        return None, open_before
    work = BatchWork(
        reads=reads,
        effective=tuple(k.effective_watermark for k in snapshot.keys),
        open_state={name: str(store.root / d) if d else None for name, d in open_before.items()},
        windows_dir=str(ctx.output / "data" / "windows" / prefix),
        late_dir=str(ctx.output / "data" / "late" / prefix),
        state_dirs={s.name: str(store.root / f"{stem}-open-{s.name}") for s in ctx.config.windows},
        range=ctx.range,
        checked=other_copies([*state.discarded, *batch_in.discarded]),
    )
    result = run_batch(
        spark, config=ctx.config, layout=ctx.layout, schema=ctx.schema, spark_paths=state.spark_paths, work=work
    )
    open_after = {
        name: (str(Path(c.open_dir).relative_to(store.root)) if c.open_dir else None)
        for name, c in result.specs.items()
    }
    return result, open_after


def _stage(
    ctx: RunContext,
    state: State,
    batch_in: Batch,
    batch: int,
    snapshot: ProgressSnapshot,
    progress: dict[str, Any],
    consumed: dict[str, list[int]],
    prefix: str,
    stem: str,
) -> tuple[str | None, str | None]:
    """Write the batch's files; returns the discarded-copy and consumed-file lists its commit
    points at (the previous commit's when they did not change)."""
    store, nkeys, previous = ctx.store, len(ctx.layout.keys), state.commit
    write_parquet(progress_table(batch, snapshot), ctx.output / "data" / "progress" / f"{prefix}.parquet")
    _state.write_buffers(store.root / f"{stem}-buffers.parquet", batch_in.buffers, nkeys)
    discarded_rel = previous.discarded if previous else None
    if batch_in.discarded:
        discarded_rel = f"{stem}-discarded.parquet"
        _state.write_discarded(store.root / discarded_rel, [*state.discarded, *batch_in.discarded])
    consumed_rel = previous.consumed if previous else None
    if batch_in.finish:
        consumed.update({f: file_stamp(f) for f in ctx.run_files})
        consumed_rel = f"{stem}-files.parquet"
        _state.write_consumed(store.root / consumed_rel, consumed)
    engine_values, held = state.engine.export_state()
    held_files = {b.file for b in held}
    store.write_snapshot(
        f"{stem}-engine.json",
        EngineSnapshot(
            engine=engine_values,
            undecided=tuple(sorted(state.pending)),
            progress=progress,
            spark_paths={f: p for f, p in state.spark_paths.items() if f in held_files},
        ),
    )
    _state.write_buffers(store.root / f"{stem}-held.parquet", held, nkeys)
    return discarded_rel, consumed_rel
