"""Benchmarks (measurements, never timed tests).

Run with ``./dev.sh bench [inspect|inspect-warm|run|cold|floor|resume|fixed|scale|soak]
[--sizes TUPLES:TUPLES_PER_BUFFER ...]``.

``soak``: one small job run again and again in one session, and the JVM heap it holds after each
20 runs (``benchmarks/soak.py``); with ``--kept-driver``, the same runs sent to a kept driver.

``resume``: a resume after 10 and after 1,000 committed batches (``benchmarks/resume.py``).

``cold``: ``replay run`` against the plain batch and Structured Streaming, each command in its own
process, with and without the JVM's class-data archive (``benchmarks/cold.py``).

``fixed``: the fixed cost of a micro-batch, fit over 1, 10 and 100 batches of the 1M archive;
``scale``: ``replay run`` cold on growing archives, time and peak driver memory
(``benchmarks/scaling.py``).

``run``: ``replay run`` against plain Spark batch and Structured Streaming (``bench_run``).
``floor``: plain batch against the cheapest possible metadata pass (``bench_floor``).

``inspect``: ``replay inspect --json`` as a user runs it (its own process) on generated
archives of several sizes and buffer sizes. Reports wall time, tuples/s, and the peak resident
memory of the Python driver and of a JVM separately, sampled every 50 ms, so that "driver memory
grows with buffers, not tuples" can be read off the table. With a local master ``inspect``
starts no JVM ("none"). Archives are cached under ``benchmarks/data/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from replay.generate import generate_archive
from replay.generate_options import GenerateOptions

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data"
RESULTS = ROOT / "results"


def archive(tuples: int, buffer_tuples: int, files: int = 8) -> Path:
    path = DATA / (f"inspect-{tuples}-{buffer_tuples}" + (f"-{files}files" if files != 8 else ""))
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
            files=files,
        )
        generate_archive(path, options)
    return path


def measure(args: list[str]) -> tuple[float, int, int, str]:
    """Run a command; return wall seconds, peak Python RSS, peak JVM RSS (bytes) and stdout.

    The wall time runs until every process the command started has ended, not only the command's
    own: a PySpark script's JVM goes on (stopping its SparkContext in a shutdown hook) after the
    script has returned, unless the script waits for it as ``replay`` does. Every command, Replay's
    and the baselines', is timed to the end of its JVM, so none runs on the cores of the next.
    (Reading the command's output to its end already waited for a JVM that kept it open; the
    session's end also covers one that does not.)"""
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
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
    while _session_alive(proc.pid):
        time.sleep(0.02)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{args} exited with {proc.returncode}")
    return time.perf_counter() - start, py_peak, jvm_peak, out


def _session_alive(session: int) -> bool:
    """Whether a process of ``session`` (a command started in a session of its own) still runs."""
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == session and process.status() != psutil.STATUS_ZOMBIE:
                return True
        except (psutil.Error, OSError):
            continue
    return False


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
            f"{report['tuples_read'] / seconds:,.0f} | {py_peak / 2**20:.0f} | "
            f"{f'{jvm_peak / 2**20:.0f}' if jvm_peak else 'none'} |"
        )
        print(line, flush=True)
        rows.append(line)
    return "\n".join(rows)


def bench_inspect_warm(sizes: list[tuple[int, int]], repeats: int = 3) -> str:
    """In one process: the first run (imports, first reads) apart from the steady-state scan. With a
    local master ``inspect`` starts no SparkSession: its driver threads read the metadata."""
    from replay.core.config import parse_config
    from replay.engine.inspection import inspect_archive

    rows = [
        "| tuples | buffers | first run s | steady run s (best of the rest) | steady tuples/s |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for tuples, buffer_tuples in sizes:
        config = parse_config({"archive": str(archive(tuples, buffer_tuples))})
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            report = inspect_archive(config)
            times.append(time.perf_counter() - start)
        steady = min(times[1:])
        line = (
            f"| {report.scan.tuples_read:,} | {len(report.scan.buffers):,} | {times[0]:.1f} | {steady:.1f} | "
            f"{report.scan.tuples_read / steady:,.0f} |"
        )
        print(line, flush=True)
        rows.append(line)
    return "\n".join(rows)


def _session() -> Any:
    """The one warm session ``run`` and ``floor`` measure in: 4 GiB driver, shuffle partitions 2."""
    from replay.core.config import SparkSettings
    from replay.engine.spark import get_session

    spark = get_session(SparkSettings(conf={"spark.driver.memory": "4g"}))
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    return spark


def _run_config(path: Path, work: Path, max_buffers: int | None, per_pass: int | None = None) -> Any:
    from replay.core.config import parse_config

    return parse_config(
        {
            "archive": str(path),
            "output": str(work / "out"),
            "checkpoint": str(work / "ckpt"),
            "windows": [
                {
                    "name": "per_minute",
                    "size": "60s",
                    "aggregations": [
                        {"fn": "count"},
                        {"fn": "sum", "column": "value"},
                        {"fn": "min", "column": "value"},
                        {"fn": "max", "column": "value"},
                    ],
                }
            ],
            "micro_batch": {"max_buffers": max_buffers}
            | ({} if per_pass is None else {"max_batches_per_pass": per_pass}),
        }
    )


def _settle(spark: Any) -> None:
    """Let Spark clean up after the previous measurement before the next one starts: a JVM garbage
    collection hands the shuffles and broadcasts nothing references any more to Spark's cleaner,
    which removes them in the background, outside the next timed run. It did not remove the
    slowdown that followed the one-action-per-batch variant (the following runs took 15 to 40 %
    longer, the plain batch included); running that variant last did (docs/performance-record.md)."""
    spark.sparkContext._jvm.System.gc()
    time.sleep(1.0)


_FILE_CACHES: dict[Path, Path] = {}  # archive -> a copy of the scan cache a run of it left behind


def _timed_run(
    path: Path, max_buffers: int | None, spark: Any, per_pass: int | None = None, *, warm_cache: bool = False
) -> tuple[Any, float]:
    """``replay run`` of the benchmark job on ``path`` in a fresh output and checkpoint: (summary, wall s).
    ``per_pass``: ``micro_batch.max_batches_per_pass`` (the default when ``None``). With ``warm_cache``
    the fresh checkpoint starts with the file cache (``scan-cache/``: per-file metadata records and
    content hashes) an earlier run of the same archive left, as a re-run or a backfill of files the
    checkpoint already knows finds it; the outputs and the progress state still start empty."""
    import shutil
    import tempfile

    from replay.runner.loop import run

    work = Path(tempfile.mkdtemp(prefix="replay-bench-"))
    try:
        if warm_cache and path in _FILE_CACHES:
            shutil.copytree(_FILE_CACHES[path], work / "ckpt" / "scan-cache")
        _settle(spark)
        start = time.perf_counter()
        summary = run(_run_config(path, work, max_buffers, per_pass), spark=spark)
        seconds = time.perf_counter() - start
        if path not in _FILE_CACHES and (work / "ckpt" / "scan-cache").is_dir():
            kept = Path(tempfile.mkdtemp(prefix="replay-bench-cache-")) / "scan-cache"
            shutil.copytree(work / "ckpt" / "scan-cache", kept)
            _FILE_CACHES[path] = kept
        return summary, seconds
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bench_run(sizes: list[tuple[int, int]], batches_wanted: int = 20, repeats: int = 3) -> str:
    """``replay run`` warm in one process, side by side with plain Spark batch and Structured Streaming.

    Same session, same files, same aggregation (60 s tumbling windows per key: count, sum, min,
    max of value), shuffle partitions 2 and a 4 GiB driver (local mode: the JVM that runs the
    tasks) for all. Each measurement is the best of ``repeats`` rounds, after one untimed warm-up
    round of each, and a second table gives the medians of the rounds; wall-clock times on these
    shared 2-core machines vary by 20 to 30 % from run to run, and on a busy day the best rounds of
    one measurement and another's can come from different moments of the machine. The archive
    has 40 files; the incremental shape is about ``batches_wanted`` micro-batches on both sides
    (replay: ``max_buffers`` = buffers / 20; Structured Streaming: ``maxFilesPerTrigger`` 2),
    beside one batch each. The fixed cost per micro-batch is the slope
    between replay's one batch and its ~20. The one batch also runs with a warm file cache (the
    checkpoint starts with the ``scan-cache/`` an earlier run of the archive left: its metadata records
    and content hashes, as a re-run or a backfill over known files finds them; outputs and progress
    still start empty). Replay's ~20 batches run twice: with the default
    passes (several batches per Spark action) and with one Spark action per batch
    (``max_batches_per_pass: 1``), so that what passes buy is read off the same run; the latter
    after everything else, since every measurement after it ran slower.
    """
    import resource

    sys.path.insert(0, str(ROOT))
    from baselines import plain_batch, structured_streaming

    spark = _session()
    rows = [
        "| tuples | buffers | replay 1 batch s | replay 1 batch, warm file cache s | replay ~20 batches s | batches "
        "| replay ~20 batches, one action each s | fixed cost per batch s | plain batch s | streaming 1 trigger s "
        "| streaming ~20 triggers s | replay / streaming (~20) | replay / streaming (~20, one action each) "
        "| replay / streaming (1) | replay / batch | replay / batch (warm file cache) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: |",
    ]
    measured: list[tuple[Path, dict[str, list[float]], int, int, int]] = []
    for tuples, buffer_tuples in sizes:
        path = archive(tuples, buffer_tuples, files=40)
        timed: dict[str, list[float]] = {}  # each measurement's timed rounds
        read = 0
        buffers = batches = 0
        for attempt in range(repeats + 1):  # round 0 warms up and is not counted
            for name in ("one", "warm", "many"):
                max_buffers = None if name in ("one", "warm") else max(1, -(-buffers // batches_wanted))
                summary, seconds = _timed_run(path, max_buffers, spark, warm_cache=name == "warm")
                if attempt:
                    timed.setdefault(name, []).append(seconds)
                read, buffers = summary.tuples_read, summary.buffers
                if name == "many":
                    batches = summary.batches
                print(
                    f"  replay run ({name}, round {attempt}): {seconds:.1f} s, {summary.batches} batches",
                    flush=True,
                )
            _settle(spark)
            batch = plain_batch(spark, path)
            _settle(spark)
            stream = structured_streaming(spark, path)
            _settle(spark)
            streams = structured_streaming(spark, path, max_files_per_trigger=2)
            if attempt:
                timed.setdefault("batch", []).append(batch.seconds)
                timed.setdefault("stream", []).append(stream.seconds)
                timed.setdefault("streams", []).append(streams.seconds)
            print(
                f"  plain batch {batch.seconds:.1f} s, streaming {stream.seconds:.1f} s (1 trigger), "
                f"{streams.seconds:.1f} s (maxFilesPerTrigger 2)",
                flush=True,
            )
        measured.append((path, timed, read, buffers, batches))
    # The previous design (one Spark action per batch) last: a session that ran it ran every later
    # measurement slower, the baselines' too (docs/performance-record.md), so nothing else follows it.
    for path, timed, _, buffers, _ in measured:
        for attempt in range(repeats + 1):
            summary, seconds = _timed_run(path, max(1, -(-buffers // batches_wanted)), spark, 1)
            if attempt:
                timed.setdefault("single", []).append(seconds)
            print(f"  replay run (single, round {attempt}): {seconds:.1f} s, {summary.batches} batches", flush=True)
    medians = [
        "",
        "Medians of the timed rounds:",
        "",
        "| tuples | replay 1 batch s | replay 1 batch, warm file cache s | replay ~20 batches s | plain batch s "
        "| streaming ~20 triggers s | replay / streaming (~20) | replay / batch | replay / batch (warm file cache) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for _, timed, read, buffers, batches in measured:
        best = {name: min(values) for name, values in timed.items()}
        mid = {name: statistics.median(values) for name, values in timed.items()}
        medians.append(
            f"| {read:,} | {mid['one']:.1f} | {mid['warm']:.1f} | {mid['many']:.1f} | {mid['batch']:.1f} "
            f"| {mid['streams']:.1f} | {mid['streams'] / mid['many']:.2f} | {mid['batch'] / mid['one']:.2f} "
            f"| {mid['batch'] / mid['warm']:.2f} |"
        )
        fixed = (best["many"] - best["one"]) / max(batches - 1, 1)
        line = (
            f"| {read:,} | {buffers:,} | {best['one']:.1f} | {best['warm']:.1f} | {best['many']:.1f} | {batches} "
            f"| {best['single']:.1f} | "
            f"{fixed:.2f} | {best['batch']:.1f} | {best['stream']:.1f} | {best['streams']:.1f} | "
            f"{best['streams'] / best['many']:.2f} | {best['streams'] / best['single']:.2f} | "
            f"{best['stream'] / best['one']:.2f} | "
            f"{best['batch'] / best['one']:.2f} | {best['batch'] / best['warm']:.2f} |"
        )
        print(line, flush=True)
        rows.append(line)
    for line in medians:
        print(line, flush=True)
    rows += medians
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rows.append("")
    rows.append(f"Python driver peak RSS over the whole benchmark: {peak:.0f} MiB")
    return "\n".join(rows)


def bench_floor(sizes: list[tuple[int, int]], repeats: int = 4) -> str:
    """The floor of any replay that must know every buffer's metadata before it can decide lateness.

    Per archive: the plain batch baseline, and the cheapest metadata pass there is (per copy: row
    count, first row, watermark, ingest time, last-chunk flag, event-time bounds; no content hash,
    no checks), best of ``repeats`` after one warm-up each. ``plain / (plain + metadata)`` bounds
    ``replay / batch`` from above: a replay that added nothing else to the plain aggregation
    would still pay for the metadata pass.
    """
    sys.path.insert(0, str(ROOT))
    from baselines import plain_batch
    from pyspark.sql import functions as F

    spark = _session()
    rows = [
        "| input rows | plain batch s | metadata pass s | plain / (plain + metadata) |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for tuples, buffer_tuples in sizes:
        path = archive(tuples, buffer_tuples)
        plain: list[float] = []
        meta: list[float] = []
        read = 0
        for _ in range(repeats + 1):
            baseline = plain_batch(spark, path)
            plain.append(baseline.seconds)
            read = baseline.tuples
            start = time.perf_counter()
            df = spark.read.parquet(str(path)).select(
                "*", F.col("_metadata.file_path").alias("_file"), F.col("_metadata.row_index").alias("_row")
            )
            df.groupBy("_file", "origin_id", "sequence_number", "chunk_number").agg(
                F.count(F.lit(1)),
                F.min("_row"),
                F.max("watermark_ts"),
                F.max("ingest_ts"),
                F.max("last_chunk"),
                F.min("event_time"),
                F.max("event_time"),
            ).collect()
            meta.append(time.perf_counter() - start)
        p, m = min(plain[1:]), min(meta[1:])
        line = f"| {read:,} | {p:.2f} | {m:.2f} | {p / (p + m):.2f} |"
        print(line, flush=True)
        rows.append(line)
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "what",
        nargs="?",
        default="inspect",
        choices=["inspect", "inspect-warm", "run", "cold", "floor", "resume", "fixed", "scale", "soak"],
    )
    parser.add_argument(
        "--sizes",
        nargs="*",
        default=["1000000:1000", "10000000:1000", "10000000:100"],
        help="TUPLES:TUPLES_PER_BUFFER pairs",
    )
    parser.add_argument(
        "--histories", nargs="*", type=int, default=[10, 1000], help="resume: committed batches before the resume"
    )
    parser.add_argument("--repeats", type=int, default=3, help="run: timed rounds after the warm-up round")
    parser.add_argument("--runs", type=int, default=200, help="soak: runs of the small job")
    parser.add_argument(
        "--kept-driver", action="store_true", help="soak: send the runs to a kept driver (replay driver serve)"
    )
    options = parser.parse_args()
    sizes = [(int(a), int(b)) for a, b in (s.split(":") for s in options.sizes)]
    if options.what == "resume":
        sys.path.insert(0, str(ROOT))
        from resume import bench_resume

        table = bench_resume(options.histories, DATA, measure)
    elif options.what in ("fixed", "scale"):
        sys.path.insert(0, str(ROOT))
        from scaling import bench_fixed, bench_scale

        if options.what == "fixed":
            tuples, buffer_tuples = sizes[0]
            table = bench_fixed(archive(tuples, buffer_tuples, files=40), _timed_run, _session(), options.repeats)
        else:
            table = bench_scale(sizes, archive, _run_config, measure)
    elif options.what == "soak":
        sys.path.insert(0, str(ROOT))
        from soak import bench_soak, bench_soak_driver

        small = archive(20_000, 100, files=4)
        if options.kept_driver:
            table = bench_soak_driver(small, _run_config, options.runs)
        else:
            table = bench_soak(small, _run_config, _session(), options.runs)
    elif options.what == "run":
        table = bench_run(sizes, repeats=options.repeats)
    elif options.what == "cold":
        sys.path.insert(0, str(ROOT))
        from cold import bench_cold

        table = bench_cold(sizes, archive, _run_config, measure, options.repeats)
    elif options.what == "floor":
        table = bench_floor(sizes)
    elif options.what == "inspect":
        table = bench_inspect(sizes)
    else:
        table = bench_inspect_warm(sizes)
    RESULTS.mkdir(exist_ok=True)
    name = f"{options.what}-driver" if options.what == "soak" and options.kept_driver else options.what
    (RESULTS / f"{name}.md").write_text(table + "\n")
    print(f"\nwritten to {RESULTS / name}.md")


if __name__ == "__main__":
    main()
