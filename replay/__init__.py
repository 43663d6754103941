"""Replay: rebuild watermark progress and window aggregates from archived stream buffers.

The public API is listed here once; everything else is internal. Importing
``replay`` is cheap: names are imported from their modules on first use (PEP 562),
so ``import replay`` (or ``replay.core.config`` from an Airflow DAG file) loads no pyarrow,
pandas, Spark or Great Expectations, and Spark sessions start only when a job needs one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replay.core.config import JobConfig, json_schema, load_config, parse_config
    from replay.core.errors import (
        ArchiveReadError,
        ArchiveSchemaError,
        BadBufferError,
        CheckpointCorruptError,
        CheckpointStateError,
        ConcurrentWriterError,
        ConfigError,
        ConflictingDuplicateError,
        DataError,
        EmptyArchiveError,
        IncompatibleCheckpointError,
        LedgerError,
        PublicationError,
        ReplayError,
        WatermarkRegressionError,
    )
    from replay.core.progress import ProgressEngine, ProgressSnapshot
    from replay.engine.inspection import InspectReport, inspect_archive
    from replay.generate import generate_archive
    from replay.generate_options import GenerateOptions, GenerateSummary
    from replay.quality.report import write_report
    from replay.quality.validate import ValidationOutcome, validate
    from replay.runner.loop import run
    from replay.runner.summary import RunSummary
    from replay.store.digest import digest, show_lines
    from replay.store.outputs import list_versions, read_table
    from replay.store.publish import PublishOutcome, publish
    from replay.store.status import checkpoint_status

_MODULES = {
    "ArchiveReadError": "replay.core.errors",
    "ArchiveSchemaError": "replay.core.errors",
    "BadBufferError": "replay.core.errors",
    "CheckpointCorruptError": "replay.core.errors",
    "CheckpointStateError": "replay.core.errors",
    "ConcurrentWriterError": "replay.core.errors",
    "ConfigError": "replay.core.errors",
    "ConflictingDuplicateError": "replay.core.errors",
    "DataError": "replay.core.errors",
    "EmptyArchiveError": "replay.core.errors",
    "GenerateOptions": "replay.generate_options",
    "GenerateSummary": "replay.generate_options",
    "IncompatibleCheckpointError": "replay.core.errors",
    "InspectReport": "replay.engine.inspection",
    "JobConfig": "replay.core.config",
    "LedgerError": "replay.core.errors",
    "ProgressEngine": "replay.core.progress",
    "ProgressSnapshot": "replay.core.progress",
    "PublicationError": "replay.core.errors",
    "PublishOutcome": "replay.store.publish",
    "ReplayError": "replay.core.errors",
    "RunSummary": "replay.runner.summary",
    "ValidationOutcome": "replay.quality.validate",
    "WatermarkRegressionError": "replay.core.errors",
    "checkpoint_status": "replay.store.status",
    "digest": "replay.store.digest",
    "generate_archive": "replay.generate",
    "inspect_archive": "replay.engine.inspection",
    "json_schema": "replay.core.config",
    "list_versions": "replay.store.outputs",
    "load_config": "replay.core.config",
    "parse_config": "replay.core.config",
    "publish": "replay.store.publish",
    "read_table": "replay.store.outputs",
    "run": "replay.runner.loop",
    "show_lines": "replay.store.digest",
    "validate": "replay.quality.validate",
    "write_report": "replay.quality.report",
}

__all__ = [
    "ArchiveReadError",
    "ArchiveSchemaError",
    "BadBufferError",
    "CheckpointCorruptError",
    "CheckpointStateError",
    "ConcurrentWriterError",
    "ConfigError",
    "ConflictingDuplicateError",
    "DataError",
    "EmptyArchiveError",
    "GenerateOptions",
    "GenerateSummary",
    "IncompatibleCheckpointError",
    "InspectReport",
    "JobConfig",
    "LedgerError",
    "ProgressEngine",
    "ProgressSnapshot",
    "PublicationError",
    "PublishOutcome",
    "ReplayError",
    "RunSummary",
    "ValidationOutcome",
    "WatermarkRegressionError",
    "checkpoint_status",
    "digest",
    "generate_archive",
    "inspect_archive",
    "json_schema",
    "list_versions",
    "load_config",
    "parse_config",
    "publish",
    "read_table",
    "run",
    "show_lines",
    "validate",
    "write_report",
]


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'replay' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
