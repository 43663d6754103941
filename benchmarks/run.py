"""Benchmarks (measurements, never timed tests). Run with ``./dev.sh bench [inspect] [--sizes ...]``.

``inspect``: ``replay inspect --json`` as a user runs it (its own process and JVM) on
generated archives of several sizes and buffer sizes. Reports wall time, tuples/s,
and the peak resident memory of the Python driver and of the JVM separately,
sampled every 50 ms, so that "driver memory grows with buffers, not tuples" can be
read off the table. Archives are cached under ``benchmarks/data/``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil

from replay.generate import GenerateOptions, generate_archive

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data"
RESULTS = ROOT / "results"


def archive(tuples: int, buffer_tuples: int) -> Path:
    path = DATA / f"inspect-{tuples}-{buffer_tuples}"
    if not any(path.glob("*.parquet")):
        options = GenerateOptions(
            origins=16,
            tuples=tuples,
            buffer_tuples=buffer_tuples,
            keys=10_000,
            seed=1,
            gaps=3,
            duplicates=5,
            late_fraction=0.01,
            multi_chunk_fraction=0.2,
            files=8,
        )
        generate_archive(path, options)
    return path


def measure(args: list[str]) -> tuple[float, int, int, str]:
    """Run a command; return wall seconds, peak Python RSS, peak JVM RSS (bytes) and stdout."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    watched = psutil.Process(proc.pid)
    py_peak = jvm_peak = 0
    while proc.poll() is None:
        try:
            py_peak = max(py_peak, watched.memory_info().rss)
            for child in watched.children(recursive=True):
                if "java" in child.name():
                    jvm_peak = max(jvm_peak, child.memory_info().rss)
        except psutil.Error:
            pass
        time.sleep(0.05)
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{args} exited with {proc.returncode}")
    return time.perf_counter() - start, py_peak, jvm_peak, out


def bench_inspect(sizes: list[tuple[int, int]]) -> str:
    rows = [
        "| tuples | tuples/buffer | buffers | wall s | tuples/s | Python driver peak MiB | JVM peak MiB |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for tuples, buffer_tuples in sizes:
        path = archive(tuples, buffer_tuples)
        seconds, py_peak, jvm_peak, out = measure([sys.executable, "-m", "replay.cli", "inspect", str(path), "--json"])
        report = json.loads(out)
        line = (
            f"| {report['tuples_read']:,} | {buffer_tuples} | {report['buffers']:,} | {seconds:.1f} | "
            f"{report['tuples_read'] / seconds:,.0f} | {py_peak / 2**20:.0f} | {jvm_peak / 2**20:.0f} |"
        )
        print(line, flush=True)
        rows.append(line)
    return "\n".join(rows)


def bench_inspect_warm(sizes: list[tuple[int, int]], repeats: int = 3) -> str:
    """In one process: the fixed cost (session start, first job) apart from the steady-state scan."""
    from replay.config import parse_config
    from replay.inspection import inspect_archive
    from replay.spark import get_session

    start = time.perf_counter()
    spark = get_session()
    session_s = time.perf_counter() - start
    rows = [
        f"SparkSession start: {session_s:.1f} s",
        "",
        "| tuples | buffers | first run s | steady run s (best of the rest) | steady tuples/s |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for tuples, buffer_tuples in sizes:
        config = parse_config({"archive": str(archive(tuples, buffer_tuples))})
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            report = inspect_archive(config, spark=spark)
            times.append(time.perf_counter() - start)
        steady = min(times[1:])
        line = (
            f"| {report.scan.tuples_read:,} | {len(report.scan.buffers):,} | {times[0]:.1f} | {steady:.1f} | "
            f"{report.scan.tuples_read / steady:,.0f} |"
        )
        print(line, flush=True)
        rows.append(line)
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="?", default="inspect", choices=["inspect", "inspect-warm"])
    parser.add_argument(
        "--sizes",
        nargs="*",
        default=["1000000:1000", "10000000:1000", "10000000:100"],
        help="TUPLES:TUPLES_PER_BUFFER pairs",
    )
    options = parser.parse_args()
    sizes = [(int(a), int(b)) for a, b in (s.split(":") for s in options.sizes)]
    table = bench_inspect(sizes) if options.what == "inspect" else bench_inspect_warm(sizes)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{options.what}.md").write_text(table + "\n")
    print(f"\nwritten to {RESULTS / options.what}.md")


if __name__ == "__main__":
    main()
