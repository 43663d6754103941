"""A session that runs again and again: ``replay run`` of one small job, from an empty output and
checkpoint each time, many times in one warm process (as a notebook, a test session or a kept
driver does), and the memory it holds afterwards.

Every 20 runs the benchmark waits until py4j has told the JVM about every proxy Python freed, then
asks the JVM for full collections one second apart until the heap in use settles (the first hands
unreferenced broadcasts and shuffles to Spark's cleaner, which removes them; a later one frees
them). Reported per step: the live JVM heap after those collections, the
JVM objects py4j still holds for Python, the Python process's resident memory, and the median wall
time of the step's runs. A driver that keeps nothing between runs holds a flat heap.

``--kept-driver``: the same runs sent to a kept driver (``replay driver serve``, its own process, 4 GiB
heap), as a scheduled replay sends them. Its heap is read from outside, as an operator would: the
JDK's ``jcmd`` asks its JVM for full collections until the heap in use settles, and reads it
(``GC.heap_info``). Reported per step beside it: the driver's Python and JVM resident memory, and
the median wall time of a run as its client sees it.

Run as ``./dev.sh bench soak [--runs 200] [--kept-driver]``.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

__all__ = ["bench_soak", "bench_soak_driver"]


def _py4j_settled(spark: Any, timeout: float = 10.0) -> int:
    """Wait until py4j's finalizer queue is empty, then say how many JVM objects the gateway still
    holds for Python proxies."""
    client = spark.sparkContext._gateway._gateway_client
    queue = getattr(client, "finalizer_deque", None)
    deadline = time.monotonic() + timeout
    while queue and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.2)  # the last message popped may still be on its way
    gateway = spark.sparkContext._gateway
    server = gateway.java_gateway_server.getGateway()
    bindings = server.getBindings()
    try:
        return int(bindings.size()) - 2  # less the two the measurement holds
    finally:
        gateway.detach(bindings)  # the measurement leaves nothing held
        gateway.detach(server)


def _live_heap_mib(spark: Any) -> float:
    """The JVM's heap in use after full collections one second apart, until two readings agree
    within 1 MiB (at most five): the first collection hands unreferenced broadcasts and shuffles to
    Spark's cleaner, which removes them in the background, and a later one frees them."""
    jvm = spark.sparkContext._jvm
    runtime = jvm.Runtime.getRuntime()
    try:
        readings: list[float] = []
        while len(readings) < 5 and (len(readings) < 2 or abs(readings[-1] - readings[-2]) > 1):
            jvm.System.gc()
            readings.append((runtime.totalMemory() - runtime.freeMemory()) / 2**20)
            time.sleep(1.0)
        return readings[-1]
    finally:
        spark.sparkContext._gateway.detach(runtime)


def bench_soak(
    archive: Path,
    run_config: Callable[[Path, Path, int | None], Any],
    spark: Any,
    runs: int = 200,
    every: int = 20,
) -> str:
    from replay.runner.loop import run

    process = psutil.Process()
    rows = [
        f"`replay run` again and again in one session: {archive.name}, 40 buffers per micro-batch, "
        "a fresh output and checkpoint per run",
        "",
        "| runs | live JVM heap (MiB) | JVM objects held for Python | Python RSS (MiB) | median s / run |",
        "|---:|---:|---:|---:|---:|",
    ]

    def step(done: int, seconds: list[float]) -> None:
        held = _py4j_settled(spark)
        heap = _live_heap_mib(spark)
        median = f"{statistics.median(seconds):.2f}" if seconds else "-"
        rows.append(f"| {done} | {heap:.0f} | {held} | {process.memory_info().rss / 2**20:.0f} | {median} |")
        print(rows[-1], flush=True)

    _soak(runs, every, lambda work: run(run_config(archive, work, 40), spark=spark), step, Path(tempfile.gettempdir()))
    return "\n".join(rows)


def _soak(
    runs: int, every: int, one: Callable[[Path], object], step: Callable[[int, list[float]], None], under: Path
) -> None:
    """``one(work)`` ``runs`` times, each in a new directory under ``under`` removed after it, and
    ``step(done, seconds)`` before the first and after every ``every`` runs with their wall times."""
    step(0, [])
    seconds: list[float] = []
    for done in range(1, runs + 1):
        work = Path(tempfile.mkdtemp(prefix="replay-soak-", dir=under))
        try:
            start = time.perf_counter()
            one(work)
            seconds.append(time.perf_counter() - start)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if done % every == 0:
            step(done, seconds)
            seconds = []


def _jcmd() -> str:
    """The JDK's ``jcmd``: next to the ``java`` of ``JAVA_HOME``, else on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    beside = Path(home) / "bin" / "jcmd" if home else None
    found = str(beside) if beside is not None and beside.exists() else shutil.which("jcmd")
    if not found:
        raise SystemExit("the kept driver's soak reads its heap with the JDK's jcmd: install a JDK or set JAVA_HOME")
    return found


def _settled_heap_mib(jcmd: str, pid: int) -> float:
    """The heap in use of JVM ``pid`` after full collections one second apart (``jcmd GC.run``), until
    two readings agree within 1 MiB (at most five), as ``_live_heap_mib`` does from inside."""
    readings: list[float] = []
    while len(readings) < 5 and (len(readings) < 2 or abs(readings[-1] - readings[-2]) > 1):
        subprocess.run([jcmd, str(pid), "GC.run"], check=True, capture_output=True)
        info = subprocess.run([jcmd, str(pid), "GC.heap_info"], check=True, capture_output=True, text=True).stdout
        used = re.search(r"heap\s+total \d+K, used (\d+)K", info)
        if used is None:
            raise SystemExit(f"jcmd GC.heap_info said nothing this benchmark reads:\n{info}")
        readings.append(int(used.group(1)) / 1024)
        time.sleep(1.0)
    return readings[-1]


def bench_soak_driver(
    archive: Path,
    run_config: Callable[[Path, Path, int | None], Any],
    runs: int = 200,
    every: int = 20,
) -> str:
    """``bench_soak``'s runs, sent to a kept driver started for the benchmark and stopped after it."""
    from replay.driver.client import run_on_driver, stop_driver
    from replay.driver.home import DriverHome

    jcmd = _jcmd()
    replay = str(Path(sys.executable).with_name("replay"))
    work = Path(tempfile.mkdtemp(prefix="replay-soak-driver-"))
    home = DriverHome(work / "driver")
    command = [replay, "driver", "serve", "--dir", str(home.path), "--conf", "spark.driver.memory=4g"]
    log = work / "driver.log"
    with log.open("w") as out:  # the driver writes to its own copy of the descriptor
        serve = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        while not home.record.exists():
            if serve.poll() is not None:
                raise SystemExit(f"replay driver serve ended with {serve.returncode}: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        driver = psutil.Process(serve.pid)
        jvm = next(child for child in driver.children(recursive=True) if child.name() == "java")
        rows = [
            f"`replay run` again and again through a kept driver: {archive.name}, 40 buffers per micro-batch, "
            "a fresh output and checkpoint per run",
            "",
            "| runs | live JVM heap (MiB) | driver's Python RSS (MiB) | its JVM's RSS (MiB) | median s / run |",
            "|---:|---:|---:|---:|---:|",
        ]

        def step(done: int, seconds: list[float]) -> None:
            heap = _settled_heap_mib(jcmd, jvm.pid)
            median = f"{statistics.median(seconds):.2f}" if seconds else "-"
            python_rss, jvm_rss = driver.memory_info().rss / 2**20, jvm.memory_info().rss / 2**20
            rows.append(f"| {done} | {heap:.0f} | {python_rss:.0f} | {jvm_rss:.0f} | {median} |")
            print(rows[-1], flush=True)

        _soak(runs, every, lambda job: run_on_driver(home, run_config(archive, job, 40)), step, work)
        return "\n".join(rows)
    finally:
        try:
            stop_driver(home)
            serve.wait(timeout=120)
        except Exception:  # a driver that does not stop: the benchmark's end must not wait on it
            serve.kill()
        shutil.rmtree(work, ignore_errors=True)
