"""``replay run`` (micro-batches, checkpoints, Spark window work) against ``replay.reference.model``.

Hypothesis draws the same small, nasty archives as ``tests/engine/test_vs_reference.py``
(chunks out of order, gaps, idle markers, duplicates, conflicts, regressions,
disorder), a window job (tumbling or sliding, every aggregation function) and a
micro-batch size; the ``windows`` and ``late`` tables of the run must equal the
reference model's, the open windows must be as many, or both must raise the same
error.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import tempfile
from collections.abc import Collection, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import Phase, event, given, settings
from hypothesis import strategies as st

from replay.core.config import JobConfig, parse_config
from replay.core.errors import ReplayError
from replay.core.timeutil import from_datetime
from replay.engine import pass_query
from replay.generate import generate_archive
from replay.reference.model import run_reference
from replay.runner.loop import run
from replay.store.outputs import read_table
from tests._archives import FEATURED, write_archive
from tests.engine.test_vs_reference import archives

pytestmark = pytest.mark.spark

AGGREGATIONS = [
    {"fn": "count"},
    {"fn": "count", "column": "value"},
    {"fn": "sum", "column": "value"},
    {"fn": "min", "column": "value"},
    {"fn": "max", "column": "value"},
    {"fn": "mean", "column": "value"},
    {"fn": "approx_count_distinct", "column": "key"},
]


@st.composite
def window_jobs(draw: st.DrawFn) -> dict[str, Any]:
    windows = []
    for index in range(draw(st.integers(1, 2))):
        size = draw(st.sampled_from([20, 50, 90]))
        window: dict[str, Any] = {
            "name": f"w{index}",
            "size": f"{size}us",
            "offset": f"{draw(st.sampled_from([0, 7]))}us",
            "aggregations": draw(st.lists(st.sampled_from(AGGREGATIONS), min_size=1, max_size=4, unique_by=str)),
        }
        if draw(st.booleans()):
            window |= {"kind": "sliding", "slide": f"{draw(st.sampled_from([size, size // 2, size // 3]))}us"}
        windows.append(window)
    return {"windows": windows, "micro_batch": {"max_buffers": draw(st.sampled_from([None, 3, 7]))}}


def _plain(value: Any) -> Any:
    return from_datetime(value) if isinstance(value, datetime) else value


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return bool(a == b)


def job_view(config: JobConfig, spark: Any) -> dict[str, Any]:
    summary = run(config, spark=spark)
    return output_view(config) | {"open": summary.open_windows}


#: The ``late`` table's columns around a tuple's own (docs/outputs.md#tables).
_LATE_HEAD = ("wm_key", "origin_id", "sequence_number", "chunk_number")
_LATE_TAIL = ("violated_watermark", "reason")


def output_view(config: JobConfig) -> dict[str, Any]:
    """The run's ``windows`` and ``late`` tables as the reference model gives them (times as
    microseconds): the late rows whole, every column of the tuple, and the names of those columns."""
    windows = read_table(config.output, "windows").to_pylist()  # type: ignore[arg-type]
    late_table = read_table(config.output, "late")  # type: ignore[arg-type]
    late = late_table.to_pylist()
    names = {agg.output_name for spec in config.windows for agg in spec.aggregations}
    columns = late_table.column_names
    assert tuple(columns[:4]) == _LATE_HEAD and tuple(columns[-2:]) == _LATE_TAIL, columns
    tuple_columns = columns[4:-2]
    return {
        "windows": sorted(
            (
                r["window"],
                r["wm_key"],
                repr(r["key"]),
                _plain(r["window_start"]),
                _plain(r["window_end"]),
                tuple(sorted((n, _plain(r[n])) for n in names)),
            )
            for r in windows
        ),
        "late_columns": tuple(tuple_columns),
        "late": sorted(
            (
                r["wm_key"],
                r["origin_id"],
                r["sequence_number"],
                r["chunk_number"],
                tuple(repr(_plain(r[c])) for c in tuple_columns),
                _plain(r["violated_watermark"]),
                r["reason"],
            )
            for r in late
        ),
    }


def reference_view(config: JobConfig, earlier: Sequence[Collection[Path]] = ()) -> dict[str, Any]:
    """The reference model's tables of ``config``'s archive; ``earlier``: the files earlier runs read."""
    ref = run_reference(config.archive, config, earlier=earlier)
    names = {agg.output_name for spec in config.windows for agg in spec.aggregations}
    return {
        "windows": sorted(
            (
                w.window,
                w.wm_key,
                repr(w.key),
                w.window_start,
                w.window_end,
                tuple(sorted((n, dict(w.values).get(n)) for n in names)),
            )
            for w in ref.windows
        ),
        "late_columns": ref.late_columns,
        "late": sorted(
            (
                r.wm_key,
                r.origin_id,
                r.sequence_number,
                r.chunk_number,
                tuple(repr(v) for v in r.row),
                r.violated_watermark,
                str(r.reason),
            )
            for r in ref.late
        ),
        "open": len(ref.open_windows),
    }


def same_windows(actual: list[Any], expected: list[Any]) -> None:
    assert [w[:5] for w in actual] == [w[:5] for w in expected]
    for a, e in zip(actual, expected, strict=True):
        assert [n for n, _ in a[5]] == [n for n, _ in e[5]]
        for (name, av), (_, ev) in zip(a[5], e[5], strict=True):
            assert _close(av, ev), (a[:5], name, av, ev)


Drawn = tuple[list[list[dict[str, Any]]], dict[str, Any], dict[str, pa.DataType]]


@settings(
    max_examples=int(os.environ.get("REPLAY_DEEP_EXAMPLES", "12")),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    deadline=None,
)
@given(archives(), window_jobs())
def test_run_equals_reference(spark: Any, drawn: Drawn, jobs: dict[str, Any]) -> None:
    _compare(spark, drawn, jobs)


@settings(
    max_examples=int(os.environ.get("REPLAY_DEEP_EXAMPLES", "6")),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    deadline=None,
)
@given(archives(unit="ns"), window_jobs())
def test_run_equals_reference_at_nanoseconds(spark: Any, drawn: Drawn, jobs: dict[str, Any]) -> None:
    """Nanosecond archives at 2020s epochs, tuples on watermarks and 1 ns / 1 us either side:
    the run's windows and late rows (event times as microsecond timestamps) equal the model's."""
    _compare(spark, drawn, jobs)


def _compare(spark: Any, drawn: Drawn, jobs: dict[str, Any]) -> None:
    files, job, types = drawn
    root = Path(tempfile.mkdtemp(prefix="replay-run-"))
    try:
        for index, rows in enumerate(files):
            write_archive(root / "archive", rows, name=f"part-{index:05d}.parquet", types=types)
        config = parse_config({"archive": str(root / "archive"), "output": str(root / "out")} | job | jobs)
        try:
            expected = reference_view(config)
        except ReplayError as error:
            event(f"error: {type(error).__name__}")
            with pytest.raises(ReplayError) as raised:
                run(config, spark=spark)
            assert (type(raised.value), raised.value.origin, raised.value.sequence) == (
                type(error),
                error.origin,
                error.sequence,
            )
            return
        event(f"windows emitted: {min(len(expected['windows']), 3)}+, late: {min(len(expected['late']), 3)}+")
        actual = job_view(config, spark)
        same_windows(actual["windows"], expected["windows"])
        assert actual["late_columns"] == expected["late_columns"]
        assert actual["late"] == expected["late"]
        assert actual["open"] == expected["open"]
    finally:
        shutil.rmtree(root)


@st.composite
def two_key_jobs(draw: st.DrawFn) -> dict[str, Any]:
    """``window_jobs`` over two watermark keys on the same columns with different allowed
    lateness: a tuple late for one key can be on time for the other, which is the case where a
    pass reads its rows a second time for the ``late`` table."""
    jobs = draw(window_jobs())
    jobs["watermarks"] = {
        "default": {"allowed_lateness": "0s"},
        "lenient": {"event_time": "event_time", "watermark": "watermark_ts", "allowed_lateness": "40us"},
    }
    for window in jobs["windows"]:
        window["wm_key"] = draw(st.sampled_from(["default", "lenient"]))
    return jobs


@settings(
    max_examples=int(os.environ.get("REPLAY_DEEP_EXAMPLES", "6")),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    deadline=None,
)
@given(archives(), two_key_jobs())
def test_run_equals_reference_with_two_watermark_keys(spark: Any, drawn: Drawn, jobs: dict[str, Any]) -> None:
    _compare(spark, drawn, jobs)


@pytest.mark.parametrize("max_buffers", [None, 7], ids=["one-batch", "batches"])
def test_watermark_ts_stays_metadata_when_the_key_uses_event_time_watermarks(
    spark: Any, tmp_path: Path, max_buffers: int | None
) -> None:
    """A declared key on event-time watermarks over an archive that has ``watermark_ts`` (SPEC
    section 1): the column is still buffer metadata, so the ``late`` table (the tuple's columns,
    not the buffer metadata) leaves it out, as the model does, and the run's late rows are the
    model's, whole."""
    archive = tmp_path / "archive"
    generate_archive(archive, dataclasses.replace(FEATURED, late_fraction=0.1, seed=5))
    assert "watermark_ts" in pq.read_schema(next(archive.glob("*.parquet"))).names
    windows = [{"name": "w", "size": "500ms", "aggregations": [{"fn": "count"}, {"fn": "max", "column": "value"}]}]
    config = parse_config(
        {
            "archive": str(archive),
            "output": str(tmp_path / "out"),
            "watermarks": {"default": {"event_time": "event_time"}},
            "windows": windows,
            "micro_batch": {"max_buffers": max_buffers},
        }
    )
    expected = reference_view(config)
    actual = job_view(config, spark)
    assert expected["late"], "the archive has tuples behind their origin's event-time watermark"
    assert "watermark_ts" not in actual["late_columns"]
    assert actual["late_columns"] == expected["late_columns"] == ("event_time", "key", "value")
    assert actual["late"] == expected["late"]
    same_windows(actual["windows"], expected["windows"])
    assert actual["open"] == expected["open"]


@pytest.mark.parametrize("late_fraction", [0.05, 0.0], ids=["late-tuples", "no-late-tuple"])
@pytest.mark.parametrize("batches_per_pass", [None, 32], ids=["one-batch", "several-batches-per-pass"])
def test_a_tumbling_run_counts_rows_and_tuples_from_its_groups(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batches_per_pass: int | None, late_fraction: float
) -> None:
    """One key, tumbling windows, no copy carried in: the pass takes the ledger's rows, tuples,
    late and on-time counts from the window aggregation's groups (``replay.engine.pass_query``), with
    the punctuation rows of idle origins in a group of their own; in a pass of several batches a
    batch's rows outside every window are its groups' rows there. So it does when no copy can hold
    a late tuple (event-time watermarks, so that the scan knows each copy's smallest event time, and
    no late tuple: no late group at all). The run's ledger holds, and its windows and late rows are
    the model's."""
    archive = tmp_path / "archive"
    generate_archive(archive, dataclasses.replace(FEATURED, idle=1, late_fraction=late_fraction, seed=11))
    rows = pa.concat_tables([pq.read_table(p) for p in sorted(archive.glob("*.parquet"))])
    assert rows.filter(pc.is_null(rows["key"])).num_rows > 0  # idle markers: punctuation rows
    windows = [{"name": "w", "size": "500ms", "aggregations": [{"fn": "count"}, {"fn": "sum", "column": "value"}]}]
    settings: dict[str, Any] = {"archive": str(archive), "output": str(tmp_path / "out"), "windows": windows}
    if batches_per_pass is not None:
        settings["micro_batch"] = {"max_buffers": 5, "max_batches_per_pass": batches_per_pass}
    if not late_fraction:
        # Event-time watermarks, lenient enough that no tuple of this archive is late.
        settings["watermarks"] = {"default": {"event_time": "event_time", "allowed_lateness": "10s"}}
    config = parse_config(settings)
    # Which way each pass counted: with the groups' counts (``tuple_flag``), by batch (``rest_by``),
    # with late groups (``late``).
    taken: list[tuple[bool, bool, bool]] = []
    partials = pass_query.partials

    def spy(*args: Any, **kwargs: Any) -> Any:
        taken.append(tuple(kwargs.get(name) is not None for name in ("tuple_flag", "rest_by", "late")))
        return partials(*args, **kwargs)

    monkeypatch.setattr(pass_query, "partials", spy)
    expected = reference_view(config)
    actual = job_view(config, spark)
    # One pass, counting from its groups.
    assert taken == [(True, batches_per_pass is not None, late_fraction > 0)], taken
    assert bool(expected["late"]) == (late_fraction > 0), "the archive has late tuples, or none"
    same_windows(actual["windows"], expected["windows"])
    assert actual["late"] == expected["late"]
    assert actual["open"] == expected["open"]
