"""Replay: rebuild watermark progress and window aggregates from archived stream buffers.

The public API is listed here once; everything else is internal. Importing
``replay`` is cheap: names are imported from their modules on first use (PEP 562),
so ``import replay`` (or ``replay.config`` from an Airflow DAG file) loads no pyarrow,
pandas, Spark or Great Expectations, and Spark sessions start only when a job needs one.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replay.config import JobConfig, json_schema, load_config, parse_config
    from replay.digest import digest, show_lines
    from replay.errors import (
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
    from replay.generate import GenerateOptions, GenerateSummary, generate_archive
    from replay.inspection import InspectReport, inspect_archive
    from replay.job import RunSummary, run
    from replay.outputs import list_versions, read_table
    from replay.progress import ProgressEngine, ProgressSnapshot
    from replay.publish import PublishOutcome, publish
    from replay.report import write_report
    from replay.status import checkpoint_status
    from replay.validate import ValidationOutcome, validate

_MODULES = {
    "ArchiveReadError": "replay.errors",
    "ArchiveSchemaError": "replay.errors",
    "BadBufferError": "replay.errors",
    "CheckpointCorruptError": "replay.errors",
    "CheckpointStateError": "replay.errors",
    "ConcurrentWriterError": "replay.errors",
    "ConfigError": "replay.errors",
    "ConflictingDuplicateError": "replay.errors",
    "DataError": "replay.errors",
    "EmptyArchiveError": "replay.errors",
    "GenerateOptions": "replay.generate",
    "GenerateSummary": "replay.generate",
    "IncompatibleCheckpointError": "replay.errors",
    "InspectReport": "replay.inspection",
    "JobConfig": "replay.config",
    "LedgerError": "replay.errors",
    "ProgressEngine": "replay.progress",
    "ProgressSnapshot": "replay.progress",
    "PublicationError": "replay.errors",
    "PublishOutcome": "replay.publish",
    "ReplayError": "replay.errors",
    "RunSummary": "replay.job",
    "ValidationOutcome": "replay.validate",
    "WatermarkRegressionError": "replay.errors",
    "checkpoint_status": "replay.status",
    "digest": "replay.digest",
    "generate_archive": "replay.generate",
    "inspect_archive": "replay.inspection",
    "json_schema": "replay.config",
    "list_versions": "replay.outputs",
    "load_config": "replay.config",
    "parse_config": "replay.config",
    "publish": "replay.publish",
    "read_table": "replay.outputs",
    "run": "replay.job",
    "show_lines": "replay.digest",
    "validate": "replay.validate",
    "write_report": "replay.report",
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


class _Package(types.ModuleType):
    # The import system binds a submodule to its package's namespace once it is loaded; for
    # ``digest``, ``publish`` and ``validate`` that would hide the function of the same name
    # (``from replay import validate`` must stay the function, as it was with eager imports).
    def __setattr__(self, name: str, value: Any) -> None:
        if name in _MODULES and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'replay' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
