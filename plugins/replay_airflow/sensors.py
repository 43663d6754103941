"""``WatermarkSensor``: wait until a replay's global watermark ``G_k`` passes a timestamp (deferrable)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator

__all__ = ["WatermarkSensor"]


class WatermarkSensor(BaseSensorOperator):
    """Succeeds once ``G_k >= target`` at ``checkpoint``: every tuple before ``target`` is replayed.

    Deferrable by default: the wait happens in the triggerer (``WatermarkTrigger``), not in a
    worker slot. With ``deferrable=False`` it pokes like a classic sensor.

    :param checkpoint: checkpoint directory, relative to the checkpoint root (templated)
    :param target: ISO 8601 timestamp with an offset, or an aware ``datetime`` (templated,
        e.g. ``"{{ data_interval_end }}"``)
    :param key: watermark key (templated); ``None`` for a job with one key
    :param poll_interval: seconds between two readings of the checkpoint (templated)
    :param deferrable: wait in the triggerer (default) or in the worker
    """

    template_fields = ("checkpoint", "target", "key", "poll_interval")

    def __init__(
        self,
        *,
        checkpoint: str,
        target: str | datetime,
        key: str | None = None,
        poll_interval: float | str = 30.0,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        # A templated interval ("{{ params.poll_interval }}") is known only once rendered (see ``execute``).
        try:
            poke_interval = float(poll_interval)
        except (TypeError, ValueError):
            poke_interval = 30.0
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.checkpoint = checkpoint
        self.target = target
        self.key = key
        self.poll_interval = poll_interval
        self.deferrable = deferrable

    def _resolved(self) -> tuple[str, int]:
        from replay.core.errors import ConfigError, Location
        from replay.core.timeutil import parse_timestamp
        from replay_airflow.roots import configured_roots

        checkpoint = configured_roots().resolve("checkpoint", self.checkpoint, param="checkpoint")
        try:
            target = parse_timestamp(self.target if isinstance(self.target, datetime) else str(self.target))
        except ValueError as exc:
            raise ConfigError(
                f"the sensor's target {self.target!r}: {exc}",
                where=Location(field="target"),
                todo="pass an ISO 8601 timestamp with an offset, e.g. '{{ data_interval_end }}'",
                code="airflow.bad_target",
            ) from exc
        return checkpoint, target

    def poke(self, context: Any) -> bool:
        from replay_airflow.hooks import CheckpointHook

        checkpoint, target = self._resolved()
        current = CheckpointHook(checkpoint=checkpoint).global_watermark(self.key or None)
        return current is not None and current >= target

    def execute(self, context: Any) -> Any:
        from replay_airflow.operators import task_errors

        with task_errors():
            self.poke_interval = float(self.poll_interval)
            if not self.deferrable:
                return super().execute(context)
            if self.poke(context):
                self.log.info("G_k already at or past the target; no need to wait")
                return None
            from replay_airflow.triggers import WatermarkTrigger

            checkpoint, target = self._resolved()
        self.defer(
            trigger=WatermarkTrigger(
                checkpoint=checkpoint, target=target, key=self.key or None, poll_interval=float(self.poll_interval)
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=float(self.timeout)) if self.timeout is not None else None,
        )

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        if not event or event.get("status") != "reached":
            raise AirflowFailException(f"the watermark trigger stopped without reaching the target: {event}")
        self.log.info(
            "G_k %s reached the target %s after %s readings", event["global"], event["target"], event["readings"]
        )
        return event
