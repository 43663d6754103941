"""Faults in Spark's tasks, for tests: ``replay run`` in a process of its own whose pass writer
(``replay.engine.aggregate``'s ``sink``) misbehaves in its first task attempts, after it has
written and fsynced its files.

    subprocess.run([sys.executable, "-c", FLAKY_WRITER, job, proof, mode, *replay_run_args])

``mode`` ``raise``: every first attempt that wrote a file then fails (Spark retries the task).
``kill-executor``: the first such attempt of the run kills its executor's JVM with SIGKILL (a lost
executor: on a standalone cluster the master starts another, and Spark runs the lost work again).
``hang``: the first such attempt waits (ten minutes), so that a test can interrupt the run there.
``enospc``: every attempt that wrote a file then fails with the ``OSError`` of a full disk on it.
Each failed attempt leaves ``<proof>/<stage>-<partition>.json``, the files it wrote, to show the
fault was injected and to check that none of them stays.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FLAKY_WRITER = """
import errno, json, os, signal, sys, time
from pathlib import Path

import replay.engine.aggregate as aggregate

real = aggregate.sink
job, proof, mode = sys.argv[1:4]
more = sys.argv[4:]


def executor_jvm(pid):
    # The Python worker's parent is PySpark's daemon, whose parent is the executor's JVM.
    while pid > 1:
        if b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise RuntimeError("no executor JVM above this Python worker: kill-executor needs a cluster")


def flaky_sink(*args, **kwargs):
    write = real(*args, **kwargs)

    def flaky(batches):
        from pyspark import TaskContext

        context = TaskContext.get()
        results = list(write(batches))  # the attempt's files are written, and fsynced
        files = [f for batch in results for f in batch.column("file").to_pylist()]
        if (context.attemptNumber() == 0 or mode == "enospc") and files:
            record = Path(proof, f"{context.stageId()}-{context.partitionId()}.json")
            if mode == "raise":
                record.write_text(json.dumps(files))
                raise RuntimeError("injected: this task attempt fails after writing its files")
            if mode == "kill-executor" and not any(Path(proof).iterdir()):
                record.write_text(json.dumps(files))
                os.kill(executor_jvm(os.getpid()), signal.SIGKILL)
            if mode == "enospc":
                record.write_text(json.dumps(files))
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), files[0])
            if mode == "hang" and not any(Path(proof).iterdir()):
                record.write_text(json.dumps(files))
                time.sleep(600)
        yield from results

    return flaky


aggregate.sink = flaky_sink
from replay.cli import main

sys.argv = ["replay", "run", "--config", job, *more]
main()
"""


def flaky_command(job: Path, mode: str, *more: str) -> tuple[list[str], Path]:
    """The command of ``replay run --config job *more`` with ``FLAKY_WRITER`` in ``mode``, and the
    directory (next to the job, made here) where its failed attempts leave their proof."""
    proof = job.parent / f"faults-{mode}"
    proof.mkdir()
    return [sys.executable, "-c", FLAKY_WRITER, str(job), str(proof), mode, *more], proof


def flaky_env() -> dict[str, str]:
    """This environment without a ``REPLAY_FAULT`` or ``REPLAY_DRIVER`` of the caller's."""
    return {k: v for k, v in os.environ.items() if k not in ("REPLAY_FAULT", "REPLAY_DRIVER")}


def proven(proof: Path) -> list[str]:
    """The files the failed attempts wrote, as their proofs in ``proof`` list them."""
    return sorted(f for record in proof.iterdir() for f in json.loads(record.read_text()))


def flaky_run(
    job: Path, mode: str, *more: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``flaky_command`` run to its end in a process of its own (in ``env``, else ``flaky_env``): the
    process, and the files the failed attempts wrote."""
    command, proof = flaky_command(job, mode, *more)
    done = subprocess.run(command, env=env or flaky_env(), capture_output=True, text=True, timeout=600, check=False)
    return done, proven(proof)
