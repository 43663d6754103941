"""Shared fixtures: one local SparkSession for the whole test session, and one validated output."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    from replay.core.config import JobConfig
    from replay.quality.validate import ValidationOutcome

from tests import _background

# As ``replay``'s entry point does: py4j logs every connection it closes at INFO, also from
# finalizers at the interpreter's exit, when a stream a test logged to may be closed already.
logging.getLogger("py4j").setLevel(logging.WARNING)

# Spark's log files (``replay.engine.spark_log``) of the session's driver and of the commands tests
# start, some before any fixture runs (``tests/_background.py``), go to a directory of this test
# run, not the user's; it goes at the session's end.
_SPARK_LOGS = None if os.environ.get("REPLAY_LOG_DIR") else tempfile.mkdtemp(prefix="replay-tests-spark-logs-")
if _SPARK_LOGS is not None:
    os.environ["REPLAY_LOG_DIR"] = _SPARK_LOGS

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``background`` go last: their work runs beside the others (``tests/_background.py``)."""
    items[:] = sorted(items, key=lambda item: item.get_closest_marker("background") is not None)


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return  # nothing runs: starting the work would only make --collect-only wait for it
    for item in session.items:
        marker = item.get_closest_marker("background")
        if marker is not None:
            _background.start(marker.args[0])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _background.finish()
    if _SPARK_LOGS is not None:
        shutil.rmtree(_SPARK_LOGS, ignore_errors=True)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """The one local SparkSession of a test run (2 cores, small shuffles, UTC)."""
    from pyspark.sql import SparkSession

    from replay.engine.spark import driver_java_options, python_worker_conf

    # Python workers (the scan and the batch pass's writer) run this interpreter, as replay.engine.spark sets it.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    for key, value in python_worker_conf().items():  # their daemon, as replay.engine.spark sets it
        builder = builder.config(key, value)
    session = (
        builder.master("local[2]")
        .appName("replay-tests")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")  # as replay.engine.spark sets it
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "2g")
        .config("spark.driver.extraJavaOptions", driver_java_options())  # the JVM archive, where there is one
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def validated_job(archive: Path, out: Path) -> JobConfig:
    """The job of ``validated_run``: two window aggregations with every kind of column the suites and the
    publication's corrections look at (``count`` in both), cut into two micro-batches."""
    from replay import parse_config

    return parse_config(
        {
            "archive": str(archive),
            "output": str(out / "out"),
            "checkpoint": str(out / "ckpt"),
            "gap_policy": "skip",  # the archive's gap is closed at the end, and reported
            "windows": [
                {
                    "name": "tumbling",
                    "size": "500ms",
                    "aggregations": [
                        {"fn": "count"},
                        {"fn": "sum", "column": "value"},
                        {"fn": "min", "column": "value"},
                        {"fn": "mean", "column": "value"},
                        {"fn": "max", "column": "value"},
                    ],
                },
                {
                    "name": "sliding",
                    "kind": "sliding",
                    "size": "1s",
                    "slide": "250ms",
                    "offset": "100ms",
                    "aggregations": [
                        {"fn": "count"},
                        {"fn": "count", "column": "value"},
                        {"fn": "max", "column": "value"},
                        {"fn": "approx_count_distinct", "column": "key"},
                    ],
                },
            ],
            "micro_batch": {"max_buffers": 26},
            "validation": {"max_late_fraction": 0.5},
        }
    )


@pytest.fixture(scope="session")
def validated_run(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> tuple[JobConfig, ValidationOutcome]:
    """One replayed and validated output (version 1), shared by ``quality/test_validate.py``, ``store/test_publish.py``
    and the plugin's tests in ``airflow/``.

    An origin-mode archive (no ``ingest_ts``) of 51 buffers with a gap, duplicates, late tuples and
    chunked sequences, replayed in two micro-batches, then validated with every suite. Tests must not
    change it: a test that breaks, re-runs or publishes it works on a ``shutil.copytree`` copy.
    """
    from replay import GenerateOptions, generate_archive, run
    from replay.quality.validate import validate

    root = tmp_path_factory.mktemp("validated")
    archive = root / "archive"
    options = GenerateOptions(
        origins=3,
        tuples=1_500,
        buffer_tuples=40,
        keys=6,
        seed=3,
        gaps=1,
        duplicates=2,
        late_fraction=0.05,
        multi_chunk_fraction=0.3,
        files=3,
        ingest_ts=False,
    )
    summary = generate_archive(archive, options)
    assert summary.gaps and summary.duplicates and summary.late_tuples
    config = validated_job(archive, root)
    assert run(config, spark=spark).batches == 2
    assert config.output is not None
    return config, validate(config.output, spark=spark)
