"""``replay validate``, ``publish`` and ``report``: a version checked, made current, shown."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from replay.console import Steps, failure, print_publication, print_validation
from replay.core.errors import ReplayError

__all__ = ["publish", "report", "validate"]


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
