"""The ``replay`` command line (typer): each command's arguments and options, the library call it
makes, its errors and exit code, in a module per group of commands (``archive``, ``runs``,
``quality``, ``jvm``; the kept driver's in ``replay.driver.commands``); this module makes the app.
What a command shows, progress bars, tables and summaries, is ``replay.console``'s.

Exit codes: 0 success, 1 a run or analysis that failed on the data, or an operational error (storage,
kept driver), with its message on stderr; 2 usage or configuration errors; 130 interrupted (Ctrl-C),
after saying what was left.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Annotated, NoReturn

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
    for handler in logging.getLogger().handlers:
        handler.addFilter(_without_py4j_noise)
    try:  # click's own handling, but Ctrl-C says what it left
        code = app(standalone_mode=False)
    except KeyboardInterrupt:
        _interrupted()
    except Exception as exc:
        if _after_an_interrupt(exc):  # the JVM's connection, broken by the interrupt, failed the clean-up
            _interrupted()
        show, exit_code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if not callable(show) or not isinstance(exit_code, int):
            # A failure Replay did not expect: its traceback, written while the JVM is up (a Spark
            # error's text is read from the JVM), then the interpreter's exit code for it.
            traceback.print_exc()
            _name_spark_log()
            sys.exit(1)
        show()  # a usage error (click's ClickException, known by its interface), as click shows it
        sys.exit(exit_code)
    finally:
        _end_spark()
    if code == _INTERRUPTED:  # typer's answer to a Ctrl-C
        _interrupted()
    if isinstance(code, int) and code != 0:
        _name_spark_log()
    sys.exit(code if isinstance(code, int) else 0)


def _name_spark_log() -> None:
    """After a failure, the file with Spark's warnings and errors in full, when Spark wrote one:
    stderr had them one line each (``replay.engine.spark_log``)."""
    from replay.engine.spark_log import written_spark_log

    written = written_spark_log()
    if written is not None:
        typer.echo(f"replay: Spark's warnings and errors of this command, with their stack traces: {written}", err=True)


_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
_JVM_EXIT = 30.0  # seconds the command waits for its JVM's exit once Spark has stopped


def _end_spark() -> None:
    """End the Spark this command started before the command ends, so that its application (its
    executors on a cluster, its Python workers, its event log) ends with the command, not after it.
    The JVM PySpark starts exits when its standard input closes: left to the interpreter's exit, it
    went on stopping the SparkContext in its shutdown hook for 0.5 to 2.5 s after the command had
    returned, on the cores of whatever ran next. Under spark-submit (no ``proc``: the JVM started
    this process) Spark is stopped and spark-submit's JVM ends after it."""
    if "pyspark" not in sys.modules:
        return
    from pyspark import SparkContext

    with contextlib.suppress(Exception, KeyboardInterrupt):  # a JVM already gone, a second Ctrl-C
        context = SparkContext._active_spark_context
        if context is not None:
            context.stop()
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if gateway is None or not isinstance(proc, subprocess.Popen):
        return
    with contextlib.suppress(Exception, KeyboardInterrupt):
        gateway.shutdown()
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(_JVM_EXIT)


def _interrupted() -> NoReturn:
    """Stop Spark (its cancelled jobs, its Python workers) before saying so and exiting: left to the
    interpreter's exit, the JVM and the workers would log their own ends after the message."""
    if "pyspark" in sys.modules:
        from pyspark import SparkContext

        with contextlib.suppress(Exception, KeyboardInterrupt):  # a broken connection, a second Ctrl-C
            context = SparkContext._active_spark_context
            if context is not None:
                context.stop()
    typer.echo(
        "replay: interrupted. What was committed stays: nothing of a batch in progress was, and the next "
        "run resumes from the checkpoint; a validation in progress wrote no verdict.",
        err=True,
    )
    sys.exit(_INTERRUPTED)


def _after_an_interrupt(error: BaseException | None) -> bool:
    """Whether ``error`` is a Ctrl-C, or was raised while one was being handled."""
    while error is not None:
        if isinstance(error, KeyboardInterrupt):
            return True
        error = error.__cause__ or error.__context__
    return False


def _without_py4j_noise(record: logging.LogRecord) -> bool:
    """py4j logs a Ctrl-C that came during a call to the JVM as errors with their tracebacks (the
    interrupt, and the connection it broke), and its retries on the root logger at INFO, tracebacks
    too: the command says it was interrupted instead. py4j's own logger is at WARNING already."""
    from_py4j = record.name.startswith("py4j") or "py4j" in Path(record.pathname).parts
    if not from_py4j:
        return True
    return record.levelno >= logging.WARNING and not (record.exc_info and _after_an_interrupt(record.exc_info[1]))
