"""How ``replay run`` scales: the fixed cost of a micro-batch, and time and driver memory by archive size.

``./dev.sh bench fixed``: the 1M-tuple archive (40 files, 1,000-tuple buffers) replayed warm in
one process at 1, 10 and 100 micro-batches (``max_buffers`` = buffers / n), best of ``repeats``
rounds after a warm-up round; a least-squares line ``seconds = a + b * batches`` through the
points gives ``b``, the fixed cost of one more micro-batch, and ``a``, the rest.

``./dev.sh bench scale [--sizes 1000000:1000 10000000:1000 30000000:1000]``: ``replay run`` cold,
as a user runs it (its own process and JVM, about 20 micro-batches), on archives of growing size:
wall time, tuples/s, and the peak resident memory of the Python driver and of the JVM, sampled
every 50 ms. Linear time and a flat Python driver are what the design promises (only per-buffer
records reach the driver, and the known buffers live in the checkpoint's files).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

__all__ = ["bench_fixed", "bench_scale"]


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``y = a + b x``: (a, b)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - b * mx, b


def bench_fixed(
    path: Path, timed_run: Callable[[Path, int | None, Any], tuple[Any, float]], session: Any, repeats: int = 2
) -> str:
    """The fixed cost per micro-batch, fit over 1, 10 and 100 batches of the archive at ``path``;
    ``timed_run(path, max_buffers, session)`` replays it once: (summary, wall seconds)."""
    best: dict[int, float] = {}
    counts: dict[int, int] = {}
    buffers = 0
    for attempt in range(repeats + 1):  # round 0 warms up and is not counted
        for wanted in (1, 10, 100):
            max_buffers = None if wanted == 1 or not buffers else max(1, -(-buffers // wanted))
            summary, seconds = timed_run(path, max_buffers, session)
            buffers = summary.buffers
            counts[wanted] = summary.batches
            if attempt:
                best[wanted] = min(best.get(wanted, seconds), seconds)
            print(f"  {summary.batches} batches (round {attempt}): {seconds:.1f} s", flush=True)
    a, b = _fit([(counts[w], best[w]) for w in (1, 10, 100)])
    rows = [
        "| micro-batches | replay run s (best, warm) |",
        "| ---: | ---: |",
        *[f"| {counts[w]} | {best[w]:.1f} |" for w in (1, 10, 100)],
        "",
        f"Least squares over the three: {a:.1f} s + {b:.3f} s per micro-batch "
        f"(fixed cost per micro-batch {b:.2f} s; {buffers:,} buffers).",
    ]
    return "\n".join(rows)


def bench_scale(
    sizes: list[tuple[int, int]],
    archive: Callable[..., Path],
    run_settings: Callable[[Path, Path, int | None], Any],
    measure: Callable[[list[str]], tuple[float, int, int, str]],
    batches_wanted: int = 20,
) -> str:
    """``replay run`` cold on each size, about ``batches_wanted`` micro-batches: time and peak memory."""
    import json

    rows = [
        "| tuples | buffers | batches | wall s (cold) | tuples/s | Python driver peak MiB | JVM peak MiB |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for tuples, buffer_tuples in sizes:
        path = archive(tuples, buffer_tuples, files=40)
        buffers = -(-tuples // buffer_tuples)
        work = Path(tempfile.mkdtemp(prefix="replay-bench-"))
        try:
            config = run_settings(path, work, max(1, -(-buffers // batches_wanted))).model_dump(mode="json")
            config["spark"] = {"conf": {"spark.driver.memory": "4g", "spark.sql.shuffle.partitions": "2"}}
            job = work / "job.yaml"
            job.write_text(yaml.safe_dump(config))
            seconds, py_peak, jvm_peak, out = measure(
                [sys.executable, "-m", "replay", "run", "--config", str(job), "--json"]
            )
            summary = json.loads(out)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        line = (
            f"| {summary['tuples_read']:,} | {summary['buffers']:,} | {summary['batches']} | {seconds:.1f} | "
            f"{summary['tuples_read'] / seconds:,.0f} | {py_peak / 2**20:.0f} | {jvm_peak / 2**20:.0f} |"
        )
        print(line, flush=True)
        rows.append(line)
    return "\n".join(rows)
