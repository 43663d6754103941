"""Every Airflow-version workaround, in one place (STYLE habit 2). Written against Airflow 3.3.

- Triggers: the Task SDK (``airflow.sdk``) has no base class for triggers in 3.3; they run in
  the triggerer, which is part of airflow-core, so ``BaseTrigger``/``TriggerEvent`` come from
  ``airflow.triggers.base``. Import this module only where a trigger is built or run.
- Configuration: task code reads ``[replay]`` options through ``airflow.sdk.conf`` (the Task
  SDK's parser); the core parser is not available to workers in Airflow 3.
- The run type: ``dag_run.run_type`` is a ``DagRunType`` enum in the scheduler and a plain
  string in the Task SDK's ``RuntimeTaskInstance`` context; ``run_type`` normalises it.
"""

from __future__ import annotations

from typing import Any

# ``BaseTrigger`` and ``TriggerEvent`` are served by ``__getattr__`` (imported on first use only).
__all__ = ["get_option", "run_type"]


def __getattr__(name: str) -> Any:
    if name in ("BaseTrigger", "TriggerEvent"):
        from airflow.triggers import base

        return getattr(base, name)
    raise AttributeError(name)


def get_option(key: str, fallback: str | None = None) -> str | None:
    """An option of the ``[replay]`` section (``AIRFLOW__REPLAY__<KEY>`` in the environment)."""
    from airflow.sdk import conf

    value = conf.get("replay", key, fallback=fallback)
    return None if value in (None, "") else str(value)


def run_type(context: Any) -> str:
    """``manual``, ``scheduled``, ``backfill``, ``asset_triggered`` ... of the task's DAG run."""
    dag_run = context.get("dag_run")
    value = getattr(dag_run, "run_type", None)
    return str(getattr(value, "value", value) or "manual")
