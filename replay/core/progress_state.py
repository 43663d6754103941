"""The progress engine's state (docs/semantics.md#progress), and that state as values.

Per origin an ``OriginState``: the complete sequence prefix, the sequence watermark per key at
the prefix, the buffers fed beyond it, the stream cut and, in arrival mode, the latest
ingest_ts and idle marker. Per key: ``G_k``, the origins counted in it and the reader time
window. Then the arrival clock, the next idle deadline, the regressions and skipped sequences.

``ProgressState`` holds all of it with the engine's settings, answers what was fed
(``seen``, ``pending_buffer``) and gives the whole state as JSON-able values and buffers
(``export_state``), what a checkpoint stores after each batch, and takes it back
(``restore``). ``replay.core.progress.ProgressEngine`` moves the state buffer by buffer; the
values it gives (decisions, snapshots) are in ``replay.core.progress_records``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from replay.core.progress_records import KeySettings, Regression, Skipped
from replay.core.timeutil import NEG_INF

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from replay.core.buffer import Buffer, PackedBuffers

__all__ = ["NEVER", "OriginState", "ProgressState"]

NEVER = 2**63  # beyond every timestamp


class OriginState:
    """One origin's progress: its complete prefix, its sequence watermark per key at the prefix, the
    buffers fed beyond the prefix, its stream cut and (arrival mode) its latest ingest_ts and idle marker."""

    __slots__ = ("blocked", "cut", "id", "idle_marker", "last", "last_ingest", "max_seq", "pending", "prefix", "wm")

    def __init__(self, origin: int, nkeys: int) -> None:
        self.id = origin
        self.prefix = 0
        self.wm: list[int] = [NEG_INF] * nkeys  # W_k(o, prefix)
        self.pending: dict[int, dict[int, Buffer]] = {}  # sequence > prefix -> chunk -> buffer
        self.last: dict[int, int] = {}  # sequence -> its last chunk number
        self.max_seq = 0
        self.cut: tuple[int, int] | None = None
        self.last_ingest: int | None = None
        self.idle_marker = False
        self.blocked: int | None = None  # inspect under 'fail': the regressing sequence


class ProgressState:
    """The progress engine's settings and state; ``ProgressEngine`` (``replay.core.progress``)
    documents the settings and moves the state."""

    def __init__(
        self,
        *,
        keys: Sequence[KeySettings],
        mode: str,
        participants: Mapping[str, Iterable[int]],
        expected_origins: Iterable[int] = (),
        chunk_base: int = 1,
        gap_policy: str = "wait",
        watermark_regression: str = "fail",
        idle_timeout: int | None = None,
        strict: bool = True,
    ) -> None:
        if mode not in ("origin", "arrival"):
            raise ValueError(f"mode must be origin or arrival, not {mode!r}")
        self.keys = tuple(keys)
        self.mode = mode
        self.chunk_base = chunk_base
        self.gap_policy = gap_policy
        self.watermark_regression = watermark_regression
        self.idle_timeout = idle_timeout
        self.strict = strict
        self.expected = frozenset(expected_origins)
        self.participants = [set(participants.get(k.name, ())) | set(self.expected) for k in self.keys]
        self.global_wm = [NEG_INF] * len(self.keys)
        # ``G_k`` when the current run began: the floor of origin-mode thresholds (``_decide``).
        self._floor = list(self.global_wm)
        # Origin mode: the most ``G_k`` may reach within the current run (``ProgressEngine.cap_run``;
        # ``None``: no bound). Not state: a run, resumed or not, computes it before its batches.
        self._cap: list[int] | None = None
        # Not state: values the decisions share (one tuple per combination of reasons, and the
        # previous decision against ``G_k``: the watermarks it was made with, its thresholds, its reasons).
        self._reasons: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._decided: tuple[list[int], tuple[int, ...], tuple[str, ...]] | None = None
        self._origins: dict[int, OriginState] = {}
        self._clock: int | None = None
        self._deadline = NEVER  # arrival mode: the clock at which the next idle timeout fires
        self._first_ingest: int | None = None
        self.regressions: list[Regression] = []
        self.skipped: list[Skipped] = []
        for origins in self.participants:
            for origin in origins:
                self._state(origin)

    @property
    def clock(self) -> int | None:
        """Arrival mode: the ``ingest_ts`` of the latest buffer fed (``None`` before the first)."""
        return self._clock

    def _counting(self, index: int) -> tuple[tuple[int, ...], tuple[int, int] | None]:
        """The origins that count in ``G_k`` of key ``index`` and their watermarks' range (the
        engine's rule: ``ProgressEngine._counting``)."""
        raise NotImplementedError

    def _state(self, origin: int) -> OriginState:
        state = self._origins.get(origin)
        if state is None:
            state = self._origins[origin] = OriginState(origin, len(self.keys))
        return state

    def seen(self, identity: tuple[int, int, int]) -> bool:
        """Whether a buffer identity lies within what was fed: its sequence is in the origin's
        complete prefix (consumed, or closed by ``gap_policy: skip``), or the chunk is pending."""
        origin, sequence, chunk = identity
        state = self._origins.get(origin)
        if state is None:
            return False
        return sequence <= state.prefix or chunk in state.pending.get(sequence, {})

    def _touched(
        self, buffers: PackedBuffers
    ) -> Iterator[tuple[OriginState, npt.NDArray[np.bool_], npt.NDArray[np.bool_]]]:
        """Per origin of ``buffers`` that the engine knows: its state, which of ``buffers`` are of a
        sequence in its complete prefix, and which of a sequence it holds chunks of (masks over
        ``buffers``)."""
        import numpy as np

        if not len(buffers) or not self._origins:
            return
        origin, sequence = buffers.column("origin"), buffers.column("sequence")
        for state in self._origins.values():
            mine = origin == state.id
            if not mine.any():
                continue
            held = mine & np.isin(sequence, list(state.pending)) if state.pending else np.zeros_like(mine)
            yield state, mine & (sequence <= state.prefix), held

    def seen_any(self, buffers: PackedBuffers) -> bool:
        """Whether ``seen`` holds for any of ``buffers`` (over their packed columns: no ``Buffer``
        object per buffer)."""
        import numpy as np

        sequence, chunk = buffers.column("sequence"), buffers.column("chunk")
        for state, done, held in self._touched(buffers):
            if done.any():
                return True
            if any(int(chunk[i]) in state.pending[int(sequence[i])] for i in np.flatnonzero(held).tolist()):
                return True
        return False

    def check_new_chunks(self, buffers: PackedBuffers) -> None:
        """That ``buffers``, a run's buffers never fed before, keep the chunk rules (at most one last
        chunk per sequence, none beyond it) together with the chunks fed in earlier runs: within
        one run the scan checks them (``replay.engine.copy_checks.check_sequences``), across runs
        only the engine knows the chunks it holds and the sequences it completed.

        Raises:
            BadBufferError: a new chunk of a sequence already complete, a second last chunk, or a
                chunk beyond the last one; naming the origin, sequence, chunk and file.
        """
        import numpy as np

        for state, done, held in self._touched(buffers):
            for i in np.flatnonzero(done | held).tolist():
                _check_chunk(state, buffers[i])

    def pending_buffer(self, identity: tuple[int, int, int]) -> Buffer | None:
        """The fed buffer of ``identity`` beyond its origin's prefix, if it is one."""
        origin, sequence, chunk = identity
        state = self._origins.get(origin)
        return None if state is None else state.pending.get(sequence, {}).get(chunk)

    def export_state(self) -> tuple[dict[str, Any], list[Buffer]]:
        """The engine's whole state: JSON-able values, and the buffers it holds beyond each
        origin's prefix (in origin, sequence, chunk order). ``restore`` takes both back.

        The size follows the origins and the buffers in flight, never the history fed.
        """
        origins = []
        held: list[Buffer] = []
        for origin, state in sorted(self._origins.items()):
            origins.append(
                {
                    "id": origin,
                    "prefix": state.prefix,
                    "wm": list(state.wm),
                    "last": sorted([seq, chunk] for seq, chunk in state.last.items()),
                    "max_seq": state.max_seq,
                    "cut": list(state.cut) if state.cut is not None else None,
                    "last_ingest": state.last_ingest,
                    "idle_marker": state.idle_marker,
                    "blocked": state.blocked,
                }
            )
            for seq in sorted(state.pending):
                held += [state.pending[seq][chunk] for chunk in sorted(state.pending[seq])]
        counting = [self._counting(index) for index in range(len(self.keys))]
        values = {
            "mode": self.mode,
            "keys": [k.name for k in self.keys],
            "participants": [sorted(p) for p in self.participants],
            "global_wm": list(self.global_wm),
            "floor": list(self._floor),
            # Derived from the rest (``_counting``), not read back; kept for those who read the state.
            "counted": [list(counted) for counted, _ in counting],
            "window": [list(window) if window is not None else None for _, window in counting],
            "clock": self._clock,
            "deadline": self._deadline,
            "first_ingest": self._first_ingest,
            "regressions": [dataclasses.asdict(r) for r in self.regressions],
            "skipped": [dataclasses.asdict(s) for s in self.skipped],
            "origins": origins,
        }
        return values, held

    def restore(self, values: Mapping[str, Any], held: Iterable[Buffer]) -> None:
        """Take back a state ``export_state`` gave, into an engine built with the same settings.

        Raises:
            ValueError: the state was exported by an engine with another mode or other keys.
        """
        if values["mode"] != self.mode or values["keys"] != [k.name for k in self.keys]:
            raise ValueError(
                f"the snapshot is of a {values['mode']} engine with keys {values['keys']}, "
                f"not {self.mode} with {[k.name for k in self.keys]}"
            )
        self.participants = [set(p) for p in values["participants"]]
        self.global_wm = list(values["global_wm"])
        # A snapshot from before the floor was kept: ``G_k`` as it stands (a batch began there).
        self._floor = list(values.get("floor", self.global_wm))
        self._clock = values["clock"]
        self._deadline = values["deadline"]
        self._first_ingest = values["first_ingest"]
        self.regressions = [Regression(**r) for r in values["regressions"]]
        self.skipped = [Skipped(**{**s, "chunks": tuple(s["chunks"])}) for s in values["skipped"]]
        self._origins = {}
        for row in values["origins"]:
            state = self._state(row["id"])
            state.prefix = row["prefix"]
            state.wm = list(row["wm"])
            state.last = {seq: chunk for seq, chunk in row["last"]}
            state.max_seq = row["max_seq"]
            state.cut = (row["cut"][0], row["cut"][1]) if row["cut"] is not None else None
            state.last_ingest = row["last_ingest"]
            state.idle_marker = row["idle_marker"]
            state.blocked = row["blocked"]
        for buf in held:
            self._origins[buf.origin].pending.setdefault(buf.sequence, {})[buf.chunk] = buf


def _check_chunk(state: OriginState, buf: Buffer) -> None:
    """``ProgressState.check_new_chunks`` for one new buffer of a sequence the engine completed or holds."""
    from replay.core.errors import BadBufferError, Location

    where = Location(file=buf.file, origin=buf.origin, sequence=buf.sequence, chunk=buf.chunk)
    todo = (
        "the last chunk must carry the highest chunk number, on exactly one chunk per sequence; fix the "
        "archiver and take this buffer's rows out of the file (or the file out of the archive) to go on"
    )
    if buf.sequence <= state.prefix:
        said = "a second last chunk" if buf.last_chunk else "a chunk beyond its last one"
        raise BadBufferError(
            f"chunk {buf.chunk} arrived after its sequence was complete (every chunk up to the last one was "
            f"replayed by an earlier run): it is {said}",
            where=where,
            todo=todo,
            code="archive.two_last_chunks" if buf.last_chunk else "archive.chunk_beyond_last",
        )
    fed = state.pending[buf.sequence]
    last = state.last.get(buf.sequence)
    if buf.chunk in fed:
        return  # another copy of a fed chunk: deduplication's case
    if buf.last_chunk and last is not None:
        raise BadBufferError(
            f"the sequence has 2 last chunks: [{min(last, buf.chunk)}, {max(last, buf.chunk)}] (chunk {last} "
            "was fed by an earlier run, which holds it until the sequence is complete)",
            where=where,
            todo=todo,
            code="archive.two_last_chunks",
        )
    beyond = buf.chunk if last is not None and buf.chunk > last else None
    if buf.last_chunk and fed and max(fed) > buf.chunk:
        beyond, last = max(fed), buf.chunk
    if beyond is not None:
        raise BadBufferError(
            f"chunk {beyond} lies beyond the sequence's last chunk {last} (one of the two was fed by an earlier "
            "run, which holds it until the sequence is complete)",
            where=where,
            todo=todo,
            code="archive.chunk_beyond_last",
        )
