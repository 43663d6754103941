"""``replay run`` and what it leaves: ``status`` (the checkpoint), ``digest`` and ``show`` (an output version)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from replay.console import Steps, failure, print_run, print_status
from replay.core.errors import ReplayError

__all__ = ["digest", "run_command", "show", "status"]


def _timestamp(value: str | None, option: str) -> int | None:
    from replay.core.timeutil import parse_timestamp

    if value is None:
        return None
    try:
        return parse_timestamp(value)
    except ValueError as exc:
        # The message already carries an example (replay/core/timeutil.py).
        raise typer.BadParameter(str(exc), param_hint=option) from exc


def run_command(
    config: Annotated[Path, typer.Option("--config", "-c", help="Job YAML file.")],
    archive: Annotated[str | None, typer.Option(help="Archive directory or URI (overrides the job's).")] = None,
    output: Annotated[str | None, typer.Option(help="Output directory (overrides the job's).")] = None,
    checkpoint: Annotated[
        str | None,
        typer.Option(
            help="Checkpoint directory (overrides the job's). With --start/--end and none given, a backfill keeps "
            "its own: beside the job's (CHECKPOINT.range_<start>_<end>), or OUTPUT/_checkpoints/range_<start>_<end>."
        ),
    ] = None,
    max_buffers: Annotated[int | None, typer.Option(help="At most this many buffers per micro-batch.")] = None,
    max_tuples: Annotated[int | None, typer.Option(help="At most this many tuples per micro-batch.")] = None,
    spark_master: Annotated[str | None, typer.Option(help="Spark master URL (overrides the job's).")] = None,
    start: Annotated[
        str | None,
        typer.Option(help="Backfill from this event time (inclusive, ISO 8601 with a UTC offset (Z or +hh:mm))."),
    ] = None,
    end: Annotated[
        str | None,
        typer.Option(help="Backfill up to this event time (exclusive, ISO 8601 with a UTC offset (Z or +hh:mm))."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    summary_file: Annotated[
        Path | None,
        typer.Option(
            help="Also write the summary (or, on a Replay error, the error) as JSON to this file: "
            "how a caller that only sees the exit code, such as spark-submit, gets the result."
        ),
    ] = None,
    driver: Annotated[
        Path | None,
        typer.Option(
            envvar="REPLAY_DRIVER",
            help="Run on the kept driver whose home this is ('replay driver serve'), not in this process "
            "(not under spark-submit, whose session the run takes).",
        ),
    ] = None,
) -> None:
    """Replay the archive in micro-batches into a new output version, resuming from the checkpoint."""
    from replay.core.config import load_config
    from replay.store.durable import write_json_atomic

    range_start, range_end = _timestamp(start, "--start"), _timestamp(end, "--end")
    try:
        job = load_config(config)
        micro = job.micro_batch.model_dump()
        micro.update({k: v for k, v in (("max_buffers", max_buffers), ("max_tuples", max_tuples)) if v is not None})
        spark = job.spark.model_dump() | ({"master": spark_master} if spark_master else {})
        job = job.with_overrides(archive=archive, output=output, checkpoint=checkpoint, micro_batch=micro, spark=spark)
        if (range_start, range_end) != (None, None) and checkpoint is None and job.checkpoint:
            # The job file's checkpoint is its replay of the whole archive's; a backfill keeps its own.
            from replay.core.paths import range_checkpoint

            job = job.with_overrides(checkpoint=range_checkpoint(job.checkpoint, range_start, range_end))
        with Steps(
            {"footers": "reading footers", "scan": "scanning buffers (Spark)", "batch": "micro-batches"}
        ) as steps:
            # Under spark-submit (the Airflow engine spark_submit) the run takes spark-submit's session.
            from replay.engine.spark import under_spark_submit

            if driver is not None and not under_spark_submit():
                from replay.driver.client import run_on_driver
                from replay.driver.home import DriverHome

                summary = run_on_driver(DriverHome(driver), job, start=range_start, end=range_end, on_event=steps)
            else:
                from replay.runner.loop import run

                summary = run(job, start=range_start, end=range_end, on_event=steps)
    except ReplayError as error:
        if summary_file is not None:
            record = error.to_dict() | {"message": error.message, "kind": type(error).__name__}
            write_json_atomic(summary_file, {"error": record})
        raise failure(error) from error
    data = summary.to_dict()
    if summary_file is not None:
        write_json_atomic(summary_file, {"summary": data})
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    print_run(summary, data)


def status(
    checkpoint: Annotated[str, typer.Option("--checkpoint", help="Checkpoint directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Checkpoint versions, stream cut, G_k, time window, open windows and pending buffers."""
    from replay.store.status import checkpoint_status

    try:
        data = checkpoint_status(checkpoint)
    except ReplayError as error:
        raise failure(error) from error
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    print_status(data)


def digest(
    output: Annotated[str, typer.Argument(help="Output directory.")],
    version: Annotated[int | None, typer.Option("--version", help="Version (default: published, else newest).")] = None,
) -> None:
    """One line per table: '<table> <sha256>' over its canonical sorted rows (docs/cli.md#replay-digest)."""
    from replay.store.digest import digest as digest_output

    try:
        digests = digest_output(output, version)
    except ReplayError as error:
        raise failure(error) from error
    for table, value in digests.items():
        typer.echo(f"{table} {value}")


def show(
    output: Annotated[str, typer.Argument(help="Output directory.")],
    table: Annotated[str, typer.Option("--table", "-t", help="windows, late, progress, integrity or corrections.")],
    fmt: Annotated[str, typer.Option("--format", help="jsonl or csv.")] = "jsonl",
    version: Annotated[int | None, typer.Option("--version", help="Version (default: published, else newest).")] = None,
) -> None:
    """Print a table's rows sorted by all columns, timestamps ISO 8601 UTC to the ms (µs if finer)."""
    from replay.store.digest import show_lines

    try:
        lines = show_lines(output, table, fmt=fmt, version=version)
    except ReplayError as error:
        raise failure(error) from error
    for line in lines:
        typer.echo(line)
