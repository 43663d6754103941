"""A pass of ``replay run``: its micro-batches fed to the engine, their tuples aggregated in one
Spark action, each then committed (docs/outputs.md#passes).

A **pass** is one or more consecutive micro-batches of a run whose tuple work one Spark action
does; each batch is still checked and committed on its own. The steps:

1. ``_plan``, per batch: the batch's buffers go to the progress engine, which decides some of
   them (their thresholds per key) and moves the watermarks; what each batch then needs for its
   commit (the engine's state, the pending buffers, ``replay.runner.context.Planned``) is kept,
   with the watermark its windows are emitted by (``replay.runner.hold``);
2. ``_tuple_work``, once per pass: the decided buffers' tuples of all its batches are
   aggregated in Spark (``replay.engine.aggregate.run_pass``), or not at all when nothing can
   change; windows go to the batch at which they became due, late rows to the batch that
   decided them;
3. per batch in order, ``replay.runner.commit.commit_batch``: the ledger's check, the batch's
   files and its commit.

Bad input met while a batch is fed (a watermark regression under ``fail``) stops the run at that
batch: the pass's batches before it are aggregated and committed first, the failing one is not.
So does a file the pass's Spark action cannot read (damaged pages behind an intact footer): the
batches before the first that reads it are aggregated again without it and committed.

A commit inside a pass names the open windows the pass started from plus the copies its batches
read up to it (``Commit.carry``): resuming there, the next pass reads those copies' tuples again
into the open windows, dropping windows the committed batches already emitted.
"""

from __future__ import annotations

import functools
import operator
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replay.core.buffer import Buffer
from replay.core.errors import ArchiveReadError, DataError
from replay.core.progress import Decision
from replay.engine.aggregate import run_pass
from replay.engine.buffers import release_arrow_memory
from replay.engine.passes import PassWork, Read, Reads, Step, WorkResult, buffer_copy_id, copy_ids
from replay.runner.commit import commit_batch
from replay.runner.context import Batch, Planned, RunContext, fault
from replay.runner.dedup import other_copies
from replay.runner.plan import relevant
from replay.runner.resume import State
from replay.store.records import Commit

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["process"]


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
    planned: list[Planned] = []
    failed: DataError | None = None
    for index, batch_in in enumerate(batches):
        try:
            step = _plan(ctx, state, batch_in, first + index)
        except DataError as error:  # bad input in this batch (a regression): the batches before it still commit
            if not planned:
                raise
            failed = error
            break
        planned.append(step)
    # The pass's reads in one set of arrays, each batch's a view of them: the driver holds them once.
    pass_reads = _share_reads(planned, len(ctx.layout.keys))
    open_before = dict(state.commit.open_state) if state.commit else {}
    try:
        results, open_after = _tuple_work(ctx, state, planned, pass_reads, floor, open_before, spark)
    except ArchiveReadError as error:  # a file Spark's tasks could not read (damaged pages)
        keep = _before_reading(planned, error.file)
        if not keep:
            raise
        # The batches before the first that reads the file are aggregated and committed, as before
        # a regression; a file they need too (an open window's copies) fails their pass the same way.
        failed, planned = error, planned[:keep]
        pass_reads = _share_reads(planned, len(ctx.layout.keys))
        results, open_after = _tuple_work(ctx, state, planned, pass_reads, floor, open_before, spark)
    committed: list[tuple[Commit, dict[str, Any]]] = []
    carry = list(state.commit.carry) if state.commit else []
    for step in planned:
        fault("before_batch", step.batch)
        last = step is planned[-1]
        if results is not None and step.reads and not last:
            carry.append(step.reads_file)
        open_state, commit_carry = (open_after, ()) if last and results is not None else (open_before, tuple(carry))
        result = None if results is None else results[step.batch]
        committed.append(commit_batch(ctx, state, step, result, open_state, commit_carry, consumed))
    if results is not None:
        state.carry_reads = []  # the pass's open windows hold them now
    release_arrow_memory()  # the decision table and the files written: none of it is kept
    if failed is not None:  # the engine, fed part of the failing batch, is not used again
        raise failed
    return committed


def _moved(planned: Sequence[Planned], floor: tuple[int, ...]) -> bool:
    """Whether a batch of ``planned`` moved its emission watermark (from ``floor``, then from the
    batch before): windows may have become due."""
    before = [floor, *(step.emission for step in planned[:-1])]
    return any(step.emission != then for step, then in zip(planned, before, strict=True))


def _share_reads(planned: list[Planned], nkeys: int) -> Reads:
    """The reads of ``planned`` in one set of arrays, each step's ``reads`` made a view of them."""
    pass_reads = Reads.concat([step.reads for step in planned], nkeys)
    at = 0
    for index, step in enumerate(planned):
        planned[index] = replace(step, reads=pass_reads[at : at + len(step.reads)])
        at += len(step.reads)
    return pass_reads


def _before_reading(planned: Sequence[Planned], file: str | None) -> int:
    """How many of ``planned`` come before the first that reads ``file``'s tuples."""
    for index, step in enumerate(planned):
        packed = step.reads.buffers
        if file in {packed.files[i] for i in set(packed.file_of.tolist())}:
            return index
    return 0  # not read by the pass's batches (an open window's copy): nothing to keep


def _plan(ctx: RunContext, state: State, batch_in: Batch, batch: int) -> Planned:
    """Feed one batch to the engine; returns what its commit needs."""
    engine = state.engine
    engine.join({k: sorted(v) for k, v in batch_in.join.items()})
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
    step = Planned(
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
    return step


def _tuple_work(
    ctx: RunContext,
    state: State,
    planned: Sequence[Planned],
    pass_reads: Reads,
    floor: tuple[int, ...],
    open_before: dict[str, str | None],
    spark: SparkSession,
) -> tuple[dict[int, WorkResult] | None, dict[str, str | None]]:
    """The pass's Spark work, per batch (``None``: none needed), and the open-window state the
    pass leaves (paths under the checkpoint)."""
    store = ctx.store
    if not pass_reads.column("tuples").any() and not _moved(planned, floor):
        # Nothing to aggregate (no reads, or punctuation only) and no batch's emission watermark
        # moved (``E_k``, or its hold): no window can change, so no Spark work.
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
