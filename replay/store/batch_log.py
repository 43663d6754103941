"""The batch log of a checkpoint: ``batches.jsonl``, one line per committed batch, chained by sha256.

A commit holds a pointer into it (lines, bytes, chain hash): the log up to the pointer is the
run's history, read back and checked only when an output version is written; a line beyond
the newest commit's pointer belongs to a batch that never committed and is dropped at the
next append.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from replay.store.durable import corrupt, fsync_dir
from replay.store.records import LogEntry, LogPointer

__all__ = ["LOG_NAME", "append_log", "read_log"]

LOG_NAME = "batches.jsonl"


def _chain(previous: str, line: bytes) -> str:
    return hashlib.sha256(previous.encode() + line).hexdigest()


def append_log(root: Path, entry: LogEntry, after: LogPointer) -> LogPointer:
    """Append ``entry`` after the log's first ``after.size`` bytes (anything beyond them is a
    line of a batch that never committed, and goes) and make it durable; the pointer to write
    into the batch's commit."""
    line = (json.dumps(entry.to_json(), sort_keys=True, separators=(",", ":")) + "\n").encode()
    path = root / LOG_NAME
    created = not path.exists()
    with open(path, "ab") as handle:
        if handle.tell() != after.size:
            handle.truncate(after.size)
            handle.seek(after.size)
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())
    if created:
        fsync_dir(root)
    return LogPointer(lines=after.lines + 1, size=after.size + len(line), chain=_chain(after.chain, line))


def read_log(root: Path, upto: LogPointer, since: LogPointer | None = None) -> list[LogEntry]:
    """The batch log's entries up to ``upto`` (after ``since``, a pointer of an earlier commit,
    when given), each checked against the pointers' sha256 chain.

    Raises:
        CheckpointCorruptError: the log is shorter than the pointer, or a line was changed
            (or ``since`` does not point into the same log).
    """
    path = root / LOG_NAME
    since = since or LogPointer()
    if upto.lines == since.lines:
        return []
    try:
        with open(path, "rb") as handle:
            handle.seek(since.size)
            data = handle.read(max(upto.size - since.size, 0))
    except FileNotFoundError:
        raise corrupt(path, "is missing") from None
    lines = data.splitlines(keepends=True)
    chain = since.chain
    for line in lines:
        chain = _chain(chain, line)
    if len(data) != upto.size - since.size or len(lines) != upto.lines - since.lines or chain != upto.chain:
        raise corrupt(path, f"does not match the sha256 chain of its first {upto.lines} line(s)")
    try:
        return [LogEntry.from_json(json.loads(line)) for line in lines]
    except (ValueError, KeyError, TypeError) as exc:
        raise corrupt(path, f"holds a line this Replay does not read: {exc}") from exc
