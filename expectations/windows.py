"""The ``windows`` suite (docs/validation.md#suites): schema, non-null, window sizes, counts, uniqueness,
closure under the effective watermark, and ``min <= mean <= max``.

The frame is the ``windows`` table plus a few columns the expectations compare:
``span_us`` (``window_end - window_start``), ``size_us`` (the configured size of the row's
window aggregation), ``end_us``, ``start_us`` and ``effective_us`` (``E_k`` of the row's key at
the end of the run), all integer microseconds.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from expectations._inputs import SuiteInputs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["NAME", "expectations", "frame"]

NAME = "windows"
_LONG_MIN = -(2**63)


def frame(inputs: SuiteInputs) -> DataFrame:
    from pyspark.sql import functions as F

    df = inputs.tables["windows"]
    sizes = F.create_map(*[x for w in inputs.config.windows for x in (F.lit(w.name), F.lit(w.size))])
    effective = F.create_map(*[x for k, e in inputs.effective.items() for x in (F.lit(k), F.lit(e))])
    return df.select(
        "*",
        (F.unix_micros("window_end") - F.unix_micros("window_start")).alias("span_us"),
        sizes[F.col("window")].alias("size_us"),
        F.unix_micros("window_start").alias("start_us"),
        F.unix_micros("window_end").alias("end_us"),
        F.coalesce(effective[F.col("wm_key")], F.lit(_LONG_MIN)).alias("effective_us"),
    )


def expectations(inputs: SuiteInputs) -> list[Any]:
    import great_expectations.expectations as gxe

    config = inputs.config
    columns = ["window", "wm_key", "key", "window_start", "window_end", *inputs.aggregation_columns]
    out: list[Any] = [
        gxe.ExpectTableColumnsToMatchSet(
            column_set=[*columns, "span_us", "size_us", "start_us", "end_us", "effective_us"],
            exact_match=True,
            description="the windows table has exactly the columns the job's aggregations give",
        ),
        gxe.ExpectColumnValuesToBeOfType(column="window_start", type_="TimestampType"),
        gxe.ExpectColumnValuesToBeOfType(column="window_end", type_="TimestampType"),
    ]
    for column in ("window", "wm_key", "key", "window_start", "window_end"):
        out.append(gxe.ExpectColumnValuesToNotBeNull(column=column, description=f"{column} is never null"))
    out += [
        gxe.ExpectColumnValuesToBeInSet(
            column="window",
            value_set=[w.name for w in config.windows],
            description="every row belongs to a configured window aggregation",
        ),
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="span_us",
            column_B="size_us",
            description="window_end - window_start equals the window's configured size",
        ),
        gxe.ExpectCompoundColumnsToBeUnique(
            column_list=["window", "key", "window_start"],
            description="each window of each key is emitted once",
        ),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="effective_us",
            column_B="end_us",
            or_equal=True,
            description="only windows the effective watermark closed are emitted (window_end <= E_k at the end)",
        ),
    ]
    if any(agg.fn == "count" and agg.column is None for w in config.windows for agg in w.aggregations):
        out.append(
            gxe.ExpectColumnValuesToBeBetween(
                column="count", min_value=1, description="a window is emitted only with an on-time tuple"
            )
        )
    # min <= mean <= max, per column, for the functions a window aggregation has.
    chains: dict[str, list[str]] = {}
    for spec in config.windows:
        for fn in ("min", "mean", "max"):
            for agg in spec.aggregations:
                if agg.fn == fn and agg.column is not None and agg.output_name not in chains.setdefault(agg.column, []):
                    chains[agg.column].append(agg.output_name)
    for column, chain in chains.items():
        order = sorted(chain, key=lambda name: ("min_", "mean_", "max_").index(name.split("_", 1)[0] + "_"))
        for low, high in itertools.pairwise(order):
            out.append(
                gxe.ExpectColumnPairValuesAToBeGreaterThanB(
                    column_A=high,
                    column_B=low,
                    or_equal=True,
                    ignore_row_if="either_value_is_missing",
                    description=f"{low} <= {high} for {column}",
                )
            )
    start, end = inputs.range
    if start is not None:
        out.append(
            gxe.ExpectColumnValuesToBeBetween(
                column="start_us", min_value=start, description="a backfill emits only windows inside its range"
            )
        )
    if end is not None:
        out.append(
            gxe.ExpectColumnValuesToBeBetween(
                column="end_us", max_value=end, description="a backfill emits only windows inside its range"
            )
        )
    return out
