"""What a run did (``RunSummary``): what ``replay run`` prints, ``--json`` gives and the Airflow
tasks push, in one record."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from replay.core.timeutil import format_ts
from replay.store.checkpoint import LockInfo

__all__ = ["RunSummary"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    """What a run did. Watermarks are int microseconds (``NEG_INF``: none yet)."""

    output: str
    checkpoint: str
    version: int | None
    new_version: bool
    resumed: bool
    batches: int
    buffers: int
    tuples_read: int
    windows_emitted: int
    open_windows: int
    late_tuples: dict[str, int]
    pending_tuples: int
    duplicate_copies: int
    watermarks: dict[str, tuple[int, int]]  # key -> (G_k, E_k)
    seconds: float
    stale_lock: LockInfo | None = None
    notes: tuple[str, ...] = ()
    output_watermarks: dict[str, int | None] = field(default_factory=dict)  # window -> min(E_k, oldest open end - 1 ms)

    def to_dict(self) -> dict[str, Any]:
        return {
            "output": self.output,
            "checkpoint": self.checkpoint,
            "version": self.version,
            "new_version": self.new_version,
            "resumed": self.resumed,
            "batches": self.batches,
            "buffers": self.buffers,
            "tuples_read": self.tuples_read,
            "windows_emitted": self.windows_emitted,
            "open_windows": self.open_windows,
            "late_tuples": self.late_tuples,
            "pending_tuples": self.pending_tuples,
            "duplicate_copies": self.duplicate_copies,
            "watermarks": {
                k: {"global": format_ts(g), "effective": format_ts(e)} for k, (g, e) in self.watermarks.items()
            },
            "output_watermarks": {name: format_ts(value) for name, value in self.output_watermarks.items()},
            "seconds": round(self.seconds, 3),
            "stale_lock": asdict(self.stale_lock) if self.stale_lock is not None else None,
            "notes": list(self.notes),
        }
