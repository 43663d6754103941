"""Progress in the reference model (docs/semantics.md, sections 2 and 3), the naive way.

Each origin's complete prefix and sequence watermarks are recomputed from scratch from its
buffers (``origin_state``), the global watermark takes one step at a time over the origins'
local watermarks and idleness (``global_step``), and ``run_progress`` replays a whole run:
buffer by buffer in arrival mode, in one batch in origin mode, with ``gap_policy: skip`` at
the end. Its result gives every buffer's lateness thresholds, which ``replay.reference.model``
applies to the tuples.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from replay.core.config import JobConfig
from replay.core.errors import Location, WatermarkRegressionError
from replay.core.timeutil import NEG_INF, format_ts, minus
from replay.core.vocabulary import Lateness, LateReason
from replay.reference.archive import Buffer, Identity, LoadedArchive, ResolvedKey

__all__ = [
    "BEHIND_GLOBAL_WATERMARK",
    "BEHIND_ORIGIN_WATERMARK",
    "OriginState",
    "Run",
    "Threshold",
    "is_complete",
    "run_progress",
]

BEHIND_ORIGIN_WATERMARK = LateReason.BEHIND_ORIGIN
BEHIND_GLOBAL_WATERMARK = LateReason.BEHIND_GLOBAL

Threshold = tuple[int, str]  # (threshold in microseconds, reason)


@dataclass(frozen=True, slots=True, kw_only=True)
class OriginState:
    """An origin's progress computed from a set of its buffers."""

    prefix: int
    marks: dict[str, tuple[int, ...]]  # key -> (W(0) = NEG_INF, W(1), ..., W(prefix))
    closed: frozenset[int]  # sequences closed by gap_policy: skip
    regressions: frozenset[tuple[int, str]]  # (sequence, key) held under clamp

    def local(self, key: str) -> int:
        return self.marks[key][-1]


def is_complete(chunks: Sequence[Buffer], chunk_base: int) -> bool:
    """The last chunk is seen and every chunk from ``chunk_base`` up to it is seen, in any order."""
    seen = {b.chunk for b in chunks}
    lasts = [b.chunk for b in chunks if b.last_chunk]
    return bool(lasts) and all(c in seen for c in range(chunk_base, max(lasts) + 1))


def origin_state(
    origin: int,
    buffers: Sequence[Buffer],
    keys: Mapping[str, ResolvedKey],
    *,
    chunk_base: int,
    skip: bool,
    on_regression: str,
    closed_before: frozenset[int] = frozenset(),
) -> OriginState:
    """An origin's complete prefix and sequence watermarks, from scratch, from its buffers.

    With ``skip``, every missing or incomplete sequence below the highest one seen is
    closed; the sequences in ``closed_before`` (closed by earlier runs) are closed whatever
    ``skip`` says. Regressions are checked as sequences enter the prefix.

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
        if s in closed_before:
            closing = True
        elif is_complete(chunks, chunk_base):
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
    return OriginState(
        prefix=s - 1,
        marks={k: tuple(v) for k, v in marks.items()},
        closed=frozenset(closed),
        regressions=frozenset(regressions),
    )


def global_step(g: int, local: Mapping[int, int], idle: frozenset[int]) -> tuple[int, tuple[int, int] | None]:
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


def idle_origins(
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
class Run:
    """The end state of the runs: final origin states, ``G_k``, time windows and thresholds, the
    buffers fed (``buffers``) and those found after an earlier run had closed their sequence
    (``after_skip``: never fed)."""

    states: dict[int, OriginState]
    participants: dict[str, set[int]]
    global_watermarks: dict[str, int]
    time_windows: dict[str, tuple[int, int] | None]
    thresholds: dict[tuple[int, int, int, str], Threshold | None]
    buffers: tuple[Buffer, ...]
    after_skip: tuple[Buffer, ...]


def run_progress(loaded: LoadedArchive, config: JobConfig, run_of: Mapping[Identity, int] | None = None) -> Run:
    """Sections 2 and 3: progress, thresholds and the global watermark of the whole replay.

    ``run_of``: per buffer identity, the run (0, 1, ...) that first finds it (docs/semantics.md,
    incremental runs); without it one run finds every buffer. Each run ends as a run ends:
    ``gap_policy: skip`` closes its gaps for good (a buffer of a closed sequence that a later run
    finds is not fed: ``after_skip``) and ``G_k`` takes a step. An origin takes part from the run
    that finds it; in arrival mode a later run's buffer arrives no earlier than the clock; in
    origin mode a threshold is at least ``G_k`` as the run that decides the buffer began.
    """
    keys = loaded.keys
    found = run_of or {}
    runs = 1 + max(found.values(), default=0)
    expected = set(config.expected_origins)
    skip = config.gap_policy == "skip"

    def state_of(origin: int, its_buffers: Sequence[Buffer], *, closing: bool) -> OriginState:
        return origin_state(
            origin,
            its_buffers,
            keys,
            chunk_base=config.chunk_base,
            skip=closing,
            on_regression=config.watermark_regression,
            closed_before=frozenset(closed.get(origin, ())),
        )

    # Participants of a run (what it and earlier runs found, plus expected origins): an origin
    # whose first buffer arrives later in the run already counts, as minus infinity, before it does.
    participants: dict[str, set[int]] = {k: set(expected) for k in keys}

    def locals_of(states: Mapping[int, OriginState], k: str) -> dict[int, int]:
        return {o: states[o].local(k) if o in states else NEG_INF for o in participants[k]}

    g = {k: NEG_INF for k in keys}
    time_windows: dict[str, tuple[int, int] | None] = {k: None for k in keys}
    thresholds: dict[tuple[int, int, int, str], Threshold | None] = {}
    idle: frozenset[int] = frozenset()  # idleness exists only in arrival mode
    closed: dict[int, set[int]] = defaultdict(set)  # per origin, the sequences earlier runs closed
    fed: dict[int, list[Buffer]] = defaultdict(list)  # per origin, the buffers fed so far
    after_skip: list[Buffer] = []
    decided: set[Identity] = set()  # origin mode
    floors: list[dict[str, int]] = []  # G_k as each run began
    applied: dict[int, list[Buffer]] = defaultdict(list)  # arrival mode: in arrival order
    latest: dict[int, Buffer] = {}
    states: dict[int, OriginState] = {}
    first_ingest: int | None = None
    clock: int | None = None
    final: dict[int, OriginState] = {}
    for run in range(runs):
        floors.append(dict(g))
        mine: list[Buffer] = []
        for b in loaded.buffers:
            if found.get(b.identity, 0) != run:
                continue
            (after_skip if b.sequence in closed.get(b.origin, ()) else mine).append(b)
        for k in keys:
            participants[k] |= {b.origin for b in mine if b.watermarks[k] is not None}
        for b in mine:
            fed[b.origin].append(b)
        if loaded.lateness == "arrival":
            # A live engine's view: buffers applied one at a time; E_k(p) is the effective
            # watermark before buffer p. Only the arriving buffer's origin changes, so only its
            # state is recomputed (from scratch, over its buffers applied so far).
            arriving = [
                b if clock is None else dataclasses.replace(b, ingest_ts=max(clock, b.ingest_ts or clock)) for b in mine
            ]
            for b in sorted(arriving, key=lambda b: (b.ingest_ts, b.origin, b.sequence, b.chunk)):
                for k, key in keys.items():
                    thresholds[(*b.identity, k)] = (minus(g[k], key.allowed_lateness), BEHIND_GLOBAL_WATERMARK)
                first_ingest = b.ingest_ts if first_ingest is None else first_ingest
                clock = b.ingest_ts
                applied[b.origin].append(b)
                latest[b.origin] = b
                states[b.origin] = state_of(b.origin, applied[b.origin], closing=False)
                idle = idle_origins(
                    set().union(*participants.values()),
                    latest,
                    clock=clock,  # type: ignore[arg-type]
                    first_ingest=first_ingest,  # type: ignore[arg-type]
                    idle_timeout=config.idle_timeout,
                    expected=expected,
                )
                for k in keys:
                    g[k], time_windows[k] = global_step(g[k], locals_of(states, k), idle)

        # End of the run: every origin's state (gap_policy: skip closes gaps now), and one more
        # step of G (the only one in origin mode).
        final = {o: state_of(o, fed[o], closing=skip) for o in sorted(fed)}
        for k in keys:
            g[k], time_windows[k] = global_step(g[k], locals_of(final, k), idle)
        for o, state in final.items():
            closed[o] |= state.closed
        states.update(final)  # arrival mode: the next run's buffers arrive after the closing
        if loaded.lateness == Lateness.ORIGIN:
            for o, its in fed.items():
                for b in its:
                    if b.identity in decided or b.sequence - 1 > final[o].prefix:
                        continue  # decided by an earlier run, or not yet (s - 1 is not in the prefix)
                    decided.add(b.identity)
                    for k, key in keys.items():
                        mark, floor = final[o].marks[k][b.sequence - 1], floors[run][k]
                        thresholds[(*b.identity, k)] = (
                            (minus(floor, key.allowed_lateness), BEHIND_GLOBAL_WATERMARK)
                            if floor > mark
                            else (minus(mark, key.allowed_lateness), BEHIND_ORIGIN_WATERMARK)
                        )
    dropped = {b.identity for b in after_skip}
    buffers = tuple(b for b in loaded.buffers if b.identity not in dropped)
    for b in buffers:
        for k in keys:
            thresholds.setdefault((*b.identity, k), None)
    return Run(
        states=final,
        participants=participants,
        global_watermarks=g,
        time_windows=time_windows,
        thresholds=thresholds,
        buffers=buffers,
        after_skip=tuple(after_skip),
    )
