"""Checkpoint storage (docs/outputs.md#checkpoints): single-writer lock, intents, atomic commits, retention.

A checkpoint is a local directory::

    checkpoint.json            identity: format_version, id, fingerprint and its fields, output
    .lock, holder.json         the single-writer lock (an OS file lock) and who holds it
    intents/<batch>.json       written before a batch is processed: its cut
    commits/<batch>.json       written atomically once the batch's outputs are staged
    state/...                  Parquet written by batches: buffer metadata, open windows

The commit is the only source of truth: a file under ``state/`` (or an output
directory of this checkpoint) that no commit references is a leftover of a batch
that crashed before its commit, and ``remove_unreferenced`` deletes it.

Every JSON document is written by ``write_json_atomic`` (temporary file, fsync,
rename, fsync of the directory) and carries ``format_version``. The checkpoint's own
records (identity, intents, commits) also carry the sha256 of their payload, checked on
read: a truncated or edited file is ``checkpoint.corrupt``, never a raw parse error and
never silently trusted. ``resume_point`` picks the newest commit that reads intact and
whose files all exist, setting the broken newer ones aside with a note.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from replay.errors import (
    CheckpointCorruptError,
    CheckpointStateError,
    ConcurrentWriterError,
    IncompatibleCheckpointError,
    Location,
    ReplayError,
)

__all__ = [
    "FORMAT_VERSION",
    "RECORD_FORMAT_VERSION",
    "CheckpointStore",
    "LockInfo",
    "ResumePoint",
    "read_record",
    "write_json_atomic",
    "write_record",
]

#: The format of the output location's JSON documents (manifests, validation records, pointer).
FORMAT_VERSION = 1
#: The format of the checkpoint's records: version 2 adds the payload's sha256 (version 1,
#: without it, is still read).
RECORD_FORMAT_VERSION = 2


def write_json_atomic(path: Path, document: Mapping[str, Any], *, compact: bool = False) -> None:
    """Write ``document`` to ``path`` so that a reader sees the old file or the new one, never a part.

    ``compact`` writes one line (json's C encoder; an indented document goes through its pure-Python
    encoder, which dominated the cost of a commit): for the checkpoint's machine records.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    text = (
        json.dumps(document, sort_keys=True, separators=(",", ":"))
        if compact
        else json.dumps(document, indent=1, sort_keys=True)
    )
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _payload_digest(payload: Mapping[str, Any]) -> str:
    """sha256 of a record's payload (everything but ``format_version`` and ``sha256``), canonical JSON."""
    body = {k: v for k, v in payload.items() if k not in ("format_version", "sha256")}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def write_record(path: Path, payload: Mapping[str, Any]) -> None:
    """Write a checkpoint record atomically, with ``format_version`` and the payload's ``sha256``."""
    body = {k: v for k, v in payload.items() if k not in ("format_version", "sha256")}
    write_json_atomic(
        path, {"format_version": RECORD_FORMAT_VERSION, "sha256": _payload_digest(body), **body}, compact=True
    )


def _corrupt(path: Path, what: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"checkpoint file {path.name} {what}",
        where=Location(file=str(path)),
        todo="restore the checkpoint directory from a backup, or start over with a new --checkpoint "
        "and --output (the archive is untouched, so a new replay rebuilds everything)",
    )


def read_record(path: Path) -> dict[str, Any]:
    """Read a checkpoint record written by ``write_record`` and check its checksum.

    Raises:
        CheckpointCorruptError: the file is missing, is not JSON (truncated), or its payload does
            not match its ``sha256`` (edited).
        CheckpointStateError: a format version this Replay does not read.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except FileNotFoundError:
        raise _corrupt(path, "is missing") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _corrupt(path, f"is not valid JSON (truncated or overwritten): {exc}") from exc
    if not isinstance(document, dict):
        raise _corrupt(path, "does not hold a JSON object")
    version = document.get("format_version")
    if version == RECORD_FORMAT_VERSION:
        if document.get("sha256") != _payload_digest(document):
            raise _corrupt(path, "does not match its sha256: it was changed after it was written")
        return {k: v for k, v in document.items() if k != "sha256"}
    if version == 1:  # written before records carried checksums
        return document
    raise CheckpointStateError(
        f"unsupported checkpoint format version {version!r} (this replay reads 1 and {RECORD_FORMAT_VERSION})",
        where=Location(file=str(path)),
        todo="use the replay version that wrote this checkpoint, or start a new checkpoint directory",
    )


def _read_json(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        document: dict[str, Any] = json.load(handle)
    version = document.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointStateError(
            f"unsupported checkpoint format version {version!r} (this replay reads {FORMAT_VERSION})",
            where=Location(file=str(path)),
            todo="use the replay version that wrote this checkpoint, or start a new checkpoint directory",
        )
    return document


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumePoint:
    """Where a run continues: the newest intact commit (``None``: start from nothing) and what was
    set aside to get there (one line per skipped commit, naming the file and the fault)."""

    commit: dict[str, Any] | None
    skipped: tuple[str, ...] = ()


def _diff(stored: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    return sorted(name for name in set(stored) | set(current) if stored.get(name) != current.get(name))


@dataclass(frozen=True, slots=True, kw_only=True)
class LockInfo:
    """Who holds (or held) the lock: process id, host, start time (ISO 8601) and command."""

    pid: int
    host: str
    started: str
    command: str


class CheckpointStore:
    """One checkpoint directory. Methods that write must be called while holding ``lock()``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    # -- identity -----------------------------------------------------------------------------

    def identity(self) -> dict[str, Any] | None:
        path = self.root / "checkpoint.json"
        return read_record(path) if path.exists() else None

    def bind(self, *, fingerprint: str, fields: Mapping[str, Any], output: str) -> dict[str, Any]:
        """Create the checkpoint's identity, or check that this job may continue it.

        Raises:
            IncompatibleCheckpointError: the stored fingerprint differs (naming the fields),
                or the checkpoint writes to another output location.
        """
        stored = self.identity()
        if stored is None:
            identity = {
                "id": uuid.uuid4().hex[:12],
                "fingerprint": fingerprint,
                "fields": dict(fields),
                "output": output,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            write_record(self.root / "checkpoint.json", identity)
            return {"format_version": RECORD_FORMAT_VERSION, **identity}
        if stored["fingerprint"] != fingerprint:
            differing = _diff(stored["fields"], fields)
            raise IncompatibleCheckpointError(
                "the checkpoint was written by a job with different "
                + ", ".join(f"'{name}'" for name in differing)
                + " settings, so its state cannot be continued",
                where=Location(
                    file=str(self.root),
                    extra={name: f"{stored['fields'].get(name)!r} -> {fields.get(name)!r}" for name in differing},
                ),
                todo="restore the job's previous settings, or run with a new --checkpoint directory "
                "(and a new --output) to replay from scratch",
            )
        if stored["output"] != output:
            raise IncompatibleCheckpointError(
                f"the checkpoint writes to output {stored['output']!r}, not {output!r}",
                where=Location(file=str(self.root)),
                todo=f"run with --output {stored['output']}, or use a new --checkpoint directory",
            )
        return stored

    # -- the single-writer lock ---------------------------------------------------------------

    @contextmanager
    def lock(self, command: str = "replay run") -> Iterator[LockInfo | None]:
        """Hold the single-writer lock; yield the info of a dead holder whose lock was broken, if any.

        The lock is an OS file lock, released by the kernel when its process dies, so a dead
        holder cannot keep it; ``holder.json`` names the holder for the error message.

        Raises:
            ConcurrentWriterError: a live process holds the lock.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        holder_path = self.root / "holder.json"
        file_lock = FileLock(self.root / ".lock", timeout=0)
        try:
            file_lock.acquire()
        except Timeout:
            holder = self._holder(holder_path)
            who = (
                f"process {holder.pid} on {holder.host} (started {holder.started}: {holder.command})"
                if holder
                else "another process"
            )
            raise ConcurrentWriterError(
                f"the checkpoint is being written by {who}",
                where=Location(file=str(self.root)),
                todo="wait for that run to finish (one writer per checkpoint), or stop it; "
                "a lock left by a dead process is broken automatically",
            ) from None
        try:
            stale = self._holder(holder_path)
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

    @staticmethod
    def _holder(path: Path) -> LockInfo | None:
        try:
            document = _read_json(path)
        except (OSError, ValueError, ReplayError):
            return None
        return LockInfo(
            pid=int(document["pid"]),
            host=str(document["host"]),
            started=str(document["started"]),
            command=str(document["command"]),
        )

    # -- intents and commits ------------------------------------------------------------------

    def _numbered(self, folder: str) -> list[int]:
        directory = self.root / folder
        if not directory.exists():
            return []
        return sorted(int(p.stem) for p in directory.glob("*.json") if p.stem.isdigit())

    def write_intent(self, batch: int, intent: Mapping[str, Any]) -> None:
        write_record(self.root / "intents" / f"{batch:08d}.json", intent)

    def pending_intent(self) -> dict[str, Any] | None:
        """The intent of a batch that was started but not committed, if any.

        Raises:
            CheckpointCorruptError: that intent does not read intact.
        """
        commits = self._numbered("commits")
        last = commits[-1] if commits else 0
        later = [n for n in self._numbered("intents") if n > last]
        return read_record(self.root / "intents" / f"{later[-1]:08d}.json") if later else None

    def commit(self, batch: int, record: Mapping[str, Any]) -> None:
        """Commit a batch atomically; from here on its staged files are part of the state."""
        write_record(self.root / "commits" / f"{batch:08d}.json", record)

    def latest(self) -> dict[str, Any] | None:
        """The newest commit, or ``None`` for a new checkpoint.

        Raises:
            CheckpointCorruptError: it does not read intact (``resume_point`` falls back instead).
        """
        commits = self._numbered("commits")
        return read_record(self.root / "commits" / f"{commits[-1]:08d}.json") if commits else None

    def resume_point(self, missing: Callable[[Mapping[str, Any]], list[str]], *, repair: bool) -> ResumePoint:
        """The newest commit that reads intact and whose files all exist (``missing(commit)`` lists
        the ones that do not).

        Newer commits that fail are reported in ``skipped``; with ``repair`` (the writer, under the
        lock) they are renamed ``<batch>.json.corrupt`` so that the run redoes those batches from
        their intents, as after a crash. ``replay status`` reads without ``repair``.

        Raises:
            CheckpointCorruptError: commits exist but none is intact.
        """
        commits = self._numbered("commits")
        skipped: list[str] = []
        bad: list[Path] = []
        for batch in reversed(commits):
            path = self.root / "commits" / f"{batch:08d}.json"
            try:
                record = read_record(path)
            except CheckpointCorruptError as error:
                skipped.append(f"commit {batch}: {error.message}")
                bad.append(path)
                continue
            absent = missing(record)
            if absent:
                shown = ", ".join(absent[:3]) + (f" and {len(absent) - 3} more" if len(absent) > 3 else "")
                skipped.append(f"commit {batch}: {len(absent)} file(s) it names are missing ({shown})")
                bad.append(path)
                continue
            if repair:
                for path in bad:
                    os.replace(path, path.with_name(path.name + ".corrupt"))
                if bad:
                    fsync_dir(self.root / "commits")
            return ResumePoint(commit=record, skipped=tuple(skipped))
        if commits:
            raise CheckpointCorruptError(
                f"none of the checkpoint's {len(commits)} commit(s) is intact: " + "; ".join(skipped),
                where=Location(file=str(self.root / "commits")),
                todo="restore the checkpoint directory from a backup, or start over with a new --checkpoint "
                "and --output (the archive is untouched, so a new replay rebuilds everything)",
            )
        return ResumePoint(commit=None)

    def commits(self) -> list[int]:
        return self._numbered("commits")

    def commit_files(self, commit: Mapping[str, Any], output: str | Path) -> list[str]:
        """Every file or directory ``commit`` names: output data (under ``output``), buffer state
        and open-window state (under the checkpoint)."""
        out = Path(output)
        files = [str(out / p) for table in ("windows", "late", "progress") for p in commit["outputs"][table]]
        for entry in commit["batches"]:
            files.append(str(self.root / entry["buffers"]))
            if entry.get("discarded"):
                files.append(str(self.root / entry["discarded"]))
        files += [str(self.root / d) for d in commit["open_state"].values() if d]
        files += [str(self.root / f) for f in commit.get("snapshot", {}).values()]
        return files

    def missing_files(self, commit: Mapping[str, Any], output: str | Path) -> list[str]:
        """The files ``commit`` names that do not exist."""
        return [f for f in self.commit_files(commit, output) if not os.path.exists(f)]

    def commit_record(self, batch: int) -> dict[str, Any]:
        return read_record(self.root / "commits" / f"{batch:08d}.json")

    # -- clean-up -----------------------------------------------------------------------------

    def remove_unreferenced(self, referenced: set[str], prefixes: Mapping[Path, str]) -> list[str]:
        """Delete staged entries that no retained commit references.

        ``prefixes`` maps a directory to the name prefix of entries this checkpoint owns in it
        (its ``state/`` and its output table directories). Returns the removed paths.
        """
        removed = []
        for directory, prefix in prefixes.items():
            if not directory.exists():
                continue
            for entry in sorted(directory.iterdir()):
                if entry.name.startswith(prefix) and str(entry) not in referenced:
                    if entry.is_dir():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
                    removed.append(str(entry))
        for batch in self._numbered("intents"):
            if batch not in set(self._numbered("commits")):
                (self.root / "intents" / f"{batch:08d}.json").unlink()
        return removed

    def prune(self, retain: int) -> list[int]:
        """Keep the newest ``retain`` commits (and their intents); return the batches dropped."""
        commits = self._numbered("commits")
        dropped = commits[:-retain] if retain > 0 else []
        for batch in dropped:
            (self.root / "commits" / f"{batch:08d}.json").unlink(missing_ok=True)
            (self.root / "intents" / f"{batch:08d}.json").unlink(missing_ok=True)
        return dropped
