"""The trigger form comes from the job configuration's JSON schema; Airflow and pydantic agree on what is valid."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from airflow.sdk.definitions.param import ParamsDict
from airflow.sdk.exceptions import ParamValidationError

from replay.core.config import JobConfig, parse_config
from replay.core.errors import ConfigError
from replay_airflow.params import FORM_FIELDS, job_params, param_schemas, resolve_job
from replay_airflow.roots import PathOutsideRootError, Roots

REPO = Path(__file__).resolve().parents[2]
WINDOW = {"name": "w", "size": "60s", "aggregations": [{"fn": "count"}]}


def _params(**values: Any) -> ParamsDict:
    params = ParamsDict(job_params(archive="a", output="o", windows=[WINDOW]))
    for name, value in values.items():
        params[name] = value  # assignment validates, as Airflow does for a trigger's conf
    return params


def test_every_setting_of_the_job_model_is_a_form_field_and_no_reference_is_left() -> None:
    schemas = param_schemas()
    model_fields = set(JobConfig.model_fields) - {"spark"}
    assert set(schemas) == model_fields | {"spark_master", "spark_conf", "start", "end", "engine"}
    assert list(schemas)[: len(FORM_FIELDS)] == list(FORM_FIELDS)
    assert "$ref" not in json.dumps(schemas)
    params = job_params(archive="a", output="o")
    assert params["windows"].schema["items"]["properties"]["kind"]["enum"] == ["tumbling", "sliding"]
    assert params["gap_policy"].schema["section"] == "Advanced" and "section" not in params["archive"].schema


def test_the_demo_job_is_valid_for_airflow_and_for_pydantic() -> None:
    demo = yaml.safe_load((REPO / "examples" / "demo.yaml").read_text())
    spark = demo.pop("spark")
    params = _params(**demo, spark_master=spark["master"])
    roots = Roots(archive="/data", output="/data", checkpoint="/data")
    job = resolve_job(params.dump(), roots)
    assert job.config.windows == parse_config(demo | {"archive": "x"}).windows
    assert job.config.archive == "/data/data/demo/archive" and job.config.spark.master == "local[*]"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("windows", [{**WINDOW, "size": "1 minute"}]),
        ("windows", [{**WINDOW, "kind": "session"}]),
        ("windows", [{**WINDOW, "colour": "red"}]),
        ("windows", [{"name": "w", "size": "60s", "aggregations": [{"fn": "median", "column": "v"}]}]),
        ("lateness", "eventually"),
        ("micro_batch", {"max_buffers": 0}),
        ("expected_origins", [0]),
        ("start", "yesterday"),
        ("spark_master", ""),
        ("engine", "yarn"),
    ],
)
def test_airflow_refuses_a_trigger_the_model_would_refuse(field: str, value: Any) -> None:
    with pytest.raises(ParamValidationError):
        _params(**{field: value})
    data = {"archive": "a", "windows": [WINDOW], field: value}
    if field in ("start", "spark_master", "engine"):
        return  # not job settings: the plan task checks them (below)
    with pytest.raises(ConfigError):
        parse_config(data)


def test_the_run_s_data_interval_is_the_range_and_a_different_range_in_the_params_is_refused() -> None:
    roots = Roots(archive="/r", output="/r", checkpoint="/r")
    interval = (datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC))
    params = _params().dump()
    job = resolve_job(params, roots, data_interval=interval)
    assert (job.start, job.end, job.range_source) == (1_767_225_600_000_000, 1_767_312_000_000_000, "data interval")
    assert job.config.checkpoint == "/r/_checkpoints/o/range_2026-01-01T000000.000Z_2026-01-02T000000.000Z"
    with pytest.raises(ConfigError, match="differs from the run's data interval"):
        resolve_job({**params, "start": "2025-12-31T00:00:00Z"}, roots, data_interval=interval)
    same = resolve_job({**params, "start": "2026-01-01T00:00:00Z"}, roots, data_interval=interval)
    assert same.start == job.start


def test_the_plan_refuses_bad_ranges_paths_and_settings_naming_them() -> None:
    roots = Roots(archive="/r/a", output="/r/o", checkpoint="/r/c")
    params = _params().dump()
    assert resolve_job(params, roots).config.checkpoint == "/r/c/_checkpoints/o/full"
    with pytest.raises(ConfigError, match="range is empty"):
        resolve_job({**params, "start": "2026-01-02T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, roots)
    with pytest.raises(ConfigError, match="no UTC offset"):
        resolve_job({**params, "start": "2026-01-02T00:00:00"}, roots)
    with pytest.raises(PathOutsideRootError, match="param 'checkpoint'"):
        resolve_job({**params, "checkpoint": "/r/o/ckpt"}, roots)
    # Every wrong path at once, not one per trigger.
    with pytest.raises(PathOutsideRootError) as several:
        resolve_job({**params, "archive": "../elsewhere", "checkpoint": "/r/o/ckpt"}, roots)
    text = str(several.value)
    assert "2 path params are wrong" in text and "param 'archive'" in text and "param 'checkpoint'" in text
    assert several.value.where.field == "archive, checkpoint" and text.count("pass a path under") == 2
    with pytest.raises(ConfigError) as empty:  # an output that is wrong has no default checkpoint beside it
        resolve_job({**params, "archive": "", "output": "/../../../etc"}, roots)
    assert empty.value.code == "airflow.path_missing" and "param 'output' = '/../../../etc'" in str(empty.value)
    assert empty.value.where.field == "archive, output"
    assert resolve_job(params, roots).engine == "in_task"
    submitted = resolve_job({**params, "engine": "spark_submit"}, roots)
    assert submitted.engine == "spark_submit" and type(submitted).from_xcom(submitted.to_xcom()) == submitted
    with pytest.raises(ConfigError, match="param 'engine' = 'yarn'"):
        resolve_job({**params, "engine": "yarn"}, roots)
    with pytest.raises(ConfigError, match=r"windows\[w\]"):
        resolve_job({**params, "windows": [{**WINDOW, "size": "0s"}]}, roots)
    with pytest.raises(ConfigError, match="unknown settings"):
        resolve_job({**params, "colour": "red"}, roots)


def test_a_spark_master_spark_would_refuse_is_refused_by_the_plan() -> None:
    """Before, ``local[abc]`` passed the plan and failed the replay task with Spark's own trace."""
    roots = Roots(archive="/r", output="/r", checkpoint="/r")
    params = {**_params().dump(), "spark_master": "local[abc]"}
    with pytest.raises(ConfigError, match="not a Spark master URL") as raised:
        resolve_job(params, roots)
    assert raised.value.where.field == "spark.master"
