"""Replay: rebuild watermark progress and window aggregates from archived stream buffers.

The public API is listed here once; everything else is internal. Importing
``replay`` does not start Spark: sessions are built on first use (``replay.spark``).
"""

from __future__ import annotations

from replay.config import JobConfig, json_schema, load_config, parse_config
from replay.digest import digest, show_lines
from replay.errors import (
    ArchiveReadError,
    ArchiveSchemaError,
    BadBufferError,
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

__all__ = [
    "ArchiveReadError",
    "ArchiveSchemaError",
    "BadBufferError",
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
