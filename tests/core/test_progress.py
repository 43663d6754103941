"""The progress engine on buffer metadata: exact cases from NebulaStream and Hazelcast Jet, and invariants."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay.core.buffer import Buffer
from replay.core.errors import WatermarkRegressionError
from replay.core.progress import BEHIND_GLOBAL, BEHIND_ORIGIN, KeySettings, ProgressEngine, arrival_order
from replay.core.timeutil import NEG_INF
from tests._archives import buffer


def buf(
    origin: int,
    seq: int,
    chunk: int = 1,
    *,
    last: bool = True,
    wm: int | None = None,
    ingest: int | None = None,
    idle: bool = False,
) -> Buffer:
    return buffer(
        origin=origin,
        sequence=seq,
        chunk=chunk,
        last_chunk=last,
        watermarks=(wm,),
        ingest=ingest,
        idle=idle,
        content_hash="x",
    )


def engine(mode: str = "origin", origins: tuple[int, ...] = (1,), **kwargs: object) -> ProgressEngine:
    lateness = kwargs.pop("allowed_lateness", 0)
    derived = kwargs.pop("derived", False)
    return ProgressEngine(
        keys=[KeySettings(name="default", allowed_lateness=lateness, derived=derived)],  # type: ignore[arg-type]
        mode=mode,
        participants={"default": origins},
        **kwargs,  # type: ignore[arg-type]
    )


# NebulaStream's sequence table: the longest consecutive sequence.
@pytest.mark.parametrize(
    ("sequences", "prefix"),
    [([1, 2, 3, 4, 5], 5), ([1, 2, 3, 5, 6], 3), ([1, 3, 4, 6], 1), ([2, 3], 0), ([], 0)],
)
def test_complete_prefix_nebulastream_table(sequences: list[int], prefix: int) -> None:
    eng = engine()
    eng.feed([buf(1, s, wm=s * 10) for s in sequences])
    row = eng.snapshot().origin(1, "default")
    assert row.complete_prefix == prefix
    assert row.local_watermark == (prefix * 10 if prefix else NEG_INF)
    assert row.pending_buffers == len([s for s in sequences if s > prefix])


@pytest.mark.parametrize("chunk_base", [0, 1])
def test_multi_chunk_out_of_order_completes_with_max_watermark(chunk_base: int) -> None:
    c = chunk_base
    eng = engine(chunk_base=chunk_base)
    # chunks arrive 3, 1, 2; the last chunk (3) carries a lower watermark than chunk 1
    eng.feed([buf(1, 1, c + 2, last=True, wm=15)])
    assert eng.snapshot().origin(1, "default").complete_prefix == 0
    eng.feed([buf(1, 1, c + 0, last=False, wm=40)])
    assert eng.snapshot().origin(1, "default").complete_prefix == 0
    eng.feed([buf(1, 1, c + 1, last=False, wm=None)])
    row = eng.snapshot().origin(1, "default")
    assert (row.complete_prefix, row.local_watermark) == (1, 40)


def test_sequence_missing_a_chunk_is_incomplete() -> None:
    eng = engine()
    eng.feed([buf(1, 1, 1, last=False, wm=5), buf(1, 1, 3, last=True, wm=6), buf(1, 2, wm=9)])
    snap = eng.snapshot()
    assert snap.origin(1, "default").complete_prefix == 0
    assert snap.incomplete == ((1, 1),)
    assert snap.stream_cut == {1: (2, 1)}


# Hazelcast Jet's coalescing example, as two origins in arrival mode.
def test_jet_coalescing_example() -> None:
    eng = engine("arrival", origins=(10, 11))
    feed = [(10, 10), (11, 12), (10, 11), (11, 13), (10, 14)]
    expected_after = [NEG_INF, 10, 11, 11, 13]
    seqs = {10: 0, 11: 0}
    for step, ((origin, wm), expected) in enumerate(zip(feed, expected_after, strict=True)):
        seqs[origin] += 1
        eng.feed([buf(origin, seqs[origin], wm=wm, ingest=step)])
        assert eng.snapshot().key("default").global_watermark == expected


def test_arrival_thresholds_use_buffers_before_position() -> None:
    eng = engine("arrival", origins=(1, 2), allowed_lateness=3)
    decisions = eng.feed([buf(1, 1, wm=10, ingest=0), buf(2, 1, wm=20, ingest=1), buf(1, 2, wm=30, ingest=2)])
    assert [d.thresholds[0] for d in decisions] == [NEG_INF, NEG_INF, 10 - 3]
    assert {d.reasons[0] for d in decisions} == {BEHIND_GLOBAL}


def test_idle_marker_excludes_origin_and_next_buffer_wakes_it() -> None:
    eng = engine("arrival", origins=(1, 2))
    eng.feed([buf(1, 1, wm=10, ingest=0), buf(2, 1, wm=50, ingest=1)])
    assert eng.snapshot().key("default").global_watermark == 10
    eng.feed([buf(1, 2, wm=None, ingest=2, idle=True)])  # origin 1 goes idle
    assert eng.snapshot().key("default").global_watermark == 50
    eng.feed([buf(1, 3, wm=20, ingest=3)])  # back, but below G: left out until it catches up
    snap = eng.snapshot()
    assert snap.key("default").global_watermark == 50
    assert not snap.origin(1, "default").counted
    eng.feed([buf(1, 4, wm=60, ingest=4), buf(2, 2, wm=70, ingest=5)])
    snap = eng.snapshot()
    assert snap.origin(1, "default").counted
    assert snap.key("default").global_watermark == 60


def test_all_idle_flush_takes_the_maximum() -> None:
    eng = engine("arrival", origins=(1, 2))
    eng.feed([buf(1, 1, wm=10, ingest=0), buf(2, 1, wm=30, ingest=1), buf(1, 2, ingest=2, idle=True)])
    assert eng.snapshot().key("default").global_watermark == 30
    eng.feed([buf(2, 2, ingest=3, idle=True)])
    key = eng.snapshot().key("default")
    assert key.global_watermark == 30
    assert key.time_window == (10, 30)


def test_idle_timeout_from_ingest_clock() -> None:
    eng = engine("arrival", origins=(1, 2), idle_timeout=100)
    eng.feed([buf(1, 1, wm=10, ingest=0), buf(2, 1, wm=50, ingest=1)])
    eng.feed([buf(2, 2, wm=60, ingest=99)])
    assert eng.snapshot().key("default").global_watermark == 10  # 99 - 0 < 100
    eng.feed([buf(2, 3, wm=70, ingest=100)])
    assert eng.snapshot().key("default").global_watermark == 70  # origin 1 silent for 100


def test_unseen_origin_times_out_from_first_ingest_but_expected_never() -> None:
    eng = engine("arrival", origins=(1, 2), idle_timeout=100)
    eng.feed([buf(1, 1, wm=10, ingest=1000), buf(1, 2, wm=20, ingest=1100)])
    assert eng.snapshot().key("default").global_watermark == 20  # origin 2 silent since 1000
    held = engine("arrival", origins=(1,), idle_timeout=100, expected_origins=(2,))
    held.feed([buf(1, 1, wm=10, ingest=1000), buf(1, 2, wm=20, ingest=1100)])
    assert held.snapshot().key("default").global_watermark == NEG_INF


def test_origin_mode_ignores_idle_markers() -> None:
    eng = engine("origin", origins=(1, 2))
    eng.feed([buf(1, 1, wm=10), buf(2, 1, wm=30), buf(1, 2, idle=True)])
    assert eng.snapshot().key("default").global_watermark == 10


def test_origin_threshold_waits_for_predecessor() -> None:
    eng = engine("origin", allowed_lateness=2)
    first = eng.feed([buf(1, 1, wm=10), buf(1, 3, wm=30)])
    assert [(d.sequence, d.thresholds[0]) for d in first] == [(1, NEG_INF)]
    later = eng.feed([buf(1, 2, wm=20)])
    assert [(d.sequence, d.thresholds[0], d.reasons[0]) for d in later] == [
        (2, 10 - 2, BEHIND_ORIGIN),
        (3, 20 - 2, BEHIND_ORIGIN),
    ]


def test_gap_skip_closes_at_end_of_run() -> None:
    eng = engine("origin", gap_policy="skip")
    decided = eng.feed([buf(1, 1, wm=10), buf(1, 3, wm=30), buf(1, 4, 1, last=False, wm=5), buf(1, 6, wm=60)])
    assert eng.snapshot().gaps == ((1, 2), (1, 5))
    decided += eng.finish()
    snap = eng.snapshot()
    assert [(s.sequence, s.chunks) for s in snap.skipped] == [(2, ()), (4, (1,)), (5, ())]
    row = snap.origin(1, "default")
    assert (row.complete_prefix, row.local_watermark) == (6, 60)
    # sequence 2 closed empty keeps 10; 4's lower chunk watermark is no regression
    assert {d.sequence: d.thresholds[0] for d in decided} == {1: NEG_INF, 3: 10, 4: 30, 6: 30}


def test_origin_mode_decides_against_the_global_watermark_the_run_began_with() -> None:
    # Origin 2 carries no watermark (it takes no part in G_k); its sequence 3 waits behind a gap
    # that the end of the run closes. The run began with G_k at minus infinity, and only windows
    # emitted by earlier runs must be kept out of (a run holds the windows its tuples may fall into,
    # ``replay.runner.hold``): the feed moving G_k to 40 does not make the tuples of sequence 3 late.
    eng = engine("origin", origins=(1,), gap_policy="skip")
    decided = eng.feed([buf(1, 1, wm=40), buf(2, 1), buf(2, 3)])
    assert eng.snapshot().key("default").global_watermark == 40
    decided += eng.finish()
    assert {(d.origin, d.sequence): (d.thresholds[0], d.reasons[0]) for d in decided} == {
        (1, 1): (NEG_INF, BEHIND_ORIGIN),
        (2, 1): (NEG_INF, BEHIND_ORIGIN),
        (2, 3): (NEG_INF, BEHIND_ORIGIN),
    }
    # The next batch of the same run keeps the floor the run began with, wherever the run was cut ...
    assert [(d.thresholds[0], d.reasons[0]) for d in eng.feed([buf(2, 4)])] == [(NEG_INF, BEHIND_ORIGIN)]
    # ... and so does a run resumed from the engine's exported state.
    values, held = eng.export_state()
    resumed = engine("origin", origins=(1,), gap_policy="skip")
    resumed.restore(values, held)
    assert [(d.thresholds[0], d.reasons[0]) for d in resumed.feed([buf(2, 5)])] == [(NEG_INF, BEHIND_ORIGIN)]
    # A new run begins at G_k as it stands (40): the floor of origin 2's tuples from then on.
    resumed.begin_run()
    assert [(d.thresholds[0], d.reasons[0]) for d in resumed.feed([buf(2, 6)])] == [(40, BEHIND_GLOBAL)]


def test_gap_wait_keeps_pending() -> None:
    eng = engine("origin")
    eng.feed([buf(1, 1, wm=10), buf(1, 3, wm=30)])
    eng.finish()
    row = eng.snapshot().origin(1, "default")
    assert (row.complete_prefix, row.pending_buffers) == (1, 1)


def test_regression_fail_clamp_and_inspect() -> None:
    with pytest.raises(WatermarkRegressionError) as err:
        engine().feed([buf(1, 1, wm=10), buf(1, 2, wm=5)])
    assert (err.value.origin, err.value.sequence) == (1, 2)
    assert "origin 1" in str(err.value) and "sequence 2" in str(err.value)

    clamp = engine(watermark_regression="clamp")
    clamp.feed([buf(1, 1, wm=10), buf(1, 2, wm=5), buf(1, 3, wm=10)])  # equal: no regression
    snap = clamp.snapshot()
    assert [(r.sequence, r.action) for r in snap.regressions] == [(2, "clamped")]
    assert snap.origin(1, "default").local_watermark == 10

    inspect = engine(strict=False)
    inspect.feed([buf(1, 1, wm=10), buf(1, 2, wm=5), buf(1, 3, wm=20)])
    snap = inspect.snapshot()
    assert snap.origin(1, "default").complete_prefix == 1
    assert [(r.sequence, r.action) for r in snap.regressions] == [(2, "held")]


def test_event_time_watermarks_never_regress() -> None:
    eng = engine(derived=True)
    eng.feed([buf(1, 1, wm=50), buf(1, 2, wm=20)])
    row = eng.snapshot().origin(1, "default")
    assert (row.complete_prefix, row.local_watermark) == (2, 50)
    assert eng.snapshot().regressions == ()


def test_expected_origin_holds_global_watermark() -> None:
    eng = engine("origin", origins=(1,), expected_origins=(7,))
    eng.feed([buf(1, 1, wm=10)])
    key = eng.snapshot().key("default")
    assert key.global_watermark == NEG_INF
    assert key.participants == (1, 7)


# -- invariants ----------------------------------------------------------------------------------


@st.composite
def archives(draw: st.DrawFn) -> list[Buffer]:
    """Random multi-origin buffer sets with chunks, gaps, idle markers and ingest times."""
    buffers = []
    for origin in range(1, draw(st.integers(1, 4)) + 1):
        wm = 0
        for seq in range(1, draw(st.integers(0, 6)) + 1):
            if draw(st.booleans()) and draw(st.booleans()) and draw(st.booleans()):
                continue  # a gap
            chunks = draw(st.integers(1, 3))
            for chunk in range(1, chunks + 1):
                wm += draw(st.integers(0, 20))
                watermark = draw(st.one_of(st.none(), st.just(wm)))
                buffers.append(
                    buf(
                        origin,
                        seq,
                        chunk,
                        last=chunk == chunks,
                        wm=watermark,
                        ingest=draw(st.integers(0, 200)),
                        idle=draw(st.integers(0, 9)) == 0,
                    )
                )
    return buffers


@given(
    archives(),
    st.sampled_from(["origin", "arrival"]),
    st.sampled_from(["wait", "skip"]),
    st.one_of(st.none(), st.integers(1, 80)),
)
def test_global_watermark_never_decreases(buffers: list[Buffer], mode: str, gap: str, timeout: int | None) -> None:
    origins = tuple(sorted({b.origin for b in buffers}))
    eng = engine(mode, origins=origins, gap_policy=gap, idle_timeout=timeout)
    seen = [NEG_INF]
    ordered = arrival_order(buffers)
    for fed in ordered:
        eng.feed([fed])
        seen.append(eng.snapshot().key("default").global_watermark)
    eng.finish()
    seen.append(eng.snapshot().key("default").global_watermark)
    assert seen == sorted(seen)
    snap = eng.snapshot()
    for row in snap.origins:  # a counted origin's local watermark is never below G
        if row.counted and mode == "origin":
            assert row.local_watermark >= snap.key("default").global_watermark


@given(archives(), st.sampled_from(["wait", "skip"]), st.randoms(use_true_random=False))
def test_origin_mode_is_order_and_batch_independent(buffers: list[Buffer], gap: str, rnd: random.Random) -> None:
    origins = tuple(sorted({b.origin for b in buffers}))

    def run(order: list[Buffer], batch: int) -> tuple[object, object]:
        eng = engine("origin", origins=origins, gap_policy=gap)
        decisions = []
        for start in range(0, len(order), batch):
            decisions += eng.feed(order[start : start + batch])
        decisions += eng.finish()
        return eng.snapshot(), sorted((d.origin, d.sequence, d.chunk, d.thresholds) for d in decisions)

    shuffled = list(buffers)
    rnd.shuffle(shuffled)
    assert run(sorted(buffers, key=lambda b: b.identity), len(buffers) + 1) == run(shuffled, rnd.randint(1, 5))


@given(
    archives(),
    st.sampled_from(["origin", "arrival"]),
    st.sampled_from(["wait", "skip"]),
    st.one_of(st.none(), st.integers(1, 80)),
    st.data(),
)
def test_a_snapshot_restored_into_a_new_engine_continues_exactly(
    buffers: list[Buffer], mode: str, gap: str, timeout: int | None, data: st.DataObject
) -> None:
    """Feeding a prefix, exporting the state through JSON and Parquet, restoring it into a fresh
    engine and feeding the rest gives the decisions and the snapshot of one uninterrupted engine."""
    import json
    import tempfile
    from pathlib import Path

    from replay.store import state as _state

    origins = tuple(sorted({b.origin for b in buffers}))
    ordered = arrival_order(buffers) if mode == "arrival" else buffers
    cut = data.draw(st.integers(0, len(ordered)))
    straight = engine(mode, origins=origins, gap_policy=gap, idle_timeout=timeout)
    expected = straight.feed(ordered) + straight.finish()

    first = engine(mode, origins=origins, gap_policy=gap, idle_timeout=timeout)
    decisions = first.feed(ordered[:cut])
    values, held = first.export_state()
    with tempfile.TemporaryDirectory() as tmp:
        _state.write_buffers(Path(tmp) / "held.parquet", held, 1)
        held = _state.read_buffers(Path(tmp) / "held.parquet", 1)
    second = engine(mode, origins=(), gap_policy=gap, idle_timeout=timeout)
    second.restore(json.loads(json.dumps(values)), held)
    decisions += second.feed(ordered[cut:]) + second.finish()
    assert decisions == expected
    assert second.snapshot() == straight.snapshot()
    assert all(second.seen(b.identity) for b in buffers)


@given(archives(), st.sampled_from(["origin", "arrival"]), st.data())
def test_seen_any_agrees_with_seen_buffer_by_buffer(buffers: list[Buffer], mode: str, data: st.DataObject) -> None:
    """``seen_any`` over packed buffers (deduplication asks it of a whole scan) answers what asking
    ``seen`` of each buffer does, whichever part of the archive was fed and whichever is asked about."""
    from replay.core.buffer import PackedBuffers

    origins = tuple(sorted({b.origin for b in buffers}))
    ordered = arrival_order(buffers) if mode == "arrival" else buffers
    eng = engine(mode, origins=origins)
    eng.feed(ordered[: data.draw(st.integers(0, len(ordered)))])
    asked = data.draw(st.lists(st.sampled_from(buffers), max_size=6)) if buffers else []
    asked += [buf(7, 3)]  # an origin the engine has not met
    assert eng.seen_any(PackedBuffers.of(asked)) == any(eng.seen(b.identity) for b in asked)
    assert not eng.seen_any(PackedBuffers.of([], 1))
