"""``WatermarkTrigger``: fires once a replay checkpoint's global watermark ``G_k`` reaches a timestamp.

Runs in Airflow's triggerer (or inline under ``airflow dags test``). It polls the checkpoint's
last commit with ``CheckpointHook`` in a worker thread, so the triggerer's event loop never
blocks on the file system.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from replay_airflow._compat import BaseTrigger, TriggerEvent

__all__ = ["WatermarkTrigger"]


def _reading(checkpoint: str, key: str | None) -> int | None:
    from replay_airflow.hooks import CheckpointHook

    return CheckpointHook(checkpoint=checkpoint).global_watermark(key)


class WatermarkTrigger(BaseTrigger):  # type: ignore[misc]  # BaseTrigger is untyped (see _compat)
    """Yields one event once ``G_k >= target`` at ``checkpoint``.

    ``G_k >= target`` means every tuple of key ``key`` with an event time before ``target`` has
    been replayed: the range ``(-inf, target)`` is complete. A missing checkpoint is waited for
    (the replay may not have started yet).

    :param checkpoint: checkpoint directory
    :param target: microseconds since the epoch
    :param key: watermark key; ``None`` for a job with one key
    :param poll_interval: seconds between two readings
    """

    def __init__(self, *, checkpoint: str, target: int, key: str | None = None, poll_interval: float = 30.0) -> None:
        super().__init__()
        self.checkpoint = checkpoint
        self.target = int(target)
        self.key = key
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "checkpoint": self.checkpoint,
                "target": self.target,
                "key": self.key,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[Any]:
        from replay.core.errors import ReplayError
        from replay.core.timeutil import format_ts

        readings = 0
        while True:
            try:
                current = await asyncio.to_thread(_reading, self.checkpoint, self.key)
            except ReplayError as exc:
                yield TriggerEvent({"status": "error", "message": exc.message, "readings": readings + 1})
                return
            readings += 1
            if current is not None and current >= self.target:
                yield TriggerEvent(
                    {
                        "status": "reached",
                        "checkpoint": self.checkpoint,
                        "key": self.key,
                        "global": format_ts(current),
                        "target": format_ts(self.target),
                        "readings": readings,
                    }
                )
                return
            self.log.info(
                "G_k at %s is %s, waiting for %s",
                self.checkpoint,
                format_ts(current) if current is not None else "not there yet",
                format_ts(self.target),
            )
            await asyncio.sleep(self.poll_interval)
