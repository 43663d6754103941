"""The cluster path: a real Spark standalone master and worker on 127.0.0.1, started without Docker by
``./dev.sh cluster`` (the pyspark distribution's ``spark-class ...Master`` / ``...Worker``), a
``replay run --spark-master spark://...`` whose tasks run in the worker's executor, and the backfill
DAG with its ``spark_submit`` engine (``airflow dags test``; spark-submit of ``python -m replay run``
against the Airflow connection ``spark_master``) on the same cluster.

docs/semantics.md#determinism: the tables are the same in cluster and local mode. The cluster run and a local run
(the test session's SparkSession, one batch where the cluster run has two) must give equal digests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from replay.core.config import load_config
from replay.generate import generate_archive
from replay.runner.loop import run
from replay.store.digest import digest
from replay.store.outputs import current_version, latest_run_version, read_manifest, read_validation
from tests import _background
from tests._airflow import SPARK_CONF, make_home
from tests._archives import FEATURED
from tests._faults import flaky_run

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
REPLAY = str(Path(sys.executable).with_name("replay"))
DETERMINISTIC = ("windows", "late", "integrity")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def master_state(ui: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as response:
        state: dict[str, Any] = json.load(response)
    return state


@contextlib.contextmanager
def standalone_cluster(work: Path) -> Iterator[tuple[str, int, subprocess.Popen[bytes]]]:
    """``./dev.sh cluster`` on free ports: (master URL, web UI port, the process). Stopped on exit."""
    port, ui, worker_ui = free_port(), free_port(), free_port()
    env = dict(
        os.environ,
        SPARK_MASTER_PORT=str(port),
        SPARK_MASTER_WEBUI_PORT=str(ui),
        SPARK_WORKER_WEBUI_PORT=str(worker_ui),
        # Three: not the 2 Spark reports before an executor registers, so that a pass's shuffle shows
        # it counted the worker's cores (``replay.engine.spark.follow_cores``).
        SPARK_WORKER_CORES="3",
        SPARK_WORKER_MEMORY="2g",
        SPARK_WORKER_DIR=str(work / "worker"),
    )
    log = (work / "cluster.log").open("wb")
    process = subprocess.Popen(
        [str(ROOT / "dev.sh"), "cluster"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        yield f"spark://127.0.0.1:{port}", ui, process
    finally:
        # dev.sh stops the master and the worker on SIGTERM; whatever is left of the group is killed.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            log.close()


def wait_for_worker(ui: int, process: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"./dev.sh cluster exited with {process.returncode}:\n{log.read_text()}"
        with contextlib.suppress(OSError, ValueError):
            if master_state(ui)["aliveworkers"] >= 1:
                return
        time.sleep(0.5)
    raise AssertionError(f"no worker registered with the master in {timeout:.0f} s:\n{log.read_text()}")


def write_job(directory: Path, archive: Path, max_buffers: int, spark_conf: dict[str, str] | None = None) -> Path:
    directory.mkdir(parents=True)
    job = {
        "archive": str(archive),
        "output": str(directory / "out"),
        "checkpoint": str(directory / "ckpt"),
        "windows": [
            {"name": "tumbling", "size": "500ms", "aggregations": [{"fn": "count"}, {"fn": "sum", "column": "value"}]},
            {
                "name": "sliding",
                "kind": "sliding",
                "size": "1s",
                "slide": "250ms",
                "aggregations": [{"fn": "max", "column": "value"}, {"fn": "approx_count_distinct", "column": "key"}],
            },
        ],
        "micro_batch": {"max_buffers": max_buffers},
    }
    if spark_conf:
        job["spark"] = {"conf": spark_conf}
    path = directory / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


@dataclass(frozen=True)
class ClusterRun:
    work: Path
    archive: Path
    job: Path
    returncode: int
    stdout: str
    stderr: str
    apps: list[dict[str, Any]]
    cluster_exit: int | None
    master_stopped: bool
    dag: subprocess.CompletedProcess[str]
    dag_output: Path
    events: Path  # Spark's event log of the ``replay run``
    kept: subprocess.CompletedProcess[str]  # ``replay run --driver`` on a kept driver whose master is the cluster
    kept_job: Path
    kept_driver_log: str
    lost: subprocess.CompletedProcess[str]  # ``replay run`` whose executor was killed in its pass's writer
    lost_job: Path
    killed: list[str]  # the files the task that killed its executor had written
    worker: Path  # the worker's directory: an application's executors, one directory each


@_background.register("cluster")
def replay_on_a_cluster() -> ClusterRun:
    """Start ``./dev.sh cluster``, write the archive and an Airflow home while its JVMs start, replay
    the archive there in two batches with ``replay run``, then with the backfill DAG's spark-submit."""
    work = Path(tempfile.mkdtemp(prefix="replay-cluster-"))
    with standalone_cluster(work) as (master, ui, process):
        airflow = make_home(work)
        archive = airflow.root / "archive"
        generated = generate_archive(archive, dataclasses.replace(FEATURED, buffer_tuples=100, seed=2))
        assert generated.buffers >= 10 and generated.duplicates and generated.late_tuples
        events = work / "events"
        events.mkdir()
        event_log = {
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": str(events),
            "spark.eventLog.compress": "false",
        }
        job = write_job(work / "cluster", archive, max_buffers=7, spark_conf=event_log)
        wait_for_worker(ui, process, work / "cluster.log")
        env = {k: v for k, v in os.environ.items() if not k.startswith("REPLAY_")}
        remote = subprocess.run(
            [REPLAY, "run", "--config", str(job), "--spark-master", master, "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        settings = yaml.safe_load(job.read_text())
        conf = {
            "archive": "archive",
            "output": "dag-out",
            "windows": settings["windows"],
            "micro_batch": settings["micro_batch"],
            "engine": "spark_submit",
            # Not used by the spark_submit engine: the connection's master is.
            "spark_master": "local[1]",
            "spark_conf": SPARK_CONF,
        }
        dag = airflow.dags_test("replay_backfill", conf, check=False, env={"AIRFLOW_CONN_SPARK_MASTER": master})
        kept_job = write_job(work / "kept", archive, max_buffers=7)  # its default local[*]: the driver's master
        kept, kept_log = _on_a_kept_driver(work / "driver-home", master, kept_job, env)
        lost_job = write_job(work / "lost", archive, max_buffers=7)
        lost, killed = flaky_run(lost_job, "kill-executor", "--spark-master", master, "--json", env=env)
        apps = master_state(ui)["completedapps"]
    try:
        master_state(ui)
        master_stopped = False
    except OSError:  # nothing listens on the master's web UI port any more
        master_stopped = True
    return ClusterRun(
        work,
        archive,
        job,
        remote.returncode,
        remote.stdout,
        remote.stderr,
        apps,
        process.returncode,
        master_stopped,
        dag,
        airflow.root / "dag-out",
        events,
        kept,
        kept_job,
        kept_log,
        lost,
        lost_job,
        killed,
        work / "worker",
    )


def _on_a_kept_driver(
    home: Path, master: str, job: Path, env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], str]:
    """``replay driver serve --master <the cluster>``, one ``replay run --driver`` sent to it, then ``stop``."""
    log = home.parent / "driver.log"
    with open(log, "w") as sink:
        serve = subprocess.Popen(
            [REPLAY, "driver", "serve", "--dir", str(home), "--master", master], env=env, stdout=sink, stderr=sink
        )
    try:
        deadline = time.monotonic() + 300
        while not (home / "driver.json").exists() and serve.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        sent = subprocess.run(
            [REPLAY, "run", "--config", str(job), "--driver", str(home), "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        subprocess.run([REPLAY, "driver", "stop", "--dir", str(home)], env=env, capture_output=True, timeout=120)
        serve.wait(120)
    finally:
        if serve.poll() is None:
            serve.kill()
    return sent, log.read_text()


@pytest.mark.background("cluster")
def test_a_replay_on_a_standalone_cluster_equals_a_local_one(tmp_path: Path, spark: Any) -> None:
    done: ClusterRun = _background.result("cluster")
    try:
        assert done.returncode == 0, done.stderr[-4000:]
        summary = json.loads(done.stdout)
        assert summary["batches"] == 2 and summary["windows_emitted"] > 0 and sum(summary["late_tuples"].values()) > 0
        # The CLI's application, then the DAG's spark-submit (named after its DAG run), both with
        # their tasks in the worker's executor.
        # Then the kept driver's, stopped after the run sent to it, and the run that lost an executor.
        names = sorted((a["name"], a["state"]) for a in done.apps)
        assert names[:2] == [("replay", "FINISHED")] * 2, done.apps
        assert len(names) == 4 and names[2][0].startswith("replay replay_backfill manual__"), done.apps
        assert names[2][1] == "FINISHED" and all(a["cores"] > 0 for a in done.apps)
        assert names[3] == ("replay-driver", "FINISHED"), done.apps
        # Each pass shuffled into one partition per core of the worker (3). Here the executor
        # registers before the session asks for the cores, so this holds without follow_cores too;
        # where executors come up later (containers) only follow_cores makes it hold
        # (tests/engine/test_spark.py has its rule).
        plans = [
            event["physicalPlanDescription"]
            for log in done.events.rglob("events_*")  # Spark 4 rolls its event log: a directory of files
            for event in map(json.loads, log.read_text().splitlines())
            if event["Event"].endswith("SQLExecutionStart") and "MapInArrow" in event["physicalPlanDescription"]
        ]
        partitions = [int(n) for plan in plans for n in re.findall(r", (\d+)\), ENSURE_REQUIREMENTS", plan)]
        assert plans and partitions and set(partitions) == {3}, partitions
        # SIGTERM: ./dev.sh cluster stopped its master and worker, then exited with 128 + 15.
        assert done.cluster_exit == 143 and done.master_stopped

        # The same archive in one batch, in this session's local SparkSession.
        local = load_config(write_job(tmp_path / "local", done.archive, max_buffers=100))
        assert run(local, spark=spark).batches == 1
        on_cluster = load_config(done.job)
        assert on_cluster.output is not None and local.output is not None
        on_cluster_digests, local_digests = digest(on_cluster.output), digest(local.output)
        assert {t: on_cluster_digests[t] for t in DETERMINISTIC} == {t: local_digests[t] for t in DETERMINISTIC}

        # The backfill DAG with engine spark_submit: the same tables, validated and published.
        assert done.dag.returncode == 0, (done.dag.stdout + done.dag.stderr)[-6000:]
        run_version = latest_run_version(done.dag_output)
        assert run_version is not None
        assert (read_validation(done.dag_output, run_version) or {}).get("success") is True
        dag_digests = digest(done.dag_output, run_version)
        assert {t: dag_digests[t] for t in DETERMINISTIC} == {t: local_digests[t] for t in DETERMINISTIC}
        published = current_version(done.dag_output)
        assert published is not None and read_manifest(done.dag_output, published).source == run_version
        assert digest(done.dag_output)["windows"] == local_digests["windows"]

        # A run sent to a kept driver whose master is the cluster: its executors, the same tables.
        assert done.kept.returncode == 0, (done.kept.stderr + done.kept_driver_log)[-6000:]
        assert json.loads(done.kept.stdout)["batches"] == 2
        kept = load_config(done.kept_job)
        assert kept.output is not None
        kept_digests = digest(kept.output)
        assert {t: kept_digests[t] for t in DETERMINISTIC} == {t: local_digests[t] for t in DETERMINISTIC}
        assert "(master spark://127.0.0.1:" in done.kept_driver_log and "driver stopped" in done.kept_driver_log

        # A run whose executor's JVM was killed (SIGKILL) in the pass's writer, after the task had
        # written its files: the master started another executor, Spark ran the lost work again,
        # none of the killed attempt's files stayed, and the tables are the same.
        assert done.lost.returncode == 0, done.lost.stderr[-6000:]
        assert done.killed, "no executor was killed: the fault was not injected"
        assert not [f for f in done.killed if Path(f).exists()]
        assert json.loads(done.lost.stdout)["batches"] == 2
        lost = load_config(done.lost_job)
        assert lost.output is not None
        lost_digests = digest(lost.output)
        assert {t: lost_digests[t] for t in DETERMINISTIC} == {t: local_digests[t] for t in DETERMINISTIC}
        executors = {app.name: [d.name for d in app.iterdir() if d.name.isdigit()] for app in done.worker.glob("app-*")}
        assert sorted(len(e) for e in executors.values()) == [1, 1, 1, 2], executors  # one was started again
    finally:
        shutil.rmtree(done.work, ignore_errors=True)
