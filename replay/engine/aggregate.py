"""The tuple work of a pass in Spark: lateness, late rows, window partials, emission.

A pass is one or more consecutive micro-batches of a run (``replay.runner.batch``). The
driver decides everything from buffer metadata (``replay.core.progress``): which buffer
copies each batch reads and the lateness threshold of each one's tuples per key. This
module turns that into one Spark action over the archive's rows, without a tuple
reaching the driver:

- the pass's rows, with their copies' decisions (``replay.engine.rows``): every row
  carries the batch that decided it (``d_batch``; 0 for a carried copy, whose tuples
  only rebuild open windows); what the pass is asked and reports back are the values of
  ``replay.engine.passes``;
- per key, a tuple is late (``event_time < threshold``), on time, or has no event
  time for the key (or, in a backfill, one outside the range);
- late tuples are written to the ``late`` table, in the directory of the batch that
  decided them; on-time ones are reduced to window partials and merged with the open
  windows carried in. With one watermark key the late tuples travel through the first window
  aggregation as groups of their own (``windows.partials``' ``late``), so the rows are read
  once; with several, a tuple late for one key may be on time for another, and the late
  tuples come from a second read of the rows;
- a window is written to the ``windows`` table in the directory of the first batch of
  the pass whose effective watermark reached its end; the others become the open-window
  state the pass carries out;
- all of it is one union (built by ``replay.engine.pass_query``), written by one
  ``mapInArrow`` (``replay.engine.sink``) whose collected result is the pass's only Spark
  action. The ledger's counts ride along as observed metrics (``replay.engine.count_plan``):
  per batch in a pass of one batch; in a pass of several, for the whole pass, with one group
  per batch of the rows outside every window, from which each batch's counts follow
  (``pass_counts.derives``, ``pass_counts.derived``); where they do not follow (several keys,
  sliding windows, a backfill range), per batch in one more branch. Without carried copies,
  with one key and tumbling windows, all but the copy checksum are sums over the first
  aggregation's groups, not its rows. A row of the union goes to one destination, so the
  destinations share its value columns (``routing.Shared``).

What comes back to the driver is small: per batch its row and tuple counts, a checksum
of its copy ids and per-key late/on-time counts (which the ledger checks), and per window
aggregation the number of windows emitted and left open and the tuples they own.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from replay.core.config import JobConfig
from replay.engine import float_sum, pass_counts, pass_query, unsummable
from replay.engine.aggregations import summed_columns
from replay.engine.archive import ArchiveLayout
from replay.engine.archive_files import read_failure
from replay.engine.passes import PassWork, SpecCounts, WorkResult
from replay.engine.sink import RESULT_SCHEMA, Written, keep_only, sink, storage_failure
from replay.engine.spark import follow_cores

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

__all__ = ["run_pass"]

_ADAPTIVE = "spark.sql.adaptive.enabled"


def run_pass(
    spark: SparkSession,
    *,
    config: JobConfig,
    layout: ArchiveLayout,
    schema: StructType,
    spark_paths: Mapping[str, str],
    work: PassWork,
) -> dict[int, WorkResult]:
    """Do the tuple work of one or more consecutive micro-batches in Spark (see the module
    docstring) in one Spark action; returns each batch's result, by batch number.

    A window is emitted at the first batch of the pass whose ``E_k`` reaches its end: every
    tuple decided in a later batch has a threshold at or above that batch's ``E_k``
    (``replay.core.progress``), so no later on-time tuple can enter it, and its aggregate over the
    whole pass is the one the batch would have emitted alone. Every destination's rows (per
    window aggregation its due windows, per batch, and its open windows; the late tuples, per
    batch; the per-batch counts) are branches of one union (``replay.engine.pass_query``),
    written by ``replay.engine.sink``.
    """
    import pyarrow.parquet as pq

    query = pass_query.build(spark, config=config, layout=layout, schema=schema, spark_paths=spark_paths, work=work)
    if query.union is None:
        return {
            step.batch: WorkResult(specs={spec.name: SpecCounts() for spec in config.windows}) for step in work.steps
        }
    parts = query.parts
    with _static_plan(spark):
        try:
            rows = query.union.mapInArrow(sink(parts, query.ids), RESULT_SCHEMA).collect()
        except Exception as exc:  # a task that could not write, or read: reported as the error it is
            summed = summed_columns(a for w in config.windows for a in w.aggregations)
            locator = (
                None
                if query.rows is None
                else unsummable.Locator(query.rows, work.reads, config, layout, query.windows)
            )
            failure: Exception | None = (
                storage_failure(exc)
                or read_failure(exc, {reported: ours for ours, reported in spark_paths.items()})
                or float_sum.failure(exc, summed, locator)
            )
            if failure is None:
                raise
            raise failure from exc
    written = [Written.from_row(r.asDict()) for r in rows]
    keep_only([p.directory for p in parts.values()], written)
    observed_counts: dict[str, Any] = dict(query.metrics.get) if query.metrics is not None else {}
    by_batch: dict[str, Any] = {}  # the counts rows: per batch, its sums (``derive``: of its rows outside every window)
    for w in written:
        if w.part == "counts":
            for row in pq.read_table(w.file).to_pylist():
                for name, value in row.items():
                    at = f"{name}_{row['batch']}"
                    by_batch[at] = by_batch.get(at, 0) + value if name != "batch" else row["batch"]
    shutil.rmtree(work.counts_dir, ignore_errors=True)

    def taken_apart(raw: Mapping[str, Any]) -> dict[str, Any]:
        return pass_counts.filled(pass_counts.unpacked(raw), query.same)

    specs = list(config.windows)
    if query.derive:  # each batch's counts from the pass's totals and its rows outside every window
        counts = pass_counts.derived(work, specs, written, taken_apart(observed_counts), taken_apart(by_batch))
    else:
        counts = taken_apart(observed_counts | by_batch)
    return pass_counts.results(work, specs, len(layout.keys), written, counts)


@contextmanager
def _static_plan(spark: SparkSession) -> Iterator[None]:
    """Adaptive execution off for the pass's action, as it was after it.

    The pass's plan is known before it starts: the driver decided every copy, the decisions are a
    broadcast (``F.broadcast``) and the rest is one aggregation into one writer. Adaptive execution
    re-planned the whole query after each of its stages (the broadcast, the aggregation's map side)
    and had nothing to change: 0.1 to 0.15 s of a 10M-tuple pass (docs/performance-record.md). Without it
    the shuffle has ``spark.sql.shuffle.partitions`` partitions exactly (one per core by default,
    counted now: ``replay.engine.spark.follow_cores``), and the observed counts of a stage that
    produced no rows stay (adaptive execution replaced such a stage by an empty relation, its
    metrics with it)."""
    follow_cores(spark)  # one shuffle partition per core the cluster has now
    before = spark.conf.get(_ADAPTIVE, None)
    spark.conf.set(_ADAPTIVE, "false")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(_ADAPTIVE)
        else:
            spark.conf.set(_ADAPTIVE, before)
