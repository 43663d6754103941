"""``replay status``: what a checkpoint holds, read without taking its lock."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from replay.core.config import WindowSpec
from replay.core.errors import ConfigError, Location
from replay.core.timeutil import MICROS_PER_MS, NEG_INF, format_ts
from replay.core.window_kinds import shape_of
from replay.store.checkpoint import CheckpointStore
from replay.store.outputs import list_versions
from replay.store.records import Commit

__all__ = ["checkpoint_status", "output_watermarks"]


def _ts(value: int | None) -> str | None:
    return None if value is None or value == NEG_INF else format_ts(value)


def output_watermarks(
    store: CheckpointStore, commit: Commit, progress: Mapping[str, Any], windows: Iterable[WindowSpec]
) -> dict[str, int | None]:
    """Per window aggregation, the output watermark of its window stage after ``commit``:
    ``min(E_k, end of its oldest open window - 1 ms)``, no window before it is still to come.
    ``None`` while ``E_k`` has no value, and for a commit inside a pass (docs/outputs.md#passes),
    whose open windows are complete only at the pass's end."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    effective = {k["key"]: k["effective"] for k in progress["keys"]}
    found: dict[str, int | None] = {}
    for spec in windows:
        e_k = effective.get(spec.wm_key)
        if commit.carry or e_k is None or e_k == NEG_INF:
            found[spec.name] = None
            continue
        directory = commit.open_state.get(spec.name)
        starts = ds.dataset(store.root / directory).to_table(columns=["window_start"]) if directory else None
        if starts is None or not starts.num_rows:
            found[spec.name] = e_k
            continue
        oldest = pc.min(starts["window_start"].cast(pa.int64())).as_py()
        found[spec.name] = min(e_k, shape_of(spec).end(oldest) - MICROS_PER_MS)
    return found


def checkpoint_status(checkpoint: str | Path) -> dict[str, Any]:
    """The last commit of a checkpoint as JSON-able values (timestamps ISO 8601 UTC, ``None``: none yet).

    Keys: ``checkpoint``, ``output``, ``versions``, ``commits`` (retained), ``batch``, ``run``,
    ``finished``, ``lateness``, ``range``, ``stream_cut`` (origin -> [sequence, chunk]),
    ``keys`` (G_k, E_k, time window), ``open_windows`` and ``output_watermarks`` (per window
    aggregation),
    ``pending_buffers``, ``pending_tuples``, ``windows_emitted``, ``late_tuples``.

    ``corrupt`` lists newer commits that do not read intact or name missing files (the next
    run sets them aside and resumes from the commit shown).

    Raises:
        ConfigError: no checkpoint (or no commit yet) at ``checkpoint``.
        CheckpointCorruptError: the identity or every commit is truncated, edited or incomplete.
    """
    store = CheckpointStore(checkpoint)
    identity = store.identity()
    point = store.resume_point(identity["output"], repair=False) if identity else None
    commit = point.commit if point else None
    if identity is None or commit is None:
        raise ConfigError(
            "no committed checkpoint here",
            where=Location(file=str(checkpoint)),
            todo="run 'replay run' first, or pass the checkpoint directory a run wrote (see its output)",
            code="checkpoint.missing",
        )
    progress = store.snapshot(commit).progress
    ledger = commit.ledger
    return {
        "checkpoint": str(checkpoint),
        "output": identity["output"],
        "rules": identity.get("rules"),  # None: written before rules were versioned (replay.core.rules)
        "versions": list_versions(identity["output"]),
        "commits": [batch for batch in store.commits() if point is None or batch not in point.skipped_batches],
        "batch": commit.batch,
        "run": commit.run,
        "finished": commit.finish,
        "lateness": commit.lateness,
        "range": [_ts(v) for v in commit.range],
        "stream_cut": {int(o): c for o, c in sorted(progress["stream_cut"].items(), key=lambda kv: int(kv[0]))},
        "keys": [
            {
                "key": k["key"],
                "global": _ts(k["global"]),
                "effective": _ts(k["effective"]),
                "time_window_lower": _ts(k["time_window"][0]) if k["time_window"] else None,
                "time_window_upper": _ts(k["time_window"][1]) if k["time_window"] else None,
                "participants": k["participants"],
            }
            for k in progress["keys"]
        ],
        "open_windows": dict(ledger["open_windows"]),
        "output_watermarks": {
            name: _ts(value)
            for name, value in output_watermarks(
                store, commit, progress, [WindowSpec.model_validate(w) for w in identity["fields"]["windows"]]
            ).items()
        },
        "windows_emitted": dict(ledger["emitted_windows"]),
        "late_tuples": {k["key"]: ledger["late"][i] for i, k in enumerate(progress["keys"])},
        "pending_buffers": commit.pending_buffers,
        "pending_tuples": commit.pending_tuples,
        "gaps": progress["gaps"],
        # Newer commits that do not read intact (or name missing files): the next run sets them
        # aside and resumes from this one.
        "corrupt": list(point.skipped) if point else [],
    }
