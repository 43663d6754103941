"""``replay status``: what a checkpoint holds, read without taking its lock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replay.core.errors import ConfigError, Location
from replay.core.timeutil import NEG_INF, format_ts
from replay.store.checkpoint import CheckpointStore
from replay.store.outputs import list_versions

__all__ = ["checkpoint_status"]


def _ts(value: int | None) -> str | None:
    return None if value is None or value == NEG_INF else format_ts(value)


def checkpoint_status(checkpoint: str | Path) -> dict[str, Any]:
    """The last commit of a checkpoint as JSON-able values (timestamps ISO 8601 UTC, ``None``: none yet).

    Keys: ``checkpoint``, ``output``, ``versions``, ``commits`` (retained), ``batch``, ``run``,
    ``finished``, ``lateness``, ``range``, ``stream_cut`` (origin -> [sequence, chunk]),
    ``keys`` (G_k, E_k, time window), ``open_windows`` (per window aggregation),
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
        "versions": list_versions(identity["output"]),
        "commits": store.commits(),
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
        "windows_emitted": dict(ledger["emitted_windows"]),
        "late_tuples": {k["key"]: ledger["late"][i] for i, k in enumerate(progress["keys"])},
        "pending_buffers": commit.pending_buffers,
        "pending_tuples": commit.pending_tuples,
        "gaps": progress["gaps"],
        # Newer commits that do not read intact (or name missing files): the next run sets them
        # aside and resumes from this one.
        "corrupt": list(point.skipped) if point else [],
    }
