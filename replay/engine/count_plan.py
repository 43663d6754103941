"""How a pass takes the ledger's counts (``replay.engine.pass_counts``): where each sum rides.

- A pass of one batch, or of several whose batches' counts follow from the pass's totals
  (``pass_counts.derives``): the counts ride with the first window aggregation's partials
  (``ride``). Every row goes through that aggregation (the rows that enter no window in one extra
  group), each count is one more sum there, and only the groups' sums are observed
  (``DataFrame.observe``). Observing every row instead cost about 1 s of a 10M-tuple pass: Spark
  observes rows outside its generated code. Without a window aggregation the rows are observed
  (``observed``).
- Otherwise each batch's counts are a branch of their own (``grouped``), a second read of the
  rows' metadata columns. Observing every batch's sums on every row cost more (10M tuples in 20
  batches, 24 s against 13 to 15 s), and so did grouping the partials by batch as well, whose two
  consumers Spark did not compute once (docs/performance-record.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from replay.core.config import WindowSpec
from replay.engine import pass_counts
from replay.engine.passes import PassWork, Step
from replay.engine.windows import WindowColumns

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Observation

__all__ = ["CountPlan", "plan_counts", "suffix"]


@dataclass(frozen=True, slots=True)
class CountPlan:
    """``terms``: the per-row values summed (``pass_counts.packed``); ``same``: the counts equal to
    another (``pass_counts.filled``); ``derive``: each batch's counts follow from the pass's totals
    and its groups outside every window; ``from_groups``: rows, tuples, late and on-time counts are
    the first aggregation's groups' own (not sums over its rows); ``columns``: by count name, the
    column holding it on a batch's groups outside every window; ``metrics``: where the sums are
    observed; ``ride``: the sums as aggregates of the first window aggregation; ``observed``: the rows
    with their sums observed (no window aggregation); ``grouped``: each batch's sums as a frame of
    their own (``c_batch``, ``c_<name>``)."""

    terms: list[tuple[str, Column]]
    same: dict[str, str | None]
    derive: bool
    from_groups: bool
    columns: dict[str, str]
    metrics: Observation | None = None
    ride: tuple[Column, ...] = ()
    observed: DataFrame | None = None
    grouped: DataFrame | None = None

    @property
    def counted(self) -> list[str]:
        """A counts row's columns: the batch, then its sums."""
        return ["batch", *self.columns]


def suffix(steps: Sequence[Step]) -> str:
    """The observed counts' suffix: the batch of a pass of one, else the pass's."""
    return str(steps[0].batch) if len(steps) == 1 else pass_counts.PASS


def plan_counts(
    rows: DataFrame | None,
    work: PassWork,
    specs: Sequence[WindowSpec],
    spec_cols: Mapping[int, WindowColumns],
    key_index: Mapping[str, int],
    *,
    carried: bool,
    decided: Column,
) -> CountPlan:
    """How the pass of ``work`` over ``rows`` (``None``: it reads none) takes each batch's counts;
    ``carried``: it reads copies a committed batch decided; ``decided``: a row is decided by a batch
    of the pass."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    steps, nkeys = list(work.steps), len(key_index)
    range_start, range_end = work.range
    bounded = range_start is not None or range_end is not None
    terms, same = pass_counts.count_terms(specs, spec_cols, key_index, nkeys, bounded=bounded)
    terms = terms if rows is not None else []
    follows = pass_counts.derives(specs, spec_cols, nkeys)
    # A pass of several batches whose counts follow from the pass's totals counts like a pass of
    # one batch, and splits the rows outside every window by batch.
    derive = rows is not None and len(steps) > 1 and follows
    # In a pass that carries no copies, with one key whose late tuples ride in the first window
    # aggregation and whose windows own every on-time tuple they hold (tumbling, no range), the
    # late and on-time counts are the groups' own: a late group counts its late tuples, a window
    # group its on-time members, and every row is the pass's. They are summed over the groups when
    # observed, not over the rows in one more aggregate. In a pass of several batches the rows
    # outside every window are then no late and no on-time tuple of any batch (a row is a window's
    # member exactly when it is on time, and a late group's when it is late), so what
    # ``pass_counts.derived`` takes from a batch's groups outside every window is their rows.
    # The same holds when no copy of the pass can hold a late tuple (no late group, every late
    # count 0), so whether the pass has late rows does not matter.
    from_groups = rows is not None and nkeys == 1 and bool(specs) and not carried and not bounded and follows
    if from_groups:
        # The copy checksum is the one count left over the rows; the rows and tuples are the
        # groups' counts of all their rows, less the punctuation rows' group for the tuples
        # (``windows.partials``' ``tuple_flag``).
        terms = [(name, value) for name, value in terms if name not in ("rows", "tuples", "late0", "on0")]
    terms = pass_counts.packed(terms, int(work.reads.column("rows").sum()))
    # With the counts from the groups, a batch's groups outside every window give its rows as well.
    columns = {name: f"_c_{name}" for name, _ in terms} | ({"rows": "_all"} if derive and from_groups else {})
    plan = CountPlan(terms, same, derive, from_groups, columns)
    if rows is None:
        return plan
    if len(steps) == 1 or derive:
        metrics = Observation(f"pass_{uuid.uuid4().hex[:8]}")
        # Not the carried copies (batch 0): counted when decided.
        mine = F.col("d_batch") == F.lit(steps[0].batch) if len(steps) == 1 and carried else decided
        if specs:
            # ``_first``: a row once, though a sliding window's partials see it once per window.
            ride = tuple(F.sum(F.when(F.col("_first") & mine, value)).alias(f"_c_{name}") for name, value in terms)
            return replace(plan, metrics=metrics, ride=ride)
        end = suffix(steps)
        sums = [F.coalesce(F.sum(F.when(mine, value)), F.lit(0)).alias(f"{name}_{end}") for name, value in terms]
        return replace(plan, metrics=metrics, observed=rows.observe(metrics, *sums))
    grouped = (
        rows.where(F.col("d_batch") > 0)
        .groupBy(F.col("d_batch").alias("c_batch"))
        .agg(*[F.coalesce(F.sum(value), F.lit(0)).alias(f"c_{name}") for name, value in terms])
    )
    return replace(plan, grouped=grouped)
