"""The single-writer lock of a checkpoint: an OS file lock, and ``holder.json`` naming who holds it;
and the output's publication lock."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from replay.core.errors import ConcurrentWriterError, Location, ReplayError
from replay.store.durable import FORMAT_VERSION, read_json, write_json_atomic

__all__ = ["LockInfo", "holder", "one_publisher", "single_writer"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LockInfo:
    """Who holds (or held) the lock: process id, host, start time (ISO 8601) and command."""

    pid: int
    host: str
    started: str
    command: str


@contextmanager
def single_writer(root: Path, command: str = "replay run") -> Iterator[LockInfo | None]:
    """Hold the single-writer lock; yield the info of a dead holder whose lock was broken, if any.

    The lock is an OS file lock, released by the kernel when its process dies, so a dead
    holder cannot keep it; ``holder.json`` names the holder for the error message.

    Raises:
        ConcurrentWriterError: a live process holds the lock.
    """
    root.mkdir(parents=True, exist_ok=True)
    holder_path = root / "holder.json"
    file_lock = FileLock(root / ".lock", timeout=0)
    try:
        file_lock.acquire()
    except Timeout:
        current = holder(holder_path)
        who = (
            f"process {current.pid} on {current.host} (started {current.started}: {current.command})"
            if current
            else "another process"
        )
        raise ConcurrentWriterError(
            f"the checkpoint is being written by {who}",
            where=Location(file=str(root)),
            todo="wait for that run to finish (one writer per checkpoint), or stop it; "
            "a lock left by a dead process is broken automatically",
        ) from None
    try:
        stale = holder(holder_path)
        info = LockInfo(
            pid=os.getpid(),
            host=socket.gethostname(),
            started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            command=command,
        )
        write_json_atomic(holder_path, {"format_version": FORMAT_VERSION, **dataclasses.asdict(info)})
        yield stale
    finally:
        holder_path.unlink(missing_ok=True)
        file_lock.release()


def holder(path: Path) -> LockInfo | None:
    """Who ``holder.json`` says holds the lock (``None``: nobody, or it cannot be read)."""
    try:
        document = read_json(path)
    except (OSError, ValueError, ReplayError):
        return None
    return LockInfo(
        pid=int(document["pid"]),
        host=str(document["host"]),
        started=str(document["started"]),
        command=str(document["command"]),
    )


@contextmanager
def one_publisher(output: Path) -> Iterator[None]:
    """Hold the output's publication lock (``.publish.lock``), waiting for another ``publish`` of
    the same output to end first: two DAGs publishing one output (a scheduled replay's and a
    backfill's) then publish one after the other, each against the publication the other left,
    instead of the later pointer switch silently dropping the earlier publication. An OS file
    lock: a dead publisher's lock is released by the kernel."""
    with FileLock(output / ".publish.lock"):
        yield
