"""Window kinds: which windows an event time falls in, a window's end, and which window owns a
tuple (docs/semantics.md#windows). Pure Python: no Spark here.

Every kind is a ``WindowShape`` (size, slide, offset; windows are half-open ``[start, start +
size)`` with starts ``offset + j * slide``), made from a job's window spec by its entry in
``SHAPES``. The arithmetic is written once, over an ``Ops`` object: ``INT_OPS`` computes on
Python integers, and the Spark data plane (``replay.engine.windows``) passes its own ``Ops`` that builds
Column expressions, so the engine's window assignment and its tests use the same formulas.
Adding a window kind is one entry in ``SHAPES`` (and its name in ``WindowKind``). The reference
model (``replay.reference.model``) keeps its own naive formulas, in the same words.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from replay.core.vocabulary import WindowKind

if TYPE_CHECKING:
    from replay.core.config import WindowSpec

__all__ = ["INT_OPS", "SHAPES", "Ops", "WindowShape", "shape_of"]


class Ops(Protocol):
    """The arithmetic a window formula needs, on integers or on Spark Columns."""

    def lit(self, value: int) -> Any: ...
    def pmod(self, value: Any, divisor: int) -> Any: ...  # the non-negative remainder
    def least(self, a: Any, b: Any) -> Any: ...


class _IntOps:
    def lit(self, value: int) -> int:
        return value

    def pmod(self, value: Any, divisor: int) -> int:
        return int(value) % divisor  # Python's % is a floor modulo: non-negative for divisor > 0

    def least(self, a: Any, b: Any) -> int:
        return min(int(a), int(b))


INT_OPS: Ops = _IntOps()


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowShape:
    """Windows ``[start, start + size)`` with starts ``offset + j * slide`` (microseconds)."""

    kind: WindowKind
    size: int
    slide: int
    offset: int = 0

    @property
    def per_tuple(self) -> int:
        """How many windows an event time falls in at most: ``ceil(size / slide)``."""
        return -(-self.size // self.slide)

    def last_start(self, t: Any, ops: Ops = INT_OPS) -> Any:
        """The latest window start at or before ``t``: the start of the latest window holding it."""
        return t - ops.pmod(t - ops.lit(self.offset), self.slide)

    def start(self, t: Any, j: Any, ops: Ops = INT_OPS) -> Any:
        """The start of the ``j``-th window back from the latest one at ``t`` (``j`` from 0 to
        ``per_tuple - 1``); it holds ``t`` when ``holds(start, t)``."""
        return self.last_start(t, ops) - j * ops.lit(self.slide)

    def holds(self, start: Any, t: Any, ops: Ops = INT_OPS) -> Any:
        """Whether the window starting at ``start`` (at or before ``t``) holds ``t``."""
        return start + ops.lit(self.size) > t

    def end(self, start: Any, ops: Ops = INT_OPS) -> Any:
        """The window's end (exclusive): it is due when the effective watermark reaches it."""
        return start + ops.lit(self.size)

    def owner(self, t: Any, range_end: int | None = None, ops: Ops = INT_OPS) -> Any:
        """The start of the window that owns a tuple at ``t``: its latest window, or with a backfill
        range the latest one ending by ``range_end`` (which may not hold ``t``: a tuple near a
        range edge may have no window inside the range, and then no window owns it)."""
        last = self.last_start(t, ops)
        if range_end is None:
            return last
        capped = ops.least(last, ops.lit(range_end - self.size))
        return capped - ops.pmod(capped - ops.lit(self.offset), self.slide)

    def starts(self, t: int) -> list[int]:
        """Every window start holding ``t``, ascending (integers only)."""
        found = [self.start(t, j) for j in range(self.per_tuple)]
        return sorted(s for s in found if self.holds(s, t))


def _tumbling(spec: WindowSpec) -> WindowShape:
    return WindowShape(kind=WindowKind.TUMBLING, size=spec.size, slide=spec.size, offset=spec.offset)


def _sliding(spec: WindowSpec) -> WindowShape:
    assert spec.slide is not None  # the job model requires it
    return WindowShape(kind=WindowKind.SLIDING, size=spec.size, slide=spec.slide, offset=spec.offset)


#: How each window kind's windows are laid out, from its spec.
SHAPES: dict[WindowKind, Callable[[WindowSpec], WindowShape]] = {
    WindowKind.TUMBLING: _tumbling,
    WindowKind.SLIDING: _sliding,
}


def shape_of(spec: WindowSpec) -> WindowShape:
    """The windows of ``spec``."""
    return SHAPES[WindowKind(spec.kind)](spec)
