"""Windows held open for tuples still to come from origins outside ``G_k`` (origin mode).

In origin mode a tuple is late against its own origin's promise (``W_k(o, s - 1)``) and, for an
origin that does not count in ``G_k``, against ``G_k`` as the run began
(``ProgressEngine.begin_run``). An origin counts in ``G_k`` once it takes part in the key and its
local watermark is at or above it; one that carries no ``k``-watermark at all, or joined behind
``G_k`` in a later run, does not, and its tuples may fall into a window whose end ``E_k`` has
passed. Emitting such a window at the batch whose ``E_k`` reached its end would make the tuple
late or not depending on where the run was cut, which determinism forbids (docs/semantics.md).

So a batch of an origin-mode run emits the windows whose end is at most ``E_k`` *and* at most the
smallest event time of the tuples the run has still to decide from such origins: those of later
batches, and the pending ones behind a gap (the run's last batch excepted: what stays pending
after the run is decided in a later run, against that run's floor). Windows held are carried
open and emitted by a later batch of the run. The hold changes which batch emits a window,
never which windows there are or what they hold (Numaflow's rule: the watermark never passes
data not yet processed).

The smallest event times come from the metadata scan where it read the event times (keys with
event-time watermarks, or a backfill range). Where it did not (a key with a watermark column), the
files holding such origins' copies are scanned once more, with the event time columns
(``read_lows``), before the run's first batch (should one of those copies no longer be there, its
file having changed since the scan, the copies hold every window until they are decided, as
unread). An archive whose every origin counts, the common case, holds nothing, reads
nothing more and pays nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from replay.core.buffer import NULL_TIME, Buffer, PackedBuffers
from replay.core.timeutil import NEG_INF

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from replay.core.progress import ProgressEngine

__all__ = ["NO_HOLD", "EmissionHold", "LowsReader"]

#: No tuple to wait for: every window whose end ``E_k`` reached is emitted.
NO_HOLD = 2**63 - 1

#: Reads the smallest event time, per key, of every copy in the given files, by ``(file, first
#: row)`` (``None``: the copy has no event time for that key): the metadata scan with the event
#: time columns (``replay.engine.scan``).
LowsReader = Callable[[Sequence[str]], Mapping[tuple[str, int], Sequence[int | None]]]


class EmissionHold:
    """The hold of one origin-mode run over its planned batches (``plan``; index ``i`` is the
    run's ``i``-th remaining batch).

    ``_from[k][o][i]``: the smallest event time (key ``k``) of origin ``o``'s copies with tuples in
    batches ``i`` and later (``NO_HOLD``: none), for the origins that did not count in ``G_k``
    when the hold was made; an origin that counts never stops counting within a run.
    """

    def __init__(
        self,
        candidates: Sequence[frozenset[int]],
        starts: Sequence[Mapping[int, npt.NDArray[np.int64]]],
        known: Sequence[bool],
        lows: Mapping[tuple[str, int], Sequence[int | None]] | None = None,
        reread: frozenset[int] = frozenset(),
    ) -> None:
        self._candidates = candidates
        self._from = starts
        self._known = known
        # The event times read again (``read_lows``), for the keys ``reread``: those whose event
        # times the scan did not read.
        self._lows = lows
        self._reread = reread

    @classmethod
    def of(
        cls,
        engine: ProgressEngine,
        plan: Sequence[PackedBuffers],
        pending: Mapping[tuple[int, int, int], Buffer],
        known: Sequence[bool],
        read_lows: LowsReader | None = None,
    ) -> EmissionHold | None:
        """The hold of a run about to process ``plan`` from ``engine``'s state (the run's origins
        joined); ``pending``: the buffers the engine holds undecided. ``known``: per key, whether
        the scan read its event times; where it did not and some origin is held for, ``read_lows``
        reads them from the files of those origins' copies (without it, such a copy holds every
        window). ``None`` when every origin of the run counts in every key."""
        import numpy as np

        origins: set[int] = {b.origin for b in pending.values()}
        for batch in plan:
            origins.update(np.unique(batch.column("origin")).tolist())
        candidates = [frozenset(origins - counted) for counted in engine.counted()]
        if not any(candidates):
            return None
        reread = frozenset(k for k, among in enumerate(candidates) if among and not known[k])
        lows = None
        if reread and read_lows is not None:
            held = _held_copies(plan, pending, frozenset().union(*(candidates[k] for k in reread)))
            lows = read_lows(sorted({file for file, _ in held}))
            if held <= lows.keys():
                known = [read or k in reread for k, read in enumerate(known)]
            else:  # a file changed since the scan: such copies hold every window, as unread
                lows = None
        if lows is None:
            reread = frozenset()
        starts: list[dict[int, npt.NDArray[np.int64]]] = []
        for k, among in enumerate(candidates):
            mins = {o: np.full(len(plan) + 1, NO_HOLD, dtype=np.int64) for o in among}
            for i, batch in enumerate(plan):
                ids = batch.column("origin")
                rows = np.flatnonzero((batch.column("tuples") > 0) & np.isin(ids, list(among)))
                if lows is not None and k in reread:
                    low = _read_lows(batch, rows, lows, k)
                else:
                    low = batch.min_event_column(k)[rows]
                for o in among:
                    mins[o][i] = _smallest(low[ids[rows] == o], known=known[k])
            # From batch i on: the running minimum from the end.
            starts.append({o: np.minimum.accumulate(m[::-1])[::-1] for o, m in mins.items()})
        return cls(candidates, starts, known, lows, reread)

    def before(
        self, engine: ProgressEngine, index: int, pending: Mapping[tuple[int, int, int], Buffer]
    ) -> tuple[int, ...]:
        """Per key, the hold in force before batch ``index`` (its tuples and the pending ones)."""
        return self._hold(engine, index, pending)

    def after(
        self, engine: ProgressEngine, index: int, pending: Mapping[tuple[int, int, int], Buffer], *, last: bool
    ) -> tuple[int, ...]:
        """Per key, the hold after batch ``index`` was fed (``pending``: what it left undecided;
        ``last``: it ends the run, and what stays pending is decided by a later run)."""
        return self._hold(engine, index + 1, {} if last else pending)

    def _hold(
        self, engine: ProgressEngine, start: int, pending: Mapping[tuple[int, int, int], Buffer]
    ) -> tuple[int, ...]:
        import numpy as np

        holds = []
        for k, (among, counted) in enumerate(zip(self._candidates, engine.counted(), strict=True)):
            waiting = among - counted
            hold = NO_HOLD
            for o in waiting:
                hold = min(hold, int(self._from[k][o][start]))
            lows = [self._low(buf, k) for buf in pending.values() if buf.origin in waiting and buf.tuples > 0]
            holds.append(min(hold, _smallest(np.array(lows, dtype=np.int64), known=self._known[k])))
        return tuple(holds)

    def _low(self, buf: Buffer, k: int) -> int:
        """Key ``k``'s smallest event time of a pending copy: as the scan gave it, or as read again."""
        if self._lows is None or k not in self._reread:
            low = buf.min_event[k]
            return NULL_TIME if low is None else low
        return _read_low(self._lows, buf.file, buf.row_start, k)


def _held_copies(
    plan: Sequence[PackedBuffers], pending: Mapping[tuple[int, int, int], Buffer], origins: frozenset[int]
) -> set[tuple[str, int]]:
    """``(file, first row)`` of the copies with tuples of ``origins``, in ``plan`` or ``pending``."""
    import numpy as np

    copies = {(b.file, b.row_start) for b in pending.values() if b.origin in origins and b.tuples > 0}
    for batch in plan:
        mine = np.flatnonzero(np.isin(batch.column("origin"), list(origins)) & (batch.column("tuples") > 0))
        copies.update(_copies(batch, mine))
    return copies


def _copies(batch: PackedBuffers, rows: npt.NDArray[np.intp]) -> list[tuple[str, int]]:
    """``(file, first row)`` of ``batch``'s copies ``rows``: how ``read_lows`` names a copy."""
    files, starts = batch.files, batch.column("row_start")[rows].tolist()
    return [(files[f], r) for f, r in zip(batch.file_of[rows].tolist(), starts, strict=True)]


def _read_low(lows: Mapping[tuple[str, int], Sequence[int | None]], file: str, row_start: int, k: int) -> int:
    """A held copy's smallest event time for key ``k`` as read again (``NULL_TIME``: none)."""
    low = lows[file, row_start][k]
    return NULL_TIME if low is None else low


def _read_lows(
    batch: PackedBuffers,
    rows: npt.NDArray[np.intp],
    lows: Mapping[tuple[str, int], Sequence[int | None]],
    k: int,
) -> npt.NDArray[np.int64]:
    """Key ``k``'s smallest event time of ``batch``'s copies ``rows``, as read again (``_read_low``)."""
    import numpy as np

    return np.array([_read_low(lows, file, row, k) for file, row in _copies(batch, rows)], dtype=np.int64)


def _smallest(lows: npt.NDArray[np.int64], *, known: bool) -> int:
    """The hold for copies with tuples whose smallest event times are ``lows`` (``NULL_TIME``:
    none): the smallest; ``NEG_INF`` (hold every window) for one whose event times the scan did
    not read (``known`` false); a copy without event times where they were read is in no window;
    ``NO_HOLD`` when none is left."""
    import numpy as np

    if (lows == NULL_TIME).any():
        if not known:
            return NEG_INF
        lows = lows[lows != NULL_TIME]
    return int(np.min(lows)) if len(lows) else NO_HOLD
