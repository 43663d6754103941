"""The ``reconciliation`` suite (docs/validation.md#suites): the emitted windows equal an independent
recomputation, and the ledger identity holds for every batch.

**The recomputation** is a plain Spark batch over the version's archive files, written
without the engine's code (no progress engine, no partials, no merging):

1. copies: runs of consecutive rows of one buffer identity within a file (a grouping where
   an identity's rows in a file are consecutive, gaps and islands over the row position where
   not); of an identity's copies the first by (``ingest_ts``, file, first row) is kept, the
   others are duplicates; every copy of a buffer the ``integrity`` table lists as ``after_skip``
   (its sequence closed by ``gap_policy: skip`` in an earlier run) is discarded;
2. in origin mode, tuples of sequences beyond ``complete prefix + 1`` are still pending
   (their threshold is not known yet) and are left out;
3. per window aggregation, tuples in the ``late`` table of its key are left out (lateness is a
   threshold on the event time, so (origin, sequence, chunk, event time) identifies them);
4. each tuple goes to every window ``[start, start + size)`` holding it, windows whose end the
   final effective watermark has not reached (and, for a backfill, windows not inside the
   range) are dropped, and each aggregation is one ``groupBy`` with Spark's own functions
   (``countDistinct`` for ``approx_count_distinct``, which the engine computes exactly), over a
   time column's values at microseconds (a nanosecond one truncated by its own arithmetic here).

The frame has one row per compared item (``check``: ``window``, ``ledger`` or ``totals``),
with ``item`` naming it and a column per comparison that is null when it agrees and says
what differs otherwise; the expectations ask those columns to be null.
"""

from __future__ import annotations

from functools import reduce
from operator import and_
from typing import TYPE_CHECKING, Any

from expectations._inputs import SuiteInputs
from expectations._times import archive_micros, archive_value, output_micros

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from replay.core.config import WindowSpec

__all__ = ["NAME", "expectations", "frame", "recompute"]

NAME = "reconciliation"
_IDENTITY = ("_o", "_s", "_c")
#: Up to this many kept copies, the archive's rows meet them in a broadcast join (a copy's record
#: is a few dozen bytes); beyond, in a join Spark plans as it sees fit.
_BROADCAST_COPIES = 1_000_000


def _kept_rows(inputs: SuiteInputs) -> tuple[DataFrame, dict[str, int]]:
    """The rows of kept copies, with ``_o, _s, _c`` identity columns, and the tuples left out:
    ``discarded`` (the other copies') and ``pending`` (in origin mode, of sequences beyond
    ``complete prefix + 1``, whose threshold is not known yet; those rows are left out too).

    Copies are found on the rows' file, position and identity alone, one record each with its row
    range, kept in Spark's memory; the archive's rows are then matched to their kept copy by file,
    identity and row range, a broadcast join while the kept copies are few enough: the wide rows
    never go through a shuffle.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from replay.engine.archive_rows import read_rows

    layout = inputs.layout
    rows = read_rows(inputs.spark, layout).select(
        "*",
        F.col(f"`{layout.origin_id}`").cast("long").alias("_o"),
        F.col(f"`{layout.sequence_number}`").cast("long").alias("_s"),
        F.col(f"`{layout.chunk_number}`").cast("long").alias("_c"),
    )
    # At microseconds, as Replay compares times: two copies a nanosecond apart arrived together.
    ingest = archive_micros(layout.ingest_ts, layout.time_columns[layout.ingest_ts]) if layout.ingest_ts else F.lit(0)
    narrow = rows.select("_file", "_row", *_IDENTITY, ingest.alias("_ingest"), _tuple_flag(layout).alias("_tuple"))
    within = ["_file", *_IDENTITY]
    stats = [
        F.min("_ingest").alias("_ingest"),
        F.min("_row").alias("_first"),
        F.max("_row").alias("_last"),
        F.sum(F.col("_tuple").cast("long")).alias("_tuples"),
    ]
    # An identity's rows in a file are one copy when they are consecutive (as many rows as their
    # range spans): a grouping, no sort. Only where they are not (an identity archived twice in one
    # file) are its rows numbered, gaps and islands: within a run of consecutive rows of one
    # identity, row - rank is constant.
    groups = narrow.groupBy(*within).agg(*stats, F.count(F.lit(1)).alias("_n")).localCheckpoint()
    runs = F.col("_n") == F.col("_last") - F.col("_first") + 1
    copies = groups.where(runs).drop("_n")
    split = groups.where(~runs).select(*within)
    if split.limit(1).count():
        rank = F.row_number().over(Window.partitionBy(*within).orderBy("_row"))
        islands = (
            narrow.join(F.broadcast(split), within, "left_semi")
            .withColumn("_island", F.col("_row") - rank)
            .groupBy(*within, "_island")
            .agg(*stats)
            .drop("_island")
        )
        copies = copies.unionByName(islands)
    first = Window.partitionBy(*_IDENTITY).orderBy("_ingest", "_file", "_first")
    copies = copies.withColumn("_kept", F.row_number().over(first) == 1)
    # A buffer of a sequence that gap_policy: skip closed in an earlier run arrived too late to be
    # replayed: every copy of it is discarded (the integrity table lists it as ``after_skip``).
    late = [
        tuple(r)
        for r in inputs.tables["integrity"]
        .where("kind = 'after_skip'")
        .select("origin_id", "sequence_number", "chunk_number")
        .collect()
    ]
    if late:
        closed = F.lit(False)
        for identity in late:
            closed = closed | reduce(and_, [F.col(c) == F.lit(v) for c, v in zip(_IDENTITY, identity, strict=True)])
        copies = copies.withColumn("_kept", F.col("_kept") & ~closed)
    if inputs.mode == "origin":
        prefix = {int(o["origin"]): int(o["complete_prefix"]) for o in inputs.manifest.origins or ()}
        limit = F.create_map(*[x for o, p in prefix.items() for x in (F.lit(o), F.lit(p + 1))])
        copies = copies.withColumn("_pending", F.col("_s") > F.coalesce(limit[F.col("_o")], F.lit(1)))
    else:
        copies = copies.withColumn("_pending", F.lit(False))
    # Computed once for both the counts below and the join (GX persists the frame it validates, so the
    # join itself runs once).
    copies = copies.select("_file", *_IDENTITY, "_first", "_last", "_tuples", "_kept", "_pending").localCheckpoint()
    totals = copies.agg(
        F.sum(F.when(~F.col("_kept"), F.col("_tuples"))).alias("discarded"),
        F.sum(F.when(F.col("_kept") & F.col("_pending"), F.col("_tuples"))).alias("pending"),
        F.sum(F.when(F.col("_kept") & ~F.col("_pending"), F.lit(1))).alias("kept"),
    ).collect()[0]
    left_out = {"discarded": int(totals["discarded"] or 0), "pending": int(totals["pending"] or 0)}
    kept = copies.where(F.col("_kept") & ~F.col("_pending")).select(
        *[F.col(c).alias(f"_k{c}") for c in ("_file", *_IDENTITY)], "_first", "_last"
    )
    if int(totals["kept"] or 0) <= _BROADCAST_COPIES:
        kept = F.broadcast(kept)
    match = (
        (rows["_file"] == kept["_k_file"])
        & (rows["_o"] == kept["_k_o"])
        & (rows["_s"] == kept["_k_s"])
        & (rows["_c"] == kept["_k_c"])
        & rows["_row"].between(kept["_first"], kept["_last"])
    )
    return rows.join(kept, match).select(rows["*"]), left_out


def _tuple_flag(layout: Any) -> Column:
    """A row is a tuple (not a punctuation row) unless its key and every event-time column are null."""
    from pyspark.sql import functions as F

    flag = F.col(f"`{layout.key}`").isNotNull()
    for key in layout.keys:
        flag = flag | F.col(f"`{key.event_time}`").isNotNull()
    return flag


def _window_rows(rows: DataFrame, spec: WindowSpec, inputs: SuiteInputs) -> DataFrame:
    """``rows`` (with their event time ``_t``) once per window holding them, as ``_start``."""
    from pyspark.sql import functions as F

    t = F.col("_t")
    size, slide, offset = spec.size, spec.effective_slide, spec.offset
    latest = t - F.pmod(t - F.lit(offset), F.lit(slide))
    per_tuple = -(-size // slide)  # windows a tuple can fall in
    starts = F.sequence(latest - F.lit((per_tuple - 1) * slide), latest, F.lit(slide))
    out = rows.select("*", F.explode(starts).alias("_start"))
    out = out.where(F.col("_start") + F.lit(size) > F.col("_t"))
    effective = inputs.effective.get(spec.wm_key, -(2**63))
    out = out.where(F.col("_start") + F.lit(size) <= F.lit(effective))
    start, end = inputs.recompute_range
    if start is not None:
        out = out.where(F.col("_start") >= F.lit(start))
    if end is not None:
        out = out.where(F.col("_start") + F.lit(size) <= F.lit(end))
    return out


def _aggregate(column: str | None, fn: str, kind: str | None) -> Column:
    """Aggregation ``fn`` over ``column`` (of time kind ``kind``, ``None`` for a column that is no
    time) with Spark's own functions."""
    from pyspark.sql import functions as F

    if fn == "count":
        return F.count(F.lit(1)) if column is None else F.count(F.col(f"`{column}`"))
    assert column is not None  # every function but count names a column
    value = archive_value(column, kind)
    return {
        "sum": F.sum,
        "min": F.min,
        "max": F.max,
        "mean": F.avg,
        "approx_count_distinct": F.count_distinct,
    }[fn](value)


def recompute(inputs: SuiteInputs) -> tuple[DataFrame, dict[str, int]]:
    """The windows a plain batch aggregate gives, and the tuple counts it left out (``pending``, ``discarded``).

    Rows have ``window, key, start_us`` and one column per aggregation (``<name>`` of the
    ``windows`` table).
    """
    from pyspark.sql import functions as F

    layout = inputs.layout
    kept, left_out = _kept_rows(inputs)
    late = inputs.tables["late"]
    late_kind = {k.name: k for k in layout.keys}
    frames = []
    for spec in inputs.config.windows:
        key = late_kind[spec.wm_key]
        kind = layout.time_columns[key.event_time]
        rows = kept.withColumn("_t", archive_micros(key.event_time, kind)).where("_t IS NOT NULL")
        late_k = late.where(F.col("wm_key") == spec.wm_key).select(
            F.col("origin_id").alias("_o"),
            F.col("sequence_number").alias("_s"),
            F.col("chunk_number").alias("_c"),
            output_micros(key.event_time, kind).alias("_late_t"),
        )
        rows = rows.join(
            late_k,
            (rows["_o"] == late_k["_o"])
            & (rows["_s"] == late_k["_s"])
            & (rows["_c"] == late_k["_c"])
            & (rows["_t"] == late_k["_late_t"]),
            "left_anti",
        )
        windowed = _window_rows(rows, spec, inputs)
        aggs = [
            _aggregate(a.column, a.fn, layout.time_columns.get(a.column) if a.column else None).alias(a.output_name)
            for a in spec.aggregations
        ]
        # What a float sum or mean is compared relative to: Spark's sum rounds at every addition, so
        # it can be off by the tolerance times the sum of the magnitudes, however small the sum.
        aggs += [
            (F.sum if a.fn == "sum" else F.avg)(F.abs(F.col(f"`{a.column}`").cast("double"))).alias(
                _scale(a.output_name)
            )
            for a in spec.aggregations
            if a.fn in ("sum", "mean") and a.column is not None
        ]
        frames.append(
            windowed.groupBy(F.col(f"`{layout.key}`").alias("key"), F.col("_start").alias("start_us"))
            .agg(*aggs)
            .select(F.lit(spec.name).alias("window"), "*")
        )
    result = frames[0]
    for other in frames[1:]:
        result = result.unionByName(other, allowMissingColumns=True)
    return result, left_out


def _scale(name: str) -> str:
    return f"_scale_{name}"


def _describe(value: Column) -> Column:
    from pyspark.sql import functions as F

    return F.coalesce(value.cast("string"), F.lit("null"))


def _float_columns(inputs: SuiteInputs) -> set[str]:
    """Aggregation outputs compared with a tolerance: sums and means of floating-point columns."""
    from pyspark.sql.types import DoubleType, FloatType

    schema = inputs.tables["windows"].schema
    return {
        a.output_name
        for spec in inputs.config.windows
        for a in spec.aggregations
        if a.fn in ("sum", "mean") and isinstance(schema[a.output_name].dataType, DoubleType | FloatType)
    }


def _window_checks(inputs: SuiteInputs, expected: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    actual = inputs.tables["windows"].select("*", F.unix_micros("window_start").alias("start_us"))
    names = inputs.aggregation_columns
    a = actual.select(
        F.col("window").alias("a_window"),
        F.col("key").alias("a_key"),
        F.col("start_us").alias("a_start"),
        *[F.col(f"`{n}`").alias(f"a_{n}") for n in names],
        F.lit(True).alias("a_present"),
    )
    e = expected.select(
        F.col("window").alias("e_window"),
        F.col("key").alias("e_key"),
        F.col("start_us").alias("e_start"),
        *[F.col(f"`{n}`").alias(f"e_{n}") for n in names],
        *[F.col(f"`{_scale(n)}`").alias(f"e_{_scale(n)}") for n in names if _scale(n) in expected.columns],
        F.lit(True).alias("e_present"),
    )
    joined = a.join(
        e,
        (a["a_window"] == e["e_window"]) & a["a_key"].eqNullSafe(e["e_key"]) & (a["a_start"] == e["e_start"]),
        "full_outer",
    )
    window = F.coalesce("a_window", "e_window")
    key = F.coalesce(F.col("a_key"), F.col("e_key"))
    start = F.coalesce("a_start", "e_start")
    item = F.concat_ws(
        " ",
        window,
        F.concat(F.lit("key="), _describe(key)),
        F.date_format(F.timestamp_micros(start), "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"),
    )
    both = F.col("a_present") & F.col("e_present")
    presence = (
        F.when(both, F.lit("both"))
        .when(F.col("a_present"), F.lit("emitted, not in the recomputation"))
        .otherwise(F.lit("in the recomputation, not emitted"))
    )
    floats = _float_columns(inputs)
    tolerance = inputs.config.validation.float_tolerance
    checks = []
    for n in names:
        av, ev = F.col(f"a_{n}"), F.col(f"e_{n}")
        if n in floats:
            scale = F.greatest(F.abs(av), F.abs(ev), F.coalesce(F.col(f"e_{_scale(n)}"), F.lit(0.0)), F.lit(1.0))
            agree = (av.isNull() & ev.isNull()) | (F.abs(av - ev) <= F.lit(tolerance) * scale)
        else:
            agree = av.eqNullSafe(ev)
        checks.append(
            F.when(~both | F.coalesce(agree, F.lit(False)), F.lit(None))
            .otherwise(F.concat(item, F.lit(f": {n} recomputed "), _describe(ev), F.lit(", emitted "), _describe(av)))
            .alias(f"{n}_mismatch")
        )
    return joined.select(
        F.lit("window").alias("check"),
        item.alias("item"),
        presence.alias("presence"),
        *checks,
    )


def _ledger_checks(
    inputs: SuiteInputs, left_out: dict[str, int], window_counts: dict[str, int]
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    batches = list(inputs.manifest.ledger_batches or ())
    for entry in batches:
        accounted_xor = entry["processed_xor"] ^ entry["pending_xor"] ^ entry["discarded_xor"]
        xor_problem = None
        if accounted_xor != entry["read_xor"]:
            xor_problem = (
                f"batch {entry['batch']}: XOR of the copies read {entry['read_xor']:#x} differs from the XOR of "
                f"those processed, pending and discarded {accounted_xor:#x}"
            )
        for name, w in entry["windows"].items():
            terms = {
                "in windows": w["emitted"] + w["open"],
                "unwindowed": w["unwindowed"],
                "late": w["late"],
                "no event time": w["no_event_time"],
                "outside the range": w["outside_range"] + entry["outside_skipped"],
                "pending": entry["pending"],
                "duplicates": entry["discarded"],
            }
            total = sum(terms.values())
            problem = None
            if total != entry["tuples_read"]:
                parts = " + ".join(f"{v} {k}" for k, v in terms.items())
                problem = (
                    f"batch {entry['batch']} {name}: {entry['tuples_read']} tuples read, {total} accounted ({parts})"
                )
            elif w["entered"] != w["emitted"] + w["open"]:
                problem = (
                    f"batch {entry['batch']} {name}: {w['entered']} on-time tuples entered, "
                    f"windows own {w['emitted'] + w['open']}"
                )
            rows.append(
                {
                    "check": "ledger",
                    "item": f"batch {entry['batch']} {name}",
                    "ledger_identity": problem,
                    "ledger_xor": xor_problem,
                }
            )
    if batches and inputs.previous_windows is None:  # a merged publication's tables hold more than its run
        last = batches[-1]
        for spec in inputs.config.windows:
            w = last["windows"][spec.name]
            problems = []
            if window_counts.get(spec.name, 0) != w["emitted_windows"]:
                problems.append(
                    f"the ledger counts {w['emitted_windows']} emitted windows, the table has "
                    f"{window_counts.get(spec.name, 0)}"
                )
            if inputs.late_per_key.get(spec.wm_key, 0) != w["late"]:
                problems.append(
                    f"the ledger counts {w['late']} late tuples of key {spec.wm_key}, the late table has "
                    f"{inputs.late_per_key.get(spec.wm_key, 0)}"
                )
            if inputs.recompute_range == (None, None):
                for term in ("pending", "discarded"):
                    if left_out[term] != last[term]:
                        problems.append(
                            f"the ledger counts {last[term]} {term} tuples, the recomputation finds {left_out[term]}"
                        )
            rows.append(
                {
                    "check": "totals",
                    "item": f"{spec.name} after batch {last['batch']}",
                    "ledger_tables": "; ".join(problems) or None,
                }
            )
    return rows


def _outside(inputs: SuiteInputs, windows: DataFrame) -> DataFrame:
    """A merged publication's copied part: the previous publication's windows not inside the run's range."""
    from pyspark.sql import functions as F

    start, end = inputs.recompute_range
    inside = F.lit(True)
    if start is not None:
        inside = inside & (F.unix_micros("window_start") >= F.lit(start))
    if end is not None:
        inside = inside & (F.unix_micros("window_end") <= F.lit(end))
    names = inputs.aggregation_columns
    return windows.where(~inside).select(
        "window", "key", F.unix_micros("window_start").alias("start_us"), *[F.col(f"`{n}`") for n in names]
    )


def frame(inputs: SuiteInputs) -> DataFrame:
    expected, left_out = recompute(inputs)
    if inputs.previous_windows is not None:
        expected = expected.unionByName(_outside(inputs, inputs.previous_windows), allowMissingColumns=True)
    windows = _window_checks(inputs, expected)
    counts = {r["window"]: int(r["count"]) for r in inputs.tables["windows"].groupBy("window").count().collect()}
    ledger = _ledger_checks(inputs, left_out, counts)
    schema = "check string, item string, ledger_identity string, ledger_xor string, ledger_tables string"
    extra = inputs.spark.createDataFrame(
        [{k: r.get(k) for k in ("check", "item", "ledger_identity", "ledger_xor", "ledger_tables")} for r in ledger],
        schema,
    )
    return windows.unionByName(extra, allowMissingColumns=True)


def expectations(inputs: SuiteInputs) -> list[Any]:
    import great_expectations.expectations as gxe

    names = inputs.aggregation_columns
    out: list[Any] = [
        gxe.ExpectColumnValuesToBeInSet(
            column="presence",
            value_set=["both"],
            description="every emitted window is in the recomputation, and every recomputed window was emitted",
        )
    ]
    for n in names:
        out.append(
            gxe.ExpectColumnValuesToBeNull(
                column=f"{n}_mismatch", description=f"{n} of every emitted window equals the recomputation"
            )
        )
    out += [
        gxe.ExpectColumnValuesToBeNull(
            column="ledger_identity",
            description="per batch: tuples read = in windows + unwindowed + late + no event time + outside the "
            "range + pending + duplicates",
        ),
        gxe.ExpectColumnValuesToBeNull(
            column="ledger_xor",
            description="per batch: XOR of the buffer copies read = XOR of those processed, pending and discarded",
        ),
        gxe.ExpectColumnValuesToBeNull(
            column="ledger_tables",
            description="the ledger's emitted windows and late tuples match the tables, and its pending and "
            "duplicate tuples match the recomputation",
        ),
    ]
    return out
