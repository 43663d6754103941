"""Replay: rebuild watermark progress and window aggregates from archived stream buffers.

The public API is listed here once; everything else is internal. Importing
``replay`` does not start Spark: sessions are built on first use (``replay.spark``).
"""

from __future__ import annotations

from replay.config import JobConfig, json_schema, load_config, parse_config
from replay.errors import (
    ArchiveReadError,
    ArchiveSchemaError,
    BadBufferError,
    ConfigError,
    ConflictingDuplicateError,
    DataError,
    EmptyArchiveError,
    ReplayError,
    WatermarkRegressionError,
)
from replay.generate import GenerateOptions, GenerateSummary, generate_archive
from replay.inspection import InspectReport, inspect_archive
from replay.progress import ProgressEngine, ProgressSnapshot

__all__ = [
    "ArchiveReadError",
    "ArchiveSchemaError",
    "BadBufferError",
    "ConfigError",
    "ConflictingDuplicateError",
    "DataError",
    "EmptyArchiveError",
    "GenerateOptions",
    "GenerateSummary",
    "InspectReport",
    "JobConfig",
    "ProgressEngine",
    "ProgressSnapshot",
    "ReplayError",
    "WatermarkRegressionError",
    "generate_archive",
    "inspect_archive",
    "json_schema",
    "load_config",
    "parse_config",
]
