"""One micro-batch of ``replay run`` checked and committed (docs/outputs.md#exactly-once): the
ledger counts every copy it read and checks what Spark saw of it; its files are written (each
fsynced): progress rows, buffer records, the copies it read with their decisions, the engine
snapshot and the buffers it holds, the discarded and consumed lists when they change; it is
appended to the batch log and committed (``replay.store.checkpoint``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from replay.engine.passes import WorkResult, buffer_copy_id, copy_id
from replay.engine.schemas import table_schemas
from replay.runner.context import Planned, RunContext, fault
from replay.runner.ledger import Ledger, account, check_ledger, ledger_row
from replay.runner.plan import CHANGED, unchanged
from replay.runner.resume import State
from replay.store import state as _state
from replay.store.durable import write_parquet_atomic
from replay.store.outputs import encode_schema
from replay.store.records import Commit, EngineSnapshot, LogEntry, LogPointer
from replay.store.tables import progress_table, snapshot_json

__all__ = ["commit_batch"]


def commit_batch(
    ctx: RunContext,
    state: State,
    step: Planned,
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
        archive_schema=encode_schema(ctx.layout.schema),
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


def _count_reads(ledger: Ledger, step: Planned) -> None:
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


def _stage(
    ctx: RunContext,
    state: State,
    step: Planned,
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
    write_parquet_atomic(progress_table(step.batch, step.snapshot), progress_file)
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
        # The stamps taken before the scan, of the files that still have them: a file rewritten
        # since (the archiver added buffers) is not consumed, so the next run scans it again.
        kept, ctx.changed[:] = unchanged(ctx.stamps)
        consumed.update(kept)
        # It stays listed (the run's output version read it) with a stamp no file has.
        consumed.update({f: list(CHANGED) for f in ctx.changed})
        consumed_rel = f"{stem}-files.parquet"
        _state.write_consumed(store.root / consumed_rel, consumed)
    _state.write_buffers(store.root / f"{stem}-held.parquet", step.held, nkeys)
    held_files = {b.file for b in step.held}
    # Written last: its rename's fsync of ``state/`` makes the state files' names above durable too.
    store.write_snapshot(
        f"{stem}-engine.json",
        EngineSnapshot(
            engine=step.engine,
            undecided=tuple(sorted(step.pending)),
            progress=progress,
            spark_paths={f: p for f, p in state.spark_paths.items() if f in held_files},
        ),
    )
    return discarded_rel, consumed_rel
