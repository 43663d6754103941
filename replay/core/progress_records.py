"""The values the progress engine takes and gives (docs/semantics.md#progress): a key's settings,
a buffer's lateness decision, a watermark regression, a skipped sequence, and the snapshot of
progress per origin and key that reports, checkpoints and tests read."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Decision",
    "KeyProgress",
    "KeySettings",
    "OriginProgress",
    "ProgressSnapshot",
    "Regression",
    "Skipped",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class KeySettings:
    """What the engine needs of a watermark key.

    ``derived``: event-time watermarks (max event time of the tuples), which never regress.
    ``allowed_lateness`` in microseconds.
    """

    name: str
    allowed_lateness: int = 0
    derived: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """The lateness thresholds of one buffer's tuples, one per key.

    A tuple is late for key ``k`` when its ``k`` event time is strictly below
    ``thresholds[k]``; ``reasons[k]`` is the reason written to the ``late`` table.
    """

    origin: int
    sequence: int
    chunk: int
    thresholds: tuple[int, ...]
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Regression:
    """A sequence watermark below its predecessor's. ``action``: clamped, or held (inspect under fail)."""

    origin: int
    sequence: int
    key: str
    watermark: int
    previous: int
    action: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Skipped:
    """A sequence closed by ``gap_policy: skip``: data loss. ``chunks``: the chunks it had."""

    origin: int
    sequence: int
    chunks: tuple[int, ...]

    @property
    def missing(self) -> bool:
        return not self.chunks


@dataclass(frozen=True, slots=True, kw_only=True)
class OriginProgress:
    origin: int
    key: str
    complete_prefix: int
    local_watermark: int
    pending_buffers: int
    idle: bool
    counted: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyProgress:
    """Per key: ``G_k``, ``E_k = G_k - allowed_lateness`` and the reader time window (inclusive bounds)."""

    key: str
    global_watermark: int
    effective_watermark: int
    time_window: tuple[int, int] | None
    participants: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgressSnapshot:
    """The engine's state as values, for reports, checkpoints and tests."""

    mode: str
    origins: tuple[OriginProgress, ...]
    keys: tuple[KeyProgress, ...]
    stream_cut: dict[int, tuple[int, int]]
    gaps: tuple[tuple[int, int], ...]
    incomplete: tuple[tuple[int, int], ...]
    skipped: tuple[Skipped, ...]
    regressions: tuple[Regression, ...]

    def key(self, name: str) -> KeyProgress:
        return next(k for k in self.keys if k.key == name)

    def origin(self, origin: int, key: str) -> OriginProgress:
        return next(o for o in self.origins if o.origin == origin and o.key == key)
