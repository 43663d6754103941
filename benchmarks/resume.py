"""What a resume costs after a long history: ``replay run`` on a checkpoint that has committed
N one-buffer batches, plus one new file, as a user runs it (its own process and JVM).

The history is one buffer with tuples followed by N - 1 punctuation buffers that promise nothing
new (so building it costs commits, not Spark work); the new file holds the next sequence with a
tuple and a watermark that closes the first windows. Reported per N: the best wall time of three
resumes of the same checkpoint (restored from a copy before each) and the peak
resident memory of the Python driver and of the JVM (sampled every 50 ms), and the commit's size.

Run as ``./dev.sh bench resume [--histories 10 1000]``.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

__all__ = ["bench_resume"]

T0 = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z in microseconds
SECOND = 1_000_000
TS = pa.timestamp("us", tz="UTC")


def _buffers(first: int, last: int, *, tuple_at: int | None, watermark: int | None) -> pa.Table:
    n = last - first + 1
    return pa.table(
        {
            "origin_id": pa.array([1] * n, pa.int64()),
            "sequence_number": pa.array(range(first, last + 1), pa.int64()),
            "chunk_number": pa.array([1] * n, pa.int32()),
            "last_chunk": pa.array([True] * n),
            "watermark_ts": pa.array([watermark] * n, pa.int64()).cast(TS),
            "event_time": pa.array([tuple_at] * n, pa.int64()).cast(TS),
            "key": pa.array([1 if tuple_at is not None else None] * n, pa.int64()),
            "value": pa.array([1.0 if tuple_at is not None else None] * n, pa.float64()),
        }
    )


def _history(root: Path, batches: int) -> Path:
    """Build the archive and its committed history in this process; returns the job file."""
    from replay.core.config import load_config
    from replay.runner.loop import run

    shutil.rmtree(root, ignore_errors=True)
    archive = root / "archive"
    archive.mkdir(parents=True)
    pq.write_table(_buffers(1, 1, tuple_at=T0 + SECOND // 2, watermark=T0 + SECOND), archive / "part-00000.parquet")
    if batches > 1:
        pq.write_table(_buffers(2, batches, tuple_at=None, watermark=None), archive / "part-00001.parquet")
    job = root / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "archive": str(archive),
                "output": str(root / "out"),
                "checkpoint": str(root / "ckpt"),
                "windows": [{"name": "w", "size": "1s", "aggregations": [{"fn": "count"}]}],
                "micro_batch": {"max_buffers": 1},
            }
        )
    )
    start = time.perf_counter()
    summary = run(load_config(job))
    print(f"history of {summary.batches} batches built in {time.perf_counter() - start:.1f} s", flush=True)
    pq.write_table(
        _buffers(batches + 1, batches + 1, tuple_at=T0 + 2 * SECOND, watermark=T0 + 10 * SECOND),
        archive / "part-00002.parquet",
    )
    return job


def bench_resume(
    histories: list[int], data: Path, measure: Callable[[list[str]], tuple[float, int, int, str]], rounds: int = 3
) -> str:
    """The table of resumes; ``measure`` runs a command and gives its wall seconds, peak Python and JVM RSS."""
    rows = [
        "| committed batches | resume wall s (best) | Python driver peak MiB | JVM peak MiB | last commit KiB |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for batches in histories:
        job = _history(data / f"resume-{batches}", batches)
        root = job.parent
        # Each round resumes the same checkpoint: both directories are restored from a copy first.
        for name in ("ckpt", "out"):
            shutil.copytree(root / name, root / f"{name}.before", dirs_exist_ok=True)
        best: tuple[float, int, int] | None = None
        for _ in range(rounds):
            for name in ("ckpt", "out"):
                shutil.rmtree(root / name)
                shutil.copytree(root / f"{name}.before", root / name)
            seconds, py_peak, jvm_peak, _ = measure([sys.executable, "-m", "replay.cli", "run", "--config", str(job)])
            if best is None or seconds < best[0]:
                best = (seconds, py_peak, jvm_peak)
        assert best is not None
        seconds, py_peak, jvm_peak = best
        commits = sorted((root / "ckpt" / "commits").glob("*.json"))
        size = commits[-1].stat().st_size / 1024
        line = f"| {batches:,} | {seconds:.1f} | {py_peak / 2**20:.0f} | {jvm_peak / 2**20:.0f} | {size:.0f} |"
        print(line, flush=True)
        rows.append(line)
    return "\n".join(rows)
