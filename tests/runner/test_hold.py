"""Origin mode with origins outside ``G_k``: what is late, and what the windows hold, does not
depend on where a run is cut into batches, nor on a crash in the middle of it (docs/semantics.md).

Origin 1 carries watermarks and drives ``G_k``; origin 2 carries none (it takes no part in the
key) and its tuples fall into windows whose end ``E_k`` has long passed; origin 3 first appears
in a later run, behind ``G_k``. ``replay.runner.hold`` keeps such windows open until those
tuples are decided, and the engine judges them against ``G_k`` as the run began.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from replay.core.buffer import Buffer, PackedBuffers
from replay.core.config import JobConfig
from replay.core.progress import KeySettings, ProgressEngine
from replay.core.timeutil import NEG_INF
from replay.runner import batch as batch_module
from replay.runner.hold import NO_HOLD, EmissionHold
from replay.runner.loop import run
from replay.store.outputs import read_table
from tests._archives import buffer, buffer_rows, write_archive
from tests.runner.test_job import digests, job
from tests.runner.test_job_vs_reference import _compare, job_view, reference_view, same_windows

SECOND = 1_000_000
#: A tumbling and a sliding aggregation, in windows of half a second and two seconds.
WINDOWS = [
    {"name": "half", "size": "500ms", "aggregations": [{"fn": "count"}, {"fn": "sum", "column": "value"}]},
    {
        "name": "sliding",
        "kind": "sliding",
        "size": "2s",
        "slide": "1s",
        "aggregations": [{"fn": "max", "column": "value"}],
    },
]


def _job(archive: Path, out: Path, **extra: Any) -> JobConfig:
    """``test_job``'s job in origin mode, over ``WINDOWS``."""
    return job(archive, out, lateness="origin", windows=WINDOWS, **extra)


def _first_file(archive: Path) -> None:
    """Origin 1, sequences 1 to 6, a watermark of ``s`` seconds each; origin 2 with no watermark,
    two tuples in the half second before ``s`` seconds (one on the window's last microsecond), and
    its sequence 3 missing (until the second file): its sequences 4 to 6 wait behind the gap, with
    tuples in windows ``E_k`` passes before the end of the run decides them."""
    rows = []
    for s in range(1, 7):
        rows += buffer_rows(1, s, watermark=s * SECOND, events=[(s * SECOND, 1, 1.0), (s * SECOND + 7, 2, 2.0)])
        if s != 3:
            events = [(s * SECOND - SECOND // 2 + s, 3, 10.0 * s), (s * SECOND - 1, 3, 1.0)]
            rows += buffer_rows(2, s, watermark=None, events=events)
    write_archive(archive, rows, name="part-00000.parquet")


def _second_file(archive: Path) -> None:
    """Origin 1 goes on to 9 seconds; origin 2's missing sequence 3 and two more, a tuple at 1 s and
    one at 7 s each; origin 3, new, with watermarks from 2 s to 5 s, a tuple half a second before
    each, and one at 6.5 s. In sequence order (origin mode) origin 1's sequence 8 moves ``E_k`` past
    the window [7 s, 7.5 s) one batch before origin 2's sequence 8 brings a tuple into it."""
    rows = []
    for s in range(7, 10):
        rows += buffer_rows(1, s, watermark=s * SECOND, events=[(s * SECOND, 1, 1.0)])
    for s in (3, 7, 8):
        rows += buffer_rows(2, s, watermark=None, events=[(SECOND + s, 3, 5.0), (7 * SECOND + s, 3, 5.0)])
    for s in range(1, 5):
        events = [((1 + s) * SECOND - SECOND // 2, 4, 3.0)] + ([(6 * SECOND + SECOND // 2, 4, 4.0)] if s == 4 else [])
        rows += buffer_rows(3, s, watermark=(1 + s) * SECOND, events=events)
    write_archive(archive, rows, name="part-00001.parquet")


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hold") / "archive"
    _first_file(path)
    return path


@pytest.mark.spark
@pytest.mark.parametrize(("gap_policy", "ranged"), [("wait", False), ("skip", False), ("skip", True)])
def test_an_origin_without_watermarks_gives_the_same_windows_whatever_the_cut(
    archive: Path, tmp_path: Path, spark: Any, gap_policy: str, ranged: bool
) -> None:
    """``ranged``: a backfill range around the whole archive, for which the scan reads every copy's
    event times, so that windows are held exactly as far as the tuples to come need (without it,
    a copy of unknown event times holds every window until it is decided)."""
    bounds: dict[str, int | None] = {"start": 0, "end": 100 * SECOND} if ranged else {"start": None, "end": None}
    whole = _job(archive, tmp_path / "whole", gap_policy=gap_policy)
    if not ranged:
        expected_view = reference_view(whole)
        view = job_view(whole, spark)
        same_windows(view["windows"], expected_view["windows"])
        assert (view["late"], view["open"]) == (expected_view["late"], expected_view["open"])
        # Origin 2's tuples are never late in a single run (its own promise is minus infinity).
        assert view["late"] == []
    else:
        run(whole, spark=spark, **bounds)
    expected = digests(whole)
    windows = read_table(whole.output, "windows")  # type: ignore[arg-type]
    assert windows.num_rows > 0
    for max_buffers, per_pass in ((1, 4), (2, 2), (3, 32)):
        config = _job(
            archive,
            tmp_path / f"b{max_buffers}-{per_pass}",
            gap_policy=gap_policy,
            micro_batch={"max_buffers": max_buffers, "max_batches_per_pass": per_pass},
        )
        summary = run(config, spark=spark, **bounds)
        assert summary.batches > 1
        assert digests(config) == expected, f"max_buffers {max_buffers}, {per_pass} batches per pass"


def _emitted_by_batch(config: JobConfig) -> dict[int, int]:
    """How many windows each batch emitted: the rows of its ``windows`` directory."""
    import re

    import pyarrow.parquet as pq

    counts: dict[int, int] = {}
    for part in sorted((Path(config.output) / "data" / "windows").rglob("*.parquet")):
        found = re.search(r"-b(\d{8})-", part.parent.name)
        assert found is not None, part
        batch = int(found.group(1))
        counts[batch] = counts.get(batch, 0) + pq.ParquetFile(part).metadata.num_rows
    return counts


@pytest.mark.spark
def test_with_a_watermark_column_the_hold_reads_the_held_copies_event_times(
    archive: Path, tmp_path: Path, spark: Any
) -> None:
    """The scan of a run with a ``watermark`` column reads no event time, so the run reads those of
    origin 2's copies before its first batch and holds windows only as far as they need: each batch
    emits what it emits when the scan reads every event time (a backfill range around the whole
    archive), not everything at the end of the run."""
    cut = {"micro_batch": {"max_buffers": 2, "max_batches_per_pass": 32}}
    plain = _job(archive, tmp_path / "plain", **cut)
    ranged = _job(archive, tmp_path / "ranged", **cut)
    run(plain, spark=spark)
    run(ranged, spark=spark, start=-100 * SECOND, end=100 * SECOND)
    assert digests(plain) == digests(ranged)
    emitted = _emitted_by_batch(plain)
    assert emitted == _emitted_by_batch(ranged)
    assert len(emitted) > 2  # windows leave in many batches, not all in the last


def _two_runs(archive: Path, out: Path, spark: Any, **extra: Any) -> JobConfig:
    """The first file in one run, then the second file in a run cut by ``extra``."""
    run(_job(archive, out), spark=spark)
    _second_file(archive)
    return _job(archive, out, **extra)


@st.composite
def silent_archives(draw: st.DrawFn) -> tuple[list[list[dict[str, Any]]], dict[str, Any], dict[str, Any]]:
    """Two origins with watermarks and one without, gaps, tuples anywhere in the stream's time
    (microseconds 0 to 2,000, windows of 100 us): ``_compare``'s (files, job settings, types)."""
    rows: list[dict[str, Any]] = []
    for origin in (1, 2, 3):
        wm = 0
        for seq in range(1, draw(st.integers(2, 6)) + 1):
            if seq > 1 and draw(st.integers(0, 5)) == 0:
                continue  # a gap
            wm += draw(st.integers(0, 500))
            events = [
                (draw(st.integers(0, 2_000)), draw(st.integers(0, 2)), draw(st.sampled_from([1.0, 2.5])))
                for _ in range(draw(st.integers(0, 3)))
            ]
            rows += buffer_rows(origin, seq, watermark=None if origin == 3 else wm, events=events)
    job = {
        "lateness": "origin",
        "gap_policy": draw(st.sampled_from(["wait", "skip"])),
        "watermarks": {
            "default": {"watermark": "watermark_ts", "allowed_lateness": draw(st.sampled_from(["0s", "150us"]))}
        },
    }
    return [rows], job, {}


@pytest.mark.spark
@settings(
    max_examples=int(os.environ.get("REPLAY_DEEP_EXAMPLES", "5")),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    deadline=None,
)
@given(silent_archives(), st.integers(1, 4))
def test_a_run_with_an_origin_without_watermarks_equals_the_reference(
    spark: Any, drawn: tuple[list[list[dict[str, Any]]], dict[str, Any], dict[str, Any]], max_buffers: int
) -> None:
    """Cut into batches of 1 to 4 buffers, a run gives the reference model's windows, late tuples
    and open windows, which know no batches."""
    windows = [{"name": "w", "size": "100us", "aggregations": [{"fn": "count"}, {"fn": "sum", "column": "value"}]}]
    _compare(spark, drawn, {"windows": windows, "micro_batch": {"max_buffers": max_buffers}})


@pytest.mark.spark
def test_a_later_run_judges_origins_outside_g_against_g_as_the_run_began(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected: dict[str, str] | None = None
    plans: list[dict[str, Any]] = [
        {},
        {"micro_batch": {"max_buffers": 1, "max_batches_per_pass": 1}},
        {"micro_batch": {"max_buffers": 2, "max_batches_per_pass": 3}},
    ]
    for number, plan in enumerate(plans):
        archive = tmp_path / f"a{number}" / "archive"
        _first_file(archive)
        config = _two_runs(archive, tmp_path / f"r{number}", spark, **plan)
        summary = run(config, spark=spark)
        if expected is None:
            expected = digests(config)
            late = read_table(config.output, "late").to_pylist()  # type: ignore[arg-type]
            # Behind G_k as the second run began (6 s): origin 2's tuples before it (two in each
            # sequence the first run left pending behind its gap, one in each new sequence) and
            # origin 3's before 6 s; not those at 6.5 s and 7 s, though E_k passes them in the run.
            assert {(r["origin_id"], r["reason"]) for r in late} == {
                (2, "behind_global_watermark"),
                (3, "behind_global_watermark"),
            }
            assert {r["violated_watermark"].timestamp() for r in late} == {6.0}
            assert sum(summary.late_tuples.values()) == len(late) == 3 * 2 + 3 + 4
        else:
            assert summary.batches > 2
            assert digests(config) == expected, plan

    # The same second run stopped after its fifth batch and resumed: the resumed part keeps the
    # run's floor (from the engine's snapshot) and its hold.
    archive = tmp_path / "crash" / "archive"
    _first_file(archive)
    config = _two_runs(archive, tmp_path / "crash", spark, **plans[1])
    # Batch 9 (origin 1, sequence 8) moved G_k to 8 s.
    assert _stopped_and_resumed(config, spark, monkeypatch, before_batch=10).resumed
    assert digests(config) == expected


def _stopped_and_resumed(config: JobConfig, spark: Any, monkeypatch: pytest.MonkeyPatch, *, before_batch: int) -> Any:
    """Run ``config`` stopped just before batch ``before_batch``, then again: the resumed run's summary."""
    real_fault = batch_module.fault

    def stop(point: str, batch: int) -> None:
        if point == "before_batch" and batch == before_batch:
            raise RuntimeError("stopped")
        real_fault(point, batch)

    monkeypatch.setattr(batch_module, "fault", stop)
    with pytest.raises(RuntimeError, match="stopped"):
        run(config, spark=spark)
    monkeypatch.setattr(batch_module, "fault", real_fault)
    return run(config, spark=spark)


def test_the_hold_follows_the_tuples_still_to_come_from_origins_outside_g() -> None:
    """Without Spark: the hold per key before and after each batch of a planned run."""
    engine = ProgressEngine(
        keys=[KeySettings(name="default", allowed_lateness=0, derived=False)],  # type: ignore[arg-type]
        mode="origin",
        participants={"default": [1]},
    )

    def copy(origin: int, sequence: int, low: int | None, wm: int | None = None, tuples: int = 1) -> Buffer:
        return buffer(
            origin=origin, sequence=sequence, watermarks=(wm,), min_event=(low,), max_event=(low,), tuples=tuples
        )

    counted_only = [PackedBuffers.of([copy(1, 1, 10, wm=10)], 1), PackedBuffers.of([copy(1, 2, 20, wm=20)], 1)]
    assert EmissionHold.of(engine, counted_only, {}, known=[True]) is None  # the common case holds nothing

    plan = [
        PackedBuffers.of([copy(1, 1, 10, wm=10), copy(2, 1, 50)], 1),
        PackedBuffers.of([copy(1, 2, 20, wm=20), copy(2, 3, 30)], 1),  # origin 2's sequence 3 waits for 2
        PackedBuffers.of([copy(1, 3, 30, wm=30), copy(2, 4, 70), copy(2, 5, None, tuples=0)], 1),
        PackedBuffers.of([copy(2, 2, 40)], 1),
    ]
    hold = EmissionHold.of(engine, plan, {}, known=[True])
    assert hold is not None
    assert hold.before(engine, 0, {}) == (30,)  # the smallest of every copy of origin 2
    pending: dict[tuple[int, int, int], Buffer] = {}
    afters = []
    for index, batch in enumerate(plan):
        pending.update({b.identity: b for b in batch})
        for decision in engine.feed(list(batch)):
            del pending[decision.origin, decision.sequence, decision.chunk]
        afters.append(hold.after(engine, index, pending, last=index == len(plan) - 1)[0])
    # After batch 0: origin 2's copies to come (30 and up). After 1: sequence 3 (30) waits behind the
    # gap, pending. After 2: the pending 30, 70; punctuation holds nothing. After the last: no hold.
    assert afters == [30, 30, 30, NO_HOLD]
    # Event times the scan did not read: a copy with tuples holds every window until it is decided.
    unknown = EmissionHold.of(engine, [PackedBuffers.of([copy(2, 6, None)], 1)], {}, known=[False])
    assert unknown is not None and unknown.before(engine, 0, {}) == (NEG_INF,)


def test_event_times_the_scan_did_not_read_are_read_from_the_held_copies_files() -> None:
    """Without Spark: with ``read_lows`` the hold asks for the files of the held origins' copies
    with tuples only, and holds as far as their event times need; when the second reading misses
    a copy (its file changed), every such copy holds every window, as if nothing was read."""
    engine = ProgressEngine(
        keys=[KeySettings(name="default", allowed_lateness=0, derived=False)],  # type: ignore[arg-type]
        mode="origin",
        participants={"default": [1]},
    )

    def copy(origin: int, sequence: int, file: str, row: int, wm: int | None = None, tuples: int = 1) -> Buffer:
        return buffer(origin=origin, sequence=sequence, watermarks=(wm,), file=file, row_start=row, tuples=tuples)

    plan = [
        PackedBuffers.of([copy(1, 1, "a", 0, wm=10), copy(2, 1, "b", 0)], 1),
        PackedBuffers.of([copy(1, 2, "c", 0, wm=20), copy(2, 2, "b", 5), copy(2, 3, "d", 0, tuples=0)], 1),
    ]
    pending = {(2, 9, 1): copy(2, 9, "e", 3)}
    lows = {("b", 0): (50,), ("b", 5): (40,), ("e", 3): (45,)}
    asked: list[list[str]] = []

    def read(files: Any) -> dict[tuple[str, int], tuple[int | None, ...]]:
        asked.append(list(files))
        return lows

    hold = EmissionHold.of(engine, plan, pending, known=[False], read_lows=read)
    assert hold is not None
    assert asked == [["b", "e"]]  # not origin 1's files, nor "d" (punctuation only)
    assert hold.before(engine, 0, pending) == (40,)
    assert hold.after(engine, 0, pending, last=False) == (40,)
    assert hold.after(engine, 1, pending, last=False) == (45,)  # the pending copy
    assert hold.after(engine, 1, pending, last=True) == (NO_HOLD,)
    del lows["b", 5]
    again = EmissionHold.of(engine, plan, pending, known=[False], read_lows=read)
    assert again is not None and again.before(engine, 0, pending) == (NEG_INF,)
    assert again.after(engine, 1, pending, last=False) == (NEG_INF,)
    # Read again without an event time for the key, a copy is in no window: it holds nothing (while
    # a copy whose event times were never read holds every window).
    lows["b", 5] = (None,)
    timeless = EmissionHold.of(engine, plan, pending, known=[False], read_lows=read)
    assert timeless is not None and timeless.before(engine, 0, pending) == (45,)
    assert timeless.after(engine, 0, pending, last=True) == (NO_HOLD,)


_ONE_SECOND = [{"name": "w", "size": "1s", "aggregations": [{"fn": "count"}]}]


def _joiner_runs(archive: Path, *, by_closing: bool) -> list[list[dict[str, Any]]]:
    """The rows of two runs' files. Origins 1 and 2 end the first run at 1 s (``G_k``); in the
    second they reach 3 s, and origin 3 joins behind ``G_k`` (its first sequence at 0.9 s) and
    ends the run at 2 s: by its own second sequence, or (``by_closing``) by ``gap_policy: skip``
    closing its incomplete second sequence, whose one chunk holds 2 s, at the end of the run."""
    first = buffer_rows(1, 1, events=[(SECOND, 1, 1.0)]) + buffer_rows(2, 1, events=[(SECOND, 2, 1.0)])
    second = buffer_rows(1, 2, events=[(3 * SECOND, 1, 1.0)]) + buffer_rows(2, 2, events=[(3 * SECOND, 2, 1.0)])
    second += buffer_rows(3, 1, events=[(SECOND * 9 // 10, 3, 1.0)])
    if by_closing:
        second += buffer_rows(3, 2, 1, last=False, events=[(2 * SECOND, 3, 1.0)])
        second += buffer_rows(3, 3, events=[(SECOND * 3 // 2, 3, 1.0)])
    else:
        second += buffer_rows(3, 2, events=[(2 * SECOND, 3, 1.0)])
    return [first, second]


@pytest.mark.spark
@pytest.mark.parametrize("by_closing", [False, True], ids=["by-its-sequences", "by-the-skip-closing"])
def test_an_origin_that_joins_behind_g_counts_once_caught_up_whatever_the_cut(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, by_closing: bool
) -> None:
    """An origin that joins in a later run behind ``G_k`` is left out of it until it catches up.
    Stepped batch by batch, ``G_k`` reached 3 s while origin 3 was still behind it, in batches of
    one buffer but not in one batch, and closed the windows up to 3 s in the one case only. The
    run's ``G_k`` now never passes the value the run ends at: one step from the run's floor over
    where every origin ends the run, 2 s here. The same digests for every cut, and the reference
    model's windows, late tuples and open windows."""
    expected: dict[str, str] | None = None
    for size in (None, 1, 2):
        root = tmp_path / f"b{size}"
        archive = root / "archive"
        extra: dict[str, Any] = {"micro_batch": {"max_buffers": size}}
        if by_closing:
            extra["gap_policy"] = "skip"
        config = job(
            archive,
            root,
            lateness="origin",
            windows=_ONE_SECOND,
            **extra,
        )
        read: list[list[Path]] = []
        for number, rows in enumerate(_joiner_runs(archive, by_closing=by_closing)):
            path = write_archive(archive, rows, name=f"part-{number:05d}.parquet")
            summary = run(config, spark=spark)
            if number == 1:
                reference = reference_view(config, read)
                actual = job_view(config, spark)
                same_windows(actual["windows"], reference["windows"])
                assert actual["late"] == reference["late"] and actual["open"] == reference["open"], size
            read.append([path])
        assert summary.watermarks["default"][0] == 2 * SECOND, (size, summary.watermarks)
        if expected is None:
            expected = digests(config)
        else:
            assert digests(config) == expected, size

    # Batches of one buffer, the second run stopped before its third batch and resumed: the resumed
    # part bounds G_k from its snapshot and its remaining batches the same way.
    root = tmp_path / "crash"
    archive = root / "archive"
    extra = {"micro_batch": {"max_buffers": 1}} | ({"gap_policy": "skip"} if by_closing else {})
    config = job(archive, root, lateness="origin", windows=_ONE_SECOND, **extra)
    first, second = _joiner_runs(archive, by_closing=by_closing)
    write_archive(archive, first, name="part-00000.parquet")
    run(config, spark=spark)
    write_archive(archive, second, name="part-00001.parquet")
    # The first run's two batches, then two of the second.
    assert _stopped_and_resumed(config, spark, monkeypatch, before_batch=5).resumed
    assert digests(config) == expected
