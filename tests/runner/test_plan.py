"""The batch plan (replay.runner.plan): cuts by buffer and tuple bounds, a redone first batch, passes of
consecutive batches, range relevance."""

from __future__ import annotations

import pytest

from replay.core.buffer import Buffer, PackedBuffers
from replay.core.config import parse_config
from replay.runner.plan import plan_batches, plan_passes, relevant
from tests._archives import buffer


def _buf(seq: int, tuples: int, lo: int | None = None, hi: int | None = None) -> Buffer:
    return buffer(
        sequence=seq,
        min_event=(lo,),
        max_event=(hi,),
        tuples=tuples,
        rows=max(tuples, 1),
        row_start=seq,
        content_hash="h",
    )


@pytest.mark.parametrize(
    ("sizes", "micro_batch", "first", "cuts"),
    [
        ([5, 5, 5, 5, 5], {"max_buffers": 2}, None, [2, 2, 1]),
        ([5, 5, 5, 5, 5], {"max_tuples": 10}, None, [2, 2, 1]),
        ([5, 5, 5, 5, 5], {"max_tuples": 9}, None, [1, 1, 1, 1, 1]),
        ([20, 1, 1], {"max_tuples": 10}, None, [1, 2]),  # one buffer above the bound is a batch alone
        ([5, 5, 5, 5, 5], {"max_buffers": 2}, 3, [3, 2]),  # a redone intent keeps its cut
        ([1, 1, 1], {"max_buffers": 2, "max_tuples": 1}, None, [1, 1, 1]),
        ([1, 1, 1], {}, None, [3]),
        ([], {"max_buffers": 2}, None, [0]),  # a run with nothing new still commits one batch
    ],
)
def test_cuts(sizes: list[int], micro_batch: dict[str, int], first: int | None, cuts: list[int]) -> None:
    config = parse_config({"archive": "a", "micro_batch": micro_batch})
    buffers = [_buf(i + 1, n) for i, n in enumerate(sizes)]
    plan = plan_batches(buffers, config, first)
    assert [len(b) for b in plan] == cuts
    assert [b for batch in plan for b in batch] == buffers  # order kept, nothing lost or repeated
    packed = plan_batches(PackedBuffers.of(buffers, nkeys=1), config, first)  # a run's buffers: the same cut
    assert [list(b) for b in packed] == plan and all(isinstance(b, PackedBuffers) for b in packed)


@pytest.mark.parametrize(
    ("batch_tuples", "micro_batch", "passes"),
    [
        ([5, 5, 5, 5, 5], {"max_batches_per_pass": 2}, [[0, 1], [2, 3], [4]]),
        ([5, 5, 5, 5, 5], {"max_batches_per_pass": 32, "max_tuples_per_pass": 10}, [[0, 1], [2, 3], [4]]),
        ([5, 5, 5, 5, 5], {"max_tuples_per_pass": 9}, [[0], [1], [2], [3], [4]]),
        ([20, 1, 1, 30, 1], {"max_tuples_per_pass": 10}, [[0], [1, 2], [3], [4]]),  # a large batch is a pass alone
        ([5] * 70, {}, [list(range(0, 32)), list(range(32, 64)), list(range(64, 70))]),  # 32 batches by default
        ([5, 5, 5], {"max_batches_per_pass": 1}, [[0], [1], [2]]),  # one Spark action per batch
        ([0], {}, [[0]]),
    ],
)
def test_passes(batch_tuples: list[int], micro_batch: dict[str, int], passes: list[list[int]]) -> None:
    config = parse_config({"archive": "a", "micro_batch": micro_batch})
    batches = [[_buf(i + 1, n)] for i, n in enumerate(batch_tuples)]
    assert [list(p) for p in plan_passes(batches, config)] == passes


def test_pass_bounds_are_not_part_of_the_fingerprint() -> None:
    """Passes change how fast a run goes, never its results: a checkpoint resumes under other bounds."""
    one = parse_config({"archive": "a", "micro_batch": {"max_batches_per_pass": 1, "max_tuples_per_pass": 5}})
    assert one.fingerprint() == parse_config({"archive": "a"}).fingerprint()


@pytest.mark.parametrize(
    ("lo", "hi", "start", "end", "expected"),
    [
        (10, 20, None, None, True),
        (10, 20, 20, 30, True),  # its last tuple sits on the start: inside [start, end)
        (10, 20, 21, 30, False),
        (10, 20, 0, 10, False),  # its first tuple sits on the end: outside
        (10, 20, 0, 11, True),
        (None, None, 0, 100, False),  # punctuation holds no tuple of any range
    ],
)
def test_relevant_to_a_half_open_range(
    lo: int | None, hi: int | None, start: int | None, end: int | None, expected: bool
) -> None:
    assert relevant(_buf(1, 1, lo, hi), start, end) is expected
