"""The small job the run-loop tests share: one tumbling window of 1 s counting rows and summing
``value``, its output and checkpoint under a test's own directory; and the tables that depend
only on the archive and the job, to compare two runs by."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replay.core.config import JobConfig, parse_config
from replay.core.timeutil import parse_timestamp
from replay.store.digest import digest

T0 = parse_timestamp("2026-01-01T00:00:00Z")
SECOND = 1_000_000
RESULTS = ("windows", "late", "integrity")


def small_job(root: Path, archive: Path, **extra: Any) -> JobConfig:
    """The job over ``archive``, writing under ``root`` (``out``, ``ckpt``); ``extra`` settings on top."""
    return parse_config(
        {
            "archive": str(archive),
            "output": str(root / "out"),
            "checkpoint": str(root / "ckpt"),
            "windows": [
                {"name": "w", "size": "1s", "aggregations": [{"fn": "count"}, {"fn": "sum", "column": "value"}]}
            ],
            **extra,
        }
    )


def results(config: JobConfig) -> dict[str, str]:
    """The digests of ``RESULTS`` in the job's output."""
    assert config.output is not None
    found = digest(config.output)
    return {table: found[table] for table in RESULTS}
