"""Operators run directly (their ``execute``), on a copy of the session's validated output."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
from airflow.sdk.execution_time.context import OutletEventAccessors

from replay.core.errors import DataError
from replay.store.outputs import current_version
from replay_airflow import PUBLISHED_WINDOWS, ReplayPublishOperator, ReplayValidateOperator

pytestmark = pytest.mark.spark  # through the session's validated output


@pytest.fixture
def output(validated_run: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config, _ = validated_run
    out = tmp_path / "outputs" / "daily"
    shutil.copytree(config.output, out)
    monkeypatch.setenv("AIRFLOW__REPLAY__ROOT", str(tmp_path / "outputs"))
    return out


def test_publish_records_the_publication_on_its_assets_and_skips_when_nothing_changed(
    output: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    publish = ReplayPublishOperator(
        task_id="publish", output_dir="daily", skip_unchanged=True, outlets=[PUBLISHED_WINDOWS]
    )
    events = OutletEventAccessors()
    result = publish.execute({"outlet_events": events})
    assert result["changed"] and result["source"] == 1 and current_version(output) == result["version"] == 2
    said = f"published version 1 of {output} as version 2 (previous: none); corrections: "
    logged = capfd.readouterr()
    assert said in logged.out + logged.err
    assert events[PUBLISHED_WINDOWS].extra == {"output": str(output), "version": 2, "source": 1}

    again = OutletEventAccessors()
    with pytest.raises(AirflowSkipException, match="already the current publication"):
        publish.execute({"outlet_events": again})
    assert again[PUBLISHED_WINDOWS].extra == {}  # no event worth recording


def test_validate_skips_a_version_with_a_passing_verdict_and_fails_without_retries_on_bad_input(output: Path) -> None:
    validate = ReplayValidateOperator(task_id="validate", output_dir="daily")
    assert validate.execute({}) == {"output": str(output), "version": 1, "success": True, "revalidated": False}
    outside = ReplayValidateOperator(task_id="validate", output_dir="../elsewhere")
    with pytest.raises(AirflowFailException, match=r"airflow\.path_outside_root"):
        outside.execute({})
    empty = ReplayValidateOperator(task_id="validate", output_dir="nothing-here", current=True)
    with pytest.raises(AirflowFailException, match="no publication to validate"):
        empty.execute({})


def test_operators_record_the_dag_runs_that_changed_the_output_for_the_replays_page(output: Path) -> None:
    from replay_airflow.records import read_record, record_path

    def context(task_id: str) -> dict[str, Any]:
        return {
            "dag_run": SimpleNamespace(dag_id="replay_backfill", run_id="manual__2026-01-01", run_type="manual"),
            "ti": SimpleNamespace(task_id=task_id, try_number=1),
            "outlet_events": OutletEventAccessors(),
        }

    from replay_airflow.records import record_task

    root = str(output.parent)
    # Outside a DAG run (no dag_run in the context: an operator executed directly), nothing is recorded.
    record_task({}, str(output), "validated", version=1)
    assert read_record(root, str(output)) is None
    # One suite is enough to write a verdict (the whole validation is tested elsewhere).
    validate = ReplayValidateOperator(task_id="validate", output_dir="daily", suites=("integrity",))
    validate.execute(context("validate"))
    publish = ReplayPublishOperator(task_id="publish", output_dir="daily", skip_unchanged=True)
    publish.execute(context("publish"))
    # What changes nothing records nothing: a passing verdict kept, the same publication.
    ReplayValidateOperator(task_id="validate", output_dir="daily").execute(context("validate"))
    with pytest.raises(AirflowSkipException):
        publish.execute(context("publish"))
    record = read_record(root, str(output))
    assert record is not None and record["output"] == str(output)
    path = record_path(root, str(output))
    assert path is not None and path.parent == output.parent / ".replay-airflow"
    assert [
        (r["dag_id"], r["run_id"], r["run_type"], r["task_id"], r["action"], r["version"]) for r in record["runs"]
    ] == [
        ("replay_backfill", "manual__2026-01-01", "manual", "validate", "validated", 1),
        ("replay_backfill", "manual__2026-01-01", "manual", "publish", "published", 2),
    ]
    assert record["runs"][0]["success"] is True and record["runs"][1]["source"] == 1


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        (lambda: DataError("bad input", todo="fix it"), AirflowFailException),  # no retry
        (lambda: OSError("disk full"), OSError),  # retried, as it was
    ],
)
def test_a_failed_task_names_the_spark_log_its_process_wrote(
    error: Any, raised: type[BaseException], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """The task log has Spark's warnings and errors a line each; a failed task names the file that
    has them whole, when Spark wrote one, and fails as it did."""
    import logging

    from replay.engine import spark_log
    from replay_airflow.operators import task_errors

    monkeypatch.setenv("REPLAY_LOG_DIR", str(tmp_path))
    spark_log.spark_log.cache_clear()
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(raised), task_errors():
            raise error()
        assert "stack traces" not in caplog.text  # no driver JVM given a log: nothing to name
        spark_log.spark_log()  # given to a driver JVM, which has written nothing yet
        with caplog.at_level(logging.WARNING), pytest.raises(raised), task_errors():
            raise error()
        assert "stack traces" not in caplog.text  # Spark wrote nothing: nothing to name
        spark_log.spark_log().write_text("26/11/29 05:23:29 ERROR Executor: Exception in task 1.0\n")
        with caplog.at_level(logging.WARNING), pytest.raises(raised), task_errors():
            raise error()
        assert f"with their stack traces: {spark_log.spark_log()}" in caplog.text
    finally:
        spark_log.spark_log.cache_clear()
