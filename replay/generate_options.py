"""What ``replay generate`` is asked and reports back.

``GenerateOptions`` is checked when made: each option's range, and what the options allow
together (gaps only among the sequences neither first nor last of their origin, a ``start`` that
keeps every generated time valid). ``GenerateSummary`` says what was written. ``replay.generate``
writes the archive; ``origin_tuples``, the split of the tuples over the origins, is used by both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from replay.core.timeutil import MICROS_PER_SECOND

__all__ = ["DEFAULT_START", "GenerateOptions", "GenerateSummary", "origin_tuples"]

#: 2026-01-01T00:00:00Z in microseconds.
DEFAULT_START = 1_767_225_600_000_000

_MINUTE = 60 * MICROS_PER_SECOND
_MAX_TS = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999Z


def _check_int(name: str, value: Any, low: int, high: int, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer between {low} and {high}{hint}, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}{hint}, got {value}")


def _check_fraction(name: str, value: Any, *, below_one: bool) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not (0.0 <= value < 1.0 if below_one else 0.0 <= value <= 1.0):
        interval = "[0, 1)" if below_one else "[0, 1]"
        raise ValueError(f"{name} must be a number in {interval}, got {value!r}")


def origin_tuples(origins: int, tuples: int, idle: int) -> np.ndarray:
    """Tuples per origin (index 0 is origin 1): an even split; idle origins keep about half of theirs."""
    n = np.full(origins, tuples // origins, dtype=np.int64)
    n[: tuples % origins] += 1
    if idle:
        n[origins - idle :] = np.maximum(1, n[origins - idle :] // 2)
    return n


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateOptions:
    """What to generate. Times and durations are integer microseconds (UTC epoch for ``start``).

    ``tuples`` is split evenly over the origins before idle origins stop early (at about half of their
    share) and gaps remove whole sequences; ``GenerateSummary.tuples`` says how many were written.
    ``duplicates`` and ``conflicts`` count buffers (one chunk each) written a second time.
    ``late_fraction`` is the expected fraction of written tuples made late (drawn per tuple), capped by
    the tuples that may be late: not in an origin's first sequence and not the last of a sequence.
    ``watermarks=False`` leaves out the ``watermark_ts`` column (event-time watermarks); ``idle`` is
    the number of origins (the highest ids) that stop early and end with an idle punctuation buffer.

    Raises:
        ValueError: an option is out of range; the message names it and the allowed range.
    """

    origins: int = 4
    tuples: int = 10_000
    buffer_tuples: int = 100
    keys: int = 10
    seed: int = 0
    gaps: int = 0
    duplicates: int = 0
    conflicts: int = 0
    late_fraction: float = 0.0
    multi_chunk_fraction: float = 0.0
    files: int = 1
    ingest_ts: bool = True
    watermarks: bool = True
    idle: int = 0
    chunk_base: int = 1
    key_type: str = "int"
    start: int = DEFAULT_START
    tuple_interval: int = 10_000
    disorder: int = 2_000_000

    def __post_init__(self) -> None:
        _check_int("origins", self.origins, 1, 100_000)
        _check_int("tuples", self.tuples, self.origins, 10**10, " (at least one per origin)")
        _check_int("buffer_tuples", self.buffer_tuples, 1, 10**8)
        _check_int("keys", self.keys, 1, 2**31 - 1)
        _check_int("seed", self.seed, 0, 2**63 - 1)
        _check_int("idle", self.idle, 0, self.origins, " (the number of origins)")
        _check_int("chunk_base", self.chunk_base, 0, 1)
        _check_int("tuple_interval", self.tuple_interval, 1, 3_600 * MICROS_PER_SECOND, " (1 us to 1 h)")
        _check_int("disorder", self.disorder, 0, 86_400 * MICROS_PER_SECOND, " (0 to 1 day)")
        _check_fraction("late_fraction", self.late_fraction, below_one=True)
        _check_fraction("multi_chunk_fraction", self.multi_chunk_fraction, below_one=False)
        for name in ("ingest_ts", "watermarks"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.key_type not in ("int", "string"):
            raise ValueError(f"key_type must be 'int' or 'string', got {self.key_type!r}")
        n = origin_tuples(self.origins, self.tuples, self.idle)
        span = int(n.max()) * self.tuple_interval * 11 // 10 + self.disorder + 10 * _MINUTE
        low = self.disorder + 10 * _MINUTE  # late tuples stay after the epoch
        _check_int("start", self.start, low, _MAX_TS - span, " (so every generated time is valid)")
        seqs = -(-n // self.buffer_tuples)
        interior = int(np.maximum(seqs - 2, 0).sum())
        _check_int("gaps", self.gaps, 0, interior, " (sequences neither first nor last of their origin)")
        kept = int(seqs.sum()) - self.gaps
        _check_int("duplicates", self.duplicates, 0, kept, " (the buffers left after gaps)")
        _check_int(
            "conflicts", self.conflicts, 0, kept - self.duplicates, " (the buffers left after gaps and duplicates)"
        )
        _check_int("files", self.files, 1, min(10_000, kept + self.idle), " (at most one per buffer)")
        if self.files == 1 and self.duplicates + self.conflicts and kept + self.idle < 2:
            raise ValueError(
                "duplicates and conflicts need at least 2 buffers so a copy is not adjacent to its"
                " original; raise tuples or lower buffer_tuples"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateSummary:
    """What was written. ``rows`` counts every row (copies and punctuation rows included), ``tuples``
    the distinct tuples, ``buffers`` the distinct buffer identities (punctuation buffers included).
    ``gaps`` lists the removed (origin, sequence); ``duplicates`` and ``conflicts`` the (origin,
    sequence, chunk) written twice, identically or not; ``late_tuples`` the tuples made late."""

    path: str
    files: int
    rows: int
    tuples: int
    buffers: int
    gaps: tuple[tuple[int, int], ...]
    duplicates: tuple[tuple[int, int, int], ...]
    conflicts: tuple[tuple[int, int, int], ...]
    idle_origins: tuple[int, ...]
    late_tuples: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (tuples become lists)."""
        return {
            k: [list(x) if isinstance(x, tuple) else x for x in v] if isinstance(v, tuple) else v
            for k, v in asdict(self).items()
        }
