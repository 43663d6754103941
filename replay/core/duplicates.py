"""What deduplication finds besides the kept copy of a buffer: an identical copy, discarded, or a
copy whose content differs (a conflict: the run stops, or keeps the first copy, as the job's
``on_conflict`` says). Both become rows of the ``integrity`` table and are never replayed as data.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Conflict", "DuplicateCopy"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DuplicateCopy:
    """An identical copy that was discarded in favour of the first one."""

    origin: int
    sequence: int
    chunk: int
    file: str
    row_start: int
    tuples: int
    kept_file: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Conflict:
    """A copy whose content differs from the first copy of the same identity."""

    origin: int
    sequence: int
    chunk: int
    kept_file: str
    kept_row: int
    other_file: str
    other_row: int
    other_tuples: int = 0
