"""The Airflow Assets the Replay DAGs update and consume."""

from __future__ import annotations

from airflow.sdk import Asset

__all__ = ["PUBLISHED_WINDOWS"]

#: The windows published by ``replay_scheduled``. Its events carry ``extra = {output, version, source}``:
#: the output directory, the publication version ``current`` now names, and the run version it came from.
PUBLISHED_WINDOWS = Asset(name="replay_published_windows", uri="x-replay://scheduled/windows", group="replay")
