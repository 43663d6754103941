"""Replay's Airflow integration: operators, a checkpoint hook, a deferrable watermark sensor, a UI page.

The public API is listed here once. Importing it loads the Airflow Task SDK and pydantic, never
pyarrow, Spark, pandas or Great Expectations (those load inside ``execute``), so DAG files that
import it stay cheap to parse. The UI page (``replay_airflow.ui``) and the trigger
(``replay_airflow.triggers``) are imported by the API server and the triggerer, not by DAGs.
"""

from __future__ import annotations

from replay_airflow.assets import PUBLISHED_WINDOWS
from replay_airflow.defaults import task_defaults
from replay_airflow.hooks import CheckpointHook, find_checkpoints
from replay_airflow.operators import (
    ReplayPlanOperator,
    ReplayPublishOperator,
    ReplayReportOperator,
    ReplayRunOperator,
    ReplayValidateOperator,
)
from replay_airflow.params import job_params
from replay_airflow.roots import PathOutsideRootError, Roots, configured_roots
from replay_airflow.sensors import WatermarkSensor

__all__ = [
    "PUBLISHED_WINDOWS",
    "CheckpointHook",
    "PathOutsideRootError",
    "ReplayPlanOperator",
    "ReplayPublishOperator",
    "ReplayReportOperator",
    "ReplayRunOperator",
    "ReplayValidateOperator",
    "Roots",
    "WatermarkSensor",
    "configured_roots",
    "find_checkpoints",
    "job_params",
    "task_defaults",
]
