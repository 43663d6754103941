"""Replay what is new in the archive every hour, from the persisted checkpoint; validate, publish, update an Asset.

One run at a time (``max_active_runs=1``): each run resumes from the checkpoint the previous one
committed, replays only the files that arrived since, validates the new version and publishes it.
Publishing records an event on the ``replay_published_windows`` Asset, which schedules
``replay_quality_report``; a run that finds nothing new publishes nothing and records no event.
Change the job through the params' defaults below (or per run in the trigger form); the paths
are relative to the ``[replay]`` roots.
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.sdk import DAG

from replay_airflow import (
    PUBLISHED_WINDOWS,
    ReplayPlanOperator,
    ReplayPublishOperator,
    ReplayRunOperator,
    ReplayValidateOperator,
    job_params,
    task_defaults,
)

DEFAULT_WINDOWS = [
    {
        "name": "per_minute",
        "wm_key": "default",
        "kind": "tumbling",
        "size": "60s",
        "aggregations": [{"fn": "count"}, {"fn": "sum", "column": "value"}, {"fn": "max", "column": "value"}],
    }
]

with DAG(
    default_args=task_defaults(),  # operational failures retried (replay_airflow.defaults)
    dag_id="replay_scheduled",
    description="Replay new archive files from the checkpoint, validate, publish",
    doc_md=__doc__,
    schedule="@hourly",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    params=job_params(
        archive="live/archive",
        output="live/out",
        checkpoint="live",
        windows=DEFAULT_WINDOWS,
        micro_batch={"max_buffers": 2000},
    ),
    tags=["replay"],
):
    # The whole archive, incrementally: a scheduled run's data interval is not an event-time range.
    plan = ReplayPlanOperator(task_id="plan", interval_run_types=())
    replay = ReplayRunOperator(task_id="replay", plan=plan.output)
    validate = ReplayValidateOperator(task_id="validate", source=replay.output)
    publish = ReplayPublishOperator(
        task_id="publish", source=replay.output, skip_unchanged=True, outlets=[PUBLISHED_WINDOWS]
    )
    validate >> publish
