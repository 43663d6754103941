"""What a command calls to use a kept driver: send it a run (``run_on_driver``) or a validation
(``validate_on_driver``), ask how it is (``driver_status``), stop it (``stop_driver``)."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replay.core.errors import DriverError, Location
from replay.core.paths import local_path
from replay.driver import wire
from replay.driver.home import DriverHome

if TYPE_CHECKING:
    from collections.abc import Sequence

    from replay.core.config import JobConfig
    from replay.quality.validate import ValidationOutcome
    from replay.runner.summary import RunSummary

__all__ = ["driver_status", "run_on_driver", "stop_driver", "validate_on_driver"]

log = logging.getLogger("replay.driver")

#: Seconds a command waits for the driver to pass the key challenge (connecting included), unless a
#: shorter bound is asked for (``driver_status(timeout=)``). A driver busy with a run still answers it
#: at once: each connection has a thread of its own there.
CONNECT_TIMEOUT = 30.0

#: What is left after a run or a validation the driver did not finish.
_AFTER = {
    "run": "nothing of the batch in progress was committed, and the next run resumes from the checkpoint",
    "validation": "no verdict was written on the version: validate it again",
}


def run_on_driver(
    home: DriverHome,
    config: JobConfig,
    *,
    start: int | None = None,
    end: int | None = None,
    on_event: Callable[[str, int, int], None] | None = None,
) -> RunSummary:
    """``replay.run(config, start=, end=)`` on the kept driver of ``home``: the same summary, the
    same errors, the same events. Relative local paths are resolved here, against this process's
    working directory, not the driver's. Ctrl-C (or this process's end) cancels the run.

    Raises:
        DriverError: no driver answers at ``home`` (``driver.unreachable``), it runs other code
            than this process (``driver.version``: another Replay, or the same one changed since it
            started), it is stopping (``driver.stopping``), it ended during the run
            (``driver.lost``), or the run failed there with an unexpected error
            (``driver.crashed``, its traceback on stderr).
        ConfigError: the job asks for what the driver cannot give (``driver.master``,
            ``driver.static_conf``).
        ReplayError: what the run raised, as in process.
    """
    request = wire.request("run", job=_absolute(config), start=start, end=end)
    summary: RunSummary = _exchange(home, request, on_event, "run")
    return summary


def validate_on_driver(
    home: DriverHome,
    output: str | Path,
    version: int | None = None,
    *,
    suites: Sequence[str] | None = None,
    on_step: Callable[[str, int, int], None] | None = None,
) -> ValidationOutcome:
    """``replay.validate(output, version, suites=)`` on the kept driver of ``home``: the same verdict,
    record and Data Docs, the same errors (``run_on_driver``'s ``DriverError`` and ``ReplayError``).
    A relative local ``output`` is this process's."""
    request = wire.request(
        "validate", output=_here(str(output)), version=version, suites=list(suites) if suites is not None else None
    )
    outcome: ValidationOutcome = _exchange(home, request, on_step, "validation")
    return outcome


def _exchange(
    home: DriverHome, request: dict[str, Any], on_event: Callable[[str, int, int], None] | None, what: str
) -> Any:
    """Send ``request`` (``wire.request``), relay its events and log records while it goes, return its
    summary or raise its error."""
    conn, details = _connect(home)
    try:
        conn.send(request)
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError) as exc:
                raise DriverError(
                    f"the kept driver at {home.path} ended during the {what} ({type(exc).__name__})",
                    code="driver.lost",
                    where=Location(file=str(home.record)),
                    todo="look at the driver's log; " + _AFTER[what],
                ) from exc
            if "event" in message:
                if on_event is not None:
                    on_event(*message["event"])
            elif "log" in message:
                level, name, text = message["log"]
                logging.getLogger(name).log(level, "%s", text)
            elif "queued" in message:
                log.info("the driver is busy: this %s waits for %d before it", what, message["queued"])
            elif "summary" in message:
                return message["summary"]
            elif "error" in message:
                _name_spark_log(message)
                raise message["error"]
            elif "refused" in message:
                raise _other_code(home, details, message["code"], what)
            else:
                sys.stderr.write(str(message.get("crash", message)))
                _name_spark_log(message)
                raise DriverError(
                    f"the {what} failed in the kept driver with an unexpected error (its traceback above)",
                    code="driver.crashed",
                    todo="report it with the traceback; " + _AFTER[what],
                )
    except KeyboardInterrupt:
        with contextlib.suppress(OSError, ValueError):
            conn.send({"op": "cancel"})
        raise
    finally:
        conn.close()


def driver_status(home: DriverHome, *, timeout: float | None = None) -> dict[str, Any]:
    """The driver's process, address, master, runs served and memory (``DriverServer.status``).
    ``timeout``: seconds to wait for it, connecting included (a page that shows it must not hang on it)."""
    return dict(_ask(home, {"op": "status"}, timeout)["status"])


def stop_driver(home: DriverHome, *, cancel: bool = False) -> None:
    """Ask the driver to stop: it takes no more runs and exits once the run in progress has ended,
    or at once with ``cancel`` (the run's jobs cancelled, nothing more committed)."""
    _ask(home, {"op": "stop", "cancel": cancel})


def _ask(home: DriverHome, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
    began = time.monotonic()
    conn, details = _connect(home, CONNECT_TIMEOUT if timeout is None else timeout)
    try:
        conn.send(request)
        if timeout is not None and not conn.poll(max(0.0, timeout - (time.monotonic() - began))):
            raise _unreachable(home, details, TimeoutError(f"no answer in {timeout:g} s"))
        answer: dict[str, Any] = conn.recv()
        return answer
    except (EOFError, OSError) as exc:  # it ended between the handshake and its answer
        raise _unreachable(home, details, exc) from exc
    finally:
        conn.close()


def _connect(home: DriverHome, within: float = CONNECT_TIMEOUT) -> tuple[Connection, dict[str, Any]]:
    """A connection to the driver of ``home``, authenticated within ``within`` seconds, and the
    record it was found by."""
    details = home.details()
    address = (details["host"], int(details["port"]))
    try:
        return wire.connect(address, details["key"], within=within), details
    except (OSError, EOFError, AuthenticationError) as exc:  # refused, silent, reset, or another key
        raise _unreachable(home, details, exc) from exc


def _other_code(home: DriverHome, details: dict[str, Any], theirs: str, what: str) -> DriverError:
    return DriverError(
        f"the kept driver of {home.path} (process {details.get('pid')}) runs Replay {theirs}, and this "
        f"command Replay {wire.code_identity()}: the {what} was not sent, since it would run the driver's code",
        where=Location(file=str(home.record)),
        code="driver.version",
        todo=f"restart the driver so that it loads the code installed now ('replay driver stop --dir {home.path}', "
        "then 'replay driver serve' as before; under ./dev.sh airflow or docker compose, restart its "
        "replay-driver service), or run without a driver",
    )


def _unreachable(home: DriverHome, details: dict[str, Any], exc: BaseException) -> DriverError:
    return DriverError(
        f"the Replay driver of {home.path} (process {details.get('pid')}) does not answer at "
        f"{details['host']}:{details['port']} ({type(exc).__name__}: {exc})",
        where=Location(file=str(home.record)),
        code="driver.unreachable",
        todo=f"start it again with 'replay driver serve --dir {home.path}', or run without a driver",
    )


def _absolute(config: JobConfig) -> JobConfig:
    """``config`` with its archive, output and checkpoint as this process means them (``_here``)."""
    changes = {}
    for name in ("archive", "output", "checkpoint"):
        value = getattr(config, name)
        if value and _here(value) != value:
            changes[name] = _here(value)
    return config.with_overrides(**changes) if changes else config


def _here(value: str) -> str:
    """``value`` as this process means it: a relative local path (plain, or a ``file:`` URI such as
    ``file:out``) made absolute against this working directory; anything else as it is."""
    path = local_path(value)
    return str(Path(path).absolute()) if path and not Path(path).is_absolute() else value


def _name_spark_log(message: dict[str, Any]) -> None:
    """A failed request's answer names the driver's Spark log when Spark wrote to it: its warnings
    and errors in full, which the driver's own stderr had a line each (``replay.engine.spark_log``)."""
    if message.get("spark_log"):
        log.warning("the kept driver's Spark warnings and errors, with their stack traces: %s", message["spark_log"])
