"""Progress in the reference model (docs/semantics.md, sections 2 and 3), the naive way.

Each origin's complete prefix and sequence watermarks are recomputed from scratch from its
buffers (``origin_state``), the global watermark takes one step at a time over the origins'
local watermarks and idleness (``global_step``), and ``run_progress`` replays a whole run:
buffer by buffer in arrival mode, in one batch in origin mode, with ``gap_policy: skip`` at
the end. Its result gives every buffer's lateness thresholds, which ``replay.reference.model``
applies to the tuples.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from replay.core.config import JobConfig
from replay.core.errors import Location, WatermarkRegressionError
from replay.core.timeutil import NEG_INF, format_ts, minus
from replay.core.vocabulary import Lateness, LateReason
from replay.reference.archive import Buffer, LoadedArchive, ResolvedKey

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
) -> OriginState:
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
        if is_complete(chunks, chunk_base):
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
    """The end state of one run: final origin states, ``G_k``, time windows and thresholds."""

    states: dict[int, OriginState]
    participants: dict[str, set[int]]
    global_watermarks: dict[str, int]
    time_windows: dict[str, tuple[int, int] | None]
    thresholds: dict[tuple[int, int, int, str], Threshold | None]


def run_progress(loaded: LoadedArchive, config: JobConfig) -> Run:
    """Sections 2 and 3: progress, thresholds and the global watermark of the whole run."""
    keys, buffers = loaded.keys, loaded.buffers
    by_origin: dict[int, list[Buffer]] = defaultdict(list)
    for b in buffers:
        by_origin[b.origin].append(b)
    expected = set(config.expected_origins)
    # Participants of the whole run (the archive as read plus expected origins): an origin
    # whose first buffer arrives later already counts, as minus infinity, before it does.
    participants = {k: {b.origin for b in buffers if b.watermarks[k] is not None} | expected for k in keys}

    def state_of(origin: int, its_buffers: Sequence[Buffer], *, skip: bool) -> OriginState:
        return origin_state(
            origin,
            its_buffers,
            keys,
            chunk_base=config.chunk_base,
            skip=skip,
            on_regression=config.watermark_regression,
        )

    def locals_of(states: Mapping[int, OriginState], k: str) -> dict[int, int]:
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
        states: dict[int, OriginState] = {}
        for b in order:
            for k, key in keys.items():
                thresholds[(*b.identity, k)] = (minus(g[k], key.allowed_lateness), BEHIND_GLOBAL_WATERMARK)
            applied[b.origin].append(b)
            latest[b.origin] = b
            states[b.origin] = state_of(b.origin, applied[b.origin], skip=False)
            idle = idle_origins(
                set().union(*participants.values()),
                latest,
                clock=b.ingest_ts,  # type: ignore[arg-type]
                first_ingest=order[0].ingest_ts,  # type: ignore[arg-type]
                idle_timeout=config.idle_timeout,
                expected=expected,
            )
            for k in keys:
                g[k], time_windows[k] = global_step(g[k], locals_of(states, k), idle)

    # End of the run: every origin's final state (gap_policy: skip closes gaps now), and one
    # more step of G (the only one in origin mode, where the whole run is one batch).
    final = {o: state_of(o, by_origin[o], skip=config.gap_policy == "skip") for o in sorted(by_origin)}
    for k in keys:
        g[k], time_windows[k] = global_step(g[k], locals_of(final, k), idle)

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
    return Run(
        states=final, participants=participants, global_watermarks=g, time_windows=time_windows, thresholds=thresholds
    )
