"""The ``replay`` command line (typer): each command's arguments and options, the library call it
makes, its errors and exit code, in a module per group of commands (``archive``, ``runs``,
``quality``, ``jvm``; the kept driver's in ``replay.driver.commands``); this module makes the app.
What a command shows, progress bars, tables and summaries, is ``replay.console``'s.

Exit codes: 0 success, 1 a run or analysis that failed on the data (message on stderr), 2 usage or
configuration errors.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from replay.cli import archive, jvm, quality, runs
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
    if value:  # the version, and after '+' a digest of the installed code (what a kept driver compares)
        from replay.driver.wire import code_identity

        typer.echo(f"replay {code_identity()}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_version,
            is_eager=True,
            help="Print the version (+ the installed code's digest) and exit.",
        ),
    ] = False,
) -> None:
    """Replay archived stream buffers through PySpark: progress, watermarks and windows."""


# In the order ``replay --help`` lists them.
app.command()(archive.generate)
app.command()(archive.inspect)
app.command(name="run")(runs.run_command)
app.command()(runs.status)
app.command()(runs.digest)
app.command()(runs.show)
app.command()(quality.validate)
app.command()(quality.publish)
app.command()(quality.report)
app.command(name="jvm-archive")(jvm.jvm_archive)


def main() -> None:
    """Entry point of the ``replay`` script."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    from replay.engine.spark import driver_arrow_memory

    driver_arrow_memory()  # before any Arrow memory is taken: see its docstring
    app()
