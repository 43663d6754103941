"""Micro-batches of ``replay run``, from feeding the engine to the commit (docs/outputs.md#passes).

A **pass** is one or more consecutive micro-batches of a run whose tuple work one Spark action
does; each batch is still checked and committed on its own. The steps, each a function below:

1. ``_plan``, per batch: the batch's buffers go to the progress engine, which decides some of
   them (their thresholds per key) and moves the watermarks; what each batch then needs for its
   commit (the engine's state, the pending buffers) is kept;
2. ``_tuple_work``, once per pass: the decided buffers' tuples of all its batches are
   aggregated in Spark (``replay.engine.aggregate.run_pass``), or not at all when nothing can
   change; windows go to the batch at which they became due, late rows to the batch that
   decided them;
3. ``_commit``, per batch in order: the ledger counts every copy read and checks what Spark saw
   of the batch; the batch's files are written (each fsynced): progress rows, buffer records,
   the copies it read with their decisions, the engine snapshot and the buffers it holds, the
   discarded and consumed lists when they change; the batch is appended to the batch log and
   committed (``replay.store.checkpoint``).

A commit inside a pass names the open windows the pass started from plus the copies its batches
read up to it (``Commit.carry``): resuming there, the next pass reads those copies' tuples again
into the open windows, dropping windows the committed batches already emitted.
"""

from __future__ import annotations

import functools
import operator
import os
import signal
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replay.core.buffer import Buffer, PackedBuffers
from replay.core.config import JobConfig
from replay.core.progress import Decision, ProgressSnapshot
from replay.engine.aggregate import run_pass
from replay.engine.archive import ArchiveLayout
from replay.engine.buffers import release_arrow_memory
from replay.engine.passes import PassWork, Read, Reads, Step, WorkResult, buffer_copy_id, copy_id, copy_ids
from replay.engine.schemas import table_schemas
from replay.runner.dedup import other_copies
from replay.runner.hold import EmissionHold
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
    """Test hook: ``REPLAY_FAULT=<point>:<batch>`` kills this process with SIGKILL at that point.

    The points, in the order a run reaches them (``batch`` is the run's first batch for the
    first two, else the batch named):

    - ``before_intent``: the run's batch cuts are planned, its intent not yet written;
    - ``after_intent``: the intent is durable, no batch has started;
    - ``before_batch``: the pass's Spark work is done (its files staged), batch ``N - 1`` is
      committed and ``N`` not yet checked by the ledger;
    - ``after_staging``: batch ``N``'s state and progress files are written, its log line and
      commit not;
    - ``during_commit``: the batch-log line is appended, the commit record not yet written.

    ``tests/runner/test_job_crash.py`` kills a run at each of them and checks that the resumed
    run's digests equal an uninterrupted run's.
    """
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
    hold: EmissionHold | None = None  # origin mode, some origin outside G_k: windows held for its tuples


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    """One cut of the run: its buffers (in feed order), the origins that join the engine with it,
    the copies it discards, and whether it ends the run (the engine then decides what it holds);
    ``index``: its place among the batches the run has left (``EmissionHold``)."""

    index: int
    buffers: PackedBuffers
    join: Mapping[str, set[int]]
    discarded: Sequence[_state.Discarded]
    finish: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class _Planned:
    """One batch of a pass after the engine was fed: what its commit needs."""

    batch: int
    token: str
    input: Batch
    snapshot: ProgressSnapshot
    emission: tuple[int, ...]  # per key, windows ending by it are due (``E_k``, or less under a hold)
    reads: Reads  # decided copies whose tuples the batch reads, packed until the pass has read them
    skipped: list[Buffer]  # decided copies a backfill range does not need
    engine: dict[str, Any]  # the engine's state after the batch, and the buffers it holds
    held: list[Buffer]
    pending: dict[tuple[int, int, int], Buffer]  # undecided after the batch
    input_xor: int  # the XOR of the ``buffer_copy_id`` of the batch's input buffers (the ledger's read side)

    @property
    def prefix(self) -> str:
        return f"b{self.batch:08d}-{self.token}"

    @property
    def reads_file(self) -> str:
        """The state file of the copies it read with their decisions (a commit's ``carry``)."""
        return f"state/{self.prefix}-reads.parquet"


def process(
    ctx: RunContext, state: State, batches: Sequence[Batch], consumed: dict[str, list[int]], spark: SparkSession
) -> list[tuple[Commit, dict[str, Any]]]:
    """Process one pass of consecutive batches in one Spark action and commit each batch in
    order; returns each commit with its progress report. ``state`` and ``consumed`` (updated when
    a batch ends the run) are carried to the next pass."""
    previous = state.commit
    first = (previous.batch + 1) if previous else 1
    # Windows ending by the floor were emitted by the commit the pass continues from.
    floor = tuple(k.effective_watermark for k in state.engine.snapshot().keys)
    if ctx.hold is not None:
        floor = tuple(map(min, floor, ctx.hold.before(state.engine, batches[0].index, state.pending)))
    planned: list[_Planned] = []
    moved = False
    emitted = floor
    for index, batch_in in enumerate(batches):
        step, step_moved = _plan(ctx, state, batch_in, first + index)
        planned.append(step)
        moved = moved or step_moved or step.emission != emitted
        emitted = step.emission
    # The pass's reads in one set of arrays, each batch's a view of them: the driver holds them once.
    pass_reads = Reads.concat([step.reads for step in planned], len(ctx.layout.keys))
    at = 0
    for index, step in enumerate(planned):
        planned[index] = replace(step, reads=pass_reads[at : at + len(step.reads)])
        at += len(step.reads)
    open_before = dict(state.commit.open_state) if state.commit else {}
    results, open_after = _tuple_work(ctx, state, planned, pass_reads, moved, floor, open_before, spark)
    committed: list[tuple[Commit, dict[str, Any]]] = []
    carry = list(state.commit.carry) if state.commit else []
    for step in planned:
        fault("before_batch", step.batch)
        last = step is planned[-1]
        if results is not None and step.reads and not last:
            carry.append(step.reads_file)
        open_state, commit_carry = (open_after, ()) if last and results is not None else (open_before, tuple(carry))
        result = None if results is None else results[step.batch]
        committed.append(_commit(ctx, state, step, result, open_state, commit_carry, consumed))
    if results is not None:
        state.carry_reads = []  # the pass's open windows hold them now
    release_arrow_memory()  # the decision table and the files written: none of it is kept
    return committed


def _plan(ctx: RunContext, state: State, batch_in: Batch, batch: int) -> tuple[_Planned, bool]:
    """Feed one batch to the engine; returns what its commit needs and whether an effective
    watermark moved."""
    engine = state.engine
    engine.join({k: sorted(v) for k, v in batch_in.join.items()})
    before = tuple(k.effective_watermark for k in engine.snapshot().keys)
    packed = batch_in.buffers
    buffers = list(packed)  # objects for this batch only (a run keeps them packed)
    identities = packed.identities()
    ids = copy_ids(packed)
    state.pending.update(zip(identities, buffers, strict=True))
    input_ids = dict(zip(identities, ids, strict=True))  # each input copy's id, computed once
    input_xor = functools.reduce(operator.xor, ids, 0)
    del identities, ids
    decisions: list[Decision] = engine.feed(buffers)
    del buffers
    if batch_in.finish:
        decisions += engine.finish()
    snapshot = engine.snapshot()
    emission = tuple(k.effective_watermark for k in snapshot.keys)
    start, end = ctx.range
    reads: list[Read] = []
    read_ids: list[int] = []
    skipped: list[Buffer] = []
    for d in decisions:
        identity = (d.origin, d.sequence, d.chunk)
        buf = state.pending.pop(identity)
        if relevant(buf, start, end):
            reads.append(Read(buf=buf, thresholds=d.thresholds, reasons=d.reasons, batch=batch))
            # a copy fed by an earlier batch and decided now: its id is not among this input's
            read_ids.append(input_ids[identity] if identity in input_ids else buffer_copy_id(buf))
        else:
            skipped.append(buf)
    if ctx.hold is not None:
        emission = tuple(
            map(min, emission, ctx.hold.after(engine, batch_in.index, state.pending, last=batch_in.finish))
        )
    values, held = engine.export_state()
    step = _Planned(
        batch=batch,
        token=uuid.uuid4().hex[:8],
        input=batch_in,
        snapshot=snapshot,
        emission=emission,
        reads=Reads.of(reads, len(ctx.layout.keys), read_ids),
        skipped=skipped,
        engine=values,
        held=held,
        pending=dict(state.pending),
        input_xor=input_xor,
    )
    return step, tuple(k.effective_watermark for k in snapshot.keys) != before


def _count_reads(ledger: Ledger, step: _Planned) -> None:
    """Every copy read enters the ledger: the kept ones, and the discarded ones as discarded; a
    copy a backfill range did not need counts as processed, outside the range."""
    ledger.tuples_read += int(step.input.buffers.column("tuples").sum())
    ledger.read_xor ^= step.input_xor
    for copy in step.input.discarded:
        cid = copy_id(copy.origin, copy.sequence, copy.chunk, copy.file, copy.row_start)
        ledger.tuples_read += copy.tuples
        ledger.read_xor ^= cid
        ledger.discarded_xor ^= cid
        ledger.discarded_tuples += copy.tuples
        ledger.discarded_copies += 1
    for buf in step.skipped:
        ledger.outside_skipped += buf.tuples
        ledger.processed_xor ^= buffer_copy_id(buf)


def _tuple_work(
    ctx: RunContext,
    state: State,
    planned: Sequence[_Planned],
    pass_reads: Reads,
    moved: bool,
    floor: tuple[int, ...],
    open_before: dict[str, str | None],
    spark: SparkSession,
) -> tuple[dict[int, WorkResult] | None, dict[str, str | None]]:
    """The pass's Spark work, per batch (``None``: none needed), and the open-window state the
    pass leaves (paths under the checkpoint)."""
    store = ctx.store
    if not pass_reads.column("tuples").any() and not moved:
        # Nothing to aggregate (no reads, or punctuation only) and no watermark moved: no window
        # can change, so no Spark work.
        return None, open_before
    last = planned[-1]
    nkeys = len(ctx.layout.keys)
    carried = Reads.of(
        [Read(buf=buf, thresholds=thr, reasons=why, batch=0) for buf, thr, why in state.carry_reads], nkeys
    )
    reads = Reads.concat([carried, pass_reads], nkeys)
    work = PassWork(
        reads=reads,
        steps=[
            Step(
                batch=step.batch,
                effective=step.emission,
                windows_dir=str(ctx.output / "data" / "windows" / f"{ctx.cid}-{step.prefix}"),
                late_dir=str(ctx.output / "data" / "late" / f"{ctx.cid}-{step.prefix}"),
            )
            for step in planned
        ],
        floor=floor,
        open_state={name: str(store.root / d) if d else None for name, d in open_before.items()},
        state_dirs={s.name: str(store.root / "state" / f"{last.prefix}-open-{s.name}") for s in ctx.config.windows},
        counts_dir=str(store.root / "state" / f"{last.prefix}-counts"),
        range=ctx.range,
        checked=other_copies(state.discarded + [c for step in planned for c in step.input.discarded]),
    )
    results = run_pass(
        spark, config=ctx.config, layout=ctx.layout, schema=ctx.schema, spark_paths=state.spark_paths, work=work
    )
    open_after = {
        name: (str(Path(c.open_dir).relative_to(store.root)) if c.open_dir else None)
        for name, c in results[last.batch].specs.items()
    }
    return results, open_after


def _commit(
    ctx: RunContext,
    state: State,
    step: _Planned,
    result: WorkResult | None,
    open_state: Mapping[str, str | None],
    carry: tuple[str, ...],
    consumed: dict[str, list[int]],
) -> tuple[Commit, dict[str, Any]]:
    """Check one batch's ledger, stage its files and commit it."""
    previous = state.commit
    batch, prefix = step.batch, step.prefix
    key_index = {k.name: i for i, k in enumerate(ctx.layout.keys)}
    _count_reads(state.ledger, step)
    if result is None:
        for cid in step.reads.copy_ids.tolist():
            state.ledger.processed_xor ^= cid
    else:
        account(state.ledger, step.reads, result, ctx.config, key_index, len(ctx.layout.keys), batch)
    check_ledger(state.ledger, step.pending, ctx.config, key_index, batch)

    worked = result or WorkResult()
    outputs = {
        "windows": f"data/windows/{ctx.cid}-{prefix}" if worked.windows_written else None,
        "late": f"data/late/{ctx.cid}-{prefix}" if worked.late_written else None,
        "progress": f"data/progress/{ctx.cid}-{prefix}.parquet",
    }
    progress = snapshot_json(step.snapshot)
    discarded_rel, consumed_rel = _stage(ctx, state, step, step.reads_file in carry, progress, consumed)
    fault("after_staging", batch)
    stem = f"state/{prefix}"
    log = ctx.store.append_log(
        LogEntry(
            batch=batch,
            run=ctx.run,
            token=step.token,
            finish=step.input.finish,
            join={k: tuple(sorted(v)) for k, v in step.input.join.items()},
            buffers=f"{stem}-buffers.parquet",
            outputs=outputs,
            ledger=ledger_row(state.ledger, step.pending, ctx.config, key_index),
        ),
        previous.log if previous else LogPointer(),
    )
    record = Commit(
        batch=batch,
        run=ctx.run,
        token=step.token,
        finish=step.input.finish,
        lateness=ctx.mode,
        range=ctx.range,
        log=log,
        consumed=consumed_rel,
        discarded=discarded_rel,
        engine=f"{stem}-engine.json",
        held=f"{stem}-held.parquet",
        open_state=dict(open_state),
        outputs=outputs,
        ledger=state.ledger.to_json(),
        pending_buffers=len(step.pending),
        pending_tuples=sum(b.tuples for b in step.pending.values()),
        schemas=table_schemas(ctx.config, ctx.schema, ctx.layout, previous.schemas if previous else None),
        carry=carry,
    )
    fault("during_commit", batch)
    ctx.store.commit(record)
    # The batch's buffers and copies join the history in the batch log, not in ``known``: only the
    # deduplication at a run's start reads the history, and keeping every buffer fed would grow
    # the driver's memory with the run (``State.load_history`` reads them back when needed).
    state.history_loaded = False
    state.discarded.extend(step.input.discarded)
    state.commit = record
    return record, progress


def _stage(
    ctx: RunContext,
    state: State,
    step: _Planned,
    carried: bool,
    progress: dict[str, Any],
    consumed: dict[str, list[int]],
) -> tuple[str | None, str | None]:
    """Write the batch's files (``carried``: also the copies it read, which its commit carries);
    returns the discarded-copy and consumed-file lists its commit points at (the previous
    commit's when they did not change)."""
    store, nkeys, previous = ctx.store, len(ctx.layout.keys), state.commit
    stem = f"state/{step.prefix}"
    progress_file = ctx.output / "data" / "progress" / f"{ctx.cid}-{step.prefix}.parquet"
    write_parquet(progress_table(step.batch, step.snapshot), progress_file)
    _state.write_buffers(store.root / f"{stem}-buffers.parquet", step.input.buffers, nkeys)
    if carried:
        reads = step.reads
        _state.write_reads(store.root / step.reads_file, reads.buffers, reads.thresholds, reads.reasons, nkeys)
    discarded_rel = previous.discarded if previous else None
    if step.input.discarded:
        discarded_rel = f"{stem}-discarded.parquet"
        _state.write_discarded(store.root / discarded_rel, [*state.discarded, *step.input.discarded])
    consumed_rel = previous.consumed if previous else None
    if step.input.finish:
        consumed.update({f: file_stamp(f) for f in ctx.run_files})
        consumed_rel = f"{stem}-files.parquet"
        _state.write_consumed(store.root / consumed_rel, consumed)
    held_files = {b.file for b in step.held}
    store.write_snapshot(
        f"{stem}-engine.json",
        EngineSnapshot(
            engine=step.engine,
            undecided=tuple(sorted(step.pending)),
            progress=progress,
            spark_paths={f: p for f, p in state.spark_paths.items() if f in held_files},
        ),
    )
    _state.write_buffers(store.root / f"{stem}-held.parquet", step.held, nkeys)
    return discarded_rel, consumed_rel
