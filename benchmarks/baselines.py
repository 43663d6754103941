"""Baselines for ``replay run``: the same window aggregation done the plain Spark ways.

Both baselines read every row of an archive of Parquet files (as written by ``replay generate``) and
compute, per 60 s tumbling window on ``event_time`` and per ``key``: ``count(*)``, ``sum(value)``,
``min(value)``, ``max(value)``. The result is written as Parquet to a temporary directory (removed
afterwards), so the work really happens and the output cost is comparable to Replay's.

- ``plain_batch``: ``spark.read.parquet`` and one batch ``groupBy``; every window is written.
- ``structured_streaming``: the archive as a file stream source, a 0 s watermark on ``event_time``
  (allowed lateness 0), append mode, ``trigger(availableNow=True)``. Windows still open when the input
  ends (at least the one holding the largest event time) are never emitted; with several micro-batches
  (``max_files_per_trigger``), rows of a window already emitted in an earlier micro-batch are dropped as
  late (Spark filters late rows with the previous micro-batch's watermark).

Neither baseline knows about buffers: re-delivered copies and idle punctuation rows, if the archive has
any, are aggregated like tuples. Times are wall-clock seconds (``time.perf_counter``), throughput is
input rows per wall-clock second.

Run as ``python benchmarks/baselines.py ARCHIVE_DIR [--shuffle-partitions 2]``: one local session, each
baseline twice (the first run also warms up the JVM), a table of both runs.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["WINDOW", "BaselineResult", "main", "plain_batch", "structured_streaming"]

#: The tumbling window length, as Spark's ``window()`` duration string.
WINDOW = "60 seconds"


@dataclass(frozen=True, slots=True, kw_only=True)
class BaselineResult:
    """One measured run of a baseline.

    ``tuples`` is the number of input rows read (rows, not buffers); ``seconds`` the wall-clock seconds
    from the first Spark call on the archive until the output was written (the query terminated);
    ``tuples_per_s`` is ``tuples / seconds`` (rows per wall-clock second); ``output_rows`` the number of
    (window, key) rows written. ``extra`` holds notes (durations in seconds, counts in rows).
    """

    name: str
    tuples: int
    seconds: float
    tuples_per_s: float
    output_rows: int
    extra: Mapping[str, Any] = field(default_factory=dict)


def _aggregate(df: DataFrame) -> DataFrame:
    """The aggregation both baselines run: per 60 s tumbling window on ``event_time`` and per ``key``."""
    from pyspark.sql import functions as F

    aggregates: list[Column] = [
        F.count(F.lit(1)).alias("count"),
        F.sum("value").alias("sum"),
        F.min("value").alias("min"),
        F.max("value").alias("max"),
    ]
    return df.groupBy(F.window("event_time", WINDOW).alias("window"), F.col("key")).agg(*aggregates)


def _count_parquet(spark: SparkSession, path: Path, like: DataFrame) -> int:
    """Rows in a Parquet output directory (read with ``like``'s schema, so an empty output counts 0)."""
    return spark.read.schema(like.schema).parquet(str(path)).count()


def _result(name: str, tuples: int, seconds: float, output_rows: int, extra: Mapping[str, Any]) -> BaselineResult:
    return BaselineResult(
        name=name,
        tuples=tuples,
        seconds=seconds,
        tuples_per_s=tuples / seconds if seconds > 0 else float("nan"),
        output_rows=output_rows,
        extra=dict(extra),
    )


def plain_batch(spark: SparkSession, archive: Path) -> BaselineResult:
    """Batch baseline: ``spark.read.parquet(archive)``, one ``groupBy(window, key)``, written as Parquet.

    The timed part (``seconds``, wall-clock) runs from ``spark.read.parquet`` (file listing, schema)
    until the output directory is written. The input rows (``tuples``) and output rows are counted
    afterwards, outside the timed part. Every window is written, including the last (partial) ones.
    """
    with tempfile.TemporaryDirectory(prefix="replay-baseline-batch-") as tmp:
        out = Path(tmp) / "out"
        start = time.perf_counter()
        source = spark.read.parquet(str(archive))
        result = _aggregate(source)
        result.write.mode("overwrite").parquet(str(out))
        seconds = time.perf_counter() - start
        tuples = source.count()
        output_rows = _count_parquet(spark, out, result)
    return _result("plain batch", tuples, seconds, output_rows, {"tuples_from": "count() of the input, untimed"})


def structured_streaming(
    spark: SparkSession, archive: Path, *, max_files_per_trigger: int | None = None
) -> BaselineResult:
    """Structured Streaming baseline: the archive as a Parquet file stream, drained with ``availableNow``.

    ``spark.readStream.schema(<the files' schema>).parquet(archive)``, ``withWatermark('event_time',
    '0 seconds')``, the same ``groupBy(window, key)``, output mode ``append``, a Parquet file sink with
    its own (fresh) checkpoint location, ``trigger(availableNow=True)``, ``awaitTermination()``.
    ``max_files_per_trigger`` (files per micro-batch) is passed as ``maxFilesPerTrigger`` when set.

    ``seconds`` (wall-clock) runs from reading the files' schema until the query terminated;
    ``extra['query_s']`` is the part from ``start()`` on. ``tuples`` is the sum of ``numInputRows`` over
    the query's progress reports (all micro-batches). ``output_rows`` counts the emitted (window, key)
    rows: windows still open at the end of the input are not emitted (``extra['state_rows_left']``
    counts those groups), and rows of windows already emitted in an earlier micro-batch are dropped as late
    (``extra['rows_dropped_by_watermark']``, counted after Spark's partial aggregation, so per (window, key)
    group and partition rather than per tuple).

    Raises:
        RuntimeError: the query stopped with an error, or its progress reports were incomplete.
    """
    retention_key = "spark.sql.streaming.numRecentProgressUpdates"
    old_retention = spark.conf.get(retention_key, None)
    # Keep every micro-batch's report (the default keeps 100), so the input rows can be summed.
    spark.conf.set(retention_key, "100000")
    try:
        with tempfile.TemporaryDirectory(prefix="replay-baseline-stream-") as tmp:
            out, checkpoint = Path(tmp) / "out", Path(tmp) / "checkpoint"
            start = time.perf_counter()
            schema = spark.read.parquet(str(archive)).schema
            reader = spark.readStream.schema(schema)
            if max_files_per_trigger is not None:
                reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
            source = reader.parquet(str(archive)).withWatermark("event_time", "0 seconds")
            result = _aggregate(source)
            query_start = time.perf_counter()
            query = (
                result.writeStream.outputMode("append")
                .format("parquet")
                .option("path", str(out))
                .option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            end = time.perf_counter()
            if query.exception() is not None:
                raise RuntimeError(f"the streaming baseline failed: {query.exception()}")
            progress = query.recentProgress
            if progress and progress[0].batchId != 0:
                raise RuntimeError(f"progress reports start at batch {progress[0].batchId}, not 0")
            tuples = sum(p.numInputRows for p in progress)
            data_batches = sum(1 for p in progress if p.numInputRows > 0)
            states = [p.stateOperators[0] for p in progress if p.stateOperators]
            output_rows = _count_parquet(spark, out, result)
    finally:
        if old_retention is None:
            spark.conf.unset(retention_key)
        else:
            spark.conf.set(retention_key, old_retention)
    extra: dict[str, Any] = {
        "query_s": end - query_start,
        "batches": len(progress),
        "data_batches": data_batches,
        "rows_dropped_by_watermark": sum(s.numRowsDroppedByWatermark for s in states),
        "state_rows_left": states[-1].numRowsTotal if states else 0,
        "tuples_from": "sum of numInputRows over recentProgress",
    }
    if max_files_per_trigger is not None:
        extra["max_files_per_trigger"] = max_files_per_trigger
    return _result("structured streaming", tuples, end - start, output_rows, extra)


def _session(shuffle_partitions: int, java_options: str = "") -> SparkSession:
    """One embedded ``local[*]`` session: UTC, no UI, ``shuffle_partitions`` shuffle partitions;
    ``java_options``: more driver JVM options (``--java-options``)."""
    from pyspark.sql import SparkSession

    import replay

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log_config = Path(replay.__file__).parent / "engine" / "log4j2.properties"
    options = f"-Dlog4j2.configurationFile={log_config.as_uri()} {java_options}"
    spark = (
        SparkSession.builder.appName("replay-baselines")
        .master("local[*]")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", options.strip())
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _table(rows: list[tuple[int, BaselineResult]]) -> str:
    lines = [
        "| baseline | run | tuples | wall s | tuples/s | output rows | notes |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for run, r in rows:
        notes = ", ".join(
            f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.extra.items() if k != "tuples_from"
        )
        lines.append(
            f"| {r.name} | {run} | {r.tuples:,} | {r.seconds:.1f} | {r.tuples_per_s:,.0f} | "
            f"{r.output_rows:,} | {notes} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run both baselines twice on one archive in one local session and print a table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("archive", type=Path, help="directory of Parquet files (e.g. from 'replay generate')")
    parser.add_argument("--shuffle-partitions", type=int, default=2, help="spark.sql.shuffle.partitions (default 2)")
    parser.add_argument("--runs", type=int, default=2, help="runs of each baseline (default 2; the first warms up)")
    parser.add_argument(
        "--max-files-per-trigger", type=int, default=None, help="files per micro-batch of the streaming baseline"
    )
    parser.add_argument(
        "--only", choices=("batch", "streaming"), default=None, help="run one baseline (a cold run in its own process)"
    )
    parser.add_argument(
        "--java-options",
        default="",
        help="more driver JVM options: '-XX:SharedArchiveFile=FILE' starts the JVM from the class-data "
        "archive of 'replay jvm-archive', as replay's own runs do once it exists",
    )
    options = parser.parse_args(argv)
    if not options.archive.is_dir():
        parser.error(f"{options.archive} is not a directory")
    start = time.perf_counter()
    spark = _session(options.shuffle_partitions, options.java_options)
    print(f"SparkSession start: {time.perf_counter() - start:.1f} s", flush=True)
    rows: list[tuple[int, BaselineResult]] = []
    try:
        for run in range(1, options.runs + 1 if options.only != "streaming" else 1):
            rows.append((run, plain_batch(spark, options.archive)))
            print(_table(rows[-1:]).splitlines()[-1], flush=True)
        for run in range(1, options.runs + 1 if options.only != "batch" else 1):
            result = structured_streaming(spark, options.archive, max_files_per_trigger=options.max_files_per_trigger)
            rows.append((run, result))
            print(_table(rows[-1:]).splitlines()[-1], flush=True)
    finally:
        spark.stop()
    print()
    print(_table(rows))


if __name__ == "__main__":
    main()
