"""The one place a SparkSession is built.

``local[*]`` embedded by default; any ``spark://`` (or other) master URL from the
job's ``spark.master`` setting. Settings that Replay relies on are forced here:
UTC session time zone (timestamps are instants) and Parquet metadata columns.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import shutil
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from replay.core.errors import ConfigError, Location

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from replay.core.config import SparkSettings

__all__ = [
    "check_java",
    "compiler_options",
    "driver_arrow_memory",
    "driver_java_options",
    "follow_cores",
    "get_session",
    "import_ahead",
    "job_progress",
    "job_session",
    "planned_master",
    "python_worker_conf",
    "refuse_speculation",
    "under_spark_submit",
    "with_job_conf",
]

_MIN_SPLITS = "spark.sql.files.minPartitionNum"
_SHUFFLE = "spark.sql.shuffle.partitions"
_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
_DAEMON_MODULE = "spark.python.daemon.module"
_DEFAULT_MASTER = "local[*]"
_CHOSEN = "spark.replay.chosen."  # + a key: the value ``get_session`` chose for it (``follow_cores``)

_DEFAULTS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.adaptive.enabled": "true",
    # PySpark's DataFrame debugging records the Python call site of every DataFrame and Column
    # call in the JVM: four more py4j round trips per call, 40 % of a micro-batch's plan
    # building (docs/performance-record.md). Replay's errors name files, origins and sequences instead.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # Rows cross to Python (a pass's writer) in Arrow batches of at most 10,000 rows
    # (``maxRecordsPerBatch``); a byte limit as well makes Spark measure every vector of the batch
    # after each row: 9 % of a pass's task time in a JVM profile (docs/performance-record.md). The byte
    # limit is off at this value exactly.
    "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1),
}
if hasattr(socket, "AF_UNIX"):
    # Spark talks to its Python workers (the pass's writer, the metadata scan, content hashes) and
    # hands the driver local data over sockets: a Unix domain socket instead of TCP on loopback
    # takes about 25 ms off every Python task here (a task of a trivial ``mapInArrow`` job: 60 ms
    # of run time over TCP; docs/performance-record.md). PySpark refuses it where Python has none.
    _DEFAULTS["spark.python.unix.domain.socket.enabled"] = "true"


def under_spark_submit() -> bool:
    """Whether this process was started by spark-submit, which starts the JVM first and hands Python
    its gateway: the session, its master and its driver options are then spark-submit's."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def check_java() -> None:
    """Fail early, with install instructions, when no Java runtime is on the machine.

    Raises:
        ConfigError: neither ``JAVA_HOME`` nor ``java`` on the PATH.
    """
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.path.exists(os.path.join(java_home, "bin", "java")):
        return
    if shutil.which("java"):
        return
    raise ConfigError(
        "no Java runtime found: PySpark needs Java 17",
        where=Location(extra={"JAVA_HOME": java_home or "(unset)"}),
        todo=(
            "install Java 17 (Debian/Ubuntu: 'apt-get install openjdk-17-jre-headless'; "
            "macOS: 'brew install openjdk@17') or set JAVA_HOME to a Java 17 installation"
        ),
        code="env.no_java",
    )


#: When the JIT's optimizing compiler (C2, tier 4) takes a method: at ten times the JDK's
#: invocation, loop and compile thresholds. With the defaults, C2 spent 16 to 21 s of CPU on some
#: 1,500 methods in a cold 20-batch run of 10M tuples that took 22 to 25 s on two cores, mostly on
#: code that runs a few thousand times while the JVM starts and plans; that CPU is the tasks'. At
#: ten times, C2 took 10 to 11 s and the run 2 s less; the per-row code, which runs millions of
#: times, still reaches C2 within the first batch, and a warm session runs as fast as before
#: (docs/performance-record.md, "Where a cold run's CPU goes").
_COMPILE_THRESHOLDS = (
    "-XX:Tier4InvocationThreshold=50000 -XX:Tier4MinInvocationThreshold=6000 "
    "-XX:Tier4CompileThreshold=150000 -XX:Tier4BackEdgeThreshold=400000"
)


def compiler_options() -> str:
    """The JIT options Replay gives the driver's JVM (``_COMPILE_THRESHOLDS``)."""
    return _COMPILE_THRESHOLDS


def driver_java_options() -> str:
    """The driver's JVM options Replay sets: its log4j2 configuration (warnings and errors only, one
    line each on stderr, whole in the process's log file: ``replay.engine.spark_log``), the JIT's
    later optimizing compilation (``compiler_options``), and the class-data archive when
    ``replay jvm-archive`` made one (``replay.engine.jvm_archive``).

    spark-submit callers pass it as ``--conf spark.driver.extraJavaOptions=...``: the JVM is
    started before Replay's code runs.
    """
    from replay.engine.jvm_archive import java_options
    from replay.engine.spark_log import log_option

    log_config = Path(__file__).with_name("log4j2.properties")
    options = (f"-Dlog4j2.configurationFile={log_config.as_uri()}", log_option(), compiler_options(), java_options())
    return " ".join(option for option in options if option)


@functools.cache
def _workers_import(module: str) -> bool:
    """Whether the Python workers' interpreter (this one, in this directory and environment) can
    import ``module``: asked of a process of its own once (some 30 ms), for a module this process
    may have found on a path it was given in code, which Spark's workers would not have."""
    import subprocess

    try:
        done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def python_worker_conf() -> dict[str, str]:
    """Settings for the Python workers of a local master: their daemon starts from the installed
    PySpark's compiled modules instead of the sources in its bundled zip (``replay.engine.pydaemon``:
    the first Python task of a new JVM 1.4 to 1.7 s before, 0.7 to 0.8 s after). Only where the
    workers run this interpreter (``PYSPARK_PYTHON``) and can import that module; else none."""
    if os.environ.get("PYSPARK_PYTHON", sys.executable) != sys.executable:
        return {}
    module = "replay.engine.pydaemon"
    return {_DAEMON_MODULE: module} if _workers_import(module) else {}


def get_session(settings: SparkSettings | None = None, *, app_name: str = "replay") -> SparkSession:
    """Return the active SparkSession, or build one from ``settings``.

    An already active session (a test session, a notebook) is reused as it is: its master and
    configuration belong to whoever started it. Under spark-submit (which starts the JVM and hands
    this process its gateway), the session takes spark-submit's master and driver options; the
    job's ``spark.master`` is not applied, its ``spark.conf`` and Replay's settings are.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    submitted = under_spark_submit()
    if not submitted:
        check_java()
    driver_arrow_memory()
    master = settings.master if settings is not None else _DEFAULT_MASTER
    # The batch pass writes its tables from Python workers (pyarrow): they run this interpreter
    # unless the deployment names another one.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    conf = dict(_DEFAULTS)
    if not submitted:  # spark-submit's --master, --name and driver options stand
        builder = builder.appName(app_name)
        if master.startswith("local"):
            # An embedded driver talks to itself only: bind to loopback instead of guessing an interface.
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        from replay.engine.readers import driver_threads

        if driver_threads(None, master) is not None:  # local, local[N]; not local-cluster: executors of its own
            conf |= python_worker_conf()
        builder = builder.master(master)
        conf[_JAVA_OPTIONS] = driver_java_options()
    if settings is not None:
        conf = with_job_conf(conf, settings.conf)
    for key, value in conf.items():
        builder = builder.config(key, value)
    if not submitted:
        _import_ahead()
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    _cancel_on_interrupt(session)
    _choose_per_core(session, conf)
    return session


def refuse_speculation(session: SparkSession) -> None:
    """Refuse a session whose Spark runs speculative task attempts (``spark.speculation``).

    A pass's tasks write its tables' files themselves, and a batch keeps the files its successful
    attempts return (``replay.engine.sink``). A speculative copy of a task still running when the
    pass ends could write its file after that, into a batch already committed: its rows would then
    be read twice. Spark's default is off; a cluster's defaults may turn it on.

    Raises:
        ConfigError: ``spark.speculation`` is on.
    """
    if session.sparkContext.getConf().get("spark.speculation", "false").strip().lower() == "true":
        raise ConfigError(
            "the Spark session runs speculative task attempts (spark.speculation=true): a late "
            "attempt could add a file to a batch already committed",
            where=Location(field="spark.conf.spark.speculation"),
            todo="set spark.speculation=false for Replay's jobs (in the job's spark.conf, or the "
            "cluster's spark-defaults.conf, or spark-submit's --conf)",
        )


def _cancel_on_interrupt(session: SparkSession) -> None:
    """Ctrl-C (SIGINT) cancels the session's Spark jobs and interrupts the main thread, as PySpark's
    own handler does, but cancels from a thread of its own. PySpark's handler calls the JVM from the
    interrupted thread, in the middle of that thread's own call, and py4j then logs the clash as
    errors with their tracebacks ("reentrant call") before the interrupt comes through."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        return
    context = session.sparkContext

    def cancel() -> None:
        with contextlib.suppress(Exception):  # a JVM already gone: nothing to cancel
            context.cancelAllJobs()

    def interrupted(signum: int, frame: object) -> None:
        threading.Thread(target=cancel, name="replay-cancel", daemon=True).start()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupted)


def _choose_per_core(session: SparkSession, given: Mapping[str, str]) -> None:
    """Set ``_per_core``'s settings on ``session``, except those ``given`` names (the job's stand)."""
    for key, value in _per_core(session).items():
        if key not in given:
            session.conf.set(key, value)
            session.conf.set(_CHOSEN + key, value)


def job_session(base: SparkSession, settings: SparkSettings) -> SparkSession:
    """A session of its own for one job, on ``base``'s driver (a kept driver's: ``replay.driver``).

    It shares ``base``'s JVM, and with it what the JVM compiled and Spark's generated classes, and
    has SQL settings of its own: Replay's, those ``_per_core`` chooses, and the job's
    ``spark.conf``. What a session cannot change, the master and the settings fixed when the
    driver started (its JVM options, memory, the cluster's), must be what the job asks for or
    absent from it; a job's ``local[*]``, the default, takes the driver's master.

    Raises:
        ConfigError: the job asks for another master, or for a static setting the driver has
            another value of.
    """
    context = base.sparkContext
    master = str(context.master)
    if settings.master not in (master, _DEFAULT_MASTER):
        raise ConfigError(
            f"the job asks for the Spark master {settings.master}; the kept driver runs {master}",
            where=Location(field="spark.master"),
            code="driver.master",
            todo=f"run it with --spark-master {master} (or spark.master in the job file), "
            f"start a driver with --master {settings.master}, or run it without the driver",
        )
    session = base.newSession()
    fixed = dict(context.getConf().getAll())
    for key, value in settings.conf.items():
        if session.conf.isModifiable(key):
            session.conf.set(key, value)
        elif fixed.get(key) != value:
            raise ConfigError(
                f"the job sets {key}={value}, which is fixed when a driver starts; "
                f"the kept driver has {fixed.get(key, 'no value')}",
                where=Location(field=f"spark.conf.{key}"),
                code="driver.static_conf",
                todo=f"start a driver with --conf {key}={value}, drop the setting from the job, "
                "or run it without the driver",
            )
    _choose_per_core(session, settings.conf)
    return session


def _import_ahead() -> None:
    """Import, in a thread of its own, what PySpark imports the first time py4j converts an
    argument once the JVM is up: ``pyspark.testing.utils``, and pandas through it (0.35 s of a cold
    run, docs/performance-record.md). Started just before the JVM is, it runs while this thread only waits
    for the JVM's gateway; PySpark's own import then finds the module loaded (or waits for it)."""
    import_ahead("pyspark.testing.utils")


def import_ahead(module: str) -> None:
    """Import ``module`` in a daemon thread of its own, unless it is loaded already, while this
    thread goes on with work that mostly waits (for the JVM, say). An import that fails there is
    let go: the caller's own import later does it again and says what went wrong."""
    if module in sys.modules:
        return

    def load() -> None:
        with contextlib.suppress(Exception):
            importlib.import_module(module)

    threading.Thread(target=load, name="replay-import-ahead", daemon=True).start()


def planned_master(settings: SparkSettings | None = None) -> str | None:
    """The master of the session ``get_session(settings)`` gives, before it is built: an active
    session's, the job's (``local[*]`` without settings), or ``None`` under spark-submit, whose
    master is known once the session is up."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return str(active.sparkContext.master)
    if under_spark_submit():
        return None
    return settings.master if settings is not None else _DEFAULT_MASTER


def with_job_conf(conf: Mapping[str, str], given: Mapping[str, str]) -> dict[str, str]:
    """Replay's session settings ``conf`` with the job's ``given`` ones: the job's stand, except
    that its driver JVM options come after Replay's (the JVM takes the last of two that conflict)
    instead of replacing them."""
    merged = {**conf, **given}
    if _JAVA_OPTIONS in conf and _JAVA_OPTIONS in given:
        merged[_JAVA_OPTIONS] = f"{conf[_JAVA_OPTIONS]} {given[_JAVA_OPTIONS]}".strip()
    return merged


def _per_core(session: SparkSession) -> dict[str, str]:
    """The settings ``get_session`` derives from the cores Spark has now (``defaultParallelism``).

    - ``spark.sql.files.minPartitionNum``, two splits per core: Spark packs a scan's files into
      splits of about the input's size over the cores, and 40 small files on two cores became three
      tasks, the third running alone while a core idled (a pass of 10M tuples: 0.2 s less;
      docs/performance-record.md).
    - ``spark.sql.shuffle.partitions``, one per core (Spark's default is 200): a pass shuffles its
      window partials once, without adaptive execution (``replay.engine.aggregate``)."""
    cores = session.sparkContext.defaultParallelism
    return {_MIN_SPLITS: str(2 * cores), _SHUFFLE: str(cores)}


def follow_cores(session: SparkSession) -> None:
    """Bring the per-core settings ``get_session`` chose (``_per_core``) up to the cores Spark has
    now; a pass calls it before its action.

    On a cluster the executors register after the session starts: ``defaultParallelism`` was the
    minimum of 2 when ``get_session`` asked and is every executor's cores later. A setting the job
    gave, or anyone changed since (a test, a notebook), is left as it is."""
    for key, value in _per_core(session).items():
        chosen = session.conf.get(_CHOSEN + key, None)
        if chosen is not None and chosen != value and session.conf.get(key, None) == chosen:
            session.conf.set(key, value)
            session.conf.set(_CHOSEN + key, value)


def driver_arrow_memory() -> None:
    """Arrow memory from the system allocator, unless ``ARROW_DEFAULT_MEMORY_POOL`` names one.

    Arrow's default allocator (mimalloc) keeps the memory it freed for its own reuse. The driver
    allocates Arrow memory in bursts (the metadata scan's records, each pass's decision table) and
    keeps Python objects in between, so what it kept was resident memory the run never used again:
    the driver's peak grew 7 MiB more from 1M to 30M tuples with it than with the system allocator
    (docs/performance.md#time-and-driver-memory-by-archive-size). The variable is set for Arrow's
    own default and for the processes started from here (the JVM, hence Spark's Python workers,
    where it measured no slower); pyarrow's default is switched too, for a process whose Arrow is
    already in use (an Airflow task running ``replay.run``). The command line calls it before its first Arrow
    allocation; ``replay.run`` and ``inspect_archive`` call it first thing. It also fixes glibc's
    threshold for mapped blocks (``_large_blocks_mapped``)."""
    _large_blocks_mapped()
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return
    os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())


def _large_blocks_mapped() -> None:
    """glibc's allocator: blocks of 128 KiB and more always from their own mapping, given back to
    the system when freed (``mallopt(M_MMAP_THRESHOLD)``). By default glibc raises that threshold to
    the size of the largest block freed so far, after which such blocks come from its heap, which
    gives nothing back while a small object lives above them: reading the 40 files' metadata columns
    in the driver (``replay.engine.scan``) left 2.3 MiB more resident per file (the 10M-tuple
    benchmark's driver: 228 MiB after the scan, against 136 MiB with the threshold fixed;
    docs/performance-record.md). Nothing where the C library is another one."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD (glibc's malloc.h)


@contextmanager
def job_progress(
    session: SparkSession, report: Callable[[int, int], None] | None, *, interval: float = 0.5
) -> Iterator[None]:
    """While the block runs, report (finished tasks, known tasks) of the session's active stages.

    Polls Spark's status tracker from a daemon thread; no-op when ``report`` is ``None``.
    """
    if report is None:
        yield
        return
    tracker = session.sparkContext.statusTracker()
    stop = threading.Event()
    seen: dict[int, tuple[int, int]] = {}

    def poll() -> None:
        while not stop.wait(interval):
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    seen[stage_id] = (info.numCompletedTasks, info.numTasks)
            done = sum(d for d, _ in seen.values())
            total = sum(t for _, t in seen.values())
            if total:
                report(done, total)

    thread = threading.Thread(target=poll, name="replay-spark-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
