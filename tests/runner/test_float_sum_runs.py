"""Runs over floating-point values that are not multiples of a power of two (the generator's are):
the ``windows`` table holds exact sums and means inside [min, max], which the ``windows`` suite
checks; any micro-batch size gives the same digests; NaN stops the run with a named error; open
windows written with the earlier two-integer float sums are refused. Decimal columns: exact sums,
means inside [min, max], the reference model's values exactly."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from replay.core.errors import ReplayError
from replay.quality.validate import validate
from replay.runner.loop import run
from replay.store.outputs import read_table
from tests._archives import buffer_rows, write_archive
from tests.runner._jobs import RESULTS, SECOND, T0, results, small_job
from tests.runner.test_job_vs_reference import output_view, reference_view

pytestmark = pytest.mark.spark

_AGGREGATIONS = [{"fn": "count"}] + [{"fn": fn, "column": "value"} for fn in ("sum", "mean", "min", "max")]
# Per window (one second each), the values of its tuples: one-value windows below and above their
# sum's old 1e-9 rounding, three 0.1 (whose mean rounds below 0.1), tiny and mixed ones, and values
# that cancel (the reconciliation's Spark sum gives 0.125 there, the exact sum 0.1).
_WINDOWS = [[-0.3], [-0.1], [1 / 3], [4e-10] * 5, [0.1] * 3, [0.1, 0.2, -0.3, 7.25], [-0.3] * 7, [1e15, 0.1, -1e15]]


def _job(root: Path, archive: Path, **extra: Any) -> Any:
    windows = [{"name": "w", "size": "1s", "aggregations": _AGGREGATIONS}]
    return small_job(root, archive, windows=windows, **extra)


def _archive(
    archive: Path, windows: list[list[Any]] = _WINDOWS, *, close: bool = True, types: dict[str, Any] | None = None
) -> None:
    """One buffer per window's tuple, window ``w`` being second ``w``; the last buffer's watermark
    closes every window when ``close``."""
    rows: list[dict[str, Any]] = []
    seq = 0
    for w, values in enumerate(windows):
        for j, value in enumerate(values):
            seq += 1
            rows += buffer_rows(1, seq, watermark=T0 + w * SECOND, events=[(T0 + w * SECOND + 1 + j, 1, value)])
    if close:
        rows += buffer_rows(1, seq + 1, watermark=T0 + (len(windows) + 1) * SECOND)
    write_archive(archive, rows, types=types)


def test_windows_hold_exact_sums_and_means_within_min_and_max(spark: Any, tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    _archive(archive)
    config = _job(tmp_path, archive)
    run(config, spark=spark)
    rows = sorted(read_table(config.output, "windows").to_pylist(), key=lambda r: r["window_start"])
    assert [r["count"] for r in rows] == [len(v) for v in _WINDOWS]
    for row, values in zip(rows, _WINDOWS, strict=True):
        assert row["min_value"] <= row["mean_value"] <= row["max_value"], (values, row)
        assert math.isclose(row["sum_value"], math.fsum(values), rel_tol=1e-15, abs_tol=1e-300)
    assert [rows[i]["sum_value"] for i in range(3)] == [-0.3, -0.1, 1 / 3]
    assert [rows[i]["mean_value"] for i in range(3)] == [-0.3, -0.1, 1 / 3]
    assert rows[3]["sum_value"] > 1.9e-9 and rows[4]["mean_value"] == 0.1 and rows[7]["sum_value"] == 0.1
    outcome = validate(config.output, suites=["windows", "reconciliation"], spark=spark)
    assert [s["success"] for s in outcome.record["suites"]] == [True, True]


# Three 0.1 (the double of their sum 0.3, over 3, is below 0.1), three 0.3, mixed signs, and
# values with as many digits as decimal(18, 3) holds.
_DECIMALS = [["0.1"] * 3, ["0.3"] * 3, ["0.7", "-0.1", "0.3"], ["-0.3"], ["123456789012345.123"] * 7]


def test_decimal_windows_hold_exact_sums_and_means_within_min_and_max(spark: Any, tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    windows = [[Decimal(v) for v in values] for values in _DECIMALS]
    _archive(archive, windows, types={"value": pa.decimal128(18, 3)})
    config = _job(tmp_path, archive, micro_batch={"max_buffers": 2})
    run(config, spark=spark)
    rows = sorted(read_table(config.output, "windows").to_pylist(), key=lambda r: r["window_start"])
    assert [r["sum_value"] for r in rows] == [sum(values, Decimal(0)) for values in windows]
    for row in rows:
        assert float(row["min_value"]) <= row["mean_value"] <= float(row["max_value"]), row
    assert rows[0]["mean_value"] == 0.1 and rows[1]["mean_value"] == 0.3
    assert output_view(config)["windows"] == reference_view(config)["windows"]
    outcome = validate(config.output, suites=["windows", "reconciliation"], spark=spark)
    assert [s["success"] for s in outcome.record["suites"]] == [True, True]


def test_any_micro_batch_size_gives_the_same_digests(spark: Any, tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    _archive(archive)
    digests = []
    for size in (None, 1, 4):
        config = _job(tmp_path / f"b{size}", archive, micro_batch={"max_buffers": size})
        run(config, spark=spark)
        digests.append(results(config))
    assert digests[0] == digests[1] == digests[2]
    assert set(digests[0]) == set(RESULTS)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -(2.0**63)])
def test_a_value_that_cannot_be_summed_stops_the_run_naming_its_column(spark: Any, tmp_path: Path, bad: float) -> None:
    archive = tmp_path / "archive"
    _archive(archive, [[1.0], [0.5, bad]])
    config = _job(tmp_path, archive)
    with pytest.raises(ReplayError) as raised:
        run(config, spark=spark)
    assert raised.value.code == "archive.unsummable"
    assert raised.value.where.column == "value" and "'value'" in str(raised.value)


def _bad_values_archive(archive: Path) -> None:
    """Two buffers with a NaN in the summed column: sequence 3 (two tuples, the NaN second) and 5;
    a late NaN (sequence 6, behind the watermark of sequence 5) that no window sums; one file."""
    events = {1: [1.0], 2: [0.5], 3: [0.25, math.nan], 4: [2.0], 5: [math.nan]}
    rows: list[dict[str, Any]] = []
    for seq, values in events.items():
        at = T0 + (seq - 1) * SECOND
        rows += buffer_rows(1, seq, watermark=at, events=[(at + 1 + j, 1, v) for j, v in enumerate(values)])
    rows += buffer_rows(1, 6, watermark=T0 + 4 * SECOND, events=[(T0 + 1, 1, math.nan)])  # late
    rows += buffer_rows(1, 7, watermark=T0 + 9 * SECOND)
    write_archive(archive, rows)


@pytest.mark.parametrize("max_buffers", [None, 1])
def test_a_value_that_cannot_be_summed_is_located_in_its_buffer(
    spark: Any, tmp_path: Path, max_buffers: int | None
) -> None:
    """The error names the first buffer (by identity) whose on-time tuple holds the value, its rows
    in the file, the batch that read it and how many such values the failed pass read: a late NaN
    is not one (no window sums it), and nothing was committed."""
    archive = tmp_path / "archive"
    _bad_values_archive(archive)
    config = _job(tmp_path, archive, micro_batch={"max_buffers": max_buffers})
    with pytest.raises(ReplayError) as raised:
        run(config, spark=spark)
    error = raised.value
    assert error.code == "archive.unsummable"
    (file,) = archive.glob("*.parquet")
    sequences = pq.read_table(file, columns=["sequence_number"]).column(0).to_pylist()
    rows = [i for i, s in enumerate(sequences) if s == 3]
    where = error.where
    assert (where.file, where.origin, where.sequence, where.chunk, where.column) == (str(file), 1, 3, 1, "value")
    assert where.extra["rows"] == f"{rows[0]} to {rows[-1]}" and where.extra["value"] == "NaN"
    if max_buffers is None:  # one batch read both buffers; the late NaN is not counted
        assert where.extra["batch"] == 1 and "2 such values" in str(error)
    else:  # a batch per buffer, in sequence order: the third holds the first NaN
        assert where.extra["batch"] == 3 and re.search(r": [12] such values? ", str(error))
    assert f"file {file}, origin 1, sequence 3, chunk 1, column value, rows {rows[0]} to {rows[-1]}" in str(error)


def test_open_windows_of_the_earlier_float_sums_are_refused(spark: Any, tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    _archive(archive, [[0.25], [0.5]], close=False)  # the second window stays open
    config = _job(tmp_path, archive)
    run(config, spark=spark)
    # The open windows as the earlier Replay wrote them: the float sums as (integer part, fraction
    # in units of 1e-9) in p<i>_s and p<i>_f, no limbs, and the mean without its min and max.
    files = list((tmp_path / "ckpt" / "state").glob("*-open-*/*.parquet"))
    assert files
    for path in files:
        table = pq.read_table(path)
        limbs = [n for n in table.column_names if re.fullmatch(r"p\d+_(l\d|lo|hi)", n)]
        assert limbs
        for i in (1, 2):
            table = table.append_column(f"p{i}_s", pc.cast(table.column(f"p{i}_l0"), pa.int64()))
            table = table.append_column(f"p{i}_f", pa.array([0] * table.num_rows, pa.int64()))
        pq.write_table(table.drop_columns(limbs), path)
    write_archive(archive, buffer_rows(1, 3, watermark=T0 + 5 * SECOND), name="part-00001.parquet")
    with pytest.raises(ReplayError) as raised:
        run(config, spark=spark)
    assert raised.value.code == "checkpoint.state"
    assert "'w'" in str(raised.value) and "p1_l0" in str(raised.value)


@pytest.mark.parametrize(
    ("values", "kind"),
    [([2**62, 2**62], pa.int64()), ([2.0**62, 2.0**62], pa.float64()), ([Decimal("9" * 38)] * 2, pa.decimal128(38, 0))],
)
def test_a_sum_beyond_its_exact_type_stops_the_run_naming_its_column(
    spark: Any, tmp_path: Path, values: list[Any], kind: Any
) -> None:
    """Each value fits, their sum does not: 64-bit integers (a float's integer parts) or 38 digits."""
    archive = tmp_path / "archive"
    _archive(archive, [values[:1], values], types={"value": kind})
    config = _job(tmp_path, archive)
    with pytest.raises(ReplayError) as raised:
        run(config, spark=spark)
    assert raised.value.code == "archive.unsummable"
    assert raised.value.where.column == "value" and "'value'" in str(raised.value)


def _two_columns_archive(
    archive: Path, values: list[tuple[Any, Any]], *, first_seq: int = 1, close: bool = True
) -> None:
    """One buffer per (value, other) pair, all in window 0 (the first second); the last buffer's
    watermark closes it when ``close``."""
    rows: list[dict[str, Any]] = []
    for j, (value, other) in enumerate(values):
        event = {"event_time": T0 + 1 + j, "key": 1, "value": value, "other": other}
        rows += buffer_rows(1, first_seq + j, watermark=T0, events=[event])
    if close:
        rows += buffer_rows(1, first_seq + len(values), watermark=T0 + 5 * SECOND)
    name = f"part-{first_seq:05d}.parquet"
    write_archive(archive, rows, name=name, types={"value": pa.float64(), "other": pa.int64()})


def _two_columns_job(root: Path, archive: Path) -> Any:
    aggregations = [{"fn": "sum", "column": "value"}, {"fn": "mean", "column": "other"}]
    return small_job(root, archive, windows=[{"name": "w", "size": "1s", "aggregations": aggregations}])


@pytest.mark.parametrize("overflowing", ["value", "other"])
def test_the_sum_that_overflows_is_named_with_its_window(spark: Any, tmp_path: Path, overflowing: str) -> None:
    """Two summed columns, one of them beyond 2^63 in a window of the batch: the error names that
    column and its window aggregation, and not the other."""
    archive = tmp_path / "archive"
    big = {"value": 2.0**62, "other": 2**62}
    small = {"value": 0.5, "other": 3}
    pair = tuple(big[c] if c == overflowing else small[c] for c in ("value", "other"))
    _two_columns_archive(archive, [pair, pair])
    with pytest.raises(ReplayError) as raised:
        run(_two_columns_job(tmp_path, archive), spark=spark)
    error = raised.value
    other = "other" if overflowing == "value" else "value"
    assert error.code == "archive.unsummable"
    assert error.where.column == overflowing and error.where.extra == {"window": "w"}
    assert f"the sum of '{overflowing}' in window aggregation 'w' over a window" in str(error)
    assert f"'{other}'" not in str(error)


def test_a_sum_that_overflows_only_with_an_open_window_names_every_summed_column(spark: Any, tmp_path: Path) -> None:
    """The window left open by the first run holds 2^62; the second run's tuple of 2^62 overflows
    only once merged with it, which summing the run's own tuples again cannot find: the error
    names every summed column, as Spark's error allows."""
    archive = tmp_path / "archive"
    _two_columns_archive(archive, [(2.0**62, 1)], close=False)
    config = _two_columns_job(tmp_path, archive)
    run(config, spark=spark)
    _two_columns_archive(archive, [(2.0**62, 1)], first_seq=2)
    with pytest.raises(ReplayError) as raised:
        run(config, spark=spark)
    error = raised.value
    assert error.code == "archive.unsummable" and error.where.column is None and not error.where.extra
    assert "a window's sum over 'value', 'other' does not fit" in str(error)
