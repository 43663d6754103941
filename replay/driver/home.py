"""Where a kept driver says how to reach it: a directory holding ``driver.json`` (its process, its
address and its Spark master) and ``key``, the secret a client proves it knows before the driver
reads a word from it. Both are readable by the driver's user only; a deployment shares the directory
with the processes allowed to send runs (an Airflow worker, say)."""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay.core.errors import DriverError, Location
from replay.store.durable import write_json_atomic

__all__ = ["DriverHome", "default_home"]

_ENV = "REPLAY_DRIVER"


def default_home() -> Path:
    """``$REPLAY_DRIVER``, else ``~/.replay/driver``."""
    given = os.environ.get(_ENV)
    return Path(given) if given else Path.home() / ".replay" / "driver"


@dataclass(frozen=True, slots=True)
class DriverHome:
    path: Path

    @property
    def record(self) -> Path:
        return self.path / "driver.json"

    @property
    def key_file(self) -> Path:
        return self.path / "key"

    def new_key(self) -> bytes:
        """A new secret, written for the driver's user only (the directory too)."""
        self.path.mkdir(parents=True, exist_ok=True)
        os.chmod(self.path, 0o700)
        key = secrets.token_bytes(32)
        tmp = self.key_file.with_name(f".key.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(key)
        os.replace(tmp, self.key_file)
        return key

    def publish(self, details: dict[str, Any]) -> None:
        write_json_atomic(self.record, details)

    def withdraw(self, pid: int) -> None:
        """Remove the record and the key if they are still this process's (a newer driver may have
        replaced them)."""
        try:
            if json.loads(self.record.read_text()).get("pid") == pid:
                self.key_file.unlink(missing_ok=True)
                self.record.unlink()
        except (OSError, ValueError):
            pass

    def details(self) -> dict[str, Any]:
        """The driver's record.

        Raises:
            DriverError: no driver has published one here (``driver.unreachable``).
        """
        try:
            found: dict[str, Any] = json.loads(self.record.read_text())
            found["key"] = self.key_file.read_bytes()
            return found
        except (OSError, ValueError) as exc:
            raise DriverError(
                f"no Replay driver runs with its home at {self.path} ({type(exc).__name__}: {exc})",
                where=Location(file=str(self.record)),
                code="driver.unreachable",
                todo=f"start one with 'replay driver serve --dir {self.path}', point --driver (or "
                "REPLAY_DRIVER) at a running driver's directory, or run without a driver",
            ) from exc
