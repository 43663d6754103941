"""The value types a pass declares for its shared columns (``routing.Shared``) are the types Spark
gives the same expressions: the shared columns are chosen by declared type, without analysing a
projection of the values."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from pyspark.sql.types import (
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from replay.core.config import WindowSpec
from replay.engine.routing import Shared
from replay.engine.windows import WindowColumns, aggregated_types, merge, output_columns, partials, window_values

_FUNCTIONS = ("count", "sum", "mean", "min", "max", "approx_count_distinct")


@pytest.mark.spark
@pytest.mark.parametrize("key_type", [StringType(), LongType()], ids=["string key", "long key"])
def test_a_windows_row_declares_the_types_spark_gives_its_values(spark: Any, key_type: Any) -> None:
    schema = StructType(
        [
            StructField("_ev0", LongType()),
            StructField("k", key_type),
            StructField("i", IntegerType()),
            StructField("d", DoubleType()),
            StructField("m", DecimalType(10, 2)),
        ]
    )
    key = "a" if isinstance(key_type, StringType) else 1
    rows = spark.createDataFrame(
        [(60_000_000 * n + 5, key, n, n / 3, Decimal(n) / 4) for n in range(6)] + [(7, None, None, None, None)],
        schema,
    )
    aggregations = [{"fn": "count"}] + [{"fn": fn, "column": column} for fn in _FUNCTIONS for column in ("i", "d", "m")]
    spec = WindowSpec.model_validate({"name": "w", "size": "60s", "aggregations": aggregations})
    types = aggregated_types([spec], schema)
    cols = WindowColumns(event_micros="_ev0", key="k", types=types)
    merged = merge([partials(rows, spec, cols)], spec, cols)
    values, _ = window_values(spec, cols, output_columns([spec], types), merged.schema["key"].dataType)

    analysed = merged.select(*[value.alias(name) for name, value, _ in values]).schema
    assert [(name, declared) for name, _, declared in values] == [(f.name, f.dataType) for f in analysed.fields]
    # And the shared columns the declared types choose hold the values as they are.
    selected, (placed,) = Shared().select([(None, values)])
    column_of = {name: column for column, name in placed}
    written = merged.select(*selected).orderBy(column_of["key"], column_of["window_start"]).collect()
    expected = merged.select(*[value.alias(name) for name, value, _ in values]).orderBy("key", "window_start")
    assert len(written) == 7
    assert [[row[column] for column, _ in placed] for row in written] == [list(row) for row in expected.collect()]


def test_shared_columns_follow_the_declared_types() -> None:
    shared = Shared()
    assert shared.columns([LongType(), StringType(), LongType()]) == ["_v0_0", "_v1_0", "_v0_1"]
    # Another destination's values share the columns of their type, from the first.
    assert shared.columns([StringType(), DoubleType(), LongType()]) == ["_v1_0", "_v2_0", "_v0_0"]
