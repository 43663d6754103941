"""The join key of a pass's rows (``replay.engine.rows``): a copy's identity packed into one long.

The Spark expression (on the archive's rows) and the decision table's column are the same
formula: they agree, the packing is exact when it is chosen, and is not chosen when it
cannot be.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay.engine.passes import PassWork, Read, Reads
from replay.engine.rows import _decision_frame, _pack, _packed, _packing, late_reason, reason_codes
from tests._archives import buffer

identities = st.lists(
    st.tuples(st.integers(1, 2**24), st.integers(1, 2**34), st.integers(0, 2**8)), min_size=1, max_size=40
)  # up to 66 bits together: packed or not


def _reads(ids: list[tuple[int, int, int]]) -> Reads:
    reads = [
        Read(buf=buffer(origin=o, sequence=s, chunk=c), thresholds=(0,), reasons=("",), batch=1) for o, s, c in ids
    ]
    return Reads.of(reads, nkeys=1)


@given(identities)
def test_a_packed_key_is_one_per_identity_and_fits_a_signed_long(ids: list[tuple[int, int, int]]) -> None:
    bits = _packing(_reads(ids))
    widths = sum(max(identity[k] for identity in ids).bit_length() for k in range(3))
    assert (bits is None) == (widths > 63)
    if bits is not None:
        keys = {identity: _pack(*identity, bits) for identity in set(ids)}
        assert len(set(keys.values())) == len(keys)
        # The decision table packs the arrays of a pass's reads with the same formula.
        reads = _reads(ids)
        columns = (reads.column(name) for name in ("origin", "sequence", "chunk"))
        assert _pack(*columns, bits).tolist() == [keys[identity] for identity in ids]
        assert all(0 <= key < 2**63 for key in keys.values())
        # Unpacking gives the identity back: the widths hold every component.
        _, s_bits, c_bits = bits
        for identity, key in keys.items():
            sequence, chunk = (key >> c_bits) & ((1 << s_bits) - 1), key & ((1 << c_bits) - 1)
            assert (key >> (s_bits + c_bits), sequence, chunk) == identity


def test_the_widths_are_those_of_the_largest_values_up_to_63_bits() -> None:
    assert _packing(_reads([(16, 1000, 3)])) == (5, 10, 2)
    assert _packing(_reads([(2**40 - 1, 2**20 - 1, 2**3 - 1)])) == (40, 20, 3)  # 63 bits: packed
    assert _packing(_reads([(2**40, 2**20 - 1, 2**3 - 1)])) is None  # 64 bits: three columns
    assert _packing(_reads([])) is None


@pytest.mark.spark
def test_the_spark_expression_packs_as_the_decision_table_does(spark: Any) -> None:
    """``_packed`` (on the archive's rows) and ``_pack`` (the decision table) agree on identities
    that fit, and give -1, so no match, for one that does not (a component past its width,
    negative or null)."""
    from pyspark.sql import functions as F

    ids = [(16, 1000, 3), (1, 1, 0), (9, 513, 2)]
    bits = _packing(_reads(ids))
    assert bits is not None
    # Each one component past its width, negative, or null.
    rows = [*ids, (32, 1, 0), (1, 1024, 0), (1, 1, 4), (-1, 1, 0), (1, -1, 0), (1, 1, -1), (None, 1, 0), (1, 1, None)]
    frame = spark.createDataFrame(rows, "o long, s long, c int")
    got = [r[0] for r in frame.select(_packed(F.col("o"), F.col("s"), F.col("c"), bits)).collect()]
    assert got == [_pack(*identity, bits) for identity in ids] + [-1] * 8


@pytest.mark.spark
@given(
    st.lists(
        st.lists(st.sampled_from(["behind_origin_watermark", "behind_global_watermark", ""]), min_size=2, max_size=2),
        min_size=1,
        max_size=12,
    )
)
def test_a_late_reason_travels_as_a_code_and_comes_back_as_its_word(spark: Any, reasons: list[list[str]]) -> None:
    """Each copy's reason per key rides the join as a small integer (``reason_codes``); a late
    row's word (``late_reason``) is the copy's own, whatever mix of reasons the pass holds."""
    reads = Reads.of(
        [
            Read(buf=buffer(origin=1, sequence=n + 1, chunk=0), thresholds=(0, 0), reasons=tuple(r), batch=1)
            for n, r in enumerate(reasons)
        ],
        nkeys=2,
    )
    codes = [reason_codes(reads, i)[1].tolist() for i in range(2)]
    frame = spark.createDataFrame(list(zip(*codes, strict=True)), "d_reason0 int, d_reason1 int")
    got = [tuple(r) for r in frame.select(late_reason(reads, 0), late_reason(reads, 1)).collect()]
    assert got == [tuple(r) for r in reasons]


@pytest.mark.spark
def test_the_decision_table_declares_not_nullable_the_columns_without_nulls(spark: Any) -> None:
    """Spark reads a joined decision without a null check where the column has no nulls; a copy not
    checked by file has a null file, so that column stays nullable (and a null is never declared away)."""
    reads = Reads.of(
        [
            Read(
                buf=buffer(origin=1, sequence=n + 1, chunk=0, file=f"f{n % 2}.parquet"),
                thresholds=(5,),
                reasons=("",),
                batch=1,
            )
            for n in range(4)
        ],
        nkeys=1,
    )
    work = PassWork(
        reads=reads,
        steps=[],
        floor=(0,),
        open_state={},
        state_dirs={},
        counts_dir="",
        checked={(1, 1, 0): frozenset({"g.parquet"})},  # the first copy has another copy elsewhere
    )
    levels = work.check_levels()
    frame = _decision_frame(spark, reads, work, {}, 1, _packing(reads), levels)
    nullable = {f.name: f.nullable for f in frame.schema.fields}
    assert nullable == {name: name == "d_file" for name in nullable}
    assert {"d_file", "d_weight", "d_check", "d_batch", "d_id", "d_thr0", "d_reason0"} <= set(nullable)
    files = [r["d_file"] for r in frame.orderBy("d_id").collect()]
    assert files == ["f0.parquet", None, None, None]
