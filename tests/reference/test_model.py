"""The reference model (replay.reference) on exact cases from docs/semantics.md and docs/archive.md.

Every archive is written with tests/_archives.py into pytest's tmp_path. Times are
int microseconds; ``NEG_INF`` is "no watermark yet".
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from replay.core.config import JobConfig, parse_config
from replay.core.errors import ConfigError, ConflictingDuplicateError, WatermarkRegressionError
from replay.core.timeutil import NEG_INF
from replay.reference.model import run_reference
from replay.reference.results import OriginKeyProgress, ReferenceResult
from tests._archives import buffer_rows, write_archive


def job(tmp_path: Any, **settings: Any) -> JobConfig:
    return parse_config({"archive": str(tmp_path / "archive"), **settings})


def replay(
    tmp_path: Any,
    rows: list[dict[str, Any]],
    *,
    lateness: str | None = None,
    types: dict[str, pa.DataType] | None = None,
    **settings: Any,
) -> ReferenceResult:
    write_archive(tmp_path / "archive", rows, types=types)
    return run_reference(tmp_path / "archive", job(tmp_path, **settings), lateness=lateness)


def thresholds_in_order(result: ReferenceResult, identities: list[tuple[int, int]], key: str = "default") -> list:
    """The thresholds of single-chunk buffers (origin, sequence), in the order given."""
    values = []
    for origin, sequence in identities:
        decision = result.thresholds[(origin, sequence, 1, key)]
        values.append(None if decision is None else decision[0])
    return values


def tumbling(size: str, *, offset: str = "0s", **extra: Any) -> dict[str, Any]:
    aggregations = extra.pop("aggregations", [{"fn": "count"}])
    return {"name": "w", "kind": "tumbling", "size": size, "offset": offset, "aggregations": aggregations, **extra}


def watermark_key(allowed_lateness: str = "0s", watermark: str | None = "watermark_ts") -> dict[str, Any]:
    return {"default": {"event_time": "event_time", "watermark": watermark, "allowed_lateness": allowed_lateness}}


# --------------------------------------------------------------------------- section 2: complete prefix


@pytest.mark.parametrize(
    ("sequences", "prefix", "gaps"),
    [
        ([1, 2, 3, 4, 5], 5, set()),  # NebulaStream: seen all
        ([1, 2, 3, 5, 6], 3, {4}),  # missing 4
        ([1, 3, 4, 6], 1, {2, 5}),  # missing 2
    ],
)
def test_complete_prefix_is_the_longest_run_of_complete_sequences(tmp_path, sequences, prefix, gaps):
    rows = [row for s in reversed(sequences) for row in buffer_rows(1, s, watermark=10 * s)]  # order is irrelevant
    result = replay(tmp_path, rows)
    assert result.lateness == "origin"
    assert result.progress[(1, "default")].complete_prefix == prefix
    assert result.progress[(1, "default")].local_watermark == 10 * prefix
    assert result.progress[(1, "default")].pending_buffers == len(sequences) - prefix
    assert result.gaps == {(1, s) for s in gaps}
    assert result.incomplete == frozenset()
    assert result.stream_cut == {1: (max(sequences), 1)}


@pytest.mark.parametrize(
    ("chunk_base", "chunks", "last", "complete"),
    [
        (1, [1], 1, True),
        (1, [3, 1, 2], 3, True),  # out of order
        (1, [1, 3], 3, False),  # chunk 2 missing
        (1, [2], 2, False),  # chunk 1 missing
        (1, [1, 2], None, False),  # no last chunk yet
        (0, [0], 0, True),
        (0, [2, 0, 1], 2, True),
        (0, [1, 2], 2, False),  # chunk 0 missing
    ],
)
def test_sequence_completion(tmp_path, chunk_base, chunks, last, complete):
    rows = [row for c in chunks for row in buffer_rows(1, 1, c, last=c == last, watermark=100)]
    result = replay(tmp_path, rows, chunk_base=chunk_base)
    progress = result.progress[(1, "default")]
    assert progress.complete_prefix == (1 if complete else 0)
    assert progress.local_watermark == (100 if complete else NEG_INF)
    assert progress.pending_buffers == (0 if complete else len(chunks))
    assert result.incomplete == (frozenset() if complete else {(1, 1)})


@pytest.mark.parametrize("chunk_base", [0, 1])
def test_multi_chunk_sequence_watermark_is_the_maximum_over_its_chunks(tmp_path, chunk_base):
    # Chunks archived as 3, 1, 2 (2, 0, 1 from base 0); the last chunk carries the lowest watermark.
    marks = {chunk_base + 2: 100, chunk_base: 300, chunk_base + 1: 200}
    rows = [row for c, w in marks.items() for row in buffer_rows(1, 1, c, last=c == chunk_base + 2, watermark=w)]
    rows += buffer_rows(1, 2, chunk_base, watermark=400, events=[(250, 1), (300, 1)])
    result = replay(tmp_path, rows, chunk_base=chunk_base)
    assert result.progress[(1, "default")].local_watermark == 400
    assert result.thresholds[(1, 2, chunk_base, "default")] == (300, "behind_origin_watermark")
    assert [(r.row, r.violated_watermark) for r in result.late] == [((250, 1), 300)]


# --------------------------------------------------------------------------- section 2: global watermark


def test_hazelcast_jet_coalescing_example(tmp_path):
    # Jet's inputs 0 and 1 are origins 1 and 2; every wm(...) is one punctuation buffer.
    arrivals = [(1, 1, 10), (2, 1, 12), (1, 2, 11), (2, 2, 13), (1, 3, 14), (2, 3, 13)]
    rows = [row for i, (o, s, w) in enumerate(arrivals) for row in buffer_rows(o, s, watermark=w, ingest=i)]
    result = replay(tmp_path, rows)
    assert result.lateness == "arrival"
    # E(p) before each buffer: nothing until both inputs spoke, then 10, 11, still 11, then 13.
    assert thresholds_in_order(result, [(o, s) for o, s, _ in arrivals]) == [NEG_INF, NEG_INF, 10, 11, 11, 13]
    assert result.keys["default"].global_watermark == 13
    assert result.keys["default"].time_window == (13, 14)


@pytest.mark.parametrize(
    ("idle", "expected"), [(True, [NEG_INF, NEG_INF, 5, 10, 20, 20]), (False, [NEG_INF] * 2 + [5] * 4)]
)
def test_an_idle_punctuation_buffer_excludes_its_origin(tmp_path, idle, expected):
    arrivals = [(1, 1, 10), (2, 1, 5), (2, 2, None), (1, 2, 20), (1, 3, 20), (1, 4, 20)]
    rows = [
        row
        for i, (o, s, w) in enumerate(arrivals)
        for row in buffer_rows(o, s, watermark=w, ingest=i, idle=idle and (o, s) == (2, 2))
    ]
    result = replay(tmp_path, rows)
    assert thresholds_in_order(result, [(o, s) for o, s, _ in arrivals]) == expected
    assert result.keys["default"].global_watermark == expected[-1]


@pytest.mark.parametrize(("clock", "probe_threshold"), [(10, 5), (11, 30)])
def test_idle_timeout_is_reached_at_exactly_the_timeout(tmp_path, clock, probe_threshold):
    # idle when clock - last ingest >= idle_timeout: origin 2 last sent at 1, timeout 10us.
    arrivals = [(1, 1, 10, 0), (2, 1, 5, 1), (1, 2, 20, 5), (1, 3, 30, clock), (1, 4, 30, clock + 1)]
    rows = [row for o, s, w, i in arrivals for row in buffer_rows(o, s, watermark=w, ingest=i)]
    result = replay(tmp_path, rows, idle_timeout="10us")
    assert thresholds_in_order(result, [(o, s) for o, s, _, _ in arrivals]) == [NEG_INF, NEG_INF, 5, 5, probe_threshold]
    assert result.keys["default"].global_watermark == 30


@pytest.mark.parametrize(
    ("idle_timeout", "expected_origins", "thresholds", "final"),
    [
        (None, [], [NEG_INF, NEG_INF, NEG_INF], 5),  # origin 2 counts (as -inf) before it arrives
        ("10us", [], [NEG_INF, NEG_INF, 20], 20),  # not seen for 10us since the archive's first ingest: idle
        ("10us", [2], [NEG_INF, NEG_INF, NEG_INF], 5),  # an expected origin that sent nothing is never idle
    ],
)
def test_an_origin_not_seen_yet(tmp_path, idle_timeout, expected_origins, thresholds, final):
    arrivals = [(1, 1, 10, 0, []), (1, 2, 20, 10, []), (2, 1, 5, 20, [(15, 1)])]
    rows = [row for o, s, w, i, ev in arrivals for row in buffer_rows(o, s, watermark=w, ingest=i, events=ev)]
    result = replay(tmp_path, rows, idle_timeout=idle_timeout, expected_origins=expected_origins)
    assert thresholds_in_order(result, [(1, 1), (1, 2), (2, 1)]) == thresholds
    assert result.keys["default"].global_watermark == final
    assert [r.row for r in result.late] == ([(15, 1)] if thresholds[2] == 20 else [])


def test_all_idle_flushes_to_the_maximum_local_watermark(tmp_path):
    arrivals = [(1, 1, 10, False), (2, 1, 20, False), (2, 2, None, True), (1, 2, None, True)]
    rows = [
        row for i, (o, s, w, idle) in enumerate(arrivals) for row in buffer_rows(o, s, watermark=w, ingest=i, idle=idle)
    ]
    result = replay(tmp_path, rows)
    assert thresholds_in_order(result, [(o, s) for o, s, _, _ in arrivals]) == [NEG_INF, NEG_INF, 10, 10]
    assert result.keys["default"].global_watermark == 20
    assert result.keys["default"].time_window == (10, 20)


def test_an_origin_back_from_idleness_is_left_out_until_it_catches_up(tmp_path):
    arrivals = [
        (1, 1, 10, False, []),
        (2, 1, 5, False, []),
        (2, 2, None, True, []),  # origin 2 idle: G moves to origin 1's 10
        (1, 2, 30, False, []),
        (2, 3, 20, False, [(25, 7)]),  # back, behind G = 30: its tuple at 25 is late
        (1, 3, 40, False, []),  # origin 2 (20) is left out: G moves to 40
        (2, 4, 50, False, []),  # caught up: counted again
        (1, 4, 60, False, []),
    ]
    rows = [
        row
        for i, (o, s, w, idle, ev) in enumerate(arrivals)
        for row in buffer_rows(o, s, watermark=w, ingest=i, idle=idle, events=ev)
    ]
    result = replay(tmp_path, rows)
    assert thresholds_in_order(result, [a[:2] for a in arrivals]) == [NEG_INF, NEG_INF, 5, 10, 30, 30, 40, 40]
    assert [(r.origin_id, r.row, r.violated_watermark, r.reason) for r in result.late] == [
        (2, (25, 7), 30, "behind_global_watermark")
    ]
    assert result.keys["default"].global_watermark == 50
    assert result.keys["default"].time_window == (50, 60)


@pytest.mark.parametrize(
    ("lateness", "expected_origins", "final"),
    [
        ("origin", [], 10),
        ("origin", [1, 2, 3], NEG_INF),
        ("arrival", [], 20),  # the 1us timeout makes origin 1 idle once origin 2 arrives
        ("arrival", [1, 2, 3], NEG_INF),  # origin 3 never sent anything: never idle, holds G
    ],
)
def test_an_expected_origin_that_sent_nothing_holds_the_global_watermark(tmp_path, lateness, expected_origins, final):
    rows = [*buffer_rows(1, 1, watermark=10, ingest=1), *buffer_rows(2, 1, watermark=20, ingest=2)]
    result = replay(tmp_path, rows, lateness=lateness, expected_origins=expected_origins, idle_timeout="1us")
    assert result.keys["default"].global_watermark == final
    if expected_origins:
        assert result.progress[(3, "default")] == OriginKeyProgress(
            origin=3, key="default", complete_prefix=0, local_watermark=NEG_INF, pending_buffers=0
        )
        assert 3 not in result.stream_cut


# --------------------------------------------------------------------------- section 3: origin lateness and gaps


@pytest.mark.parametrize(
    ("allowed_lateness", "threshold", "late"),
    [("0s", 100, [89, 90, 99]), ("10us", 90, [89]), ("1s", 100 - 1_000_000, [])],
)
def test_origin_lateness_threshold(tmp_path, allowed_lateness, threshold, late):
    rows = [
        *buffer_rows(1, 1, watermark=100, events=[(50, 1)]),
        *buffer_rows(1, 2, watermark=200, events=[(89, 1), (90, 1), (99, 1), (100, 1)]),
    ]
    result = replay(tmp_path, rows, watermarks=watermark_key(allowed_lateness), windows=[tumbling("1s")])
    assert result.thresholds[(1, 1, 1, "default")] == (NEG_INF, "behind_origin_watermark")
    assert result.thresholds[(1, 2, 1, "default")] == (threshold, "behind_origin_watermark")
    assert [r.row[0] for r in result.late] == late
    assert {r.violated_watermark for r in result.late} <= {threshold}
    on_time = sum(dict(w.values)["count"] for w in result.windows + result.open_windows)
    assert on_time == 5 - len(late)  # late tuples never enter a window


def test_tuples_behind_a_gap_stay_pending(tmp_path):
    rows = [
        *buffer_rows(1, 1, watermark=100, events=[(50, 1)]),
        *buffer_rows(1, 3, watermark=300, events=[(10, 1), (20, 1)]),
    ]
    result = replay(tmp_path, rows, windows=[tumbling("1s")])
    assert result.gaps == {(1, 2)}
    assert result.thresholds[(1, 1, 1, "default")] == (NEG_INF, "behind_origin_watermark")
    assert result.thresholds[(1, 3, 1, "default")] is None
    assert result.pending_tuples == 2
    assert result.progress[(1, "default")].pending_buffers == 1
    assert result.late == ()
    assert [dict(w.values)["count"] for w in result.open_windows] == [1]  # only the tuple at 50
    assert result.tuples_read == 3


@pytest.mark.parametrize(
    ("gap_policy", "sequence_3_mark", "prefix", "local", "late", "pending"),
    [
        ("wait", 150, 1, 100, [], 3),
        ("skip", 150, 4, 250, [140, 240], 0),  # s3 closed with its chunk's 150, s4 checked against it
        ("skip", 50, 4, 250, [240], 0),  # a closed sequence's lower watermark is no regression: W(3) = 100
    ],
)
def test_gap_policy_skip_closes_missing_and_incomplete_sequences_at_the_end(
    tmp_path, gap_policy, sequence_3_mark, prefix, local, late, pending
):
    rows = [
        *buffer_rows(1, 1, watermark=100, events=[(50, 1)]),
        # sequence 2 missing
        *buffer_rows(1, 3, 1, last=False, watermark=sequence_3_mark, events=[(120, 1)]),
        *buffer_rows(1, 4, watermark=250, events=[(140, 1)]),
        *buffer_rows(1, 5, 1, last=False, watermark=400, events=[(240, 1)]),  # the highest: never closed
    ]
    result = replay(tmp_path, rows, gap_policy=gap_policy)
    assert result.gaps == {(1, 2)}
    assert result.incomplete == {(1, 3), (1, 5)}
    assert result.skipped == ({(1, 2), (1, 3)} if gap_policy == "skip" else frozenset())
    assert result.progress[(1, "default")].complete_prefix == prefix
    assert result.progress[(1, "default")].local_watermark == local
    assert result.keys["default"].global_watermark == local
    assert [r.row[0] for r in result.late] == late
    assert result.pending_tuples == pending
    assert result.regressions == frozenset()


# --------------------------------------------------------------------------- regressions


@pytest.mark.parametrize("lateness", ["origin", "arrival"])
def test_watermark_regression_fails_by_default(tmp_path, lateness):
    rows = [*buffer_rows(1, 1, watermark=200, ingest=1), *buffer_rows(1, 2, watermark=100, ingest=2)]
    with pytest.raises(WatermarkRegressionError) as raised:
        replay(tmp_path, rows, lateness=lateness)
    assert (raised.value.origin, raised.value.sequence, raised.value.where.extra) == (1, 2, {"key": "default"})
    assert raised.value.code == "progress.watermark_regression"


def test_watermark_regression_clamp_holds_the_previous_watermark(tmp_path):
    rows = [
        *buffer_rows(1, 1, watermark=200),
        *buffer_rows(1, 2, watermark=100, events=[(150, 1)]),
        *buffer_rows(1, 3, watermark=300, events=[(150, 2)]),
    ]
    result = replay(tmp_path, rows, watermark_regression="clamp")
    assert result.regressions == {(1, 2, "default")}
    assert result.thresholds[(1, 3, 1, "default")] == (200, "behind_origin_watermark")  # W(2) held at 200
    assert [(r.row, r.violated_watermark) for r in result.late] == [((150, 1), 200), ((150, 2), 200)]
    assert result.progress[(1, "default")].local_watermark == 300


@pytest.mark.parametrize(
    "marks",
    [
        [200, 200, 300],  # an equal watermark is not a regression
        [200, None, 300],  # a null watermark makes no new promise: W(2) = W(1)
    ],
)
def test_no_regression(tmp_path, marks):
    rows = [row for s, w in enumerate(marks, 1) for row in buffer_rows(1, s, watermark=w)]
    result = replay(tmp_path, rows)
    assert result.regressions == frozenset()
    assert result.thresholds[(1, 3, 1, "default")] == (200, "behind_origin_watermark")


def test_a_regression_beyond_a_gap_is_not_checked(tmp_path):
    rows = [*buffer_rows(1, 1, watermark=200), *buffer_rows(1, 3, watermark=100)]
    result = replay(tmp_path, rows)
    assert result.progress[(1, "default")].complete_prefix == 1


def test_event_time_watermarks_are_cumulative_and_never_regress(tmp_path):
    rows = [
        *buffer_rows(1, 1, events=[(100, 1), (200, 1)]),
        *buffer_rows(1, 2, events=[(50, 1)]),
        *buffer_rows(1, 3, events=[(300, 1)]),
    ]
    result = replay(tmp_path, rows)  # no watermark_ts column, watermark_regression: fail
    assert result.regressions == frozenset()
    assert result.thresholds[(1, 2, 1, "default")] == (200, "behind_origin_watermark")
    assert result.thresholds[(1, 3, 1, "default")] == (200, "behind_origin_watermark")
    assert [(r.row, r.violated_watermark) for r in result.late] == [((50, 1), 200)]
    assert result.progress[(1, "default")].local_watermark == 300


# --------------------------------------------------------------------------- section 1: duplicates and conflicts


def test_an_identical_copy_in_another_file_is_a_counted_duplicate(tmp_path):
    events = [(5, 1, 1.0), (6, 1, 2.0)]
    write_archive(tmp_path / "archive", buffer_rows(1, 1, watermark=10, events=events), name="a.parquet")
    write_archive(tmp_path / "archive", buffer_rows(1, 1, watermark=10, events=events[::-1]), name="b.parquet")
    result = run_reference(tmp_path / "archive", job(tmp_path, windows=[tumbling("10us")]))
    assert result.duplicate_copies == {1: 1}
    assert result.duplicate_tuples == {1: 2}
    assert result.tuples_read == 4
    assert [dict(w.values)["count"] for w in result.windows] == [2]


def test_the_same_identity_twice_in_one_file_is_two_copies(tmp_path):
    rows = [*buffer_rows(1, 1, watermark=10), *buffer_rows(1, 2, watermark=20), *buffer_rows(1, 1, watermark=10)]
    result = replay(tmp_path, rows)
    assert result.duplicate_copies == {1: 1}
    assert result.duplicate_tuples == {1: 0}  # punctuation rows are no tuples
    assert result.tuples_read == 0


def test_the_first_copy_by_ingest_ts_gives_the_arrival_position(tmp_path):
    # a.parquet sorts first, but its copy of (1, 2) was ingested last: the copy in b.parquet
    # (ingested at 3) places the buffer, so the probe at 50 sees min(30, 20) = 20.
    write_archive(tmp_path / "archive", buffer_rows(1, 2, watermark=30, ingest=100), name="a.parquet")
    rows = [
        *buffer_rows(1, 1, watermark=10, ingest=1),
        *buffer_rows(2, 1, watermark=20, ingest=2),
        *buffer_rows(1, 2, watermark=30, ingest=3),
        *buffer_rows(2, 2, watermark=40, ingest=50),
    ]
    write_archive(tmp_path / "archive", rows, name="b.parquet")
    result = run_reference(tmp_path / "archive", job(tmp_path))
    assert result.duplicate_copies == {1: 1}
    assert result.thresholds[(2, 2, 1, "default")] == (20, "behind_global_watermark")


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"events": [(5, 1, 1.0)]}, {"events": [(5, 1, 2.0)]}),  # a tuple differs
        ({"events": [(5, 1, 1.0)]}, {"events": [(5, 1, 1.0), (5, 1, 1.0)]}),  # multiplicity differs
        ({"watermark": 10}, {"watermark": 11}),  # metadata differs
    ],
)
def test_a_conflicting_copy_stops_the_job(tmp_path, first, second):
    write_archive(tmp_path / "archive", buffer_rows(1, 1, **{"watermark": 10, **first}), name="a.parquet")
    write_archive(tmp_path / "archive", buffer_rows(1, 1, **{"watermark": 10, **second}), name="b.parquet")
    with pytest.raises(ConflictingDuplicateError) as raised:
        run_reference(tmp_path / "archive", job(tmp_path))
    error = raised.value
    assert (error.origin, error.sequence, error.chunk) == (1, 1, 1)
    assert error.file == str(tmp_path / "archive" / "a.parquet")
    assert error.where.extra == {"other_file": str(tmp_path / "archive" / "b.parquet")}


def test_an_ingest_ts_difference_is_no_conflict(tmp_path):
    write_archive(tmp_path / "archive", buffer_rows(1, 1, watermark=10, ingest=1, events=[(5, 1)]), name="a.parquet")
    write_archive(tmp_path / "archive", buffer_rows(1, 1, watermark=10, ingest=2, events=[(5, 1)]), name="b.parquet")
    result = run_reference(tmp_path / "archive", job(tmp_path))
    assert result.duplicate_copies == {1: 1}
    assert result.conflicts == frozenset()


@pytest.mark.parametrize(("ingest_a", "ingest_b", "kept_value"), [(None, None, 1.0), (10, 5, 2.0), (5, 10, 1.0)])
def test_keep_first_keeps_the_earliest_copy_and_reports_the_conflict(tmp_path, ingest_a, ingest_b, kept_value):
    extra_a = {} if ingest_a is None else {"ingest": ingest_a}
    extra_b = {} if ingest_b is None else {"ingest": ingest_b}
    write_archive(
        tmp_path / "archive", buffer_rows(1, 1, watermark=10, events=[(5, 1, 1.0)], **extra_a), name="a.parquet"
    )
    write_archive(
        tmp_path / "archive", buffer_rows(1, 1, watermark=10, events=[(5, 1, 2.0)], **extra_b), name="b.parquet"
    )
    aggregations = [{"fn": "sum", "column": "value"}]
    config = job(tmp_path, on_conflict="keep_first", windows=[tumbling("10us", aggregations=aggregations)])
    result = run_reference(tmp_path / "archive", config)
    assert result.conflicts == {(1, 1, 1)}
    assert result.duplicate_copies == {}
    assert [w.values for w in result.windows] == [(("sum_value", kept_value),)]


# --------------------------------------------------------------------------- section 4: windows


def window_starts(tmp_path: Any, t: int, window: dict[str, Any]) -> list[int]:
    rows = buffer_rows(1, 1, watermark=1_000, events=[(t, 1)])
    result = replay(tmp_path, rows, windows=[window])
    assert result.open_windows == ()
    return [w.window_start for w in result.windows]


@pytest.mark.parametrize(
    ("offset", "t", "starts"),
    [
        ("0s", 7, [5]),
        ("0s", 9, [5]),  # end - 1us: still in [5, 10)
        ("0s", 10, [10]),  # end: the next window
        ("0s", 11, [10]),
        ("0s", 0, [0]),
        ("0s", -1, [-5]),
        ("2us", 7, [7]),  # Beam: 7 and 11 fall in [7, 12), 12 in [12, 17)
        ("2us", 11, [7]),
        ("2us", 12, [12]),
        ("2us", 6, [2]),
    ],
)
def test_tumbling_window_boundaries(tmp_path, offset, t, starts):
    assert window_starts(tmp_path, t, tumbling("5us", offset=offset)) == starts


@pytest.mark.parametrize(
    ("size", "slide", "t", "starts"),
    [
        ("10us", "5us", 7, [0, 5]),
        ("10us", "5us", 9, [0, 5]),
        ("10us", "5us", 10, [5, 10]),
        ("10us", "5us", 4, [-5, 0]),
        ("10us", "3us", 7, [0, 3, 6]),
        ("10us", "3us", 0, [-9, -6, -3, 0]),
        ("5us", "5us", 7, [5]),  # slide = size: tumbling
    ],
)
def test_sliding_window_boundaries(tmp_path, size, slide, t, starts):
    window = {"name": "w", "kind": "sliding", "size": size, "slide": slide, "aggregations": [{"fn": "count"}]}
    assert window_starts(tmp_path, t, window) == starts


def test_aggregations_follow_sql_null_rules(tmp_path):
    events = [
        {"event_time": 1, "key": 1, "value": 1.0, "n": 2},
        {"event_time": 2, "key": 1, "value": None, "n": 3},
        {"event_time": 3, "key": 1, "value": 3.0, "n": None},
        {"event_time": 4, "key": 1, "value": 3.0, "n": 5},
        {"event_time": 5, "key": 2, "value": None, "n": None},
        {"event_time": 6, "key": None, "value": 4.0, "n": 1},  # a null key is its own group
    ]
    aggregations = [
        {"fn": "count"},
        {"fn": "count", "column": "value"},
        {"fn": "sum", "column": "value"},
        {"fn": "sum", "column": "n"},
        {"fn": "min", "column": "value"},
        {"fn": "max", "column": "value"},
        {"fn": "mean", "column": "value"},
        {"fn": "mean", "column": "n"},
        {"fn": "approx_count_distinct", "column": "value"},
    ]
    rows = buffer_rows(1, 1, watermark=100, events=events)
    result = replay(tmp_path, rows, types={"n": pa.int64()}, windows=[tumbling("10us", aggregations=aggregations)])
    by_key = {w.key: dict(w.values) for w in result.windows}
    assert [w.key for w in result.windows] == [1, 2, None]  # sorted by repr of the key
    assert by_key[1] == {
        "count": 4,
        "count_value": 3,
        "sum_value": 7.0,
        "sum_n": 10,
        "min_value": 1.0,
        "max_value": 3.0,
        "mean_value": pytest.approx(7.0 / 3),
        "mean_n": pytest.approx(10 / 3),
        "approx_count_distinct_value": 2,
    }
    assert by_key[2] == {
        "count": 1,
        "count_value": 0,
        "sum_value": None,
        "sum_n": None,
        "min_value": None,
        "max_value": None,
        "mean_value": None,
        "mean_n": None,
        "approx_count_distinct_value": 0,
    }
    assert by_key[None]["count"] == 1
    assert isinstance(by_key[1]["sum_n"], int)


@pytest.mark.parametrize(
    ("watermark", "allowed_lateness", "emitted"),
    [
        (10, "0s", True),  # E = end: emitted
        (9, "0s", False),
        (11, "1us", True),
        (10, "1us", False),  # allowed lateness delays the emission
    ],
)
def test_a_window_is_emitted_once_the_effective_watermark_reaches_its_end(
    tmp_path, watermark, allowed_lateness, emitted
):
    rows = [*buffer_rows(1, 1, watermark=0, events=[(0, 1), (9, 1)]), *buffer_rows(1, 2, watermark=watermark)]
    result = replay(tmp_path, rows, watermarks=watermark_key(allowed_lateness), windows=[tumbling("10us")])
    assert result.keys["default"].effective_watermark == watermark - (1 if allowed_lateness == "1us" else 0)
    window = (result.windows if emitted else result.open_windows)[0]
    assert (window.window_start, window.window_end, window.values) == (0, 10, (("count", 2),))
    assert len(result.windows) + len(result.open_windows) == 1


# --------------------------------------------------------------------------- keys, columns, configuration


def test_thresholds_exist_for_every_buffer_and_every_key(tmp_path):
    watermarks = {"wm": {"event_time": "event_time", "watermark": "watermark_ts"}, "et": {"event_time": "event_time"}}
    rows = [
        *buffer_rows(1, 1, watermark=100, events=[(50, 1)]),
        *buffer_rows(1, 2, watermark=200, events=[(40, 1)]),
        *buffer_rows(2, 1, watermark=300),  # no tuples: takes part in "wm" only
    ]
    result = replay(tmp_path, rows, watermarks=watermarks)
    assert set(result.progress) == {(1, "wm"), (2, "wm"), (1, "et")}
    assert result.thresholds[(1, 2, 1, "wm")] == (100, "behind_origin_watermark")
    assert result.thresholds[(1, 2, 1, "et")] == (50, "behind_origin_watermark")
    assert result.thresholds[(2, 1, 1, "et")] == (NEG_INF, "behind_origin_watermark")
    assert [(r.wm_key, r.violated_watermark) for r in result.late] == [("et", 50), ("wm", 100)]
    assert result.keys["wm"].global_watermark == 200
    assert result.keys["et"].global_watermark == 50


@pytest.mark.parametrize(
    ("types", "time_unit", "scale"),
    [
        ({}, "native", 1),
        ({"event_time": pa.timestamp("ns", tz="UTC")}, "native", 1),
        ({"event_time": pa.timestamp("ms")}, "native", 1),  # naive: read as UTC
        ({"event_time": pa.int64(), "watermark_ts": pa.int64()}, "ms", 1_000),  # int64 epoch milliseconds
    ],
)
def test_timestamps_become_int_microseconds(tmp_path, types, time_unit, scale):
    rows = [
        *buffer_rows(1, 1, watermark=5_000 // scale, events=[(7_000 // scale, 1)]),
        *buffer_rows(1, 2, watermark=10_000 // scale, events=[(3_000 // scale, 1)]),
    ]
    result = replay(tmp_path, rows, types=types, time_unit=time_unit, windows=[tumbling("5ms")])
    assert [(w.window_start, w.window_end) for w in result.windows] == [(5_000, 10_000)]
    assert [(r.row, r.violated_watermark) for r in result.late] == [((3_000, 1), 5_000)]
    assert result.keys["default"].global_watermark == 10_000


def test_lateness_mode_resolution(tmp_path):
    rows = buffer_rows(1, 1, watermark=10, ingest=1)
    assert replay(tmp_path, rows).lateness == "arrival"
    assert replay(tmp_path, rows, lateness="origin").lateness == "origin"
    assert replay(tmp_path, rows, lateness="auto").lateness == "arrival"


def test_arrival_lateness_needs_ingest_ts(tmp_path):
    with pytest.raises(ConfigError):
        replay(tmp_path, buffer_rows(1, 1, watermark=10), lateness="arrival")


def test_a_missing_watermark_column_named_in_the_job_is_a_config_error(tmp_path):
    watermarks = {"default": {"event_time": "event_time", "watermark": "promise_ts"}}
    with pytest.raises(ConfigError) as raised:
        replay(tmp_path, buffer_rows(1, 1, watermark=10), watermarks=watermarks)
    assert raised.value.code == "config.unknown_column"
    assert raised.value.column == "promise_ts"


def test_without_watermark_column_the_default_key_uses_event_times(tmp_path):
    rows = [*buffer_rows(1, 1, events=[(100, 1)]), *buffer_rows(1, 2, events=[(50, 1)])]
    result = replay(tmp_path, rows)
    assert result.progress[(1, "default")].local_watermark == 100
    assert [r.row for r in result.late] == [(50, 1)]


def test_punctuation_rows_are_no_tuples(tmp_path):
    rows = [*buffer_rows(1, 1, watermark=10), *buffer_rows(1, 2, watermark=20, events=[(15, 1), (16, 2)])]
    result = replay(tmp_path, rows, windows=[tumbling("10us")])
    assert result.tuples_read == 2
    assert result.stream_cut == {1: (2, 1)}
    assert [(w.key, dict(w.values)["count"]) for w in result.windows] == [(1, 1), (2, 1)]


@pytest.mark.parametrize("made", [False, True], ids=["missing", "empty"])
def test_an_archive_that_is_missing_or_empty_is_the_engines_error(tmp_path: Any, made: bool) -> None:
    """As the engine's listing says (``discover_files``): no directory is ``archive.not_found``, a
    directory without a Parquet file ``archive.empty``."""
    from replay.core.errors import ReplayError
    from replay.engine.archive_files import discover_files

    archive = tmp_path / "archive"
    if made:
        archive.mkdir()
    with pytest.raises(ReplayError) as engine:
        discover_files(str(archive))
    with pytest.raises(ReplayError) as model:
        run_reference(archive, job(tmp_path))
    assert (type(model.value), model.value.code) == (type(engine.value), engine.value.code)
    assert engine.value.code == ("archive.empty" if made else "archive.not_found")
