"""``CheckpointHook``: read a replay's checkpoint (stream cut, ``G_k`` per key, last batch) without its lock.

Used by the watermark trigger, the UI page and the operators. It only reads: a running replay
is never blocked, and what it sees is the last committed batch (commits are atomic renames).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from airflow.sdk import BaseHook

__all__ = ["CheckpointHook", "find_checkpoints"]

_IDENTITY = "checkpoint.json"


def find_checkpoints(*roots: str, max_depth: int = 6) -> list[str]:
    """Checkpoint directories (those holding ``checkpoint.json``) under local ``roots``, sorted.

    URI roots are skipped: listing object stores belongs to the replay runs themselves.
    """
    found: set[str] = set()
    for root in roots:
        if "://" in root or not os.path.isdir(root):
            continue
        base_depth = root.rstrip(os.sep).count(os.sep)
        for current, dirs, files in os.walk(root):
            if _IDENTITY in files:
                found.add(current)
                dirs[:] = []  # a checkpoint holds no other checkpoint
                continue
            if current.count(os.sep) - base_depth >= max_depth:
                dirs[:] = []
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in ("data", "versions", "state"))
    return sorted(found)


class CheckpointHook(BaseHook):
    """Reads one checkpoint directory. No Airflow connection: checkpoints live on paths under the roots.

    :param checkpoint: the checkpoint directory (a local path)
    """

    conn_name_attr = "checkpoint"
    hook_name = "Replay checkpoint"

    def __init__(self, *, checkpoint: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.checkpoint = str(checkpoint)

    def exists(self) -> bool:
        """Whether a replay has committed at least one batch here."""
        commits = Path(self.checkpoint) / "commits"
        return (Path(self.checkpoint) / _IDENTITY).is_file() and commits.is_dir() and any(commits.glob("*.json"))

    def holder(self) -> dict[str, Any] | None:
        """The live process holding the checkpoint's writer lock, or ``None`` (none, or it died)."""
        import json

        try:
            holder = json.loads((Path(self.checkpoint) / "holder.json").read_text())
        except (OSError, ValueError):
            return None
        if holder.get("host") == socket.gethostname():
            try:
                os.kill(int(holder["pid"]), 0)
            except (ProcessLookupError, ValueError, KeyError):
                return None
            except PermissionError:
                pass  # alive, owned by someone else
        return dict(holder)

    def status(self) -> dict[str, Any]:
        """``replay.checkpoint_status`` plus ``state`` and the output's publication.

        ``state``: ``running`` (a live writer holds the lock), ``interrupted`` (the last run stopped
        before its last batch; the next run resumes it) or ``finished``. ``published``: the version
        the output's ``current`` pointer names (``None``: nothing published); ``run_version``: the
        newest version a run wrote, and ``validated`` its verdict (``None``: not validated).

        Raises:
            ConfigError: no committed checkpoint here.
        """
        from replay.store.outputs import current_version, latest_run_version, read_validation
        from replay.store.status import checkpoint_status

        status = checkpoint_status(self.checkpoint)
        holder = self.holder()
        status["state"] = "running" if holder else ("finished" if status["finished"] else "interrupted")
        status["holder"] = holder
        output = status["output"]
        exists = os.path.isdir(output)
        status["published"] = current_version(output) if exists else None
        status["run_version"] = latest_run_version(output) if exists else None
        record = read_validation(output, status["run_version"]) if status["run_version"] is not None else None
        status["validated"] = None if record is None else bool(record.get("success"))
        return status

    def global_watermark(self, key: str | None = None) -> int | None:
        """``G_k`` of watermark key ``key`` in microseconds (``None``: no checkpoint or no watermark yet).

        ``key=None`` is the only key of a single-key job.

        Raises:
            ConfigError: ``key`` is not a key of this job, or ``None`` for a job with several keys.
        """
        from replay.core.errors import ConfigError, Location
        from replay.core.timeutil import parse_timestamp

        if not self.exists():
            return None
        from replay.store.status import checkpoint_status

        keys = {k["key"]: k["global"] for k in checkpoint_status(self.checkpoint)["keys"]}
        if key is None and len(keys) == 1:
            key = next(iter(keys))
        if key not in keys:
            raise ConfigError(
                f"watermark key {key!r} is not a key of the replay at this checkpoint; its keys are {sorted(keys)}",
                where=Location(file=self.checkpoint, field="key"),
                todo="pass one of those keys",
                code="airflow.unknown_key",
            )
        value = keys[key]
        return None if value is None else parse_timestamp(value)
