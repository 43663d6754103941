"""State and resume: what a run continues from, rebuilt from the last commit's engine snapshot
(docs/outputs.md#resume-reads-one-snapshot)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from replay.core.buffer import Buffer
from replay.core.config import JobConfig
from replay.core.errors import ArchiveReadError, CheckpointStateError, Location
from replay.core.paths import local_path
from replay.core.progress import ProgressEngine
from replay.engine.archive import ArchiveLayout
from replay.engine.inspection import engine_for
from replay.runner.ledger import Ledger
from replay.store import state as _state
from replay.store.checkpoint import CheckpointStore
from replay.store.records import Commit, RunIntent

__all__ = ["State", "empty_state", "intent_with_files", "new_engine", "rebuild"]


def new_engine(config: JobConfig, layout: ArchiveLayout, mode: str) -> ProgressEngine:
    """An engine configured from the job, with no participants yet (a run joins them batch by batch)."""
    return engine_for(config, layout, mode, (), strict=True)


@dataclass(slots=True, kw_only=True)
class State:
    """Everything a run continues from: the engine, pending buffers, discarded copies, the last commit.

    ``known`` and ``known_copies`` (every buffer ever fed, and every copy consumed or discarded)
    are the history: read from the batch log's buffer records only when the scan meets an
    identity the engine has seen before (a re-delivered buffer, or a file that changed and was
    read again), so that resuming costs the same after ten batches as after thousands. A commit
    does not add its batch to them (it is in the batch log; ``history_loaded`` turns false): only
    the deduplication at a run's start reads them, and the driver's memory stays flat.
    ``spark_paths``: the path Spark reports for a file, where it differs from the plain path.
    """

    engine: ProgressEngine
    known: dict[tuple[int, int, int], Buffer]
    known_copies: set[tuple[str, int]]  # (file, row_start) of every copy consumed or discarded
    pending: dict[tuple[int, int, int], Buffer]
    discarded: list[_state.Discarded]
    ledger: Ledger
    commit: Commit | None
    spark_paths: dict[str, str] = field(default_factory=dict)
    # The copies, with their decisions, whose on-time tuples complete the open windows of a commit
    # inside a pass (``Commit.carry``): the next pass reads them into its open windows again.
    carry_reads: list[tuple[Buffer, tuple[int, ...], tuple[str, ...]]] = field(default_factory=list)
    history_loaded: bool = True
    nkeys: int = 1

    def load_history(self, store: CheckpointStore) -> None:
        """Read every committed batch's buffer records (listed by the batch log) into ``known``
        and ``known_copies``."""
        if self.history_loaded:
            return
        assert self.commit is not None
        for entry in store.read_log(self.commit.log):
            for buf in _state.read_buffers(store.root / entry.buffers, self.nkeys):
                self.known[buf.identity] = buf
                self.known_copies.add((buf.file, buf.row_start))
        self.known_copies |= {(c.file, c.row_start) for c in self.discarded}
        self.history_loaded = True


def empty_state(engine: ProgressEngine, nkeys: int) -> State:
    return State(
        engine=engine,
        known={},
        known_copies=set(),
        pending={},
        discarded=[],
        ledger=Ledger(late=[0] * nkeys, no_event=[0] * nkeys, outside=[0] * nkeys),
        commit=None,
        nkeys=nkeys,
    )


def rebuild(
    store: CheckpointStore, config: JobConfig, layout: ArchiveLayout, mode: str, commit: Commit | None
) -> State:
    """The state ``commit`` left: its engine snapshot, the buffers held, the discarded copies and the
    consumed files (a bounded number of files, whatever the number of batches before it)."""
    engine = new_engine(config, layout, mode)
    nkeys = len(layout.keys)
    if commit is None:
        return empty_state(engine, nkeys)
    if commit.lateness != mode:
        raise CheckpointStateError(
            f"the checkpoint replays in {commit.lateness} mode but the archive now gives {mode}",
            where=Location(file=str(store.root)),
            todo="restore the archive's ingest_ts column, or start a new checkpoint",
        )
    state = empty_state(engine, nkeys)
    state.commit = commit
    state.ledger = Ledger.from_json(commit.ledger)
    if commit.discarded:
        # Every copy discarded so far counts as consumed: a copy found again is not a new one.
        state.discarded = _state.read_discarded(store.root / commit.discarded)
        state.known_copies = {(c.file, c.row_start) for c in state.discarded}
    snapshot = store.snapshot(commit)
    held = _state.read_buffers(store.root / commit.held, nkeys)
    engine.restore(snapshot.engine, held)
    undecided = set(snapshot.undecided)
    state.pending = {b.identity: b for b in held if b.identity in undecided}
    state.spark_paths = dict(snapshot.spark_paths)
    state.carry_reads = [read for path in commit.carry for read in _state.read_reads(store.root / path, nkeys)]
    state.history_loaded = False
    if len(state.pending) != commit.pending_buffers:
        raise CheckpointStateError(
            f"rebuilding the checkpoint gives {len(state.pending)} pending buffers, its last commit says "
            f"{commit.pending_buffers}",
            where=Location(file=str(store.root)),
            todo="the checkpoint is damaged or was written by another replay version; start a new checkpoint",
        )
    return state


def intent_with_files(store: CheckpointStore, intent: RunIntent, *, begun: bool, notes: list[str]) -> RunIntent | None:
    """``intent`` when its files are all there; ``None`` (the run is planned again, its intent
    dropped, said in ``notes``) when some are gone (a damaged file moved out after the run failed
    on it) and nothing of the run was committed (``begun``), so that nothing depends on its cut.

    Raises:
        ArchiveReadError: files are gone from a run that committed batches read from its files.
    """
    gone = [f for f in intent.files if (local := local_path(f)) is not None and not os.path.exists(local)]
    if not gone:
        return intent
    shown = ", ".join(gone[:3]) + (f" and {len(gone) - 3} more" if len(gone) > 3 else "")
    if begun:
        raise ArchiveReadError(
            f"{len(gone)} file(s) run {intent.run} reads are gone: {shown}",
            where=Location(file=gone[0]),
            todo=f"restore the file(s): run {intent.run} committed batches read from its files and cuts the rest "
            "from the same ones; a damaged file can be replaced by an intact copy under the same name",
        )
    store.drop_run_intents(after=intent.run - 1)
    notes.append(
        f"{len(gone)} file(s) run {intent.run} was to read are gone ({shown}); nothing of the run was "
        "committed, so it is planned again from the archive's files"
    )
    return None
