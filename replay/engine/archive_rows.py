"""The archive's rows in Spark: read with the file and position of each row (``read_rows``), and
their time columns as Spark expressions (docs/archive.md#timestamps): int64 microseconds since the
epoch (``time_micros``), what progress, lateness and windows compare, and the value output tables
show (``time_value``).

The copies' content hashes (``replay.engine.copies``), a pass's rows (``replay.engine.rows``), the
output tables (``replay.engine.aggregate``) and the reconciliation suite's recomputation read the
archive through here; the metadata scan (``replay.engine.scan``) reads it with pyarrow instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from replay.core.paths import local_path
from replay.engine.archive import ArchiveLayout

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["read_parquet", "read_rows", "time_micros", "time_value"]


def _sql_name(column: str) -> str:
    """``column`` quoted for a Spark SQL expression."""
    return "`" + column.replace("`", "``") + "`"


def time_micros(df: DataFrame, column: str, kind: str) -> Column:
    """A Spark expression for ``column`` as int64 microseconds since the epoch (UTC).

    ``kind`` is the column's entry in ``ArchiveLayout.time_columns``. Nanoseconds (read as
    int64 under ``spark.sql.legacy.parquet.nanosAsLong``) are truncated toward minus infinity
    in exact 64-bit integer arithmetic: ``-1 ns`` is ``-1 us``, ``999 ns`` is ``0 us``. They
    never go through a double, which holds epoch nanoseconds of this century only to the
    nearest 256 ns and would put a tuple on the wrong side of a watermark.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampNTZType

    col = F.col(_sql_name(column))
    if kind == "epoch_ms":
        return col.cast("long") * 1000
    if kind == "ns":
        nanos = col.cast("long")
        # SQL's integral ``div`` truncates toward zero; below the epoch a remainder means one less.
        toward_zero = F.expr(f"CAST({_sql_name(column)} AS BIGINT) div 1000")
        return F.when(nanos % 1000 < 0, toward_zero - 1).otherwise(toward_zero)
    if isinstance(df.schema[column].dataType, TimestampNTZType):
        col = col.cast("timestamp")  # wall clock taken as UTC (the session time zone)
    return F.unix_micros(col)


def time_value(df: DataFrame, column: str, kind: str) -> Column:
    """``column`` as it appears in output tables: a timestamp (microseconds, UTC) for a Parquet
    timestamp of any unit, the int64 epoch milliseconds unchanged under ``time_unit: ms``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    if kind == "epoch_ms" or isinstance(df.schema[column].dataType, TimestampType):
        return F.col(_sql_name(column))
    return F.timestamp_micros(time_micros(df, column, kind))


_LISTING = "spark.sql.sources.parallelPartitionDiscovery.threshold"


def read_parquet(spark: SparkSession, schema: StructType | None, paths: Sequence[str]) -> DataFrame:
    """Spark's Parquet reader over ``paths`` (with ``schema``, or merging the files' schemas when
    ``None``). Local files are listed on the driver: past 32 paths Spark would otherwise list them
    in a Spark job of its own (about a quarter of a second), which only pays off on remote stores."""
    reader = spark.read.schema(schema) if schema is not None else spark.read.option("mergeSchema", "true")
    if len(paths) <= 32 or any(local_path(p) is None for p in paths):
        return reader.parquet(*paths)
    previous = spark.conf.get(_LISTING, None)
    spark.conf.set(_LISTING, str(len(paths) + 1))
    try:
        return reader.parquet(*paths)  # the file index is built (the files listed) here
    finally:
        if previous is None:
            spark.conf.unset(_LISTING)
        else:
            spark.conf.set(_LISTING, previous)


def read_rows(spark: SparkSession, layout: ArchiveLayout, files: Sequence[str] | None = None) -> DataFrame:
    """The rows of ``files`` (default: the archive's) with ``_file`` and ``_row`` (position within
    the file) attached."""
    from pyspark.sql import functions as F

    if "ns" in layout.time_columns.values():
        spark.conf.set("spark.sql.legacy.parquet.nanosAsLong", "true")
    # Files may differ in optional columns: merge the footers' schemas (types were checked to agree),
    # so that a column one file lacks reads as null instead of vanishing from the others.
    if len(layout.schema):
        from replay.engine.archive import spark_schema

        df = read_parquet(spark, spark_schema(layout), files or layout.files)
    else:
        df = read_parquet(spark, None, files or layout.files)
    return df.select("*", F.col("_metadata.file_path").alias("_file"), F.col("_metadata.row_index").alias("_row"))
