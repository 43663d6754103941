"""The operators of the Replay DAGs: plan, replay, validate, publish, report.

Each calls one library function of ``replay`` (``inspect_archive``, ``run``, ``validate``,
``publish``, ``write_report``) and returns a small JSON-able result for the next task. They take
keyword-only arguments, declare ``template_fields``, and import ``replay`` (and with it pyarrow,
Spark, Great Expectations) only inside ``execute``: DAG files stay cheap to parse.

Errors: a ``ReplayError`` that says the input or the configuration is wrong (``ConfigError``,
``DataError``) fails the task without retries, with replay's message (what, where, what to do);
anything else (a Spark executor lost, another writer holding the checkpoint) is retried as
the task's ``retries`` allow.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from airflow.sdk import BaseOperator

from replay_airflow.engines import Progress

__all__ = [
    "ReplayPlanOperator",
    "ReplayPublishOperator",
    "ReplayReportOperator",
    "ReplayRunOperator",
    "ReplayValidateOperator",
    "task_errors",
]


@contextmanager
def task_errors() -> Iterator[None]:
    """Turn replay's input and configuration errors into failures Airflow does not retry."""
    from airflow.sdk.exceptions import AirflowFailException

    from replay.core.errors import ConfigError, DataError

    try:
        yield
    except (ConfigError, DataError) as exc:
        _name_spark_log()
        raise AirflowFailException(exc.message) from exc
    except Exception:
        _name_spark_log()
        raise


def _name_spark_log() -> None:
    """In the task's log, the file with Spark's warnings and errors of this process in full, when
    Spark wrote one: the task log has them one line each (``replay.engine.spark_log``)."""
    from replay.engine.spark_log import written_spark_log

    written = written_spark_log()
    if written is not None:
        logging.getLogger(__name__).warning("Spark's warnings and errors, with their stack traces: %s", written)


def _int_or_none(value: Any) -> int | None:
    return None if value in (None, "", "None") else int(value)


class ReplayPlanOperator(BaseOperator):
    """Resolve a run's job (paths under the roots, configuration validated, range chosen) and check the archive.

    Nothing is written, and no Spark session starts: the archive's files and schema are checked from
    their Parquet footers (``inspect=True`` adds ``replay inspect``'s Spark analysis of the buffers).
    The result (the validated configuration and the range, as JSON) is what ``ReplayRunOperator``
    replays; a path outside its root, an invalid setting or a bad schema fails here.

    :param job: the job's settings, as the trigger form has them (templated); default: the run's params
    :param interval_run_types: run types whose data interval is the event-time range
        (default: ``backfill``, the runs of ``airflow backfill create``)
    :param inspect: also analyse the archive's progress from buffer metadata (``replay inspect``, Spark)
    :param skip_run_types: run types that end here as skipped, with everything downstream (see
        ``replay_backfill``: Airflow 3.3 gives a DAG that can be backfilled scheduled runs too)
    """

    template_fields = ("job",)
    ui_color = "#e8f0fe"

    def __init__(
        self,
        *,
        job: Mapping[str, Any] | None = None,
        interval_run_types: tuple[str, ...] = ("backfill",),
        inspect: bool = False,
        skip_run_types: tuple[str, ...] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.interval_run_types = tuple(interval_run_types)
        self.inspect = inspect
        self.skip_run_types = tuple(skip_run_types)

    def execute(self, context: Any) -> dict[str, Any]:
        from replay_airflow._compat import run_type
        from replay_airflow.params import resolve_job
        from replay_airflow.roots import configured_roots

        kind = run_type(context)
        if kind in self.skip_run_types:
            from airflow.sdk.exceptions import AirflowSkipException

            raise AirflowSkipException(
                f"{kind} runs of this DAG do nothing: trigger it by hand, or create runs with 'airflow backfill create'"
            )
        with task_errors():
            params = dict(self.job if self.job is not None else context["params"])
            interval = None
            if kind in self.interval_run_types:
                interval = (context["data_interval_start"], context["data_interval_end"])
            resolved = resolve_job(params, configured_roots(), data_interval=interval)
            result = resolved.to_xcom()
            self.log.info(
                "%s run: archive %s, output %s, checkpoint %s, range [%s, %s) from %s",
                kind,
                resolved.config.archive,
                resolved.config.output,
                resolved.config.checkpoint,
                result["start"] or "-inf",
                result["end"] or "+inf",
                resolved.range_source,
            )
            if self.inspect:
                from replay import inspect_archive

                report = inspect_archive(resolved.config, on_step=Progress(self.log)).to_dict()
                summary = {k: v for k, v in report.items() if not isinstance(v, list | dict)}
                summary["keys"] = report["keys"]
                summary["integrity"] = {name: len(items) for name, items in report["integrity"].items()}
                result["inspection"] = summary
            else:
                # Footers only: the archive's files and schema are checked without Spark.
                from replay.engine.archive import inspect_schema, resolve_lateness

                layout = inspect_schema(resolved.config, on_file=Progress(self.log).files)
                summary = {
                    "files": len(layout.files),
                    "lateness": resolve_lateness(resolved.config, layout),
                    "keys": [k.name for k in layout.keys],
                    # Where each key's watermark is in the files (the page's lag reads their statistics).
                    "watermark_columns": {
                        k.name: {
                            "column": k.watermark or k.event_time,
                            "unit": layout.time_columns.get(k.watermark or k.event_time),
                        }
                        for k in layout.keys
                    },
                }
                result["inspection"] = summary
            self.log.info("archive: %s", _described(result["inspection"]))
        return result


def _described(inspection: Mapping[str, Any]) -> str:
    """The plan's archive summary as one line: files, lateness, and where each key's watermark is."""
    keys = ", ".join(
        f"{key} (watermark {where['column']}" + (f", {where['unit']})" if where.get("unit") else ")")
        for key, where in inspection["watermark_columns"].items()
    )
    return f"{inspection['files']} file(s), lateness {inspection['lateness']}, keys {keys}"


class ReplayRunOperator(BaseOperator):
    """Replay the planned job into a new output version, resuming from its checkpoint (``replay.run``).

    Running it again with nothing new in the archive writes nothing and returns the same version.

    Where the Spark driver runs is the run's ``engine`` param (``ResolvedJob.engine``): ``in_task``
    (the default) calls ``replay.run`` inside this task, on the job's ``spark_master``;
    ``spark_submit`` hands ``python -m replay run`` to spark-submit, through the Spark provider's
    ``SparkSubmitHook`` (what ``SparkSubmitOperator`` runs), against the cluster of the Airflow
    connection ``conn_id``, and waits for it; ``kept_driver`` sends the run to the kept driver
    (``replay driver serve``) whose home the worker's ``REPLAY_DRIVER`` names, and waits for it
    (the task's end cancels it). All three return the same summary.

    :param plan: the result of ``ReplayPlanOperator`` (templated; pass ``plan_task.output``)
    :param conn_id: the Spark connection of the ``spark_submit`` engine (e.g.
        ``AIRFLOW_CONN_SPARK_MASTER=spark://spark-master:7077``)
    """

    template_fields = ("plan",)
    ui_color = "#fde8e8"

    def __init__(self, *, plan: Mapping[str, Any] | Any, conn_id: str = "spark_master", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.conn_id = conn_id

    def execute(self, context: Any) -> dict[str, Any]:
        from replay_airflow.params import ResolvedJob

        with task_errors():
            job = ResolvedJob.from_xcom(self.plan)
            from replay_airflow import engines

            if job.engine == "spark_submit":
                result = engines.submitted(job, context, self.conn_id, self.log)
            elif job.engine == "kept_driver":
                result = engines.on_kept_driver(job, self.log)
            else:
                result = engines.in_task(job, self.log)
        if result["batches"] or result["new_version"]:
            from replay_airflow.records import record_task

            columns = dict(self.plan or {}).get("inspection", {}).get("watermark_columns")
            record_task(
                context,
                result["output"],
                "replayed",
                version=result["version"],
                archive={"path": job.config.archive, "keys": columns} if columns else None,
                checkpoint=result["checkpoint"],
                batches=result["batches"],
            )
        # Batches and tuples are this attempt's (a retry resumes after what an earlier one
        # committed); windows and late tuples are the checkpoint's, as the version holds them.
        self.log.info(
            "version %s (%s): this attempt %s%d micro-batch(es), %d tuples; in all %d windows emitted, %d open, "
            "late tuples %s",
            result["version"],
            "new" if result["new_version"] else "nothing new",
            "resumed from the checkpoint, " if result["resumed"] else "",
            result["batches"],
            result["tuples_read"],
            result["windows_emitted"],
            result["open_windows"],
            ", ".join(f"{key} {n}" for key, n in result["late_tuples"].items()) or "none",
        )
        return result


class _OutputOperator(BaseOperator):
    """An operator on an output version: ``output_dir``/``version``, or both from an upstream ``source`` result.

    (``output`` is taken: it is every operator's XCom result in Airflow.)
    """

    template_fields: tuple[str, ...] = ("output_dir", "version", "source")

    def __init__(
        self,
        *,
        output_dir: str | None = None,
        version: int | str | None = None,
        source: Mapping[str, Any] | Any = None,
        from_asset_events: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.output_dir = output_dir
        self.version = version
        self.source = source
        self.from_asset_events = from_asset_events

    def _target(self, context: Any) -> tuple[str, int | None]:
        """The output (resolved under the output root unless an upstream task resolved it) and version.

        With ``from_asset_events``, the newest triggering Asset event that names an output wins
        over ``output_dir``; its path is still checked against the output root.
        """
        from replay.core.errors import ConfigError, Location
        from replay_airflow.roots import configured_roots

        source = dict(self.source or {})
        named = None
        if self.from_asset_events:
            events = [e for evs in (context.get("triggering_asset_events") or {}).values() for e in evs]
            named = next((e.extra["output"] for e in reversed(events) if (e.extra or {}).get("output")), None)
        if named:
            output = configured_roots().resolve("output", str(named), param="asset event output")
        elif self.output_dir:
            output = configured_roots().resolve("output", str(self.output_dir), param="output_dir")
        elif source.get("output"):
            output = str(source["output"])
        else:
            raise ConfigError(
                f"task {self.task_id!r} has no output to work on",
                where=Location(field="output"),
                todo="pass output_dir=... or source=<an upstream replay task>.output",
                code="airflow.no_output",
            )
        version = _int_or_none(self.version) if self.version not in (None, "") else _int_or_none(source.get("version"))
        return output, version


class ReplayValidateOperator(_OutputOperator):
    """Run the Great Expectations suites on a version and record the verdict (``replay.validate``).

    Fails (without retries) when an expectation fails, naming each. A version that already carries
    a passing verdict is not validated again unless ``revalidate`` is set, so re-running a DAG
    changes nothing. Under the DAG param ``engine: kept_driver`` the validation, like the run, goes
    to the kept driver.

    :param output_dir: output directory, relative to the output root (templated)
    :param version: the version (templated); default: the source's, else the newest run's
    :param source: an upstream result holding ``output`` and ``version`` (templated)
    :param current: validate the current publication instead of the newest run's version
    :param revalidate: validate even when a passing verdict is recorded
    :param suites: a subset of ``windows``, ``progress``, ``integrity``, ``reconciliation``
    """

    ui_color = "#e6f4ea"

    def __init__(
        self,
        *,
        current: bool = False,
        revalidate: bool = False,
        suites: tuple[str, ...] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.current = current
        self.revalidate = revalidate
        self.suites = suites

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from replay import validate
        from replay.core.errors import ConfigError, Location
        from replay.store.outputs import current_version, latest_run_version, read_validation

        with task_errors():
            output, version = self._target(context)
            if version is None:
                version = current_version(output) if self.current else latest_run_version(output)
            if version is None:
                raise ConfigError(
                    "the output holds no " + ("publication" if self.current else "version") + " to validate",
                    where=Location(file=output),
                    todo="run (and publish) a replay into it first",
                    code="airflow.nothing_to_validate",
                )
            record = None if self.revalidate or self.suites else read_validation(output, version)
            if record is not None and record.get("success"):
                self.log.info(
                    "version %d of %s already passed validation at %s", version, output, record["validated_at"]
                )
                return {"output": output, "version": version, "success": True, "revalidated": False}
            if (context.get("params") or {}).get("engine") == "kept_driver":
                from replay_airflow.engines import validate_on_kept_driver

                outcome = validate_on_kept_driver(output, version, self.suites, self.log)
            else:
                outcome = validate(output, version, suites=self.suites, on_step=Progress(self.log))
        self.log.info("Data Docs: %s", outcome.data_docs)
        from replay_airflow.records import record_task

        record_task(context, output, "validated", version=version, success=outcome.success)
        if not outcome.success:
            failed = "; ".join(
                f"{suite}: {e['type']}" + (f" on {e['column']}" if e.get("column") else "") + f" ({e['description']})"
                for suite, e in outcome.failures
            )
            raise AirflowFailException(
                f"version {version} of {output} failed validation: {failed}. Data Docs: {outcome.data_docs}"
            )
        return {
            "output": output,
            "version": version,
            "success": True,
            "revalidated": True,
            "data_docs": outcome.data_docs,
        }


class ReplayPublishOperator(_OutputOperator):
    """Publish a validated version (``replay.publish``) and record the publication on the task's Assets.

    :param retain: keep the newest N versions (default: the job's ``publication.retain_versions``)
    :param skip_unchanged: end the task as *skipped* when the publication did not change, so its
        outlet Assets get no event (scheduled replays with nothing new)
    """

    ui_color = "#fef7e0"

    def __init__(self, *, retain: int | None = None, skip_unchanged: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.retain = retain
        self.skip_unchanged = skip_unchanged

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowSkipException

        from replay import publish

        with task_errors():
            output, version = self._target(context)
            outcome = publish(output, version, retain_versions=self.retain)
        result = {
            "output": outcome.output,
            "source": outcome.source,
            "version": outcome.publication,
            "previous": outcome.previous,
            "changed": outcome.changed,
            "corrections": outcome.corrections,
            "removed_versions": list(outcome.removed_versions),
            "rules": outcome.rules,
            "merged_rules": None if outcome.merged_rules is None else list(outcome.merged_rules),
        }
        self.log.info("%s", outcome.describe())
        if outcome.merged_rules:
            from replay.core.rules import publication_note

            self.log.warning("%s", publication_note(outcome.merged_rules, outcome.rules))
        if outcome.changed:
            from replay_airflow.records import record_task

            record_task(context, outcome.output, "published", version=outcome.publication, source=outcome.source)
        if not outcome.changed and self.skip_unchanged:
            raise AirflowSkipException(f"version {outcome.source} is already the current publication of {output}")
        extra = {"output": outcome.output, "version": outcome.publication, "source": outcome.source}
        for outlet in self.outlets or ():
            context["outlet_events"][outlet].extra = extra
        return result


class ReplayReportOperator(_OutputOperator):
    """Write the HTML report of a version (``replay.write_report``) and return its path.

    :param checkpoint: checkpoint whose stream cut and watermarks the report shows (templated;
        relative to the checkpoint root, or a path from ``source``)
    :param to: the report directory (templated); default ``<output>/_report``
    :param current: report the current publication
    """

    template_fields = (*_OutputOperator.template_fields, "checkpoint", "to")
    ui_color = "#f3e8fd"

    def __init__(
        self,
        *,
        checkpoint: str | None = None,
        to: str | None = None,
        current: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.checkpoint = checkpoint
        self.to = to
        self.current = current

    def execute(self, context: Any) -> dict[str, Any]:
        import os

        from replay import write_report
        from replay_airflow.roots import configured_roots

        with task_errors():
            output, version = self._target(context)
            if self.current:
                version = None  # write_report's default: the published version
            checkpoint = self.checkpoint or dict(self.source or {}).get("checkpoint")
            if checkpoint and not os.path.isabs(str(checkpoint)):
                checkpoint = configured_roots().resolve("checkpoint", str(checkpoint), param="checkpoint")
            to = (
                configured_roots().resolve("output", str(self.to), param="to")
                if self.to
                else os.path.join(output, "_report")
            )
            path = write_report(output, checkpoint or None, to, version=version)
        self.log.info("report: %s", path)
        return {"output": output, "version": version, "report": str(path)}
