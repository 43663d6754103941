"""What every suite is built from: the job configuration and the facts a version records."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from replay.core.config import JobConfig
    from replay.engine.archive import ArchiveLayout
    from replay.store.manifest import Manifest

__all__ = ["SuiteInputs"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SuiteInputs:
    """One output version, ready to be validated.

    ``effective`` maps each watermark key to ``E_k`` at the end of the version's run
    (integer microseconds; ``NEG_INF`` when no watermark yet). ``range`` is the
    backfill range ``[start, end)`` (``None`` on either side: unbounded).
    ``tables`` holds the version's tables as Spark DataFrames. ``manifest`` is the
    version's manifest, typed (``ledger_batches``, ``origins``, ``counts``, ``files``).
    """

    spark: SparkSession
    config: JobConfig
    layout: ArchiveLayout
    mode: str
    effective: Mapping[str, int]
    range: tuple[int | None, int | None]
    tables: Mapping[str, DataFrame]
    manifest: Manifest
    version: int
    late_per_key: Mapping[str, int]  # rows of the late table per watermark key
    #: The event-time range the run replayed (differs from ``range`` for a merged publication, whose
    #: windows outside it are the previous publication's, given in ``previous_windows``).
    recompute_range: tuple[int | None, int | None] = (None, None)
    previous_windows: DataFrame | None = None

    @property
    def aggregation_columns(self) -> list[str]:
        """The ``windows`` table's aggregation columns: the union over the window aggregations, in order."""
        return list(dict.fromkeys(a.output_name for spec in self.config.windows for a in spec.aggregations))
