"""The ``progress`` suite (docs/validation.md#suites): ``G_k`` never decreases across batches; per origin
and key the local watermark, the complete prefix and the stream cut never decrease.

The frame is the ``progress`` table with each watermark as integer microseconds ("no
watermark yet" is the int64 minimum, so a watermark that disappears counts as going back)
and, per (key, origin), the same values of the batch before (``prev_*``, null on the first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from expectations._inputs import SuiteInputs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["NAME", "expectations", "frame"]

NAME = "progress"
_LONG_MIN = -(2**63)


def frame(inputs: SuiteInputs) -> DataFrame:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    df = inputs.tables["progress"]
    df = df.select(
        "*",
        F.coalesce(F.unix_micros("global_watermark"), F.lit(_LONG_MIN)).alias("global_us"),
        F.coalesce(F.unix_micros("local_watermark"), F.lit(_LONG_MIN)).alias("local_us"),
    )
    by_origin = Window.partitionBy("wm_key", "origin_id").orderBy("batch")
    cut = F.struct(F.coalesce("cut_sequence", F.lit(0)), F.coalesce("cut_chunk", F.lit(0)))
    previous_cut = F.lag(cut).over(by_origin)
    return df.select(
        "*",
        F.lag("global_us").over(by_origin).alias("prev_global_us"),
        F.lag("local_us").over(by_origin).alias("prev_local_us"),
        F.lag("complete_prefix").over(by_origin).alias("prev_complete_prefix"),
        F.when(previous_cut.isNull(), F.lit(None))
        .when(cut < previous_cut, F.lit("back"))
        .otherwise(F.lit("forward"))
        .alias("stream_cut_move"),
    )


def expectations(inputs: SuiteInputs) -> list[Any]:
    import great_expectations.expectations as gxe

    def monotone(column: str, what: str) -> Any:
        return gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A=column,
            column_B=f"prev_{column}",
            or_equal=True,
            ignore_row_if="either_value_is_missing",
            description=what,
        )

    return [
        gxe.ExpectTableRowCountToBeBetween(min_value=1, description="every committed batch records its progress"),
        gxe.ExpectCompoundColumnsToBeUnique(
            column_list=["batch", "wm_key", "origin_id"], description="one row per batch, key and origin"
        ),
        monotone("global_us", "the global watermark G_k never decreases across batches"),
        monotone("local_us", "an origin's local watermark never decreases"),
        monotone("complete_prefix", "an origin's complete prefix never shrinks"),
        gxe.ExpectColumnValuesToBeInSet(
            column="stream_cut_move",
            value_set=["forward"],
            description="an origin's stream cut (sequence, chunk) never moves back",
        ),
    ]
