"""Checkpoint storage (docs/outputs.md#checkpoints): single-writer lock, run intents, atomic
commits, the batch log, retention.

A checkpoint is a local directory::

    checkpoint.json            identity: format_version, id, fingerprint and its fields, output
    .lock, holder.json         the single-writer lock (an OS file lock) and who holds it
    runs/<run>.json            written before a run's first batch: its files and its cut
    commits/<batch>.json       written atomically once the batch's files are staged; fixed in size
    batches.jsonl              the batch log: one line per committed batch, chained by sha256
    state/b<batch>-<token>-*   written by a batch: buffer metadata, engine snapshot, open windows
    scan-cache/                the archive scan's per-file cache

The newest intact commit is the source of truth. A state file or output entry of a batch after
it is a leftover of a batch that crashed before its commit (or whose commit was set aside), and
``remove_leftovers`` deletes it; a line of the batch log beyond the commit's pointer is dropped
at the next append.

Every JSON document is written by ``write_json_atomic`` (temporary file, fsync, rename, fsync of
the directory) and carries ``format_version``. The checkpoint's own records (identity, run
intents, commits, engine snapshots) also carry the sha256 of their payload, checked on read: a
truncated or edited file is ``checkpoint.corrupt``, never a raw parse error and never silently
trusted. ``resume_point`` picks the newest commit that reads intact and whose files all exist,
setting the broken newer ones aside with a note. The typed records are in ``replay.store.records``.
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
from typing import Any, TypeVar

from filelock import FileLock, Timeout

from replay.core.errors import (
    CheckpointCorruptError,
    CheckpointStateError,
    ConcurrentWriterError,
    IncompatibleCheckpointError,
    Location,
    ReplayError,
)
from replay.store.records import Commit, EngineSnapshot, LogEntry, LogPointer, RunIntent

T = TypeVar("T")

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
#: The format of the checkpoint's records: version 2 added the payload's sha256, version 3 the
#: fixed-size commit and the batch log. ``read_record`` reads all three; the typed readers only 3.
RECORD_FORMAT_VERSION = 3


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
    if version in (2, RECORD_FORMAT_VERSION):
        if document.get("sha256") != _payload_digest(document):
            raise _corrupt(path, "does not match its sha256: it was changed after it was written")
        return {k: v for k, v in document.items() if k != "sha256"}
    if version == 1:  # written before records carried checksums
        return document
    raise CheckpointStateError(
        f"unsupported checkpoint format version {version!r} (this replay reads 1 to {RECORD_FORMAT_VERSION})",
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

    commit: Commit | None
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

    # -- run intents ---------------------------------------------------------------------------

    def _numbered(self, folder: str) -> list[int]:
        directory = self.root / folder
        if not directory.exists():
            return []
        return sorted(int(p.stem) for p in directory.glob("*.json") if p.stem.isdigit())

    def write_run_intent(self, intent: RunIntent) -> None:
        """Record a run's files and cut before its first batch."""
        write_record(self.root / "runs" / f"{intent.run:08d}.json", intent.to_json())

    def run_intent(self, run: int) -> RunIntent | None:
        """The intent of run ``run``, if it was written.

        Raises:
            CheckpointCorruptError: it does not read intact.
        """
        path = self.root / "runs" / f"{run:08d}.json"
        return _typed(path, RunIntent.from_json) if path.exists() else None

    def drop_run_intents(self, *, after: int) -> None:
        """Forget the intents of runs after ``after`` (runs whose commits were set aside)."""
        for run in self._numbered("runs"):
            if run > after:
                (self.root / "runs" / f"{run:08d}.json").unlink()

    # -- commits --------------------------------------------------------------------------------

    def commit(self, commit: Commit) -> None:
        """Commit a batch atomically; from here on its staged files are part of the state."""
        write_record(self.root / "commits" / f"{commit.batch:08d}.json", commit.to_json())

    def commit_record(self, batch: int) -> Commit:
        """The commit of ``batch``.

        Raises:
            CheckpointCorruptError: it is missing or does not read intact.
            CheckpointStateError: it was written by a Replay whose commits this one does not read.
        """
        return _typed(self.root / "commits" / f"{batch:08d}.json", Commit.from_json)

    def latest(self) -> Commit | None:
        """The newest commit, or ``None`` for a new checkpoint.

        Raises:
            CheckpointCorruptError: it does not read intact (``resume_point`` falls back instead).
        """
        commits = self._numbered("commits")
        return self.commit_record(commits[-1]) if commits else None

    def commits(self) -> list[int]:
        return self._numbered("commits")

    def resume_point(self, output: str | Path, *, repair: bool) -> ResumePoint:
        """The newest commit that reads intact, whose files all exist (``missing_files``) and whose
        engine snapshot reads intact.

        Newer commits that fail are reported in ``skipped``; with ``repair`` (the writer, under the
        lock) they are renamed ``<batch>.json.corrupt`` so that the run redoes those batches from
        their run's intent, as after a crash. ``replay status`` reads without ``repair``.

        Raises:
            CheckpointCorruptError: commits exist but none is intact.
        """
        commits = self._numbered("commits")
        skipped: list[str] = []
        bad: list[Path] = []
        for batch in reversed(commits):
            path = self.root / "commits" / f"{batch:08d}.json"
            try:
                record = self.commit_record(batch)
            except CheckpointCorruptError as error:
                skipped.append(f"commit {batch}: {error.message}")
                bad.append(path)
                continue
            absent = self.missing_files(record, output)
            if not absent:
                try:
                    self.snapshot(record)
                except (CheckpointCorruptError, CheckpointStateError) as error:
                    skipped.append(f"commit {batch}: its engine snapshot {error.message}")
                    bad.append(path)
                    continue
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

    def missing_files(self, commit: Commit, output: str | Path) -> list[str]:
        """The files ``commit`` names that do not exist, and the batch log if it is shorter than
        the commit says."""
        out = Path(output)
        files = [str(self.root / f) for f in commit.state_files()] + [str(out / f) for f in commit.output_files()]
        missing = [f for f in files if not os.path.exists(f)]
        log = self.root / LOG_NAME
        if commit.log.size and (not log.exists() or log.stat().st_size < commit.log.size):
            missing.append(str(log))
        return missing

    # -- the engine snapshot --------------------------------------------------------------------

    def write_snapshot(self, relative: str, snapshot: EngineSnapshot) -> None:
        write_record(self.root / relative, snapshot.to_json())

    def snapshot(self, commit: Commit) -> EngineSnapshot:
        """The engine snapshot ``commit`` points at.

        Raises:
            CheckpointCorruptError: it is missing or does not read intact.
        """
        return _typed(self.root / commit.engine, EngineSnapshot.from_json)

    # -- the batch log --------------------------------------------------------------------------

    def append_log(self, entry: LogEntry, after: LogPointer) -> LogPointer:
        """Append ``entry`` after the log's first ``after.size`` bytes (anything beyond them is a
        line of a batch that never committed, and goes) and make it durable; the pointer to write
        into the batch's commit."""
        line = (json.dumps(entry.to_json(), sort_keys=True, separators=(",", ":")) + "\n").encode()
        path = self.root / LOG_NAME
        created = not path.exists()
        with open(path, "ab") as handle:
            if handle.tell() != after.size:
                handle.truncate(after.size)
                handle.seek(after.size)
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        if created:
            fsync_dir(self.root)
        return LogPointer(lines=after.lines + 1, size=after.size + len(line), chain=_chain(after.chain, line))

    def read_log(self, upto: LogPointer, since: LogPointer | None = None) -> list[LogEntry]:
        """The batch log's entries up to ``upto`` (after ``since``, a pointer of an earlier commit,
        when given), each checked against the pointers' sha256 chain.

        Raises:
            CheckpointCorruptError: the log is shorter than the pointer, or a line was changed
                (or ``since`` does not point into the same log).
        """
        path = self.root / LOG_NAME
        since = since or LogPointer()
        if upto.lines == since.lines:
            return []
        try:
            with open(path, "rb") as handle:
                handle.seek(since.size)
                data = handle.read(max(upto.size - since.size, 0))
        except FileNotFoundError:
            raise _corrupt(path, "is missing") from None
        lines = data.splitlines(keepends=True)
        chain = since.chain
        for line in lines:
            chain = _chain(chain, line)
        if len(data) != upto.size - since.size or len(lines) != upto.lines - since.lines or chain != upto.chain:
            raise _corrupt(path, f"does not match the sha256 chain of its first {upto.lines} line(s)")
        try:
            return [LogEntry.from_json(json.loads(line)) for line in lines]
        except (ValueError, KeyError, TypeError) as exc:
            raise _corrupt(path, f"holds a line this Replay does not read: {exc}") from exc

    # -- clean-up -------------------------------------------------------------------------------

    def remove_leftovers(self, after: int, outputs: Mapping[Path, str], keep: set[str]) -> list[str]:
        """Delete what batches after ``after`` (the commit a run continues from) staged: their state
        files, their output entries (``outputs`` maps a table directory to the prefix of this
        checkpoint's entries in it) unless ``keep`` names them (an output version lists them), and
        the intents of runs that committed nothing. Returns the removed paths."""
        removed = []
        targets = [(self.root / "state", "b"), *outputs.items()]
        for directory, prefix in targets:
            if not directory.exists():
                continue
            for entry in sorted(directory.iterdir()):
                batch = _batch_of(entry.name, prefix)
                if batch is not None and batch > after and str(entry) not in keep:
                    _remove(entry)
                    removed.append(str(entry))
        return removed

    def prune(self, retain: int, known: Mapping[int, Commit]) -> list[int]:
        """Keep the newest ``retain`` commits; delete older ones with the state files only they
        needed (open windows, engine snapshots, consumed-file and discarded-copy lists). ``known``:
        commits already read. Buffer records stay: they are the history (see ``read_log``)."""
        commits = self._numbered("commits")
        dropped = commits[:-retain] if retain > 0 else []
        if not dropped:
            return []
        needed: set[str] = set()
        for batch in commits[-retain:]:
            try:
                needed |= set((known.get(batch) or self.commit_record(batch)).state_files())
            except (CheckpointCorruptError, CheckpointStateError):
                continue
        for batch in dropped:
            path = self.root / "commits" / f"{batch:08d}.json"
            try:
                old = known.get(batch) or self.commit_record(batch)
            except (CheckpointCorruptError, CheckpointStateError):
                old = None
            path.unlink(missing_ok=True)
            for name in old.state_files() if old else ():
                if name not in needed and (self.root / name).exists():
                    _remove(self.root / name)
        first_run = min((known[b].run for b in commits[-retain:] if b in known), default=None)
        if first_run is not None:
            for run in self._numbered("runs"):
                if run < first_run:
                    (self.root / "runs" / f"{run:08d}.json").unlink()
        return dropped


LOG_NAME = "batches.jsonl"


def _chain(previous: str, line: bytes) -> str:
    return hashlib.sha256(previous.encode() + line).hexdigest()


def _batch_of(name: str, prefix: str) -> int | None:
    """The batch number in a staged entry's name (``<prefix><8 digits>-...``), if it is one."""
    if not name.startswith(prefix):
        return None
    digits = name[len(prefix) : len(prefix) + 8]
    return int(digits) if len(digits) == 8 and digits.isdigit() and name[len(prefix) + 8 :][:1] == "-" else None


def _remove(entry: Path) -> None:
    if entry.is_dir():
        shutil.rmtree(entry)
    else:
        entry.unlink()


def _typed(path: Path, parse: Callable[[Mapping[str, Any]], T]) -> T:
    """Read a record with ``read_record`` and parse it; a record of an earlier layout is refused."""
    document = read_record(path)
    if document.get("format_version") != RECORD_FORMAT_VERSION:
        raise CheckpointStateError(
            f"checkpoint file {path.name} was written by an earlier Replay (format version "
            f"{document.get('format_version')}); this one reads format {RECORD_FORMAT_VERSION}",
            where=Location(file=str(path)),
            todo="finish with the Replay version that wrote this checkpoint, or start a new --checkpoint "
            "(and --output): the archive is untouched, so a new replay rebuilds everything",
        )
    try:
        return parse(document)
    except (KeyError, TypeError, ValueError) as exc:
        raise _corrupt(path, f"does not hold the fields of its kind ({type(exc).__name__}: {exc})") from exc
