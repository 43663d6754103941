"""Window kinds (replay.core.window_kinds) against the reference model's own window formula."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay.core.config import WindowSpec
from replay.core.vocabulary import WindowKind
from replay.core.window_kinds import SHAPES, shape_of
from replay.reference.windows import window_starts

TIMES = st.integers(min_value=-(10**15), max_value=10**15)


@st.composite
def specs(draw: st.DrawFn) -> WindowSpec:
    size = draw(st.integers(min_value=1, max_value=10**7))
    offset = draw(st.integers(min_value=0, max_value=10**7))
    if draw(st.booleans()):
        return WindowSpec(name="w", size=f"{size}us", offset=f"{offset}us", aggregations=[{"fn": "count"}])
    slide = draw(st.integers(min_value=max(1, size // 50), max_value=size))
    return WindowSpec(
        name="w",
        kind="sliding",
        size=f"{size}us",
        slide=f"{slide}us",
        offset=f"{offset}us",
        aggregations=[{"fn": "count"}],
    )


def test_every_window_kind_has_a_shape() -> None:
    assert set(SHAPES) == set(WindowKind)


@given(spec=specs(), t=TIMES)
def test_the_windows_a_time_falls_in_match_the_reference(spec: WindowSpec, t: int) -> None:
    shape = shape_of(spec)
    starts = shape.starts(t)
    assert starts == window_starts(t, size=spec.size, slide=spec.effective_slide, offset=spec.offset)
    assert 1 <= len(starts) <= shape.per_tuple
    assert all(s <= t < shape.end(s) and (s - spec.offset) % shape.slide == 0 for s in starts)
    assert shape.owner(t) == starts[-1]  # without a range, a tuple's owner is its latest window


@given(spec=specs(), t=TIMES, room=st.integers(min_value=0, max_value=10**8))
def test_with_a_range_end_the_owner_is_the_latest_window_ending_by_it(spec: WindowSpec, t: int, room: int) -> None:
    shape = shape_of(spec)
    range_end = t + room
    owner = shape.owner(t, range_end)
    assert shape.end(owner) <= range_end and (owner - spec.offset) % shape.slide == 0
    assert shape.end(owner + shape.slide) > range_end or owner == shape.last_start(t)
    kept = [s for s in shape.starts(t) if shape.end(s) <= range_end]
    if kept:
        assert owner == kept[-1]
    else:
        assert owner not in shape.starts(t)  # no window inside the range holds t: nothing owns it


@pytest.mark.parametrize("kind", list(WindowKind))
def test_the_job_model_takes_every_kind_by_its_name(kind: WindowKind) -> None:
    extra = {"slide": "5s"} if kind == WindowKind.SLIDING else {}
    spec = WindowSpec(name="w", kind=kind.value, size="10s", aggregations=[{"fn": "count"}], **extra)
    assert shape_of(spec).kind == kind
