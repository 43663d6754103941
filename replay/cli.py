"""The ``replay`` command line (typer): each command's arguments and options, the library call it
makes, its errors and exit code. What a command shows, progress bars, tables and summaries, is
``replay.console``'s.

Exit codes: 0 success, 1 a run or analysis that failed on the data (message on
stderr), 2 usage or configuration errors.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from replay.console import (
    Steps,
    failure,
    print_generated,
    print_inspection,
    print_publication,
    print_run,
    print_status,
    print_validation,
)
from replay.core.errors import ReplayError
from replay.driver.commands import driver_app

__all__ = ["app", "main"]

app = typer.Typer(
    name="replay",
    help="Replay archived stream buffers through PySpark: progress, watermarks and windows.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(driver_app, name="driver")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"replay {version('replay')}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Replay archived stream buffers through PySpark: progress, watermarks and windows."""


def _load(config: Path | None, archive: str | None) -> Any:
    from replay.core.config import load_config, parse_config

    if config is not None:
        job = load_config(config)
        return job.with_overrides(archive=archive) if archive else job
    if archive is None:
        raise typer.BadParameter("give an ARCHIVE or a --config")
    return parse_config({"archive": archive}, source="the command line")


@app.command()
def generate(
    out: Annotated[Path, typer.Argument(help="Directory to write the archive to (created; must hold no Parquet).")],
    origins: Annotated[int, typer.Option(help="Number of origins (emitters).")] = 4,
    tuples: Annotated[int, typer.Option(help="Total number of tuples.")] = 10_000,
    buffer_tuples: Annotated[int, typer.Option(help="Tuples per sequence (buffer).")] = 100,
    keys: Annotated[int, typer.Option(help="Number of distinct grouping keys.")] = 10,
    seed: Annotated[int, typer.Option(help="Random seed: the same seed gives the same files.")] = 0,
    gaps: Annotated[int, typer.Option(help="Whole sequences to leave out (lost buffers).")] = 0,
    duplicates: Annotated[int, typer.Option(help="Buffers archived twice, identically.")] = 0,
    conflicts: Annotated[int, typer.Option(help="Buffers archived twice with different content.")] = 0,
    late_fraction: Annotated[float, typer.Option(help="Fraction of tuples behind their origin's watermark.")] = 0.0,
    multi_chunk_fraction: Annotated[float, typer.Option(help="Fraction of sequences split into chunks.")] = 0.0,
    files: Annotated[int, typer.Option(help="Number of Parquet files (buffers interleaved).")] = 1,
    ingest_ts: Annotated[bool, typer.Option("--ingest-ts/--no-ingest-ts", help="Write the ingest_ts column.")] = True,
    watermarks: Annotated[
        bool, typer.Option("--watermarks/--no-watermarks", help="Write watermark_ts (else event-time watermarks).")
    ] = True,
    idle: Annotated[int, typer.Option(help="Origins that stop early with an idle marker.")] = 0,
    chunk_base: Annotated[int, typer.Option(help="First chunk number (0 or 1).")] = 1,
    key_type: Annotated[str, typer.Option(help="Key column type: int or string.")] = "int",
) -> None:
    """Write a seeded synthetic archive with chosen gaps, duplicates, disorder and late data."""
    from replay.generate import generate_archive
    from replay.generate_options import GenerateOptions

    try:
        options = GenerateOptions(
            origins=origins,
            tuples=tuples,
            buffer_tuples=buffer_tuples,
            keys=keys,
            seed=seed,
            gaps=gaps,
            duplicates=duplicates,
            conflicts=conflicts,
            late_fraction=late_fraction,
            multi_chunk_fraction=multi_chunk_fraction,
            files=files,
            ingest_ts=ingest_ts,
            watermarks=watermarks,
            idle=idle,
            chunk_base=chunk_base,
            key_type=key_type,
        )
    except ValueError as exc:
        typer.echo(f"replay: error: {exc}", err=True)
        raise typer.Exit(2) from exc
    with Steps({"tuples": "writing tuples"}) as steps:
        try:
            summary = generate_archive(out, options, progress=lambda done, total: steps("tuples", done, total))
        except ValueError as exc:
            typer.echo(f"replay: error: {exc}", err=True)
            raise typer.Exit(2) from exc
    print_generated(summary)


@app.command()
def inspect(
    archive: Annotated[str | None, typer.Argument(help="Archive directory or URI (overrides the job's).")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Job YAML file.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Metadata-only progress analysis: per-origin prefixes, gaps, watermarks; no tuple is aggregated."""
    from replay.engine.inspection import inspect_archive

    try:
        job = _load(config, archive)
        with Steps(
            {"footers": "reading footers", "buffers": "scanning buffers", "progress": "tracking progress"}
        ) as steps:
            report = inspect_archive(job, on_step=steps)
    except ReplayError as error:
        raise failure(error) from error
    data = report.to_dict()
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        print_inspection(data)
    if report.has_errors:
        typer.echo(
            "replay: error: the archive has findings that would stop 'replay run' (see conflicts and regressions "
            "above); fix the archive or set on_conflict: keep_first / watermark_regression: clamp",
            err=True,
        )
        raise typer.Exit(1)


def _timestamp(value: str | None, option: str) -> int | None:
    from replay.core.timeutil import parse_timestamp

    if value is None:
        return None
    try:
        return parse_timestamp(value)
    except ValueError as exc:
        raise typer.BadParameter(f"{exc} (e.g. 2026-01-01T00:00:00Z)", param_hint=option) from exc


@app.command(name="run")
def run_command(
    config: Annotated[Path, typer.Option("--config", "-c", help="Job YAML file.")],
    archive: Annotated[str | None, typer.Option(help="Archive directory or URI (overrides the job's).")] = None,
    output: Annotated[str | None, typer.Option(help="Output directory (overrides the job's).")] = None,
    checkpoint: Annotated[str | None, typer.Option(help="Checkpoint directory (overrides the job's).")] = None,
    max_buffers: Annotated[int | None, typer.Option(help="At most this many buffers per micro-batch.")] = None,
    max_tuples: Annotated[int | None, typer.Option(help="At most this many tuples per micro-batch.")] = None,
    spark_master: Annotated[str | None, typer.Option(help="Spark master URL (overrides the job's).")] = None,
    start: Annotated[str | None, typer.Option(help="Backfill from this event time (inclusive, ISO 8601).")] = None,
    end: Annotated[str | None, typer.Option(help="Backfill up to this event time (exclusive, ISO 8601).")] = None,
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


@app.command()
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


@app.command()
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


@app.command()
def show(
    output: Annotated[str, typer.Argument(help="Output directory.")],
    table: Annotated[str, typer.Option("--table", "-t", help="windows, late, progress, integrity or corrections.")],
    fmt: Annotated[str, typer.Option("--format", help="jsonl or csv.")] = "jsonl",
    version: Annotated[int | None, typer.Option("--version", help="Version (default: published, else newest).")] = None,
) -> None:
    """Print a table's rows sorted by all columns, timestamps as ISO 8601 UTC with milliseconds."""
    from replay.store.digest import show_lines

    try:
        lines = show_lines(output, table, fmt=fmt, version=version)
    except ReplayError as error:
        raise failure(error) from error
    for line in lines:
        typer.echo(line)


@app.command()
def validate(
    output: Annotated[str, typer.Argument(help="Output directory.")],
    version: Annotated[int | None, typer.Option("--version", help="Version (default: the newest run's).")] = None,
    suite: Annotated[
        list[str] | None, typer.Option("--suite", help="Run only this suite (repeatable); the verdict needs all.")
    ] = None,
    driver: Annotated[
        Path | None,
        typer.Option(
            envvar="REPLAY_DRIVER", help="Validate on the kept driver whose home this is, not in this process."
        ),
    ] = None,
) -> None:
    """Run the Great Expectations suites on a version, write Data Docs; exit 1 when an expectation fails."""
    try:
        with Steps({}) as steps:
            if driver is not None:
                from replay.driver.client import validate_on_driver
                from replay.driver.home import DriverHome

                outcome = validate_on_driver(DriverHome(driver), output, version, suites=suite, on_step=steps)
            else:
                from replay.quality.validate import validate as run_validation

                outcome = run_validation(output, version, suites=suite, on_step=steps)
    except ReplayError as error:
        raise failure(error) from error
    print_validation(output, outcome)
    if not outcome.success:
        raise typer.Exit(1)


@app.command()
def publish(
    output: Annotated[str, typer.Argument(help="Output directory.")],
    version: Annotated[int | None, typer.Option("--version", help="Version (default: the newest run's).")] = None,
    retain: Annotated[
        int | None, typer.Option("--retain", help="Keep the newest N versions (default: the job's setting).")
    ] = None,
) -> None:
    """Make a validated version the current publication (atomically), with its corrections."""
    from replay.store.publish import publish as publish_version

    try:
        outcome = publish_version(output, version, retain_versions=retain)
    except ReplayError as error:
        raise failure(error) from error
    print_publication(outcome)


@app.command()
def report(
    output: Annotated[str, typer.Option("--output", help="Output directory.")],
    to: Annotated[Path, typer.Option("--to", help="Directory to write index.html to (created if needed).")],
    checkpoint: Annotated[
        str | None, typer.Option("--checkpoint", help="Checkpoint directory: adds its stream cut and watermarks.")
    ] = None,
    version: Annotated[int | None, typer.Option("--version", help="Version (default: published, else newest).")] = None,
) -> None:
    """Write a self-contained HTML report (watermarks, lateness, integrity, validation, corrections); print its path."""
    from replay.quality.report import write_report

    try:
        path = write_report(output, checkpoint, to, version=version)
    except ReplayError as error:
        raise failure(error) from error
    typer.echo(str(path))


@app.command(name="jvm-archive")
def jvm_archive(
    path: Annotated[
        Path | None,
        typer.Option(help="Where to write it (default: the place runs look, under the user's cache directory)."),
    ] = None,
    if_missing: Annotated[
        bool, typer.Option("--if-missing", help="Do nothing when a usable archive is there.")
    ] = False,
    remove: Annotated[bool, typer.Option("--remove", help="Delete the archive instead.")] = False,
    record_into: Annotated[Path | None, typer.Option(hidden=True)] = None,
) -> None:
    """Record the classes Spark's JVM loads into a class-data archive: later runs start their JVM from it
    (seconds less per command; REPLAY_JVM_ARCHIVE names another file, or 'off'). Prints its path."""
    from replay.engine import jvm_archive as archives

    if record_into is not None:  # the process ``create`` starts (its working directory is a scratch one)
        _record_classes(record_into)
        return
    target = path if path is not None else archives.archive_path()
    try:
        if target is not None and (remove or (if_missing and archives.usable(target))):
            if remove:
                archives.remove(target)
            typer.echo(str(target))
            return
        created = archives.create(target, [sys.executable, "-m", "replay", "jvm-archive", "--record-into"])
    except ReplayError as error:
        raise failure(error) from error
    typer.echo(str(created.path))
    typer.echo(f"{created.size / 2**20:.0f} MiB, made in {created.seconds:.0f} s", err=True)


def _record_classes(destination: Path) -> None:
    """A small replay (two origins, 4,000 tuples, a window of four aggregations) in the current
    directory, by a JVM that writes the class-data archive ``destination`` when it exits."""
    from replay.core.config import parse_config
    from replay.engine.jvm_archive import recording_options, wait_for_exit
    from replay.generate import generate_archive
    from replay.generate_options import GenerateOptions
    from replay.runner.loop import run

    options = GenerateOptions(
        origins=2,
        tuples=4_000,
        buffer_tuples=100,
        keys=10,
        files=2,
        seed=1,
        gaps=0,
        duplicates=1,
        late_fraction=0.01,
        multi_chunk_fraction=0.2,
    )
    work = Path.cwd()
    generate_archive(work / "archive", options)
    aggregations = [{"fn": "count"}, *({"fn": fn, "column": "value"} for fn in ("sum", "min", "max"))]
    job = {
        "archive": str(work / "archive"),
        "output": str(work / "out"),
        "checkpoint": str(work / "checkpoint"),
        "windows": [{"name": "per_minute", "size": "60s", "aggregations": aggregations}],
        "micro_batch": {"max_buffers": 10},
        # After Replay's own options (``get_session``).
        "spark": {"conf": {"spark.driver.extraJavaOptions": recording_options(destination)}},
    }
    run(parse_config(job, source="replay jvm-archive"))
    wait_for_exit()


def main() -> None:
    """Entry point of the ``replay`` script."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    from replay.engine.spark import driver_arrow_memory

    driver_arrow_memory()  # before any Arrow memory is taken: see its docstring
    app()


if __name__ == "__main__":
    main()
