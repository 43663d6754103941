"""The reference model of docs/archive.md (duplicates) and docs/semantics.md, naive and pure Python.

It plays the role PySpark's ``TwsTester`` plays for stateful streaming: an
independent, obviously-correct model the engine (``replay.core.progress`` and the
Spark job) is compared with on generated archives. It follows
``docs/semantics.md`` and ``docs/archive.md`` rule by rule.

Clarity over speed: the archive (a few thousand rows at most) is read into
Python objects (``replay.reference.archive``), one run covers the whole archive (no
micro-batches, no checkpoint; an incremental replay is told which files each earlier run
read, and those runs only end where they ended: skip closes gaps and ``G_k`` steps there),
and each origin's progress is recomputed from scratch
from its buffers whenever it is needed (``replay.reference.progress``). Here the
thresholds are applied to the tuples, the windows built (``replay.reference.windows``)
and everything gathered into a ``replay.reference.results.ReferenceResult``. Time is
integer microseconds, ``NEG_INF`` means "no watermark yet", intervals are half-open.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from replay.core.config import JobConfig
from replay.core.timeutil import NEG_INF, minus
from replay.reference.archive import Buffer, LoadedArchive, Row, load_archive, run_finder
from replay.reference.progress import Threshold, is_complete, run_progress
from replay.reference.results import KeyProgress, LateRow, OriginKeyProgress, ReferenceResult
from replay.reference.windows import build_windows

__all__ = ["run_reference"]


def _decide(
    loaded: LoadedArchive, thresholds: Mapping[tuple[int, int, int, str], Threshold | None]
) -> tuple[list[LateRow], dict[str, list[Row]], int]:
    """Section 3: (late rows, on-time tuples per key, pending tuples) of the kept buffers."""
    late: list[LateRow] = []
    on_time: dict[str, list[Row]] = {k: [] for k in loaded.keys}
    pending = 0
    for b in loaded.buffers:
        if any(thresholds[(*b.identity, k)] is None for k in loaded.keys):
            pending += len(b.tuples)
        for k, key in loaded.keys.items():
            decision = thresholds[(*b.identity, k)]
            if decision is None:
                continue
            threshold, reason = decision
            for r in b.tuples:
                t = r.get(key.event_time)
                if t is None:
                    continue  # no event time for this key: no part in it
                if t < threshold:  # type: ignore[operator]
                    late.append(
                        LateRow(
                            wm_key=k,
                            origin_id=b.origin,
                            sequence_number=b.sequence,
                            chunk_number=b.chunk,
                            row=tuple(r.get(c) for c in loaded.payload_columns),
                            violated_watermark=threshold,
                            reason=reason,
                        )
                    )
                else:
                    on_time[k].append(r)
    return late, on_time, pending


def _late_order(row: LateRow) -> tuple[object, ...]:
    """Sort key of late rows: key, buffer identity, then the row's values (nulls first)."""
    values = tuple((0,) if v is None else (1, v) for v in row.row)
    return (row.wm_key, row.origin_id, row.sequence_number, row.chunk_number, values)


def run_reference(
    archive: str | Path,
    config: JobConfig,
    *,
    lateness: str | None = None,
    earlier: Sequence[Collection[str | Path]] = (),
) -> ReferenceResult:
    """Replay a local Parquet archive through the reference model, in one run (or after ``earlier`` runs).

    Reads every ``*.parquet`` file under ``archive`` (recursively, sorted by path),
    deduplicates buffers, computes progress per origin and key, decides lateness
    (``lateness`` overrides ``config.lateness``), applies ``gap_policy: skip`` at the
    end of the run, and aggregates the windows. Times are int microseconds.

    ``earlier``: the files each earlier run of an incremental replay found (every file it
    read, in run order); a buffer belongs to the first run whose files hold it, the last run
    finds the rest (``replay.reference.progress.run_progress``).

    Raises:
        ConfigError: a watermark column named in the job is absent from the archive
            (``config.unknown_column``), or ``arrival`` lateness without ``ingest_ts``.
        ConflictingDuplicateError: two copies of a buffer differ, under ``on_conflict: fail``.
        WatermarkRegressionError: a sequence watermark below its predecessor's, under
            ``watermark_regression: fail``.
        EmptyArchiveError: no Parquet file under ``archive``.
    """
    loaded = load_archive(archive, config, lateness=lateness, earlier=earlier)
    keys = loaded.keys
    run_of_file = run_finder(earlier)
    run_of = {b.identity: run_of_file(b.file) for b in loaded.buffers}
    run = run_progress(loaded, config, run_of)
    loaded = dataclasses.replace(loaded, buffers=run.buffers)  # without the after_skip buffers
    late, on_time, pending_tuples = _decide(loaded, run.thresholds)
    effective = {k: minus(run.global_watermarks[k], key.allowed_lateness) for k, key in keys.items()}
    windows, open_windows = build_windows(
        config.windows,
        on_time=on_time,
        event_time_column={k: key.event_time for k, key in keys.items()},
        effective_watermark=effective,
        columns=config.columns,
    )

    by_origin: dict[int, list[Buffer]] = defaultdict(list)
    for b in loaded.buffers:
        by_origin[b.origin].append(b)
    gaps: set[tuple[int, int]] = set()
    incomplete: set[tuple[int, int]] = set()
    for o, its in by_origin.items():
        sequences = {b.sequence for b in its}
        gaps |= {(o, s) for s in range(1, max(sequences)) if s not in sequences}
        incomplete |= {
            (o, s) for s in sequences if not is_complete([b for b in its if b.sequence == s], config.chunk_base)
        }

    progress = {}
    for k in keys:
        for o in sorted(run.participants[k]):
            state = run.states.get(o)
            prefix = state.prefix if state else 0
            progress[(o, k)] = OriginKeyProgress(
                origin=o,
                key=k,
                complete_prefix=prefix,
                local_watermark=state.local(k) if state else NEG_INF,
                pending_buffers=sum(1 for b in by_origin.get(o, []) if b.sequence > prefix),
            )

    return ReferenceResult(
        lateness=loaded.lateness,
        progress=progress,
        keys={
            k: KeyProgress(
                key=k,
                global_watermark=run.global_watermarks[k],
                effective_watermark=effective[k],
                time_window=run.time_windows[k],
            )
            for k in keys
        },
        stream_cut={o: max((b.sequence, b.chunk) for b in its) for o, its in sorted(by_origin.items())},
        gaps=frozenset(gaps),
        incomplete=frozenset(incomplete),
        skipped=frozenset((o, s) for o, state in run.states.items() for s in state.closed),
        duplicate_copies=loaded.duplicate_copies,
        duplicate_tuples=loaded.duplicate_tuples,
        conflicts=loaded.conflicts,
        regressions=frozenset((o, s, k) for o, state in run.states.items() for s, k in state.regressions),
        thresholds=run.thresholds,
        late=tuple(sorted(late, key=_late_order)),
        late_columns=loaded.payload_columns,
        windows=windows,
        open_windows=open_windows,
        pending_tuples=pending_tuples,
        tuples_read=loaded.tuples_read,
        after_skip=frozenset(b.identity for b in run.after_skip),
    )
