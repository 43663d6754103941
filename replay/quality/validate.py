"""``replay validate``: run the Great Expectations suites on an output version (docs/validation.md#validate).

The suites live in the ``expectations`` package, one module each, built from the job
configuration the version's manifest records. Each suite runs through its GX Checkpoint
(``replay_<suite>``) on a Spark DataFrame, in a file-based GX project under
``OUTPUT/_validation/gx``; the Data Docs there are built once per validation for the suites it
ran, and keep the newest ``validation.docs_history`` runs per suite. The verdict, per expectation, is
recorded on the version (``versions/<version>.validation.json``); ``replay publish``
refuses a version without a passing one.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replay.core.config import JobConfig
from replay.core.errors import CheckpointStateError, ConfigError, Location, ReplayError, storage_errors
from replay.store.outputs import (
    TABLES,
    Manifest,
    decode_schema,
    latest_run_version,
    read_manifest,
    read_validation,
    resolve_version,
    table_files,
    write_validation,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from expectations import SuiteInputs

__all__ = ["DOCS_INDEX", "ValidationOutcome", "validate"]

#: The manifest fields validation needs, which manifests written by earlier Replays may lack.
_VALIDATION_FACTS = ("config", "files", "lateness", "watermarks", "ledger_batches")

#: The Data Docs index, relative to the output root.
DOCS_INDEX = "_validation/gx/uncommitted/data_docs/local_site/index.html"


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationOutcome:
    """The verdict of ``validate``: ``success`` and the record written on the version."""

    output: str
    version: int
    success: bool
    record: dict[str, Any]
    data_docs: str  # path of the Data Docs index

    @property
    def failures(self) -> list[tuple[str, dict[str, Any]]]:
        """(suite, expectation) of every failed expectation."""
        return [(s["name"], e) for s in self.record["suites"] for e in s["expectations"] if not e["success"]]


def _error(message: str, output: Path, version: int, todo: str, code: str) -> ReplayError:
    return CheckpointStateError(
        message, where=Location(file=str(output), extra={"version": version}), todo=todo, code=code
    )


def spark_table(spark: SparkSession, output: Path, manifest: Manifest, table: str) -> DataFrame:
    """One table of a version as a Spark DataFrame (empty, with the recorded schema, when it has no file)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    # Absolute: the JVM resolves relative paths against its own working directory, not Python's.
    files = [str(Path(f).absolute()) for f in table_files(output, manifest, table)]
    if files:
        return spark.read.option("mergeSchema", "true").parquet(*files)
    hexed = manifest.schemas.get(table)
    if not hexed:
        return spark.createDataFrame([], "empty string")
    return spark.createDataFrame([], from_arrow_schema(decode_schema(hexed)))


def _inputs(spark: SparkSession, output: Path, version: int, manifest: Manifest) -> SuiteInputs:
    """What the suites are built from; ``manifest`` holds every field ``_VALIDATION_FACTS`` names."""
    from expectations import SuiteInputs
    from replay.engine.archive import inspect_schema

    config = JobConfig.model_validate(manifest.config)
    layout = inspect_schema(config, manifest.files or ())
    tables = {t: spark_table(spark, output, manifest, t) for t in TABLES if t != "corrections"}
    run_range = manifest.range or (None, None)
    shown_range = run_range
    previous_windows = None
    if manifest.kind == "publication" and manifest.merged_range and manifest.previous is not None:
        # The previous publication's windows outside the range were copied; the suites check the whole.
        shown_range = (None, None)
        previous = read_manifest(output, manifest.previous)
        previous_windows = spark_table(spark, output, previous, "windows")
    return SuiteInputs(
        spark=spark,
        config=config,
        layout=layout,
        mode=manifest.lateness or "",
        effective={k["key"]: int(k["effective"]) for k in manifest.watermarks or ()},
        range=shown_range,
        recompute_range=run_range,
        previous_windows=previous_windows,
        tables=tables,
        late_per_key={r["wm_key"]: int(r["count"]) for r in tables["late"].groupBy("wm_key").count().collect()},
        manifest=manifest,
        version=version,
    )


def _quiet_gx() -> None:
    """Before GX is imported: no analytics, and its INFO bookkeeping (registry, config saves) out of task logs."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    gx_log = logging.getLogger("great_expectations")
    if gx_log.level == logging.NOTSET:  # a level the user set is kept
        gx_log.setLevel(logging.WARNING)


def _import_gx_ahead() -> None:
    """Import Great Expectations in a thread of its own (some 6 s of CPU on a slow 2-core machine)
    while this one starts the Spark session and reads the suites' inputs, which mostly wait for the
    JVM; the suites' own import then finds it loaded, or waits for it, or imports it again and says
    what went wrong."""
    from replay.engine.spark import import_ahead

    _quiet_gx()
    import_ahead("great_expectations.expectations")


def _context(root: Path) -> Any:
    _quiet_gx()
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="file", project_root_dir=str(root))
    bars = context.variables.progress_bars  # a dict once read back from great_expectations.yml
    enabled = bars is None or (bars.get("globally", True) if isinstance(bars, dict) else bars.globally)
    if enabled:
        context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        context.variables.save()
    return context


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(v) for v in value]
    return str(value)


def _expectation_record(result: Any) -> dict[str, Any]:
    config = result.expectation_config
    kwargs = dict(config.kwargs)
    details = result.result or {}
    column = kwargs.get("column") or kwargs.get("column_A") or kwargs.get("column_list") or kwargs.get("column_set")
    examples = details.get("partial_unexpected_list") or []
    return {
        "type": config.type,
        "column": _jsonable(column),
        "description": config.description or "",
        "success": bool(result.success),
        "element_count": details.get("element_count"),
        "unexpected_count": details.get("unexpected_count"),
        "observed_value": _jsonable(details.get("observed_value")),
        "unexpected_examples": _jsonable(examples[:10]),
        "error": (result.exception_info or {}).get("exception_message") if not result.success else None,
    }


def _prune_history(gx_root: Path, keep: int) -> bool:
    """Keep the newest ``keep`` runs per suite in the validation store; say whether anything went."""
    store = gx_root / "uncommitted" / "validations"
    pruned = False
    if not store.exists():
        return False
    for suite_dir in store.iterdir():
        if not suite_dir.is_dir():
            continue
        runs = sorted(suite_dir.rglob("*.json"), key=lambda p: p.stat().st_mtime)
        for old in runs[: max(0, len(runs) - keep)]:
            old.unlink()
            pruned = True
    return pruned


@storage_errors("no verdict was written on the version")
def validate(
    output: str | Path,
    version: int | None = None,
    *,
    suites: Sequence[str] | None = None,
    spark: SparkSession | None = None,
    on_step: Callable[[str, int, int], None] | None = None,
) -> ValidationOutcome:
    """Validate one version of ``output`` (default: the newest run's version, the one to publish next).

    Runs ``suites`` (default: all of ``expectations.SUITES``), writes the Data Docs and the
    record ``versions/<version>.validation.json``, and returns the verdict; a failed
    expectation is a verdict, not an exception.

    Raises:
        ConfigError: no such output version, or an unknown suite name.
        CheckpointStateError: the version was written by an older Replay without the facts
            validation needs (``output.not_validatable``).
        ReplayError: the archive files the version read can no longer be read.
    """
    from filelock import FileLock

    from expectations import SUITES, suite_module
    from replay.engine.spark import get_session

    root = Path(output)
    v = resolve_version(root, version if version is not None else latest_run_version(root))
    manifest = read_manifest(root, v)
    if any(getattr(manifest, name) is None for name in _VALIDATION_FACTS):
        raise _error(
            f"version {v} was written by an earlier Replay that did not record what validation needs",
            root,
            v,
            "run the job again into a new output location, then validate that",
            "output.not_validatable",
        )
    names = list(suites) if suites is not None else list(SUITES)
    for name in names:
        if name not in SUITES:
            raise ConfigError(
                f"unknown suite {name!r}",
                where=Location(field="suites"),
                todo=f"use some of: {', '.join(SUITES)}",
                code="validate.unknown_suite",
            )
    config = JobConfig.model_validate(manifest.config)
    _import_gx_ahead()
    session = spark or get_session(config.spark)
    inputs = _inputs(session, root, v, manifest)
    project = root / "_validation"
    project.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    suite_records = []
    with FileLock(str(project / ".lock")):
        _quiet_gx()
        import great_expectations as gx
        from great_expectations.core.run_identifier import RunIdentifier
        from great_expectations.data_context.types.resource_identifiers import ExpectationSuiteIdentifier

        context = _context(project)
        rendered: list[Any] = []  # the Data Docs pages to build: each suite's and its new result's
        source = context.data_sources.add_or_update_spark(name="replay")
        for index, name in enumerate(names):
            if on_step is not None:
                on_step(f"suite {name}", index, len(names))
            module = suite_module(name)
            data = module.frame(inputs)
            asset = source.get_asset(name) if name in [a.name for a in source.assets] else None
            if asset is None:
                asset = source.add_dataframe_asset(name=name)
            batch = next((b for b in asset.batch_definitions if b.name == "version"), None)
            if batch is None:
                batch = asset.add_batch_definition_whole_dataframe("version")
            suite = gx.ExpectationSuite(name=name, expectations=module.expectations(inputs))
            suite = context.suites.add_or_update(suite)
            definition = context.validation_definitions.add_or_update(
                gx.ValidationDefinition(name=name, data=batch, suite=suite)
            )
            checkpoint = context.checkpoints.add_or_update(
                gx.Checkpoint(
                    name=f"replay_{name}",
                    validation_definitions=[definition],
                    # No action: the Data Docs are built once, below, for every suite run here (one
                    # build per Checkpoint rendered the site's templates again each time).
                    actions=[],
                    result_format={"result_format": "SUMMARY", "partial_unexpected_count": 10},
                )
            )
            result = checkpoint.run(
                batch_parameters={"dataframe": data},
                run_id=RunIdentifier(run_name=f"version-{v}"),
            )
            rendered += [*result.run_results, ExpectationSuiteIdentifier(name=name)]
            results = [r for run in result.run_results.values() for r in run.results]
            expectations = [_expectation_record(r) for r in results]
            suite_records.append(
                {
                    "name": name,
                    "success": bool(result.success),
                    "evaluated": len(expectations),
                    "failed": sum(not e["success"] for e in expectations),
                    "expectations": expectations,
                }
            )
        if _prune_history(project / "gx", config.validation.docs_history):
            site = project / "gx" / "uncommitted" / "data_docs" / "local_site"
            shutil.rmtree(site, ignore_errors=True)
            context.build_data_docs()  # the whole site again, without the runs pruned
        else:
            context.build_data_docs(resource_identifiers=rendered)
        if on_step is not None:
            on_step("done", len(names), len(names))
    previous = read_validation(root, v) if suites is not None else None
    if previous is not None:  # a partial run replaces only the suites it ran
        kept = [s for s in previous["suites"] if s["name"] not in names]
        suite_records = [*kept, *suite_records]
    success = all(s["success"] for s in suite_records) and len(suite_records) == len(SUITES)
    record = {
        "success": success,
        "validated_at": started,
        "data_docs": DOCS_INDEX,
        "suites": sorted(suite_records, key=lambda s: SUITES.index(s["name"])),
    }
    write_validation(root, v, record)
    return ValidationOutcome(
        output=str(root), version=v, success=success, record=record, data_docs=str(root / DOCS_INDEX)
    )
