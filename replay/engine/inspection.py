"""``replay inspect``: metadata-only progress analysis of an archive.

Reads the Parquet footers, extracts per-buffer metadata with one Spark
aggregation, and runs the progress engine over it. No tuple is aggregated into
windows and none reaches the driver.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from replay.core.buffer import NULL_TIME, PackedBuffers
from replay.core.progress import Decision, KeySettings, ProgressEngine, ProgressSnapshot, arrival_order
from replay.core.timeutil import format_duration, format_ts
from replay.engine.archive import ArchiveLayout, inspect_schema, resolve_lateness
from replay.engine.buffers import Buffer, BufferScan, scan_buffers

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from replay.core.config import JobConfig

__all__ = ["InspectReport", "engine_for", "inspect_archive", "participants_of", "track_progress"]


@dataclass(frozen=True, slots=True, kw_only=True)
class InspectReport:
    """What ``replay inspect`` found."""

    config: JobConfig
    layout: ArchiveLayout
    lateness: str
    scan: BufferScan
    progress: ProgressSnapshot

    @property
    def has_errors(self) -> bool:
        """Findings that would stop ``replay run``: conflicts or regressions under ``fail``."""
        conflicts = self.config.on_conflict == "fail" and bool(self.scan.conflicts)
        regressions = any(r.action == "held" for r in self.progress.regressions)
        return conflicts or regressions

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able summary: per origin and key, per key, and the integrity findings."""
        dup_copies = Counter(d.origin for d in self.scan.duplicates)
        dup_tuples: Counter[int] = Counter()
        for dup in self.scan.duplicates:
            dup_tuples[dup.origin] += dup.tuples
        conflicts = Counter(c.origin for c in self.scan.conflicts)
        regressions = Counter((r.origin, r.key) for r in self.progress.regressions)
        gaps = Counter(o for o, _ in self.progress.gaps)
        origins = []
        for row in self.progress.origins:
            origins.append(
                {
                    "origin_id": row.origin,
                    "wm_key": row.key,
                    "complete_prefix": row.complete_prefix,
                    "local_watermark": format_ts(row.local_watermark),
                    "pending_buffers": row.pending_buffers,
                    "gaps": gaps[row.origin],
                    "duplicates": dup_copies[row.origin],
                    "duplicate_tuples": dup_tuples[row.origin],
                    "conflicts": conflicts[row.origin],
                    "regressions": regressions[(row.origin, row.key)],
                    "idle": row.idle,
                    "counted": row.counted,
                    "stream_cut": list(self.progress.stream_cut.get(row.origin, (0, 0))),
                }
            )
        keys = []
        for key in self.progress.keys:
            spec = next(k for k in self.layout.keys if k.name == key.key)
            window = key.time_window
            keys.append(
                {
                    "wm_key": key.key,
                    "event_time": spec.event_time,
                    "watermark": spec.watermark or "(event time)",
                    "allowed_lateness": format_duration(spec.allowed_lateness),
                    "global_watermark": format_ts(key.global_watermark),
                    "effective_watermark": format_ts(key.effective_watermark),
                    "time_window_lower": format_ts(window[0]) if window else None,
                    "time_window_upper": format_ts(window[1]) if window else None,
                    "participants": list(key.participants),
                }
            )
        return {
            "archive": self.config.archive,
            "files": len(self.layout.files),
            "lateness": self.lateness,
            "rows_read": self.scan.rows_read,
            "tuples_read": self.scan.tuples_read,
            "buffers": len(self.scan.buffers),
            "origins": origins,
            "keys": keys,
            "integrity": {
                "gaps": [{"origin_id": o, "sequence_number": s} for o, s in self.progress.gaps],
                "incomplete": [{"origin_id": o, "sequence_number": s} for o, s in self.progress.incomplete],
                "skipped": [
                    {"origin_id": s.origin, "sequence_number": s.sequence, "chunks": list(s.chunks)}
                    for s in self.progress.skipped
                ],
                "duplicates": [
                    {
                        "origin_id": d.origin,
                        "sequence_number": d.sequence,
                        "chunk_number": d.chunk,
                        "file": d.file,
                        "kept_file": d.kept_file,
                        "tuples": d.tuples,
                    }
                    for d in self.scan.duplicates
                ],
                "conflicts": [
                    {
                        "origin_id": c.origin,
                        "sequence_number": c.sequence,
                        "chunk_number": c.chunk,
                        "kept_file": c.kept_file,
                        "other_file": c.other_file,
                        "action": "kept first" if self.config.on_conflict == "keep_first" else "would fail the run",
                    }
                    for c in self.scan.conflicts
                ],
                "regressions": [
                    {
                        "origin_id": r.origin,
                        "sequence_number": r.sequence,
                        "wm_key": r.key,
                        "watermark": format_ts(r.watermark),
                        "previous": format_ts(r.previous),
                        "action": "clamped" if r.action == "clamped" else "would fail the run",
                    }
                    for r in self.progress.regressions
                ],
            },
            "errors": self.has_errors,
        }


def participants_of(buffers: Sequence[Buffer], layout: ArchiveLayout) -> dict[str, set[int]]:
    """Per key, the origins with a non-null watermark for it on some buffer (docs/archive.md#watermark-keys)."""
    result: dict[str, set[int]] = {k.name: set() for k in layout.keys}
    if isinstance(buffers, PackedBuffers):
        import numpy as np

        origins = buffers.column("origin")
        for i, key in enumerate(layout.keys):
            result[key.name] = set(np.unique(origins[buffers.watermark_column(i) != NULL_TIME]).tolist())
        return result
    for buf in buffers:
        for key, value in zip(layout.keys, buf.watermarks, strict=True):
            if value is not None:
                result[key.name].add(buf.origin)
    return result


def engine_for(
    config: JobConfig, layout: ArchiveLayout, lateness: str, buffers: Sequence[Buffer], *, strict: bool
) -> ProgressEngine:
    """A progress engine configured from the job, with the participants found in ``buffers``."""
    return ProgressEngine(
        keys=[
            KeySettings(name=k.name, allowed_lateness=k.allowed_lateness, derived=k.watermark is None)
            for k in layout.keys
        ],
        mode=lateness,
        participants=participants_of(buffers, layout),
        expected_origins=config.expected_origins,
        chunk_base=config.chunk_base,
        gap_policy=config.gap_policy,
        watermark_regression=config.watermark_regression,
        idle_timeout=config.idle_timeout,
        strict=strict,
    )


def inspect_archive(
    config: JobConfig,
    *,
    spark: SparkSession | None = None,
    on_step: Callable[[str, int, int], None] | None = None,
) -> InspectReport:
    """Analyse the archive's progress from buffer metadata alone.

    ``on_step(step, done, total)`` reports progress (steps: ``footers``, ``buffers``, ``progress``).
    Conflicts and regressions that would stop a run are reported, not raised.

    Raises:
        ReplayError: unreadable files, schema errors, malformed buffers (docs/errors.md#bad-input).
    """
    from replay.engine.readers import driver_threads, read_progress
    from replay.engine.spark import driver_arrow_memory, get_session, job_progress, planned_master

    driver_arrow_memory()

    def step(name: str, done: int, total: int) -> None:
        if on_step is not None:
            on_step(name, done, total)

    layout = inspect_schema(config, on_file=lambda done, total: step("footers", done, total))
    lateness = resolve_lateness(config, layout)
    # With a local master the scan reads in the driver's threads: no SparkSession is started.
    threads = driver_threads(spark) if spark is not None else driver_threads(None, planned_master(config.spark))
    # Progress: files read (driver's threads), or Spark's finished tasks; no poller unless someone listens.
    report = (lambda done, total: step("buffers", done, total)) if on_step is not None else None
    if threads is not None:
        with read_progress(report):
            scan = scan_buffers(spark, layout, config, strict=False, threads=threads)
    else:
        session = spark or get_session(config.spark)
        with job_progress(session, report):
            scan = scan_buffers(session, layout, config, strict=False)
    step("progress", 0, len(scan.buffers))
    snapshot, _ = track_progress(config, layout, lateness, scan.buffers, strict=False)
    step("progress", len(scan.buffers), len(scan.buffers))
    return InspectReport(config=config, layout=layout, lateness=lateness, scan=scan, progress=snapshot)


def track_progress(
    config: JobConfig, layout: ArchiveLayout, lateness: str, buffers: Sequence[Buffer], *, strict: bool
) -> tuple[ProgressSnapshot, list[Decision]]:
    """One run over ``buffers`` in the mode's order: the final progress and every lateness decision."""
    engine = engine_for(config, layout, lateness, buffers, strict=strict)
    ordered = arrival_order(buffers) if lateness == "arrival" else sorted(buffers, key=lambda b: b.identity)
    decisions = engine.feed(ordered)
    decisions += engine.finish()
    return engine.snapshot(), decisions
