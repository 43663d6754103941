"""The ledger's 0-or-1 counts packed two to a long in a pass (``pass_counts.packed``), taken apart again."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import functions as F

from replay.engine.pass_counts import filled, packed, unpacked

_count = st.integers(0, 2**31 - 1)  # a count of a pass with fewer than 2**31 rows


@given(low=_count, high=_count, batch=st.integers(1, 10**6))
def test_a_packed_pair_comes_apart_into_its_two_counts(low: int, high: int, batch: int) -> None:
    counts = unpacked({f"on0|out0_{batch}": low + (high << 32), f"checksum_{batch}": 7})
    assert counts == {f"on0_{batch}": low, f"out0_{batch}": high, f"checksum_{batch}": 7}


@pytest.mark.spark
def test_sums_of_packed_counts_equal_the_counts(spark: Any) -> None:
    frame = spark.range(1000).select(
        (F.col("id") % 3 == 0).cast("int").alias("a"),
        (F.col("id") % 7 == 0).cast("int").alias("b"),
        (F.col("id") % 2 == 0).cast("int").alias("c"),
        F.col("id").alias("cid"),
    )
    terms = [("rows", F.lit(1)), ("checksum", F.col("cid")), ("a", F.col("a")), ("b", F.col("b")), ("c", F.col("c"))]
    pairs = packed(terms, 1000)
    assert [name for name, _ in pairs] == ["checksum", "rows|a", "b|c"]
    row = frame.agg(*[F.sum(value).alias(f"{name}_1") for name, value in pairs]).first()
    assert row is not None
    assert unpacked(row.asDict()) == {"checksum_1": 499500, "rows_1": 1000, "a_1": 334, "b_1": 143, "c_1": 500}
    # A pass of 2**31 rows or more keeps every count in a long of its own.
    assert [name for name, _ in packed(terms, 2**31)] == ["rows", "checksum", "a", "b", "c"]


def test_a_count_not_summed_is_filled_in_from_the_one_it_equals() -> None:
    """Without a backfill range no tuple is outside it, and a tumbling window aggregation owns every
    on-time tuple: ``count_terms`` sums neither, and ``filled`` gives them for every batch."""
    counts = {"on0_3": 5, "late0_3": 1, "on0_4": 2, "late0_4": 0}
    same = {"out0": None, "win0": "on0", "win1": "on0"}
    wanted = {"out0_3": 0, "out0_4": 0, "win0_3": 5, "win0_4": 2, "win1_3": 5, "win1_4": 2}
    assert filled(counts, same) == counts | wanted
