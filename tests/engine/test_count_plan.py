"""Where a pass takes the ledger's counts (``replay.engine.count_plan``): riding in the first window
aggregation, derived from the pass's totals, observed on the rows, or in a branch per batch. That the
counts are right on each path is ``tests/runner/test_job_vs_reference.py``'s; this is which path
each kind of pass takes."""

from __future__ import annotations

from typing import Any

import pytest

from replay.core.config import WindowSpec
from replay.engine.count_plan import CountPlan, plan_counts, suffix
from replay.engine.pass_counts import PASS
from replay.engine.passes import PassWork, Read, Reads, Step
from replay.engine.windows import WindowColumns
from tests._archives import buffer

pytestmark = pytest.mark.spark

COUNT = [{"fn": "count"}]
TUMBLING = WindowSpec.model_validate({"name": "per_minute", "size": "60s", "aggregations": COUNT})
SLIDING = WindowSpec.model_validate(
    {"name": "sliding", "kind": "sliding", "size": "60s", "slide": "30s", "aggregations": COUNT}
)


def _plan(
    spark: Any,
    *,
    batches: int = 1,
    keys: int = 1,
    specs: tuple[WindowSpec, ...] = (TUMBLING,),
    carried: bool = False,
    bounded: bool = False,
    rows: bool = True,
) -> CountPlan:
    from pyspark.sql import functions as F

    reads = Reads.of(
        [
            Read(buf=buffer(origin=1, sequence=n + 1, chunk=0), thresholds=(0,) * keys, reasons=("",) * keys, batch=b)
            for n, b in enumerate([*range(1, batches + 1), *([0] if carried else [])])
        ],
        nkeys=keys,
    )
    steps = [Step(batch=b, effective=(0,) * keys, windows_dir="", late_dir="") for b in range(1, batches + 1)]
    limits = (0, 10**9) if bounded else (None, None)
    work = PassWork(
        reads=reads, steps=steps, floor=(0,) * keys, open_state={}, state_dirs={}, counts_dir="", range=limits
    )
    cols = {
        s: WindowColumns(event_micros="_ev0", key="key", types={}, range_start=limits[0], range_end=limits[1])
        for s in range(len(specs))
    }
    # A pass's rows as the plan reads them (``replay.engine.rows.pass_rows``): their columns only.
    flags = [f"{flag}{k} boolean" for k in range(keys) for flag in ("_late", "_on", "_out")]
    flags += [f"_ev{k} long" for k in range(keys)]
    frame = (
        spark.createDataFrame([], ", ".join(["d_batch long", "d_weight long", "_tuple boolean", *flags]))
        if rows
        else None
    )
    key_index = {"default" if k == 0 else f"k{k}": k for k in range(keys)}
    decided = F.col("d_batch") > 0 if carried else F.lit(True)
    return plan_counts(frame, work, specs, cols, key_index, carried=carried, decided=decided)


def _names(plan: CountPlan) -> set[str]:
    return {name for term, _ in plan.terms for name in term.split("|")}


def test_one_batch_one_key_tumbling_rides_and_takes_its_counts_from_the_groups(spark: Any) -> None:
    plan = _plan(spark)
    assert plan.metrics is not None and plan.ride and plan.observed is None and plan.grouped is None
    assert plan.from_groups and not plan.derive
    # The groups give rows, tuples, late and on-time counts: only the copy checksum is summed.
    assert _names(plan) == {"checksum"}


def test_several_batches_that_follow_from_the_totals_ride_and_split_by_batch(spark: Any) -> None:
    plan = _plan(spark, batches=3)
    assert plan.derive and plan.from_groups and plan.ride and plan.grouped is None
    assert plan.columns["rows"] == "_all"  # a batch's groups outside every window give its rows


@pytest.mark.parametrize(
    "kind",
    ["two keys", "sliding", "backfill range"],
)
def test_several_batches_that_do_not_follow_are_counted_per_batch_in_a_branch(spark: Any, kind: str) -> None:
    options: dict[str, Any] = {
        "two keys": {"keys": 2},
        "sliding": {"specs": (SLIDING,)},
        "backfill range": {"bounded": True},
    }[kind]
    plan = _plan(spark, batches=3, **options)
    assert plan.grouped is not None and plan.metrics is None and not plan.ride
    assert not plan.derive and not plan.from_groups
    assert {"rows", "tuples", "checksum"} <= _names(plan)


def test_carried_copies_are_counted_over_the_rows_not_the_groups(spark: Any) -> None:
    plan = _plan(spark, carried=True)
    assert plan.ride and not plan.from_groups
    assert {"rows", "tuples", "checksum", "late0", "on0"} <= _names(plan)


def test_without_a_window_aggregation_the_rows_are_observed(spark: Any) -> None:
    plan = _plan(spark, specs=())
    assert plan.observed is not None and plan.metrics is not None and not plan.ride


def test_a_pass_reading_no_rows_sums_nothing(spark: Any) -> None:
    plan = _plan(spark, rows=False)
    assert plan.terms == [] and plan.metrics is None and plan.grouped is None and not plan.ride


def test_the_observed_suffix_is_the_batch_or_the_pass() -> None:
    one = [Step(batch=7, effective=(0,), windows_dir="", late_dir="")]
    assert suffix(one) == "7"
    assert suffix([*one, Step(batch=8, effective=(0,), windows_dir="", late_dir="")]) == PASS
