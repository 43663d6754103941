"""The DAGs end to end: ``airflow dags test`` against a throwaway metadata database, local Spark, real files.

Each DAG run is a real Airflow run in a subprocess (tasks in-process, the sensor's trigger inline); the
expected results come from the library itself (``replay.run`` on the same configuration) in this process.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from replay import GenerateOptions, digest, generate_archive, parse_config, run
from replay.core.timeutil import format_ts
from replay.store.outputs import current_version, latest_run_version, read_manifest, read_validation
from tests._airflow import AIRFLOW, SPARK_CONF, AirflowHome, make_home

pytestmark = [pytest.mark.slow, pytest.mark.spark]

WINDOWS = [
    {"name": "per_second", "size": "1s", "aggregations": [{"fn": "count"}, {"fn": "sum", "column": "value"}]},
    {
        "name": "sliding",
        "kind": "sliding",
        "size": "2s",
        "slide": "500ms",
        "aggregations": [{"fn": "max", "column": "value"}],
    },
]
DETERMINISTIC = ("windows", "late", "integrity")
BACKFILL_ARCHIVE = GenerateOptions(
    origins=2, tuples=1_600, buffer_tuples=40, keys=4, seed=3, duplicates=1, files=2, late_fraction=0.02
)
JOB = {"windows": WINDOWS, "micro_batch": {"max_buffers": 12}, "spark_conf": SPARK_CONF}


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> AirflowHome:
    return make_home(tmp_path_factory.mktemp("airflow-e2e"))


def _reference(spark: Any, archive: Path, out: Path, **settings: Any) -> Path:
    """``replay run`` of the same job into ``out``: what the DAG must have published."""
    config = parse_config(
        {
            "archive": str(archive),
            "output": str(out),
            "checkpoint": str(out.parent / f"{out.name}-ckpt"),
            "windows": WINDOWS,
            "micro_batch": JOB["micro_batch"],  # the progress table has one row set per batch
            **settings,
        }
    )
    run(config, spark=spark)
    return out


def _contents(root: Path, *, skip: tuple[str, ...] = ()) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not str(p.relative_to(root)).startswith(skip)
    }


def test_the_backfill_dag_publishes_what_replay_run_computes_and_a_second_trigger_changes_nothing(
    airflow: AirflowHome, spark: Any, tmp_path: Path
) -> None:
    archive = airflow.root / "archives" / "bf"
    generate_archive(archive, BACKFILL_ARCHIVE)
    conf = {"archive": "archives/bf", "output": "outputs/bf", **JOB}
    with airflow.dags_test_meanwhile("replay_backfill", conf):
        reference = _reference(spark, archive, tmp_path / "reference")

    out = airflow.root / "outputs" / "bf"
    run_version = latest_run_version(out)
    assert run_version is not None and digest(out, run_version) == digest(reference)
    assert (read_validation(out, run_version) or {}).get("success") is True
    published = current_version(out)
    assert published is not None and read_manifest(out, published).kind == "publication"
    assert digest(out)["windows"] == digest(reference)["windows"]
    assert (out / "_report" / "index.html").stat().st_size > 10_000
    # The plan put the checkpoint under the checkpoint root (here the common root), one per output and range.
    assert (airflow.root / "_checkpoints" / "outputs" / "bf" / "full" / "checkpoint.json").exists()

    before = _contents(airflow.root, skip=("outputs/bf/_report",))
    airflow.dags_test("replay_backfill", conf)
    assert _contents(airflow.root, skip=("outputs/bf/_report",)) == before  # the report alone is re-rendered
    assert current_version(out) == published


def test_a_run_of_airflow_backfill_create_replays_its_data_interval(airflow: AirflowHome) -> None:
    archive = airflow.root / "archives" / "bf"
    if not archive.exists():  # written by the test above, when they run together
        generate_archive(archive, BACKFILL_ARCHIVE)
    airflow.run("dags", "reserialize")
    airflow.run(
        "backfill", "create", "--dag-id", "replay_backfill", "--from-date", "2026-01-01", "--to-date", "2026-01-01"
    )
    runs = airflow.run("dags", "list-runs", "replay_backfill", "--output", "json").stdout
    run_id = re.findall(r"backfill__[0-9T:+-]+", runs)[0]
    # The backfill's run executes its plan task (no scheduler here): the data interval is the range.
    result = airflow.run("tasks", "test", "replay_backfill", "plan", run_id)
    assert (
        "backfill run: archive " in result.stdout
        and "range [2026-01-01T00:00:00.000Z, 2026-01-02T00:00:00.000Z) from data interval" in result.stdout
    ), result.stdout[-4000:]


def test_the_scheduled_dag_run_twice_with_new_files_in_between_equals_one_full_run(
    airflow: AirflowHome, spark: Any, tmp_path: Path
) -> None:
    source = tmp_path / "source"
    generate_archive(
        source,
        GenerateOptions(
            origins=3, tuples=1_500, buffer_tuples=60, keys=4, seed=7, duplicates=1, files=3, ingest_ts=False
        ),
    )
    files = sorted(source.glob("*.parquet"))
    live = airflow.root / "live" / "archive"
    live.mkdir(parents=True)
    shutil.copy(files[0], live)
    conf = {"archive": "live/archive", "output": "live/out", "checkpoint": "live/ckpt", **JOB}
    airflow.dags_test("replay_scheduled", conf)
    out = airflow.root / "live" / "out"
    first = current_version(out)
    assert first is not None

    for f in files[1:]:
        shutil.copy(f, live)
    with airflow.dags_test_meanwhile("replay_scheduled", conf):
        full = digest(_reference(spark, source, tmp_path / "full", micro_batch={"max_buffers": 1_000}))  # one batch
    assert current_version(out) != first
    # The tables that do not depend on where batches were cut (the progress table has rows per batch).
    incremental = digest(out, latest_run_version(out))
    assert {t: incremental[t] for t in DETERMINISTIC} == {t: full[t] for t in DETERMINISTIC}
    assert digest(out)["windows"] == full["windows"]

    # The quality report DAG validates the current publication and writes the report.
    airflow.dags_test("replay_quality_report", {"output": "live/out", "checkpoint": "live/ckpt"})
    published = current_version(out)
    assert published is not None and (read_validation(out, published) or {}).get("success") is True
    html = (out / "_report" / "index.html").read_text()
    assert f"version {published}" in html


def test_the_watermark_sensor_defers_and_fires_once_the_watermark_passes(
    airflow: AirflowHome, spark: Any, tmp_path: Path
) -> None:
    from replay_airflow.hooks import CheckpointHook
    from replay_airflow.params import resolve_job
    from replay_airflow.roots import Roots

    source = tmp_path / "source"
    generate_archive(source, GenerateOptions(origins=2, tuples=800, buffer_tuples=20, keys=3, seed=9, files=2))
    files = sorted(source.glob("*.parquet"))
    archive = airflow.root / "gate" / "archive"
    archive.mkdir(parents=True)
    shutil.copy(files[0], archive)
    # The job as the DAGs resolve it from params, replayed here with the test's Spark session.
    roots = Roots(archive=str(airflow.root), output=str(airflow.root), checkpoint=str(airflow.root))
    params = {"archive": "gate/archive", "output": "gate/out", "checkpoint": "gate/ckpt", **JOB}
    job = resolve_job(params, roots).config
    first = run(job, spark=spark).watermarks["default"][0]
    hook = CheckpointHook(checkpoint=str(airflow.root / "gate" / "ckpt"))
    assert hook.global_watermark() == first
    target = first + 1  # not reached until more data arrives

    log = tmp_path / "gate.log"
    with open(log, "w") as sink:
        gate = subprocess.Popen(
            [
                str(AIRFLOW),
                "dags",
                "test",
                "replay_watermark_gate",
                "--conf",
                f'{{"checkpoint": "gate/ckpt", "target": "{format_ts(target)}", "poll_interval": 0.5}}',
            ],
            env=airflow.env(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=airflow.home,
        )
        try:
            deadline = time.monotonic() + 180
            while "waiting for" not in log.read_text() and time.monotonic() < deadline:
                assert gate.poll() is None, log.read_text()[-4000:]
                time.sleep(0.5)
            assert "running trigger in line" in log.read_text()  # deferred, the trigger polls the checkpoint
            time.sleep(2)
            assert gate.poll() is None  # still waiting: G_k has not moved

            shutil.copy(files[1], archive)
            final = run(job, spark=spark).watermarks["default"][0]
            assert final >= target
            assert gate.wait(timeout=180) == 0, log.read_text()[-4000:]
        finally:
            if gate.poll() is None:
                gate.kill()
    text = log.read_text()
    assert "reached the target" in text and "state=success" in text


def test_a_path_outside_the_roots_is_refused_before_spark_starts(airflow: AirflowHome, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    result = airflow.dags_test(
        "replay_backfill", {"archive": str(outside), "output": "outputs/refused", **JOB}, check=False
    )
    assert result.returncode != 0
    text = result.stdout + result.stderr
    assert "airflow.path_outside_root" in text and "outside the archive root" in text
    assert "new_state=up_for_retry" not in text  # bad input: never retried, whatever the task's retries
    assert "SparkContext" not in text and "Running Spark version" not in text
    assert not (airflow.root / "outputs" / "refused").exists()


def test_an_operational_failure_is_retried(airflow: AirflowHome) -> None:
    """The DAGs' tasks retry what is not the input's fault (``replay_airflow.defaults``): here the
    kept driver is not up (``driver.unreachable``), as when a task starts before the driver's
    service; with one retry the replay task is tried twice, then fails."""
    generate_archive(airflow.root / "retried", GenerateOptions(origins=2, tuples=200, buffer_tuples=40, files=1))
    conf = {"archive": "retried", "output": "outputs/retried", "engine": "kept_driver", **JOB}
    env = {"REPLAY_DRIVER": str(airflow.root / "no-driver"), "REPLAY_TASK_RETRIES": "1", "REPLAY_TASK_RETRY_DELAY": "1"}
    result = airflow.dags_test("replay_backfill", conf, check=False, env=env)
    text = result.stdout + result.stderr
    assert result.returncode != 0 and text.count("[driver.unreachable]") >= 2
    states = [line.split("new_state=")[1].split()[0] for line in text.splitlines() if "new_state=" in line]
    assert states == ["success", "up_for_retry", "failed"], states  # plan; replay, then replay again
