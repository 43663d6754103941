"""A session that runs again and again: ``replay run`` of one small job, from an empty output and
checkpoint each time, many times in one warm process (as a notebook, a test session or a kept
driver does), and the memory it holds afterwards.

Every 20 runs the benchmark waits until py4j has told the JVM about every proxy Python freed, then
asks the JVM for full collections one second apart until the heap in use settles (the first hands
unreferenced broadcasts and shuffles to Spark's cleaner, which removes them; a later one frees
them). Reported per step: the live JVM heap after those collections, the
JVM objects py4j still holds for Python, the Python process's resident memory, and the median wall
time of the step's runs. A driver that keeps nothing between runs holds a flat heap.

Run as ``./dev.sh bench soak [--runs 200]``.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

__all__ = ["bench_soak"]


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

    step(0, [])
    seconds: list[float] = []
    for done in range(1, runs + 1):
        work = Path(tempfile.mkdtemp(prefix="replay-soak-"))
        try:
            start = time.perf_counter()
            run(run_config(archive, work, 40), spark=spark)
            seconds.append(time.perf_counter() - start)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if done % every == 0:
            step(done, seconds)
            seconds = []
    return "\n".join(rows)
