"""A buffer's metadata, the unit that progress, deduplication and the ledger count in.

One record per buffer identity (origin, sequence, chunk), made by the metadata scan
(``replay.engine.buffers``) from the archive's metadata columns; tuples never reach it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Buffer", "Conflict", "DuplicateCopy"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Buffer:
    """One buffer (the kept copy of an identity) and its metadata.

    Times are integer microseconds, UTC. Per-key tuples are in ``ArchiveLayout.keys`` order:
    ``watermarks[i]`` is the buffer's watermark for key ``i`` (its watermark column, or for
    event-time watermarks the max event time of its tuples; ``None`` when it has none).
    """

    origin: int
    sequence: int
    chunk: int
    last_chunk: bool
    watermarks: tuple[int | None, ...]
    min_event: tuple[int | None, ...]
    max_event: tuple[int | None, ...]
    ingest: int | None
    idle: bool
    tuples: int
    rows: int
    file: str
    row_start: int
    content_hash: str

    @property
    def identity(self) -> tuple[int, int, int]:
        return (self.origin, self.sequence, self.chunk)


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
