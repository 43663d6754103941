"""Validate the current publication and write Data Docs and the HTML report, whenever windows are published.

Scheduled on the ``replay_published_windows`` Asset (updated by ``replay_scheduled``). The output
comes from the triggering Asset event (its ``extra`` names it), else from the ``output`` param.
The report (watermark timeline per origin and key, lateness histograms, gaps, duplicates, the
validation verdict, corrections) lands in ``<output>/_report/index.html``, the Data Docs under
``<output>/_validation/``. The ``engine`` param chooses where the validation's Spark driver runs: in
the task (``in_task``), or on the kept driver whose home the worker's ``REPLAY_DRIVER`` names
(``kept_driver``), as for the replay DAGs.
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.sdk import DAG, Param

from replay_airflow import PUBLISHED_WINDOWS, ReplayReportOperator, ReplayValidateOperator, task_defaults

with DAG(
    default_args=task_defaults(),  # operational failures retried (replay_airflow.defaults)
    dag_id="replay_quality_report",
    description="Validate the current publication; write Data Docs and the HTML report",
    doc_md=__doc__,
    schedule=[PUBLISHED_WINDOWS],
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    params={
        "output": Param("live/out", type="string", minLength=1, description="output, relative to the output root"),
        "checkpoint": Param(
            "live", type=["string", "null"], description="checkpoint, relative to the checkpoint root (stream cut)"
        ),
        "engine": Param(
            "in_task",
            type="string",
            enum=["in_task", "kept_driver"],
            description="in_task: the validation's Spark driver runs inside the Airflow task; kept_driver: the "
            "validation is sent to the kept driver (replay driver serve) whose home the worker's REPLAY_DRIVER names",
        ),
    },
    tags=["replay"],
):
    validate = ReplayValidateOperator(
        task_id="validate", output_dir="{{ params.output }}", current=True, revalidate=True, from_asset_events=True
    )
    report = ReplayReportOperator(
        task_id="report", source=validate.output, checkpoint="{{ params.checkpoint or '' }}", current=True
    )
