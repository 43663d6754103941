"""Cold runs: each command in its own process, as a user runs it (the JVM's start-up included).

``replay run`` on a fresh checkpoint, in one batch against the plain Spark batch and in about 20
micro-batches against Structured Streaming with ``maxFilesPerTrigger`` 2
(``benchmarks/baselines.py --only batch|streaming``), same archive, same aggregation, shuffle
partitions 2. Replay runs with the JVM class-data archive ``replay jvm-archive`` made (as it starts
once the archive exists) and without it (``REPLAY_JVM_ARCHIVE=off``), with its JIT thresholds
(``replay.engine.spark.compiler_options``) either way; the baselines run as users run them, and with
Replay's JVM options, the same archive and thresholds (``--java-options``), for the engines'
comparison on an equal start. The commands run round-robin: one untimed round, then ``repeats`` rounds; medians.

"kept driver": the same ``replay run`` command, in its own process, sent to a kept driver
(``replay driver serve``, started before the rounds and left idle while the other commands run):
what a scheduled replay pays once its driver is up. The untimed round is that driver's first run.

Run as ``./dev.sh bench cold [--sizes 10000000:1000] [--repeats 3]``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

__all__ = ["bench_cold"]

ROOT = Path(__file__).resolve().parent


def bench_cold(
    sizes: list[tuple[int, int]],
    archive: Callable[..., Path],
    run_settings: Callable[..., Any],
    measure: Callable[[list[str]], tuple[float, int, int, str]],
    repeats: int = 3,
) -> str:
    """``run_settings(archive, work, max_buffers)``: the job of ``bench run`` (``run._run_config``)."""
    from replay.engine.jvm_archive import archive_path, java_options, usable
    from replay.engine.spark import compiler_options

    jsa = archive_path()
    if jsa is None:
        raise SystemExit("REPLAY_JVM_ARCHIVE is 'off': unset it to compare runs with and without the JVM archive")
    python = sys.executable
    replay = str(Path(python).with_name("replay"))
    if not usable(jsa):
        print(f"making the JVM archive ({jsa})", flush=True)
        subprocess.run([replay, "jvm-archive"], check=True)
    replays = f"{compiler_options()} {java_options()}"  # Replay's JVM options, for an equal start
    rows = [
        "| tuples | command | JVM archive | wall s (median) | rounds s | against | ratio (throughput) |",
        "| ---: | --- | --- | ---: | --- | --- | ---: |",
    ]
    for tuples, buffer_tuples in sizes:
        path = archive(tuples, buffer_tuples, files=40)
        work = Path(tempfile.mkdtemp(prefix="replay-cold-"))
        home = work / "driver"
        try:
            config = run_settings(path, work, None).model_dump(mode="json")
            config["spark"] = {"conf": {"spark.sql.shuffle.partitions": "2"}}
            job = work / "job.yaml"
            job.write_text(yaml.safe_dump(config))
            buffers = _buffers(path)
            per_batch = str(max(1, -(-buffers // 20)))
            baseline = [python, str(ROOT / "baselines.py"), str(path), "--runs", "1"]
            off = ["env", "REPLAY_JVM_ARCHIVE=off"]
            run_one = [replay, "run", "-c", str(job)]
            run_many = [*run_one, "--max-buffers", per_batch]
            plain = [*baseline, "--only", "batch"]
            stream = [*baseline, "--only", "streaming", "--max-files-per-trigger", "2"]
            given = ["--java-options", replays]
            serve = _serve(replay, home, work / "driver.log")
            kept = ["--driver", str(home)]
            # name: (the command, whether its JVM starts from the archive)
            commands: dict[str, tuple[list[str], bool]] = {
                "replay 1 batch": (run_one, True),
                "replay 1 batch, kept driver": ([*run_one, *kept], True),
                "replay 1 batch, no archive": ([*off, *run_one], False),
                "plain batch": (plain, False),
                "plain batch, Replay's JVM options": ([*plain, *given], True),
                "replay ~20 batches": (run_many, True),
                "replay ~20 batches, kept driver": ([*run_many, *kept], True),
                "replay ~20 batches, no archive": ([*off, *run_many], False),
                "streaming ~20 triggers": (stream, False),
                "streaming ~20 triggers, Replay's JVM options": ([*stream, *given], True),
            }
            timed: dict[str, list[float]] = {}
            for attempt in range(repeats + 1):  # round 0 warms the page cache and is not counted
                for name, (args, _) in commands.items():
                    shutil.rmtree(work / "out", ignore_errors=True)
                    shutil.rmtree(work / "ckpt", ignore_errors=True)
                    seconds, _, _, _ = measure(args)
                    print(f"  {name} (round {attempt}): {seconds:.1f} s", flush=True)
                    if attempt:
                        timed.setdefault(name, []).append(seconds)
            status = subprocess.run([replay, "driver", "status", "--dir", str(home), "--json"], capture_output=True)
            print(f"  the kept driver after its runs: {status.stdout.decode().strip()}", flush=True)
        finally:
            subprocess.run([replay, "driver", "stop", "--dir", str(home)], capture_output=True)
            with contextlib.suppress(NameError, subprocess.TimeoutExpired):
                serve.wait(120)
            shutil.rmtree(work, ignore_errors=True)
        mid = {name: statistics.median(values) for name, values in timed.items()}
        streaming_given = "streaming ~20 triggers, Replay's JVM options"
        pairs = {
            "replay 1 batch": ("plain batch", "plain batch, Replay's JVM options"),
            "replay 1 batch, no archive": ("plain batch",),
            "replay 1 batch, kept driver": ("plain batch", "plain batch, Replay's JVM options"),
            "replay ~20 batches, kept driver": ("streaming ~20 triggers", streaming_given),
            "replay ~20 batches": ("streaming ~20 triggers", streaming_given),
            "replay ~20 batches, no archive": ("streaming ~20 triggers",),
        }
        for name, values in timed.items():
            against = pairs.get(name, ())
            uses = "yes" if commands[name][1] else "no"
            rounds = ", ".join(f"{v:.1f}" for v in values)
            if not against:
                rows.append(f"| {tuples:,} | {name} | {uses} | {mid[name]:.1f} | {rounds} | | |")
            for other in against:
                rows.append(
                    f"| {tuples:,} | {name} | {uses} | {mid[name]:.1f} | {rounds} | {other} "
                    f"| {mid[other] / mid[name]:.2f} |"
                )
    return "\n".join(rows)


def _serve(replay: str, home: Path, log: Path) -> subprocess.Popen[bytes]:
    """``replay driver serve --dir home``, once it has published its address."""
    command = [replay, "driver", "serve", "--dir", str(home)]
    serve = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
    while not (home / "driver.json").exists():
        if serve.poll() is not None:
            raise SystemExit(f"replay driver serve ended with {serve.returncode}: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    return serve


def _buffers(path: Path) -> int:
    """The archive's number of buffer identities, from its metadata columns (pyarrow, no Spark)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    table = ds.dataset(str(path), format="parquet").to_table(columns=["origin_id", "sequence_number", "chunk_number"])
    keys: Any = table.group_by(["origin_id", "sequence_number", "chunk_number"]).aggregate([])
    return int(pc.count(keys.column(0)).as_py()) if len(keys) else 0


if __name__ == "__main__":  # pragma: no cover - run through benchmarks/run.py
    os.execv(sys.executable, [sys.executable, str(ROOT / "run.py"), "cold", *sys.argv[1:]])
