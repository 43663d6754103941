"""Hold downstream work until the scheduled replay's event time is complete: a deferrable watermark gate.

Each daily run waits (in the triggerer, not a worker slot) until ``G_k`` of the scheduled
replay's checkpoint reaches the end of the run's data interval, i.e. until every tuple of that day
has been replayed, then succeeds. Downstream DAGs can depend on it; ``target`` overrides the
timestamp to wait for.
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.sdk import DAG, CronDataIntervalTimetable, Param

from replay_airflow import WatermarkSensor, task_defaults

with DAG(
    default_args=task_defaults(),  # operational failures retried (replay_airflow.defaults)
    dag_id="replay_watermark_gate",
    description="Wait until the scheduled replay's watermark passes the end of the day",
    doc_md=__doc__,
    # Runs cover a day as their data interval [day, next day): Airflow 3's "@daily" alone gives
    # runs an empty interval (start = end).
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    params={
        "checkpoint": Param("live", type="string", minLength=1, description="checkpoint, relative to its root"),
        "key": Param(None, type=["string", "null"], description="watermark key; empty for a job with one key"),
        "target": Param(
            None, type=["string", "null"], description="ISO 8601 timestamp to wait for; empty: the data interval's end"
        ),
        "poll_interval": Param(30, type="number", exclusiveMinimum=0, description="seconds between two readings"),
    },
    render_template_as_native_obj=True,
    tags=["replay"],
):
    WatermarkSensor(
        task_id="wait_for_watermark",
        checkpoint="{{ params.checkpoint }}",
        key="{{ params.key }}",
        target="{{ params.target or data_interval_end.isoformat() }}",
        poll_interval="{{ params.poll_interval }}",
        timeout=6 * 3600,
    )
