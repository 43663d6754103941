"""``replay generate`` and ``replay inspect``: an archive written, an archive read (metadata only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from replay.console import Steps, failure, print_generated, print_inspection
from replay.core.errors import ReplayError

if TYPE_CHECKING:
    from replay.engine.inspection import InspectReport

__all__ = ["generate", "inspect"]


def _load(config: Path | None, archive: str | None) -> Any:
    from replay.core.config import load_config, parse_config

    if config is not None:
        job = load_config(config)
        return job.with_overrides(archive=archive) if archive else job
    if archive is None:
        raise typer.BadParameter("give an ARCHIVE or a --config")
    return parse_config({"archive": archive}, source="the command line")


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
        except ReplayError as error:
            raise failure(error) from error
        except ValueError as exc:
            typer.echo(f"replay: error: {exc}", err=True)
            raise typer.Exit(2) from exc
    print_generated(summary)


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
        raise failure(_findings(report, as_json=as_json))


def _findings(report: InspectReport, *, as_json: bool) -> ReplayError:
    """The error an inspection with findings that would stop ``replay run`` ends with: how many
    conflicts (under ``on_conflict: fail``) and held regressions, and the first of each, named."""
    from replay.core.errors import ConflictingDuplicateError, DataError, WatermarkRegressionError
    from replay.core.timeutil import format_ts

    conflicts = list(report.scan.conflicts) if report.config.on_conflict == "fail" else []
    regressions = [r for r in report.progress.regressions if r.action == "held"]
    found = []
    if conflicts:
        c = conflicts[0]
        found.append(
            f"{_count(len(conflicts), 'conflicting duplicate')}, the first origin {c.origin} sequence {c.sequence} "
            f"chunk {c.chunk} in {c.kept_file} (row {c.kept_row}) and {c.other_file} (row {c.other_row})"
        )
    if regressions:
        r = regressions[0]
        found.append(
            f"{_count(len(regressions), 'watermark regression')}, the first origin {r.origin} sequence {r.sequence} "
            f"key '{r.key}' going back from {format_ts(r.previous)} to {format_ts(r.watermark)}"
        )
    # A run meets the conflicts first (in its scan), then the regressions (in its progress).
    kind: type[DataError] = ConflictingDuplicateError if conflicts else WatermarkRegressionError
    listed = "in the JSON above" if as_json else "in 'replay inspect --json'"
    return kind(
        f"the archive has findings that would stop 'replay run': {'; '.join(found)} (every one {listed}, "
        "under integrity)",
        todo="fix the archive or set on_conflict: keep_first / watermark_regression: clamp",
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
