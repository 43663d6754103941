"""Where ``ReplayRunOperator``'s run goes, by the run's ``engine`` param (``ResolvedJob.engine``):
``in_task`` calls ``replay.run`` in the task, ``kept_driver`` sends it to a kept driver
(``replay driver serve``), ``submitted`` hands ``python -m replay run`` to spark-submit. Each
returns the run's summary as a dict; the operator turns Replay's input and configuration errors
into failures without retries (``task_errors``). Under ``kept_driver`` the validation goes to the
driver too (``validate_on_kept_driver``, for ``ReplayValidateOperator``). Imports of ``replay``
stay inside the functions: DAG files stay cheap to parse."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["Progress", "in_task", "on_kept_driver", "submitted", "validate_on_kept_driver"]


class Progress:
    """Log lines for replay's ``on_event(step, done, total)``: the first, the last, and one per 10 s."""

    def __init__(self, log: Any) -> None:
        self.log = log
        self.last = 0.0

    def __call__(self, step: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done in (0, total) or now - self.last >= 10:
            self.last = now
            self.log.info("%s: %d/%d", step, done, total)

    def files(self, done: int, total: int) -> None:
        self("footers", done, total)


def in_task(job: Any, log: Any) -> dict[str, Any]:
    """``replay.run`` in this task's process, on the job's ``spark_master``."""
    from replay import run

    return run(job.config, start=job.start, end=job.end, on_event=Progress(log)).to_dict()


def on_kept_driver(job: Any, log: Any) -> dict[str, Any]:
    """The run sent to the kept driver whose home the worker's ``REPLAY_DRIVER`` names; the task
    waits for it, and its end (a timeout, a cleared task) cancels it. A driver that cannot be
    reached or ends during the run raises ``DriverError``, which Airflow retries."""
    from replay.driver.client import run_on_driver

    home = _kept_driver_home("run", log)
    return run_on_driver(home, job.config, start=job.start, end=job.end, on_event=Progress(log)).to_dict()


def validate_on_kept_driver(output: str, version: int, suites: Any, log: Any) -> Any:
    """``replay.validate`` sent to the same kept driver as ``on_kept_driver``'s runs: a DAG run of
    engine ``kept_driver`` starts no Spark driver of its own for its validation either."""
    from replay.driver.client import validate_on_driver

    home = _kept_driver_home("validation", log)
    return validate_on_driver(home, output, version, suites=suites, on_step=Progress(log))


def _kept_driver_home(what: str, log: Any) -> Any:
    """The home the worker's ``REPLAY_DRIVER`` names (``replay.driver.home.default_home``), logged."""
    from replay.driver.home import DriverHome, default_home

    home = DriverHome(default_home())
    log.info("sending the %s to the kept driver of %s", what, home.path)
    return home


def submitted(job: Any, context: Any, conn_id: str, log: Any) -> dict[str, Any]:
    """``spark-submit .../replay/__main__.py run --config <job> --summary-file <file>`` on the
    Spark connection ``conn_id``; its summary.

    The driver runs in client mode on this worker (a standalone master runs no Python driver
    in cluster mode), with this environment's interpreter on both sides; the job's Spark
    settings go along as ``--conf``. A Replay error in the driver fails the task without
    retries, with replay's message, as in the ``in_task`` engine.
    """
    import json
    import os
    import sys
    import tempfile
    from pathlib import Path

    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.sdk.exceptions import AirflowFailException

    import replay
    from replay.core.timeutil import format_ts
    from replay.engine.spark import driver_java_options, with_job_conf

    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="replay-submit-") as tmp:
        job_file, summary_file = Path(tmp, "job.json"), Path(tmp, "summary.json")
        job_file.write_text(json.dumps(job.config.model_dump(mode="json")), encoding="utf-8")
        args = ["run", "--config", str(job_file), "--summary-file", str(summary_file)]
        if job.config.checkpoint:  # named outright: the plan chose it for this range already
            args += ["--checkpoint", str(job.config.checkpoint)]
        for option, bound in (("--start", job.start), ("--end", job.end)):
            text = format_ts(bound)  # exact: sub-millisecond digits are kept
            if text is not None:
                args += [option, text]
        ti = context["ti"]
        hook = SparkSubmitHook(
            conn_id=conn_id,
            conf=with_job_conf({"spark.driver.extraJavaOptions": driver_java_options()}, job.config.spark.conf),
            name=f"replay {ti.dag_id} {ti.run_id}",
            application_args=args,
            env_vars={
                "PYSPARK_PYTHON": python,
                "PYSPARK_DRIVER_PYTHON": python,
                # spark-submit itself: the one of the locked PySpark, beside this interpreter.
                "PATH": os.path.dirname(python) + os.pathsep + os.environ.get("PATH", ""),
            },
        )
        application = str(Path(replay.__file__).with_name("__main__.py"))
        log.info("spark-submit on connection %r: %s %s", conn_id, application, " ".join(args))
        try:
            hook.submit(application=application)
        except Exception:
            if summary_file.exists() and "error" in (outcome := json.loads(summary_file.read_text())):
                raise AirflowFailException(outcome["error"]["message"]) from None
            raise
        if not summary_file.exists():
            raise RuntimeError(f"spark-submit ended without the summary {summary_file} of 'replay run'")
        summary: dict[str, Any] = json.loads(summary_file.read_text(encoding="utf-8"))["summary"]
    return summary
