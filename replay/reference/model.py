"""The reference model of docs/archive.md (duplicates) and docs/semantics.md, naive and pure Python.

It plays the role PySpark's ``TwsTester`` plays for stateful streaming: an
independent, obviously-correct model the engine (``replay.core.progress`` and the
Spark job) is compared with on generated archives. It follows
``docs/semantics.md`` and ``docs/archive.md`` rule by rule.

Clarity over speed: the archive (a few thousand rows at most) is read into
Python objects, one run covers the whole archive (no micro-batches, no
checkpoint), and each origin's progress is recomputed from scratch from its
buffers whenever it is needed. Time is integer microseconds, ``NEG_INF`` means
"no watermark yet", intervals are half-open.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from replay.core.config import JobConfig
from replay.core.errors import Location, WatermarkRegressionError
from replay.core.timeutil import NEG_INF, format_ts, minus
from replay.core.vocabulary import Lateness, LateReason
from replay.reference.archive import Buffer, LoadedArchive, ResolvedKey, Row, load_archive
from replay.reference.windows import WindowRow, build_windows

__all__ = [
    "BEHIND_GLOBAL_WATERMARK",
    "BEHIND_ORIGIN_WATERMARK",
    "KeyProgress",
    "LateRow",
    "OriginKeyProgress",
    "ReferenceResult",
    "WindowRow",
    "run_reference",
]

BEHIND_ORIGIN_WATERMARK = LateReason.BEHIND_ORIGIN
BEHIND_GLOBAL_WATERMARK = LateReason.BEHIND_GLOBAL

Threshold = tuple[int, str]  # (threshold in microseconds, reason)

# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True, kw_only=True)
class OriginKeyProgress:
    """Progress of one origin for one watermark key at the end of the run.

    ``local_watermark`` is ``NEG_INF`` while the complete prefix is 0;
    ``pending_buffers`` counts distinct buffers with a sequence beyond the prefix.
    """

    origin: int
    key: str
    complete_prefix: int
    local_watermark: int
    pending_buffers: int


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyProgress:
    """One watermark key at the end of the run: ``G_k``, ``E_k`` and the reader time window.

    ``time_window`` is ``(lower, upper)``, both inclusive; ``None`` when no origin counts.
    """

    key: str
    global_watermark: int
    effective_watermark: int
    time_window: tuple[int, int] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LateRow:
    """One late tuple for one key; ``row`` holds its non-metadata columns in archive column order."""

    wm_key: str
    origin_id: int
    sequence_number: int
    chunk_number: int
    row: tuple[object, ...]
    violated_watermark: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ReferenceResult:
    """Everything the reference model derives from one archive and one job configuration.

    Sequence sets (``gaps``, ``incomplete``) are as read, before ``gap_policy: skip``
    closes them; everything else is the state at the end of the run.
    """

    lateness: str
    progress: dict[tuple[int, str], OriginKeyProgress]
    keys: dict[str, KeyProgress]
    stream_cut: dict[int, tuple[int, int]]
    gaps: frozenset[tuple[int, int]]
    incomplete: frozenset[tuple[int, int]]
    skipped: frozenset[tuple[int, int]]
    duplicate_copies: dict[int, int]
    duplicate_tuples: dict[int, int]
    conflicts: frozenset[tuple[int, int, int]]
    regressions: frozenset[tuple[int, int, str]]
    thresholds: dict[tuple[int, int, int, str], tuple[int, str] | None]
    late: tuple[LateRow, ...]
    windows: tuple[WindowRow, ...]
    open_windows: tuple[WindowRow, ...]
    pending_tuples: int
    tuples_read: int


# --------------------------------------------------------------------------- progress (section 2)


@dataclass(frozen=True, slots=True, kw_only=True)
class _OriginState:
    """An origin's progress computed from a set of its buffers."""

    prefix: int
    marks: dict[str, tuple[int, ...]]  # key -> (W(0) = NEG_INF, W(1), ..., W(prefix))
    closed: frozenset[int]  # sequences closed by gap_policy: skip
    regressions: frozenset[tuple[int, str]]  # (sequence, key) held under clamp

    def local(self, key: str) -> int:
        return self.marks[key][-1]


def _is_complete(chunks: Sequence[Buffer], chunk_base: int) -> bool:
    """The last chunk is seen and every chunk from ``chunk_base`` up to it is seen, in any order."""
    seen = {b.chunk for b in chunks}
    lasts = [b.chunk for b in chunks if b.last_chunk]
    return bool(lasts) and all(c in seen for c in range(chunk_base, max(lasts) + 1))


def _origin_state(
    origin: int,
    buffers: Sequence[Buffer],
    keys: Mapping[str, ResolvedKey],
    *,
    chunk_base: int,
    skip: bool,
    on_regression: str,
) -> _OriginState:
    """An origin's complete prefix and sequence watermarks, from scratch, from its buffers.

    With ``skip``, every missing or incomplete sequence below the highest one seen is
    closed. Regressions are checked as sequences enter the prefix.

    Raises:
        WatermarkRegressionError: under ``on_regression == "fail"``.
    """
    by_sequence: dict[int, list[Buffer]] = defaultdict(list)
    for b in buffers:
        by_sequence[b.sequence].append(b)
    highest = max(by_sequence, default=0)
    marks = {k: [NEG_INF] for k in keys}
    closed: set[int] = set()
    regressions: set[tuple[int, str]] = set()
    s = 1
    while True:
        chunks = by_sequence.get(s, [])
        if _is_complete(chunks, chunk_base):
            closing = False
        elif skip and s < highest:
            closing = True
        else:
            break
        for k, key in keys.items():
            previous = marks[k][-1]
            present: list[int] = [b.watermarks[k] for b in chunks if b.watermarks[k] is not None]  # type: ignore[misc]
            if closing or key.watermark is None:
                # Closed sequences and event-time watermarks are cumulative: they never regress.
                mark = max([previous, *present])
            elif not present:
                mark = previous  # no chunk made a new promise
            else:
                mark = max(present)
                if mark < previous:
                    if on_regression == "fail":
                        raise WatermarkRegressionError(
                            what=(
                                f"the watermark of origin {origin} sequence {s} for key {k!r} "
                                f"({format_ts(mark)}) is below its predecessor's ({format_ts(previous)})"
                            ),
                            todo="fix the archive, or set watermark_regression: clamp to hold the watermark and report",
                            where=Location(origin=origin, sequence=s, extra={"key": k}),
                        )
                    regressions.add((s, k))
                    mark = previous
            marks[k].append(mark)
        if closing:
            closed.add(s)
        s += 1
    return _OriginState(
        prefix=s - 1,
        marks={k: tuple(v) for k, v in marks.items()},
        closed=frozenset(closed),
        regressions=frozenset(regressions),
    )


def _global_step(g: int, local: Mapping[int, int], idle: frozenset[int]) -> tuple[int, tuple[int, int] | None]:
    """One step of the global watermark (docs/semantics.md): the new ``G`` and the time window.

    ``local`` maps every participant to its local watermark; ``g`` is the previous ``G``.
    """
    if not local:
        return g, None
    active = {o: w for o, w in local.items() if o not in idle}
    counted = {o: w for o, w in active.items() if w >= g}  # an origin below G is left out
    if not active:  # all idle: flush to the most advanced origin
        return max(g, max(local.values())), (min(local.values()), max(local.values()))
    if not counted:  # the only active origins are behind G: hold
        return g, None
    return max(g, min(counted.values())), (min(counted.values()), max(counted.values()))


def _idle_origins(
    origins: set[int],
    latest: Mapping[int, Buffer],
    *,
    clock: int,
    first_ingest: int,
    idle_timeout: int | None,
    expected: set[int],
) -> frozenset[int]:
    """Origins idle at ``clock`` (arrival mode); ``latest`` is each origin's latest applied buffer."""
    idle = set()
    for o in origins:
        if o in latest:
            b = latest[o]
            if b.idle or (idle_timeout is not None and clock - b.ingest_ts >= idle_timeout):  # type: ignore[operator]
                idle.add(o)
        elif o not in expected and idle_timeout is not None and clock - first_ingest >= idle_timeout:
            idle.add(o)  # not seen yet: counts from the first ingest_ts of the archive
    return frozenset(idle)


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True, slots=True, kw_only=True)
class _Run:
    """The end state of one run: final origin states, ``G_k``, time windows and thresholds."""

    states: dict[int, _OriginState]
    participants: dict[str, set[int]]
    global_watermarks: dict[str, int]
    time_windows: dict[str, tuple[int, int] | None]
    thresholds: dict[tuple[int, int, int, str], Threshold | None]


def _run_progress(loaded: LoadedArchive, config: JobConfig) -> _Run:
    """Sections 2 and 3: progress, thresholds and the global watermark of the whole run."""
    keys, buffers = loaded.keys, loaded.buffers
    by_origin: dict[int, list[Buffer]] = defaultdict(list)
    for b in buffers:
        by_origin[b.origin].append(b)
    expected = set(config.expected_origins)
    # Participants of the whole run (the archive as read plus expected origins): an origin
    # whose first buffer arrives later already counts, as minus infinity, before it does.
    participants = {k: {b.origin for b in buffers if b.watermarks[k] is not None} | expected for k in keys}

    def state_of(origin: int, its_buffers: Sequence[Buffer], *, skip: bool) -> _OriginState:
        return _origin_state(
            origin,
            its_buffers,
            keys,
            chunk_base=config.chunk_base,
            skip=skip,
            on_regression=config.watermark_regression,
        )

    def locals_of(states: Mapping[int, _OriginState], k: str) -> dict[int, int]:
        return {o: states[o].local(k) if o in states else NEG_INF for o in participants[k]}

    g = {k: NEG_INF for k in keys}
    time_windows: dict[str, tuple[int, int] | None] = {k: None for k in keys}
    thresholds: dict[tuple[int, int, int, str], Threshold | None] = {}
    idle: frozenset[int] = frozenset()  # idleness exists only in arrival mode

    if loaded.lateness == "arrival":
        # A live engine's view: buffers applied one at a time; E_k(p) is the effective
        # watermark before buffer p. Only the arriving buffer's origin changes, so only its
        # state is recomputed (from scratch, over its buffers applied so far).
        order = sorted(buffers, key=lambda b: (b.ingest_ts, b.origin, b.sequence, b.chunk))
        applied: dict[int, list[Buffer]] = defaultdict(list)
        latest: dict[int, Buffer] = {}
        states: dict[int, _OriginState] = {}
        for b in order:
            for k, key in keys.items():
                thresholds[(*b.identity, k)] = (minus(g[k], key.allowed_lateness), BEHIND_GLOBAL_WATERMARK)
            applied[b.origin].append(b)
            latest[b.origin] = b
            states[b.origin] = state_of(b.origin, applied[b.origin], skip=False)
            idle = _idle_origins(
                set().union(*participants.values()),
                latest,
                clock=b.ingest_ts,  # type: ignore[arg-type]
                first_ingest=order[0].ingest_ts,  # type: ignore[arg-type]
                idle_timeout=config.idle_timeout,
                expected=expected,
            )
            for k in keys:
                g[k], time_windows[k] = _global_step(g[k], locals_of(states, k), idle)

    # End of the run: every origin's final state (gap_policy: skip closes gaps now), and one
    # more step of G (the only one in origin mode, where the whole run is one batch).
    final = {o: state_of(o, by_origin[o], skip=config.gap_policy == "skip") for o in sorted(by_origin)}
    for k in keys:
        g[k], time_windows[k] = _global_step(g[k], locals_of(final, k), idle)

    if loaded.lateness == Lateness.ORIGIN:
        for b in buffers:
            state = final[b.origin]
            for k, key in keys.items():
                decided = b.sequence - 1 <= state.prefix  # s - 1 is in the complete prefix
                thresholds[(*b.identity, k)] = (
                    (minus(state.marks[k][b.sequence - 1], key.allowed_lateness), BEHIND_ORIGIN_WATERMARK)
                    if decided
                    else None
                )
    return _Run(
        states=final, participants=participants, global_watermarks=g, time_windows=time_windows, thresholds=thresholds
    )


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


def run_reference(archive: str | Path, config: JobConfig, *, lateness: str | None = None) -> ReferenceResult:
    """Replay a local Parquet archive through the reference model, in one run.

    Reads every ``*.parquet`` file under ``archive`` (recursively, sorted by path),
    deduplicates buffers, computes progress per origin and key, decides lateness
    (``lateness`` overrides ``config.lateness``), applies ``gap_policy: skip`` at the
    end of the run, and aggregates the windows. Times are int microseconds.

    Raises:
        ConfigError: a watermark column named in the job is absent from the archive
            (``config.unknown_column``), or ``arrival`` lateness without ``ingest_ts``.
        ConflictingDuplicateError: two copies of a buffer differ, under ``on_conflict: fail``.
        WatermarkRegressionError: a sequence watermark below its predecessor's, under
            ``watermark_regression: fail``.
        EmptyArchiveError: no Parquet file under ``archive``.
    """
    loaded = load_archive(archive, config, lateness=lateness)
    keys = loaded.keys
    run = _run_progress(loaded, config)
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
            (o, s) for s in sequences if not _is_complete([b for b in its if b.sequence == s], config.chunk_base)
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
        windows=windows,
        open_windows=open_windows,
        pending_tuples=pending_tuples,
        tuples_read=loaded.tuples_read,
    )
