"""The reconciliation suite's own reading of time (``expectations.reconciliation``): archive and
``late`` table time columns as int64 microseconds, and archive columns as the ``windows`` table
aggregates them, written apart from the engine's conversion (``replay.engine.archive_rows``) so
that a bug there is a difference here, not a shared wrong answer (docs/archive.md#timestamps)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = ["archive_micros", "archive_value", "output_micros"]


def archive_micros(column: str, kind: str) -> Column:
    """An archive time column as int64 microseconds, written apart from the engine's conversion
    (``replay.engine.archive_rows.time_micros``) so that a bug there shows up as a difference here.

    Nanoseconds (int64 under ``nanosAsLong``) go through exact decimal arithmetic: ``floor`` of
    ``decimal(20,0) / 1000`` truncates toward minus infinity and never touches a double.
    """
    from pyspark.sql import functions as F

    col = F.col(f"`{column}`")
    if kind == "epoch_ms":
        return col.cast("long") * F.lit(1000)
    if kind == "ns":
        return F.floor(col.cast("decimal(20,0)") / F.lit(1000).cast("decimal(4,0)")).cast("long")
    return F.unix_micros(col.cast("timestamp"))  # Spark's own reading of a ms or us Parquet timestamp


def archive_value(column: str, kind: str | None) -> Column:
    """An archive column as the ``windows`` table aggregates it: a time column of any Parquet unit
    as a timestamp at microseconds (``archive_micros``), the others (and int64 epoch milliseconds)
    as they are."""
    from pyspark.sql import functions as F

    if kind is None or kind == "epoch_ms":
        return F.col(f"`{column}`")
    return F.timestamp_micros(archive_micros(column, kind))


def output_micros(column: str, kind: str) -> Column:
    """A time column of the ``late`` table as int64 microseconds: a timestamp for every Parquet
    unit (nanoseconds were truncated to microseconds), int64 epoch milliseconds under ``time_unit: ms``."""
    from pyspark.sql import functions as F

    col = F.col(f"`{column}`")
    if kind == "epoch_ms":
        return col.cast("long") * F.lit(1000)
    return F.unix_micros(col.cast("timestamp"))
