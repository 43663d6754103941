"""What the batches of one ``replay run`` share and hand on: the run's context, a batch as cut,
a batch once the engine was fed (``Planned``), and the test hook that kills a run at a chosen
point (``fault``). ``replay.runner.batch`` feeds and aggregates a pass of batches,
``replay.runner.commit`` checks and commits each."""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replay.core.buffer import Buffer, PackedBuffers
from replay.core.config import JobConfig
from replay.core.progress import ProgressSnapshot
from replay.engine.archive import ArchiveLayout
from replay.engine.passes import Reads
from replay.runner.hold import EmissionHold
from replay.store import state as _state
from replay.store.checkpoint import CheckpointStore

__all__ = ["Batch", "Planned", "RunContext", "fault"]


def fault(point: str, batch: int) -> None:
    """Test hook: ``REPLAY_FAULT=<point>:<batch>`` kills this process with SIGKILL at that point.

    The points, in the order a run reaches them (``batch`` is the run's first batch for the
    first two, else the batch named):

    - ``before_intent``: the run's batch cuts are planned, its intent not yet written;
    - ``after_intent``: the intent is durable, no batch has started;
    - ``before_batch``: the pass's Spark work is done (its files staged), batch ``N - 1`` is
      committed and ``N`` not yet checked by the ledger;
    - ``after_staging``: batch ``N``'s state and progress files are written, its log line and
      commit not;
    - ``during_commit``: the batch-log line is appended, the commit record not yet written;
    - ``before_version``: the run's last batch ``N`` is committed, its output version not yet written.

    ``tests/runner/test_job_crash.py`` kills a run at each of them and checks that the resumed
    run's digests equal an uninterrupted run's.
    """
    wanted = os.environ.get("REPLAY_FAULT")
    if wanted and wanted == f"{point}:{batch}":
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunContext:
    """What every batch of one run shares."""

    config: JobConfig
    store: CheckpointStore
    cid: str  # the checkpoint's id: the prefix of its output entries
    output: Path
    range: tuple[int | None, int | None]
    layout: ArchiveLayout
    schema: Any  # the archive's Spark schema
    mode: str  # the lateness mode, origin or arrival
    run: int
    run_files: tuple[str, ...]
    stamps: Mapping[str, Sequence[int]]  # each run file's [size, mtime] before the run scanned it
    hold: EmissionHold | None = None  # origin mode, some origin outside G_k: windows held for its tuples
    changed: list[str] = field(default_factory=list)  # run files changed since: not consumed (the last batch)


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    """One cut of the run: its buffers (in feed order), the origins that join the engine with it,
    the copies it discards, and whether it ends the run (the engine then decides what it holds);
    ``index``: its place among the batches the run has left (``EmissionHold``)."""

    index: int
    buffers: PackedBuffers
    join: Mapping[str, set[int]]
    discarded: Sequence[_state.Discarded]
    finish: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Planned:
    """One batch of a pass after the engine was fed: what its commit needs."""

    batch: int
    token: str
    input: Batch
    snapshot: ProgressSnapshot
    emission: tuple[int, ...]  # per key, windows ending by it are due (``E_k``, or less under a hold)
    reads: Reads  # decided copies whose tuples the batch reads, packed until the pass has read them
    skipped: list[Buffer]  # decided copies a backfill range does not need
    engine: dict[str, Any]  # the engine's state after the batch, and the buffers it holds
    held: list[Buffer]
    pending: dict[tuple[int, int, int], Buffer]  # undecided after the batch
    input_xor: int  # the XOR of the ``buffer_copy_id`` of the batch's input buffers (the ledger's read side)

    @property
    def prefix(self) -> str:
        return f"b{self.batch:08d}-{self.token}"

    @property
    def reads_file(self) -> str:
        """The state file of the copies it read with their decisions (a commit's ``carry``)."""
        return f"state/{self.prefix}-reads.parquet"
