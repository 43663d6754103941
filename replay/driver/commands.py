"""``replay driver serve|status|stop``: the kept driver's commands (``replay run --driver DIR`` sends
a run to one)."""

from __future__ import annotations

import json
import logging
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from replay.console import failure
from replay.core.errors import ConfigError, DriverError, Location, ReplayError
from replay.driver.home import DriverHome, default_home

__all__ = ["driver_app"]

driver_app = typer.Typer(
    help="A kept driver: one long-lived Spark driver that runs the replays and validations sent to it "
    "with 'replay run --driver DIR' and 'replay validate --driver DIR', so that only its first run pays "
    "the JVM's start (docs/driver.md).",
    no_args_is_help=True,
)

_DIR = typer.Option(
    "--dir",
    envvar="REPLAY_DRIVER",
    help="The driver's home: where it publishes its address and key (default: ~/.replay/driver).",
)
log = logging.getLogger("replay.driver")


def _home(directory: Path | None) -> DriverHome:
    return DriverHome(directory or default_home())


@driver_app.command()
def serve(
    directory: Annotated[Path | None, _DIR] = None,
    master: Annotated[str, typer.Option(help="Spark master URL of the driver's session.")] = "local[*]",
    conf: Annotated[
        list[str] | None, typer.Option("--conf", help="A Spark setting KEY=VALUE for the driver (repeatable).")
    ] = None,
    host: Annotated[str, typer.Option(help="The address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="The port to listen on (0: any free one).")] = 0,
) -> None:
    """Start a kept driver and serve runs and validations until 'replay driver stop', SIGTERM or Ctrl-C."""
    from replay.core.config import SparkSettings
    from replay.driver.client import driver_status
    from replay.driver.server import DriverServer
    from replay.engine.spark import get_session

    home = _home(directory)
    try:
        settings = SparkSettings(master=master, conf=dict(_pair(item) for item in conf or ()))
        try:
            running = driver_status(home, timeout=10)
        except DriverError:
            running = None
        if running is not None:
            raise ConfigError(
                f"a Replay driver already runs with its home at {home.path} (process {running['pid']})",
                where=Location(file=str(home.record)),
                code="driver.running",
                todo="send runs to it, stop it with 'replay driver stop', or give this one another --dir",
            )
        session = get_session(settings, app_name="replay-driver")
        server = DriverServer(home, session, host=host, port=port)
    except ReplayError as error:
        raise failure(error) from error

    def stop(signum: int, frame: object) -> None:  # in a thread: ``stop`` talks to the accepting thread
        threading.Thread(target=server.stop, kwargs={"cancel": True}, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever()
        server.wait_idle(timeout=60)
    finally:
        session.stop()
    log.info("driver stopped")


@driver_app.command()
def status(
    directory: Annotated[Path | None, _DIR] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
) -> None:
    """Show the driver's process, address, master, runs served and memory."""
    from replay.driver.client import driver_status

    try:
        found = driver_status(_home(directory), timeout=30)
    except ReplayError as error:
        raise failure(error) from error
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    for key, value in found.items():
        typer.echo(f"{key + ':':<18} {value}")


@driver_app.command()
def stop(
    directory: Annotated[Path | None, _DIR] = None,
    cancel: Annotated[
        bool, typer.Option(help="Cancel the run in progress instead of waiting for it (nothing more is committed).")
    ] = False,
) -> None:
    """Stop the driver: it takes no more runs and exits once the run in progress has ended."""
    from replay.driver.client import stop_driver

    try:
        stop_driver(_home(directory), cancel=cancel)
    except ReplayError as error:
        raise failure(error) from error
    typer.echo("the driver is stopping")


def _pair(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ConfigError(
            f"--conf {item!r} is not KEY=VALUE",
            where=Location(field="--conf"),
            code="config.invalid",
            todo="write each setting as --conf spark.some.key=value",
        )
    return key.strip(), value
