"""The words of the contract, as one set of enums (docs/semantics.md, docs/outputs.md).

Each is a ``StrEnum``: its members are the strings written to the output tables, the job
file and the checkpoint, so ``LateReason.BEHIND_GLOBAL == "behind_global_watermark"`` and a
value read back from Parquet or JSON compares equal to its member. The engine, the reference
model and the reconciliation all speak these words; the reference model imports nothing else
of the engine.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "ConflictPolicy",
    "GapPolicy",
    "IntegrityKind",
    "LateReason",
    "Lateness",
    "RegressionPolicy",
    "TimeUnit",
    "WindowKind",
]


class Lateness(StrEnum):
    """How lateness is judged (docs/semantics.md#lateness): by each origin's own watermark in
    sequence order, by arrival (``ingest_ts``) order, or ``auto`` (arrival when the archive
    has ``ingest_ts``)."""

    AUTO = "auto"
    ORIGIN = "origin"
    ARRIVAL = "arrival"


class LateReason(StrEnum):
    """Why a tuple is in the ``late`` table: its event time is behind the watermark of its
    origin's previous buffer, or behind the global watermark ``G_k`` when it arrived."""

    BEHIND_ORIGIN = "behind_origin_watermark"
    BEHIND_GLOBAL = "behind_global_watermark"


class IntegrityKind(StrEnum):
    """A row of the ``integrity`` table."""

    GAP = "gap"  # a missing sequence
    INCOMPLETE = "incomplete"  # a sequence missing chunks
    SKIPPED = "skipped"  # a sequence closed by gap_policy: skip
    REGRESSION = "regression"  # a watermark that went backwards
    DUPLICATE = "duplicate"  # an identical copy, discarded
    CONFLICT = "conflict"  # a copy with different content, discarded
    AFTER_SKIP = "after_skip"  # a buffer of a sequence an earlier run closed (gap_policy: skip), discarded


class GapPolicy(StrEnum):
    """What a missing sequence does: hold the origin's watermark back, or be skipped."""

    WAIT = "wait"
    SKIP = "skip"


class RegressionPolicy(StrEnum):
    """What a watermark that goes backwards does: stop the run, or be clamped (and reported)."""

    FAIL = "fail"
    CLAMP = "clamp"


class ConflictPolicy(StrEnum):
    """What a buffer archived twice with different content does: stop the run, or keep the
    first copy (and report the other)."""

    FAIL = "fail"
    KEEP_FIRST = "keep_first"


class TimeUnit(StrEnum):
    """How the archive stores times: Parquet timestamps, or int64 epoch milliseconds."""

    NATIVE = "native"
    MS = "ms"


class WindowKind(StrEnum):
    """The window kinds (``replay.core.window_kinds`` says what each means)."""

    TUMBLING = "tumbling"
    SLIDING = "sliding"
