"""The schemas of the ``windows`` and ``late`` tables (docs/outputs.md#tables), for an archive's schema:
as Spark types for the batch pass, and as encoded Arrow schemas for a commit and a version's manifest."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from replay.core.config import JobConfig
from replay.engine.archive import ArchiveLayout
from replay.store.outputs import encode_schema

__all__ = ["output_field", "table_schemas", "table_structs", "value_struct"]


def output_field(field: Any, kind: str | None) -> Any:
    """An archive column's field in an output table: a Parquet timestamp of any unit is a timestamp
    (microseconds; nanoseconds arrive as int64 under ``nanosAsLong``), epoch milliseconds stay int64."""
    from pyspark.sql.types import StructField, TimestampType

    if kind is None or kind == "epoch_ms":
        return field
    return StructField(field.name, TimestampType(), field.nullable)


def value_struct(schema: Any, layout: ArchiveLayout) -> Any:
    """The archive's columns as a pass's rows carry them to the windows and the ``late`` table
    (``replay.engine.rows.pass_rows``): ``schema`` (the files' Spark schema, nanoseconds as int64)
    with every time column of ``layout`` a timestamp (``output_field``), whatever its role."""
    from pyspark.sql.types import StructType

    return StructType([output_field(f, layout.time_columns.get(f.name)) for f in schema.fields])


def table_structs(config: JobConfig, schema: Any, layout: ArchiveLayout) -> tuple[Any, Any]:
    """The Spark schemas of the ``windows`` and ``late`` tables for an archive of ``schema``: an
    archive column in them (a ``min`` or ``max`` over it, or a late tuple's) has its type in
    ``value_struct``."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    from replay.engine.windows import aggregated_types, output_columns

    values = value_struct(schema, layout)
    agg_types = aggregated_types(config.windows, values)
    windows = StructType(
        [
            StructField("window", StringType(), False),
            StructField("wm_key", StringType(), False),
            StructField("key", schema[layout.key].dataType, True),
            StructField("window_start", TimestampType(), True),
            StructField("window_end", TimestampType(), True),
            *[StructField(n, t, True) for n, t in output_columns(config.windows, agg_types)],
        ]
    )
    late = StructType(
        [
            StructField("wm_key", StringType(), False),
            StructField("origin_id", LongType(), True),
            StructField("sequence_number", LongType(), True),
            StructField("chunk_number", LongType(), True),
            *[values[n] for n in layout.payload],
            StructField("violated_watermark", TimestampType(), True),
            StructField("reason", StringType(), False),
        ]
    )
    return windows, late


def table_schemas(
    config: JobConfig, schema: Any, layout: ArchiveLayout, previous: Mapping[str, str] | None
) -> dict[str, str]:
    """The Arrow schemas (encoded) of the ``windows`` and ``late`` tables, added to ``previous``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    windows, late = table_structs(config, schema, layout)
    result = dict(previous) if previous else {}
    result["windows"] = encode_schema(to_arrow_schema(windows, timezone="UTC"))
    result["late"] = encode_schema(to_arrow_schema(late, timezone="UTC"))
    return result
