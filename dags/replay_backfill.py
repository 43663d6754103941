"""Rebuild window outputs for a past event-time range: plan, replay, validate, publish, report.

Triggered by hand (the trigger form asks for the archive, output, event-time range, origins,
windows and aggregations, lateness, micro-batch size and Spark master; Airflow validates it
against the job configuration's JSON schema before the run starts), or by Airflow's own backfill:
``airflow backfill create --dag-id replay_backfill --from-date 2026-01-01 --to-date 2026-01-08``
creates one run per day, and each run's data interval becomes its event-time range. The daily
schedule exists only for those backfills; Airflow 3.3 gives any DAG with a schedule scheduled
runs as well, and this DAG's end at ``plan`` as skipped (keep it paused if you never backfill).

Paths in the form are relative to the roots of the ``[replay]`` configuration section
(``replay_airflow.roots``). Triggering it twice with the same parameters changes nothing the
second time: the replay finds nothing new, the version keeps its verdict, and the publication
stays the same.
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.sdk import DAG, CronDataIntervalTimetable

from replay_airflow import (
    ReplayPlanOperator,
    ReplayPublishOperator,
    ReplayReportOperator,
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
    dag_id="replay_backfill",
    description="Rebuild window outputs for a past event-time range",
    doc_md=__doc__,
    # Runs cover a day as their data interval [day, next day): Airflow 3's "@daily" alone gives
    # runs an empty interval (start = end).
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    # Airflow 3.3 requires a DAG with a schedule to allow scheduled runs; the plan task skips them.
    allowed_run_types=["manual", "backfill", "scheduled"],
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    params=job_params(
        archive="archive",
        output="backfill",
        windows=DEFAULT_WINDOWS,
        micro_batch={"max_buffers": 2000},
    ),
    tags=["replay"],
):
    plan = ReplayPlanOperator(task_id="plan", skip_run_types=("scheduled",))
    replay = ReplayRunOperator(task_id="replay", plan=plan.output)
    validate = ReplayValidateOperator(task_id="validate", source=replay.output)
    publish = ReplayPublishOperator(task_id="publish", source=replay.output)
    report = ReplayReportOperator(task_id="report", source=replay.output, current=True)
    validate >> publish >> report
