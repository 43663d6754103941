"""Sums and means of floating-point columns (docs/semantics.md#aggregates): the values truncated to
multiples of 2^-96, cut into limbs summed exactly, and the window's double made from the limbs' sums
alone (within a few ulps of the exact sum; a single value exactly), whatever the order and the
split of the tuples into partials; a mean inside [min, max]; the engine equals the reference model
bit for bit."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from replay.core.config import Aggregation, WindowSpec
from replay.core.errors import DataError
from replay.reference.windows import aggregate

_FUNCTIONS = ("sum", "mean", "min", "max")
_SPEC = WindowSpec.model_validate(
    {"name": "w", "size": "60s", "aggregations": [{"fn": fn, "column": "v"} for fn in _FUNCTIONS]}
)
_NAMED = (-0.3, -0.1, 0.1, 0.3, 1 / 3, -1 / 3, 0.7, 4e-10, -4e-10, 1e-30, 5e-324, -0.0, 2.0**40 + 0.5, 1e12 + 0.1)
_VALUES = (
    st.sampled_from(_NAMED)
    | st.floats(min_value=-(2.0**40), max_value=2.0**40, allow_nan=False, allow_infinity=False)
    | st.floats(min_value=-1e-6, max_value=1e-6, allow_nan=False, allow_infinity=False)
    | st.integers(-20_000, 20_000).map(lambda n: n / 100)
)


def _reference(fn: str, values: list[float]) -> Any:
    return aggregate(Aggregation(fn=fn, column="v"), values)  # type: ignore[arg-type]


def test_one_value_comes_back_as_itself() -> None:
    for v in (-0.3, -0.1, 0.1, 1 / 3, 4e-10, 2.0**40 + 0.5, 123.456):
        assert _reference("sum", [v]) == v
        assert _reference("mean", [v]) == v


def _near(got: Any, exact: Fraction) -> bool:
    """Within two units in the last place of the exact sum."""
    return abs(Fraction(got) - exact) <= 2 * Fraction(math.ulp(float(exact)))


def test_the_reference_sum_is_within_two_ulps_of_the_exact_sum_of_the_truncated_values() -> None:
    assert _near(_reference("sum", [4e-10] * 5), 5 * Fraction(4e-10))  # not 0.0 (a 1e-9 fixed point)
    assert _near(_reference("sum", [0.1, 0.2]), Fraction(0.1) + Fraction(0.2))
    assert _near(_reference("sum", [1e15, 0.1, -1e15]), Fraction(0.1))
    assert _reference("sum", [1e-30]) == 0.0  # below 2^-96: truncated
    assert _reference("sum", [1.0, 1e-30]) == 1.0
    # Three 0.1: the sum is 0.30000000000000004 and its third rounds below 0.1; the clamp takes it back.
    assert _reference("mean", [0.1, 0.1, 0.1]) == 0.1
    assert _reference("mean", [1e-30, 1e-30]) == 1e-30


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 2.0**63, -(2.0**64)])
def test_the_reference_refuses_what_cannot_be_summed(bad: float) -> None:
    with pytest.raises(DataError) as raised:
        _reference("sum", [1.0, bad])
    assert raised.value.code == "archive.unsummable" and raised.value.where.column == "v"


def _engine(spark: Any, groups: list[list[float]], split: list[bool]) -> dict[int, tuple[Any, ...]]:
    """Each group's (sum, mean, min, max) from the engine's partials: the rows in two partial frames
    as ``split`` cuts them (and in the reverse order), merged."""
    from pyspark.sql.types import DoubleType, LongType, StructField, StructType

    from replay.engine.windows import WindowColumns, aggregated_types, merge, output_columns, partials, window_values

    schema = StructType([StructField("_ev0", LongType()), StructField("k", LongType()), StructField("v", DoubleType())])
    rows = [(5 + j, k, v) for k, values in enumerate(groups) for j, v in enumerate(values)]
    cut = [split[n % len(split)] for n in range(len(rows))]
    first = [r for r, c in zip(rows, cut, strict=True) if c]
    second = [r for r, c in zip(rows, cut, strict=True) if not c][::-1]
    types = aggregated_types([_SPEC], schema)
    cols = WindowColumns(event_micros="_ev0", key="k", types=types)
    parts = [partials(spark.createDataFrame(part, schema), _SPEC, cols) for part in (first, second) if part]
    merged = merge(parts, _SPEC, cols)
    values, _ = window_values(_SPEC, cols, output_columns([_SPEC], types), LongType())
    names = [f"{fn}_v" for fn in _FUNCTIONS]
    selected = merged.select(*[value.alias(name) for name, value, _ in values])
    return {r["key"]: tuple(r[n] for n in names) for r in selected.collect()}


def _bits(value: Any) -> Any:
    return value.hex() if isinstance(value, float) else value  # tells -0.0 from 0.0


@pytest.mark.spark
@settings(max_examples=8, phases=[Phase.explicit, Phase.reuse, Phase.generate], deadline=None)
@given(
    st.lists(st.lists(_VALUES, min_size=1, max_size=6), min_size=1, max_size=6),
    st.lists(st.booleans(), min_size=1, max_size=5),
)
@example(groups=[[-0.3], [-0.1], [1 / 3], [4e-10] * 5, [0.1] * 3, [0.1, 0.2, -0.3], [1e-30, 1e-30]], split=[True])
@example(groups=[[0.1] * 3, [-0.3] * 7, [2.0**40 + 0.5, -(2.0**40), 1e-6]], split=[True, False])
# Ties to even, a sticky bit that breaks a tie, and sums beyond 2^30 and 2^62 (fewer digits kept).
@example(groups=[[2.0**53, 1.0], [2.0**53, 1.0, 2.0**-40], [2.0**53 + 2, 1.0], [-(2.0**53), -1.0]], split=[False])
@example(groups=[[2.0**62, 2.0**61, 0.75], [-(2.0**62), -(2.0**61), 1e-9], [2.0**31, 0.1, 1e-20]], split=[True])
def test_sums_and_means_equal_the_reference_for_any_split(
    spark: Any, groups: list[list[float]], split: list[bool]
) -> None:
    actual = _engine(spark, groups, split)
    assert sorted(actual) == list(range(len(groups)))
    for k, values in enumerate(groups):
        expected = tuple(_reference(fn, values) for fn in _FUNCTIONS)
        # Sums and means to the bit (the sign of a zero too); min and max as numbers (which of -0.0
        # and 0.0 is the smaller is not theirs to say).
        assert [_bits(a) for a in actual[k][:2]] == [_bits(e) for e in expected[:2]], (values, actual[k], expected)
        assert actual[k][2:] == expected[2:], (values, actual[k], expected)
        total, mean, low, high = actual[k]
        assert low <= mean <= high, values
        if len(values) == 1:
            assert total == mean == values[0] or abs(values[0]) < 2.0**-44
