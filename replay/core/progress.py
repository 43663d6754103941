"""Progress per origin and watermark key (docs/semantics.md#progress and on), over buffer metadata only.

``ProgressEngine`` consumes buffers (in arrival order in arrival mode, in any
order in origin mode) and tracks, per origin, the complete sequence prefix and
the sequence watermarks per key; per key, the global watermark with idleness,
the all-idle flush and the left-out rule; and per buffer, the lateness
threshold its tuples are compared with (a ``Decision``). ``docs/semantics.md``
pins down every choice; ``replay.reference.model`` is the independent model the
tests compare this engine with.

The engine works buffer by buffer so that a micro-batch run can feed it batch
after batch; ``finish`` ends a run (``gap_policy: skip`` acts there). What it
holds, and how a checkpoint exports and restores that, is ``replay.core.progress_state``;
the values it takes and gives are ``replay.core.progress_records``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from replay.core.errors import BadBufferError, Location, ReplayError, WatermarkRegressionError
from replay.core.progress_records import (
    Decision,
    KeyProgress,
    KeySettings,
    OriginProgress,
    ProgressSnapshot,
    Regression,
    Skipped,
)
from replay.core.progress_state import NEVER, OriginState, ProgressState
from replay.core.timeutil import NEG_INF, format_ts, minus
from replay.core.vocabulary import Lateness, LateReason

if TYPE_CHECKING:
    from replay.core.buffer import Buffer

__all__ = [
    "BEHIND_GLOBAL",
    "BEHIND_ORIGIN",
    "Decision",
    "KeyProgress",
    "KeySettings",
    "OriginProgress",
    "ProgressEngine",
    "ProgressSnapshot",
    "Regression",
    "Skipped",
    "arrival_order",
]

BEHIND_ORIGIN = LateReason.BEHIND_ORIGIN
BEHIND_GLOBAL = LateReason.BEHIND_GLOBAL


def arrival_order(buffers: Iterable[Buffer]) -> list[Buffer]:
    """Buffers sorted by (``ingest_ts``, origin, sequence, chunk): the arrival order of docs/semantics.md#lateness."""
    return sorted(buffers, key=lambda b: (b.ingest if b.ingest is not None else NEG_INF, b.identity))


class ProgressEngine(ProgressState):
    """Incremental progress tracking over buffer metadata; the state it moves, and that state's
    export and restore, are ``ProgressState``'s.

    Args:
        keys: the watermark keys, in the order of ``Buffer.watermarks``.
        mode: ``"origin"`` or ``"arrival"`` lateness.
        participants: per key name, the origins taking part (docs/archive.md#watermark-keys), including
            expected origins; in arrival mode every one counts from the first ingest_ts.
        expected_origins: listed origins (never idle while they have sent nothing).
        chunk_base: the first chunk number (0 or 1).
        gap_policy: ``"wait"`` or ``"skip"``; ``watermark_regression``: ``"fail"`` or ``"clamp"``.
        idle_timeout: microseconds of ingest time without a buffer after which an origin is idle.
        strict: raise on a regression under ``fail`` (a run); otherwise record it and hold the
            origin's prefix before the offending sequence (``replay inspect``).
    """

    # -- feeding -----------------------------------------------------------------------------

    def feed(self, buffers: Iterable[Buffer]) -> list[Decision]:
        """Apply buffers; return the decisions that became possible.

        In arrival mode the buffers must come in arrival order (``arrival_order``), and
        every buffer is decided on arrival with ``E_k`` from the buffers before it. In
        origin mode a buffer of sequence ``s`` is decided once ``s - 1`` is in the prefix.
        """
        decisions: list[Decision] = []
        if self.mode != Lateness.ARRIVAL:
            for buf in buffers:
                self._apply(buf, buf.head(), decisions)
            self._coalesce()
            return decisions
        origins = self._origins
        for buf in buffers:
            head = buf.head()  # one unpacking of what is read of every buffer
            origin, sequence, chunk, ingest, _, idle = head
            if ingest is None:
                raise BadBufferError(
                    "arrival-mode lateness needs an ingest_ts on every buffer",
                    where=Location(file=buf.file, origin=origin, sequence=sequence, chunk=chunk),
                    todo="use 'lateness: origin', or fix the archiver so every buffer has an ingest_ts",
                    code="archive.null_metadata",
                )
            if self._clock is not None and ingest < self._clock:
                raise ValueError("arrival mode needs buffers in arrival order; sort them with arrival_order()")
            if self._first_ingest is None:
                self._first_ingest = ingest
            decisions.append(self._decide(origin, sequence, chunk, self.global_wm, BEHIND_GLOBAL))
            before = origins.get(origin)
            # G's inputs change only when this origin's prefix moves, its idleness may change
            # (it was idle, is seen for the first time, or sends an idle marker), or the clock
            # passes an idle deadline; otherwise G stays (coalescing is idempotent).
            moved = before is None or before.last_ingest is None or idle or self._idle(before)
            prefix, wm = (before.prefix, before.wm) if before is not None else (0, [])
            self._apply(buf, head, decisions)
            self._clock = ingest
            if moved or ingest >= self._deadline or (origins[origin].prefix != prefix and self._may_lift(origin, wm)):
                self._coalesce()
        return decisions

    def begin_run(self) -> None:
        """A run begins: ``G_k`` as it stands becomes the floor of origin-mode thresholds for the
        whole run (``_decide``), whatever batches the run is cut into. The floor is part of the
        exported state, so a run resumed after a crash keeps its own."""
        self._floor = list(self.global_wm)

    def cap_run(self, coming: Iterable[Buffer]) -> None:
        """Origin mode: bound ``G_k`` within the run by the value it ends the run at, whatever the
        batches the run is cut into (docs/semantics.md#global-watermark).

        An origin left out of ``G_k`` (one that joined in a later run, below it) counts again once
        its local watermark reaches ``G_k``; stepped batch by batch, ``G_k`` could first move past
        where such an origin ends the run, and then which windows close would depend on the cuts.
        So the run's ``G_k`` never passes one step from the run's floor (``G_k`` as it began) over
        every origin's local watermark at the end of the run (after ``finish``): ``coming``, the
        run's buffers not fed yet, are fed to a copy of the engine to find them. Without an origin
        below ``G_k`` nothing is left out, and the batches reach that step anyway: no copy is
        made. A copy that stops on bad input (the run will stop there too) holds ``G_k`` at the
        floor, which only holds back windows until a run gets past it. A run resumed after a crash
        computes the same bound from its snapshot (its floor kept) and its remaining batches."""
        import copy

        self._cap = None
        if self.mode != Lateness.ORIGIN or not any(
            self._origins[o].wm[index] < self.global_wm[index]
            for index, participants in enumerate(self.participants)
            for o in participants
        ):
            return
        ahead = copy.deepcopy(self)
        try:
            ahead.feed(coming)
            ahead.finish()
        except (ReplayError, ValueError):
            self._cap = list(self._floor)
            return
        cap = []
        for index, (participants, floor) in enumerate(zip(self.participants, self._floor, strict=True)):
            ends = [ahead._origins[o].wm[index] for o in participants]
            cap.append(max(floor, min((w for w in ends if w >= floor), default=floor)))
        self._cap = cap

    def counted(self) -> tuple[frozenset[int], ...]:
        """Per key, the origins that count in ``G_k`` now (``_counting``)."""
        return tuple(frozenset(self._counting(index)[0]) for index in range(len(self.keys)))

    def _may_lift(self, origin: int, before: Sequence[int]) -> bool:
        """Whether an active origin whose watermarks were ``before`` may move some ``G_k`` by
        moving its prefix: only where it was at or below ``G_k``. Above it, the origin counted
        (it is active and at or above ``G_k``), and so did another origin at ``G_k`` exactly, the
        minimum, which stays. Most prefixes move above ``G_k``: no recomputation."""
        return any(
            origin in participants and before[index] <= g
            for index, (participants, g) in enumerate(zip(self.participants, self.global_wm, strict=True))
        )

    def join(self, participants: Mapping[str, Iterable[int]]) -> None:
        """Add origins that take part from now on (an incremental run that sees them first).

        A newcomer counts as minus infinity, below ``G_k``, so it is left out of the minimum
        until it catches up (docs/semantics.md#global-watermark); ``G_k`` is recomputed.
        """
        added = False
        for index, key in enumerate(self.keys):
            for origin in participants.get(key.name, ()):
                if origin not in self.participants[index]:
                    self.participants[index].add(origin)
                    self._state(origin)
                    added = True
        if added:
            self._coalesce()

    def finish(self) -> list[Decision]:
        """End the run: under ``gap_policy: skip`` close every missing or incomplete sequence
        below each origin's highest seen one (docs/semantics.md#gaps), then recompute ``G_k``."""
        decisions: list[Decision] = []
        if self.gap_policy == "skip":
            for state in sorted(self._origins.values(), key=lambda o: o.id):
                while state.blocked is None and state.prefix < state.max_seq:
                    seq = state.prefix + 1
                    if self._complete(state, seq):
                        self._enter(state, seq, decisions, closed=False)
                    elif seq < state.max_seq:
                        chunks = tuple(sorted(state.pending.get(seq, {})))
                        self.skipped.append(Skipped(origin=state.id, sequence=seq, chunks=chunks))
                        self._enter(state, seq, decisions, closed=True)
                    else:
                        break
        self._coalesce()
        return decisions

    # -- internals ---------------------------------------------------------------------------

    def _decide(self, origin: int, sequence: int, chunk: int, watermarks: Sequence[int], reason: str) -> Decision:
        """Thresholds ``watermark - allowed_lateness`` per key: ``G_k`` (arrival) or ``W_k(o, s - 1)`` (origin).

        In origin mode the threshold is never below ``G_k`` as it stood when the run began
        (``begin_run``; for the buffers ``finish`` decides too): for an origin that counts in
        ``G_k`` that changes nothing (``W_k(o, s - 1) >= L_k(o) >= G_k`` for every buffer not yet
        decided), and for one left out (an origin that carries no watermark, or joined in a later
        run) it keeps its tuples out of windows emitted by earlier runs (docs/semantics.md). Within
        a run, windows such tuples may still fall into are held open until they are decided
        (``replay.runner.hold``), so the floor need not move with the run's batches, and no
        threshold depends on where the run was cut.
        """
        if reason != BEHIND_ORIGIN and self._decided is not None and self._decided[0] == watermarks:
            # Arrival mode decides every buffer against ``G_k``, which moves seldom: the previous
            # decision's thresholds and reasons, unless it moved.
            thresholds, reasons = self._decided[1], self._decided[2]
        else:
            marks = list(watermarks)
            why = [reason] * len(self.keys)
            if reason == BEHIND_ORIGIN:
                for index, g in enumerate(self._floor):
                    if g > marks[index]:
                        marks[index], why[index] = g, BEHIND_GLOBAL
            thresholds = tuple(minus(w, k.allowed_lateness) for w, k in zip(marks, self.keys, strict=True))
            shared = tuple(why)  # one tuple per combination of reasons, shared by the decisions
            reasons = self._reasons.setdefault(shared, shared)
            self._decided = (list(watermarks), thresholds, reasons) if reason != BEHIND_ORIGIN else None
        return Decision(
            origin=origin,
            sequence=sequence,
            chunk=chunk,
            thresholds=thresholds,
            reasons=reasons,
        )

    def _apply(
        self, buf: Buffer, head: tuple[int, int, int, int | None, bool, bool], decisions: list[Decision]
    ) -> None:
        """Feed ``buf``, whose ``Buffer.head`` is ``head``."""
        origin, seq, chunk, ingest, last_chunk, idle = head
        state = self._state(origin)
        if seq <= state.prefix or chunk in state.pending.get(seq, {}):
            raise BadBufferError(
                "buffer seen twice: its sequence is already complete or the chunk already consumed",
                where=Location(file=buf.file, origin=origin, sequence=seq, chunk=chunk),
                todo="this is a re-delivered buffer that deduplication missed; report it with the archive",
                code="progress.buffer_seen_twice",
            )
        state.pending.setdefault(seq, {})[chunk] = buf
        if last_chunk:
            state.last[seq] = chunk
        if seq > state.max_seq:
            state.max_seq = seq
        if state.cut is None or (seq, chunk) > state.cut:
            state.cut = (seq, chunk)
        if self.mode == Lateness.ARRIVAL:
            state.last_ingest = ingest
            state.idle_marker = idle
        elif seq == state.prefix + 1 and state.blocked is None:
            decisions.append(self._decide(origin, seq, chunk, state.wm, BEHIND_ORIGIN))
        while state.blocked is None and self._complete(state, state.prefix + 1):
            self._enter(state, state.prefix + 1, decisions, closed=False)

    def _complete(self, state: OriginState, seq: int) -> bool:
        last = state.last.get(seq)
        return last is not None and len(state.pending.get(seq, ())) == last - self.chunk_base + 1

    def _enter(self, state: OriginState, seq: int, decisions: list[Decision], *, closed: bool) -> None:
        chunks = state.pending.get(seq, {})
        new_wm = list(state.wm)
        clamped: list[Regression] = []
        for index, key in enumerate(self.keys):
            previous = state.wm[index]
            candidates = [w for b in chunks.values() if (w := b.watermarks[index]) is not None]
            if not candidates:
                continue
            value = max(candidates)
            if value >= previous or key.derived or closed:
                new_wm[index] = max(value, previous)
                continue
            if self.watermark_regression == "clamp":
                clamped.append(
                    Regression(
                        origin=state.id,
                        sequence=seq,
                        key=key.name,
                        watermark=value,
                        previous=previous,
                        action="clamped",
                    )
                )
                continue
            if self.strict:
                raise WatermarkRegressionError(
                    f"the watermark of key '{key.name}' goes back from {format_ts(previous)} to {format_ts(value)}",
                    where=Location(
                        origin=state.id,
                        sequence=seq,
                        file=min(b.file for b in chunks.values()),
                        extra={"key": key.name},
                    ),
                    todo="fix the archiver's watermarks, or set 'watermark_regression: clamp' to hold the "
                    "watermark and report the regression",
                )
            self.regressions.append(
                Regression(
                    origin=state.id, sequence=seq, key=key.name, watermark=value, previous=previous, action="held"
                )
            )
            state.blocked = seq
            return
        self.regressions.extend(clamped)
        state.pending.pop(seq, None)
        state.last.pop(seq, None)
        state.prefix = seq
        state.wm = new_wm
        if self.mode == Lateness.ORIGIN:
            for chunk, _ in sorted(state.pending.get(seq + 1, {}).items()):
                decisions.append(self._decide(state.id, seq + 1, chunk, state.wm, BEHIND_ORIGIN))

    def _idle(self, state: OriginState) -> bool:
        if self.mode != "arrival":
            return False
        if state.last_ingest is not None and state.idle_marker:
            return True
        if self.idle_timeout is None or self._clock is None:
            return False
        if state.last_ingest is None:
            if state.id in self.expected or self._first_ingest is None:
                return False
            return self._clock - self._first_ingest >= self.idle_timeout
        return self._clock - state.last_ingest >= self.idle_timeout

    def _idle_origins(self) -> set[int]:
        """The origins ``_idle`` holds idle now (none in origin mode; without an idle timeout, those
        whose latest buffer is an idle marker)."""
        if self.mode != Lateness.ARRIVAL:
            return set()
        if self.idle_timeout is None:
            return {o for o, s in self._origins.items() if s.idle_marker and s.last_ingest is not None}
        return {o for o, s in self._origins.items() if self._idle(s)}

    def _coalesce(self) -> None:
        origins = self._origins
        idle = self._idle_origins()
        if self.mode == Lateness.ARRIVAL and self.idle_timeout is not None:
            # The earliest clock at which a silent origin times out (unseen ones count from the
            # first ingest_ts; expected ones that sent nothing never do).
            starts = [
                s.last_ingest if s.last_ingest is not None else self._first_ingest
                for o, s in origins.items()
                if o not in idle and (s.last_ingest is not None or o not in self.expected)
            ]
            known = [t for t in starts if t is not None]
            self._deadline = min(known) + self.idle_timeout if known else NEVER
        for index, participants in enumerate(self.participants):
            previous = self.global_wm[index]
            if not participants:
                continue
            marks = [origins[o].wm[index] for o in participants if o not in idle]
            if not marks:  # every origin idle: the highest of them
                candidate = max(origins[o].wm[index] for o in participants)
            else:
                candidate = min((w for w in marks if w >= previous), default=previous)
            if self._cap is not None:  # origin mode, within a run (``cap_run``)
                candidate = min(candidate, self._cap[index])
            self.global_wm[index] = max(previous, candidate)

    def _counting(self, index: int) -> tuple[tuple[int, ...], tuple[int, int] | None]:
        """The origins that count in ``G_k`` of key ``index`` now, in origin order, and the range
        of their watermarks: the active ones at or above ``G_k`` (all of them when every one is
        idle). Computed when asked (a snapshot, an export), from the state ``_coalesce`` left:
        the active origins at or above ``G_k`` before it moved ``G_k`` are those at or above
        where it moved it, the smallest of them."""
        participants = self.participants[index]
        if not participants:
            return (), None
        idle = self._idle_origins()
        local = [(o, self._origins[o].wm[index]) for o in sorted(participants)]
        active = [pair for pair in local if pair[0] not in idle]
        g = self.global_wm[index]
        counted = [pair for pair in active if pair[1] >= g] if active else local
        values = [w for _, w in counted]
        return tuple(o for o, _ in counted), ((min(values), max(values)) if values else None)

    # -- reading -----------------------------------------------------------------------------

    def snapshot(self) -> ProgressSnapshot:
        """The current progress as immutable values."""
        counting = [self._counting(index) for index in range(len(self.keys))]
        rows = []
        for index, key in enumerate(self.keys):
            for origin in sorted(self.participants[index]):
                state = self._origins[origin]
                rows.append(
                    OriginProgress(
                        origin=origin,
                        key=key.name,
                        complete_prefix=state.prefix,
                        local_watermark=state.wm[index],
                        pending_buffers=sum(len(c) for c in state.pending.values()),
                        idle=self._idle(state),
                        counted=origin in counting[index][0],
                    )
                )
        keys = tuple(
            KeyProgress(
                key=key.name,
                global_watermark=self.global_wm[index],
                effective_watermark=minus(self.global_wm[index], key.allowed_lateness),
                time_window=counting[index][1],
                participants=tuple(sorted(self.participants[index])),
            )
            for index, key in enumerate(self.keys)
        )
        gaps, incomplete = [], []
        for origin, state in sorted(self._origins.items()):
            for seq in range(state.prefix + 1, state.max_seq + 1):
                if seq not in state.pending:
                    gaps.append((origin, seq))
                elif not self._complete(state, seq):
                    incomplete.append((origin, seq))
        return ProgressSnapshot(
            mode=self.mode,
            origins=tuple(rows),
            keys=keys,
            stream_cut={o: s.cut for o, s in sorted(self._origins.items()) if s.cut is not None},
            gaps=tuple(gaps),
            incomplete=tuple(incomplete),
            skipped=tuple(self.skipped),
            regressions=tuple(self.regressions),
        )
