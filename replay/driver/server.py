"""The kept driver (``replay driver serve``): one process, one warm SparkSession, and the runs (and
validations: ``replay validate --driver``) that clients send it, one at a time.

Each connection is authenticated with the home's key (``multiprocessing.connection``'s challenge,
``replay.driver.wire``) before a word of it is read, in the connection's own thread and within
``handshake_timeout`` seconds, so a peer that connects and says nothing holds up no one. A run gets
a session of its own on the driver's JVM (``replay.engine.spark.job_session``), so its SQL settings
are the job's and nothing carries over from the last run but what the JVM compiled. Runs wait their
turn: a second client is told it is queued and starts when the first run ends. While a run goes, its
progress events and the ``replay`` logger's records go back to the client; at its end the client
gets the run's summary, its ``ReplayError``, or an unexpected error's traceback. A client that goes
away (its process ended, Ctrl-C) cancels its run: the Spark jobs of the run's job group are
cancelled and the run stops at its next step, committing nothing more, as a crashed run would; the
next run resumes from its checkpoint.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import os
import pickle
import socket
import threading
import time
import traceback
from collections.abc import Mapping
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replay.core.errors import DriverError, ReplayError
from replay.driver.home import DriverHome
from replay.driver.wire import code_identity, handshake, hang_up

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DriverServer"]

log = logging.getLogger("replay.driver")


class _Cancelled(Exception):
    """The run's client went away or asked to cancel."""


class _Sender:
    """``send`` for several threads (the run's, Spark's progress poller's) on one connection; a
    connection that broke only marks the sender broken."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self.broken = threading.Event()

    def send(self, message: Mapping[str, Any]) -> None:
        if self.broken.is_set():
            return
        try:
            with self._lock:
                self._conn.send(dict(message))
        except (OSError, ValueError):
            self.broken.set()


class _Forward(logging.Handler):
    """The ``replay`` logger's records during a run, to its client (the driver's own excepted)."""

    def __init__(self, sender: _Sender) -> None:
        super().__init__(logging.INFO)
        self._sender = sender

    def emit(self, record: logging.LogRecord) -> None:
        if not record.name.startswith(log.name):
            self._sender.send({"log": (record.levelno, record.name, record.getMessage())})


class DriverServer:
    """Serve runs on ``session`` at ``host:port`` (port 0: any free one) until ``stop``; the address
    and a new key are published in ``home``. A connection that has not passed the key challenge
    within ``handshake_timeout`` seconds is hung up on."""

    def __init__(
        self,
        home: DriverHome,
        session: SparkSession,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        handshake_timeout: float = 10.0,
    ) -> None:
        self.home = home
        self.session = session
        self._key = home.new_key()
        self._handshake_timeout = handshake_timeout
        self.code = code_identity()  # the code it loaded: runs and validations come from clients of the same
        self._listener = Listener((host, port))  # no authkey: the challenge runs in each connection's thread
        self.address: tuple[str, int] = self._listener.address
        self._stopping = threading.Event()
        self._cancelling = threading.Event()  # ``stop(cancel=True)``: the run in progress stops too
        self._run_lock = threading.Lock()
        self._state = threading.Lock()  # the counters below
        self._ids = itertools.count(1)
        self._served = self._failed = self._waiting = 0
        self._running: dict[str, Any] | None = None
        self._started = time.time()
        # Listening on every interface (a container's): clients reach it by this host's name.
        reachable = self.address[0] if self.address[0] not in ("0.0.0.0", "::", "") else socket.gethostname()
        self.home.publish(
            {
                "pid": os.getpid(),
                "host": reachable,
                "port": self.address[1],
                "master": str(session.sparkContext.master),
                "started": self._started,
            }
        )

    # -- the loop ---------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Accept connections until ``stop``; each is served in a thread of its own."""
        log.info(
            "driver ready at %s:%d (master %s, Replay %s)", *self.address, self.session.sparkContext.master, self.code
        )
        try:
            while not self._stopping.is_set():
                try:
                    conn = self._listener.accept()
                except OSError as exc:  # a connection reset before it was accepted
                    if self._stopping.is_set():
                        break
                    log.warning("refused a connection: %s", exc)
                    continue
                if self._stopping.is_set():
                    conn.close()
                    break
                threading.Thread(target=self._serve, args=(conn,), name="replay-driver-client", daemon=True).start()
        finally:
            self._listener.close()
            self.home.withdraw(os.getpid())

    def stop(self, *, cancel: bool = False) -> None:
        """Accept nothing more; a run in progress ends first unless ``cancel`` (its jobs cancelled,
        the run stopping at its next step, as when its client goes away)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if cancel:
            self._cancelling.set()
            self.session.sparkContext.cancelAllJobs()
        with contextlib.suppress(OSError):  # wakes ``accept``
            Client(self.address).close()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait for the run in progress, if any, to end; whether it did within ``timeout``."""
        if not self._run_lock.acquire(timeout=-1 if timeout is None else timeout):
            return False
        self._run_lock.release()
        return True

    def status(self) -> dict[str, Any]:
        with self._state:
            running = dict(self._running) if self._running else None
            served, failed, waiting = self._served, self._failed, self._waiting
        runtime = self.session.sparkContext._jvm.java.lang.Runtime.getRuntime()  # type: ignore[union-attr]
        return {
            "pid": os.getpid(),
            "address": f"{self.address[0]}:{self.address[1]}",
            "master": str(self.session.sparkContext.master),
            "code": self.code,
            "uptime_s": round(time.time() - self._started, 1),
            "runs": served,
            "failed": failed,
            "running": running,
            "waiting": waiting,
            "python_rss_mib": _rss_mib(),
            "jvm_heap_used_mib": round((runtime.totalMemory() - runtime.freeMemory()) / 2**20, 1),
            "stopping": self._stopping.is_set(),
            "spark_log": _spark_log(),
        }

    # -- one connection ---------------------------------------------------------------------

    def _serve(self, conn: Connection) -> None:
        try:
            handshake(conn, self._key, server=True, within=self._handshake_timeout)
        except (OSError, EOFError, AuthenticationError) as exc:  # a wrong key, silence, or a reset
            log.warning("refused a connection: %s: %s", type(exc).__name__, exc)
            hang_up(conn)
            return
        try:
            request = conn.recv()
            op = request.get("op") if isinstance(request, dict) else None
            if op == "status":
                conn.send({"status": self.status()})
            elif op == "stop":
                conn.send({"stopping": True})
                self.stop(cancel=bool(request.get("cancel")))
            elif op in ("run", "validate"):
                if request.get("code") != self.code:  # its body is read only by the same code
                    conn.send({"refused": "code", "code": self.code})
                else:
                    self._queue(conn, {"op": op, **pickle.loads(request["body"])})
            else:
                conn.send({"crash": f"the driver does not know the request {op!r}"})
        except (EOFError, OSError):
            pass  # the client went away
        finally:
            hang_up(conn)

    def _queue(self, conn: Connection, request: Mapping[str, Any]) -> None:
        sender = _Sender(conn)
        with self._state:
            self._waiting += 1
            ahead = self._waiting - 1 + (self._running is not None)
        try:
            if not self._run_lock.acquire(blocking=False):
                sender.send({"queued": ahead})
                self._run_lock.acquire()
        finally:
            with self._state:
                self._waiting -= 1
        try:
            if self._stopping.is_set():
                sender.send({"error": _stopping_error()})
                return
            self._execute(conn, sender, request)
        finally:
            self._run_lock.release()

    def _execute(self, conn: Connection, sender: _Sender, request: Mapping[str, Any]) -> None:
        """Run ``request`` (a run, or a validation) on a session of its own, in a job group its client
        can cancel, and send its summary, error or traceback back."""
        from replay.core.config import SparkSettings
        from replay.engine.spark import job_session

        if request["op"] == "run":
            from replay.runner.loop import run

            config = request["job"]
            what, output, settings = f"run into {config.output}", config.output, config.spark

            def work(session: SparkSession, on_event: Any) -> Any:
                return run(config, start=request.get("start"), end=request.get("end"), spark=session, on_event=on_event)

        else:
            from replay.quality.validate import validate

            output, settings = request["output"], SparkSettings()
            what = f"validation of {output}"

            def work(session: SparkSession, on_event: Any) -> Any:
                return validate(
                    output, request.get("version"), suites=request.get("suites"), spark=session, on_step=on_event
                )

        group = f"replay-driver-{next(self._ids)}"
        context = self.session.sparkContext
        cancelled, finished = threading.Event(), threading.Event()
        here = threading.current_thread()

        def watch() -> None:  # the client's side: a cancel, or its end
            with contextlib.suppress(EOFError, OSError):
                while conn.recv().get("op") != "cancel":
                    pass
            if not finished.is_set():
                cancelled.set()
                context.cancelJobGroup(group)

        def on_event(step: str, done: int, total: int) -> None:
            sender.send({"event": (step, done, total)})
            stopped = cancelled.is_set() or sender.broken.is_set() or self._cancelling.is_set()
            if stopped and threading.current_thread() is here:
                raise _Cancelled

        threading.Thread(target=watch, name="replay-driver-watch", daemon=True).start()
        forward = _Forward(sender)
        logging.getLogger("replay").addHandler(forward)
        with self._state:
            self._running = {"op": request["op"], "output": output, "since": time.time()}
        began = time.perf_counter()
        outcome: str = "failed"
        reply: dict[str, Any] | None = None
        try:
            context.setJobGroup(group, f"replay {what}", interruptOnCancel=True)
            summary = work(job_session(self.session, settings), on_event)
            outcome, reply = "done", {"summary": summary}
        except ReplayError as error:
            reply = {"error": error}
        except Exception:
            if self._cancelling.is_set():
                outcome = "cancelled (the driver is stopping)"
                reply = {"error": _stopping_error()}
            elif cancelled.is_set() or sender.broken.is_set():
                outcome = "cancelled (its client went away)"
            else:
                reply = {"crash": traceback.format_exc()}
        finally:
            finished.set()  # before the client has its answer and hangs up: no cancel then
            logging.getLogger("replay").removeHandler(forward)
            seconds = time.perf_counter() - began
            with self._state:  # before the answer: a client that asks next sees this run counted
                self._running = None
                self._served += 1
                self._failed += outcome != "done"
        if reply is not None:
            if outcome != "done":
                reply["spark_log"] = _spark_log(written=True)
            sender.send(reply)
        _clean_up(context)  # the client has its answer: this is off its clock
        log.info("%s: %s in %.1f s", what, outcome, seconds)


def _clean_up(context: Any) -> None:
    """After a run: Python's collector frees the run's objects and with them the JVM objects py4j held
    for them, and a JVM collection hands the shuffles and broadcasts nothing references any more to
    Spark's cleaner, which removes them before the next run rather than during it (the warm
    benchmark settles its session so between runs)."""
    gc.collect()
    with contextlib.suppress(Exception):  # a JVM that is gone: the next run says so
        context._jvm.System.gc()


def _stopping_error() -> DriverError:
    return DriverError(
        "the kept driver is stopping and takes no more runs",
        code="driver.stopping",
        todo="send the run to a driver started again, or run it without a driver",
    )


def _rss_mib() -> float | None:
    """This process's resident memory now (Linux), else ``None``."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def _spark_log(*, written: bool = False) -> str | None:
    """The file with Spark's warnings and errors of this driver in full (``replay.engine.spark_log``),
    when its JVM was started with one; with ``written``, only once Spark wrote to it (what a failed
    run's client is told)."""
    from replay.engine.spark_log import chosen_spark_log, written_spark_log

    path = written_spark_log() if written else chosen_spark_log()
    return None if path is None else str(path)
