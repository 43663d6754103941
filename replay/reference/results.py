"""What the reference model derives from one archive (``run_reference``'s result), as plain values.

``ReferenceResult`` holds the end state of one run: progress per origin and key
(``OriginKeyProgress``), per key (``KeyProgress``), the late tuples (``LateRow``), the windows
(``replay.reference.windows.WindowRow``) and the integrity findings. ``replay.reference.model``
builds it; the tests compare it with the engine's outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

from replay.reference.windows import WindowRow

__all__ = ["KeyProgress", "LateRow", "OriginKeyProgress", "ReferenceResult"]


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
    late_columns: tuple[str, ...]  # the names of a late row's ``row`` values: the tuple's columns
    windows: tuple[WindowRow, ...]
    open_windows: tuple[WindowRow, ...]
    pending_tuples: int
    tuples_read: int
    after_skip: frozenset[tuple[int, int, int]] = frozenset()  # buffers found after their sequence was closed
