"""Operators run directly (their ``execute``), on a copy of the session's validated output."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
from airflow.sdk.execution_time.context import OutletEventAccessors

from replay.outputs import current_version
from replay_airflow import PUBLISHED_WINDOWS, ReplayPublishOperator, ReplayValidateOperator

pytestmark = pytest.mark.spark  # through the session's validated output


@pytest.fixture
def output(validated_run: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config, _ = validated_run
    out = tmp_path / "outputs" / "daily"
    shutil.copytree(config.output, out)
    monkeypatch.setenv("AIRFLOW__REPLAY__ROOT", str(tmp_path / "outputs"))
    return out


def test_publish_records_the_publication_on_its_assets_and_skips_when_nothing_changed(output: Path) -> None:
    publish = ReplayPublishOperator(
        task_id="publish", output_dir="daily", skip_unchanged=True, outlets=[PUBLISHED_WINDOWS]
    )
    events = OutletEventAccessors()
    result = publish.execute({"outlet_events": events})
    assert result["changed"] and result["source"] == 1 and current_version(output) == result["version"] == 2
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
