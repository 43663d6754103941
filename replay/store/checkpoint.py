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
at the next append; a temporary file (``*.tmp``) a writer stopped before its rename left is
deleted by ``remove_temporaries`` when the next run starts.

Every JSON document is written atomically and carries ``format_version``; the checkpoint's own
records (identity, run intents, commits, engine snapshots) also carry the sha256 of their
payload, checked on read (``replay.store.durable``): a truncated or edited file is
``checkpoint.corrupt``, never a raw parse error and never silently trusted. The lock is
``replay.store.lock``, the batch log ``replay.store.batch_log``. ``resume_point`` picks the
newest commit that reads intact and whose files all exist, setting the broken newer ones aside
with a note. The typed records are in ``replay.store.records``.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay.core.errors import (
    CheckpointCorruptError,
    CheckpointStateError,
    IncompatibleCheckpointError,
    Location,
)
from replay.core.rules import RULES_VERSION, changes_since, rules_name
from replay.store.batch_log import LOG_NAME, append_log, read_log
from replay.store.durable import RECORD_FORMAT_VERSION, fsync_dir, read_record, read_typed, write_record
from replay.store.lock import LockInfo, single_writer
from replay.store.records import Commit, EngineSnapshot, LogEntry, LogPointer, RunIntent

__all__ = ["CheckpointStore", "LockInfo", "ResumePoint"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumePoint:
    """Where a run continues: the newest intact commit (``None``: start from nothing) and what was
    set aside to get there (one line per skipped commit, naming the file and the fault)."""

    commit: Commit | None
    skipped: tuple[str, ...] = ()
    skipped_batches: tuple[int, ...] = ()  # the batches of the commits in ``skipped``


def _changes(before: Any, after: Any, path: str = "") -> list[str]:
    """What differs between two settings' values, one line per leaf: ``[w].size '5s' -> '1m'``
    (lists of named settings, such as windows, matched by name)."""
    if before == after:
        return []
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        keys = sorted(set(before) | set(after))
        return [line for key in keys for line in _changes(before.get(key), after.get(key), f"{path}.{key}")]
    if isinstance(before, list) and isinstance(after, list) and _named(before) and _named(after):
        old, new = {item["name"]: item for item in before}, {item["name"]: item for item in after}
        names = sorted(set(old) | set(new))
        return [line for n in names for line in _changes(old.get(n), new.get(n), f"{path}[{n}]")]
    return [f"{path.lstrip('.')} {before!r} -> {after!r}".lstrip()]


def _named(items: list[Any]) -> bool:
    return all(isinstance(item, Mapping) and isinstance(item.get("name"), str) for item in items)


def _diff(stored: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    return sorted(name for name in set(stored) | set(current) if stored.get(name) != current.get(name))


def _other_rules(root: Path, rules: Any) -> IncompatibleCheckpointError:
    """``checkpoint.incompatible`` for a checkpoint whose commits were made under rules ``rules``."""
    if isinstance(rules, int) and rules > RULES_VERSION:
        said = f"a newer Replay (rules {rules}; this one computes by rules {RULES_VERSION})"
        todo = "run it with that Replay release or a later one, or replay from scratch with a new --checkpoint"
    else:
        since = "; ".join(changes_since(rules if isinstance(rules, int) else None))
        said = (
            f"an earlier Replay ({rules_name(rules)}); this one computes by {rules_name(RULES_VERSION)}, "
            f"which changed: {since}"
        )
        todo = (
            "finish the replay with the Replay release that wrote the checkpoint, or replay from scratch "
            "with a new --checkpoint and a new --output (what the old checkpoint published stays as it is)"
        )
    return IncompatibleCheckpointError(
        f"the checkpoint's batches were committed by {said}; continuing them would mix two sets of rules "
        "in one output, which neither Replay computes",
        where=Location(file=str(root)),
        todo=todo,
    )


class CheckpointStore:
    """One checkpoint directory. Methods that write must be called while holding ``lock()``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    # -- identity -----------------------------------------------------------------------------

    def identity(self) -> dict[str, Any] | None:
        path = self.root / "checkpoint.json"
        return read_record(path) if path.exists() else None

    def bind(
        self,
        *,
        fingerprint: str,
        fields: Mapping[str, Any],
        output: str,
        may_change: Callable[[str, Any, Any], bool] = lambda name, before, after: False,
    ) -> dict[str, Any]:
        """Create the checkpoint's identity, or check that this job may continue it.

        A checkpoint that holds no commit yet (its first run failed before committing anything)
        takes the job's settings and output instead: nothing in it depends on the ones it had. So
        does one whose only differing fields ``may_change(name, before, after)`` allows: changes
        under which the committed batches are what the new settings would have committed. The
        identity returned then says so in ``"rebound"``.

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
                "rules": RULES_VERSION,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            write_record(self.root / "checkpoint.json", identity)
            return {"format_version": RECORD_FORMAT_VERSION, **identity}
        differing = _diff(stored["fields"], fields) if stored["fingerprint"] != fingerprint else []
        changes = {name: "; ".join(_changes(stored["fields"].get(name), fields.get(name))) for name in differing}
        if stored["output"] != output:
            changes["output"] = f"{stored['output']!r} -> {output!r}"
        rules = stored.get("rules")
        if rules != RULES_VERSION:
            changes["rules"] = f"{rules} -> {RULES_VERSION}"
        if not changes:
            return stored
        folder = self.root / "commits"
        uncommitted = not folder.exists() or not any(folder.iterdir())  # not even a commit set aside
        if not uncommitted and rules != RULES_VERSION:
            raise _other_rules(self.root, rules)
        if uncommitted or (
            stored["output"] == output
            and all(may_change(name, stored["fields"].get(name), fields.get(name)) for name in differing)
        ):
            if uncommitted:
                self.drop_run_intents(after=0)  # its cut was the old settings'
            identity = {
                key: value for key, value in stored.items() if key not in ("format_version", "sha256", "rebound")
            }
            identity |= {"fingerprint": fingerprint, "fields": dict(fields), "output": output, "rules": RULES_VERSION}
            write_record(self.root / "checkpoint.json", identity)
            reason = (
                "it held no commit yet"
                if uncommitted
                else "the batches it committed are what the new settings would have committed"
            )
            said = ", ".join(f"{name} {change}" for name, change in changes.items())
            return {"format_version": RECORD_FORMAT_VERSION, **identity, "rebound": f"{said} ({reason})"}
        if differing:
            raise IncompatibleCheckpointError(
                "the checkpoint was written by a job with different "
                + ", ".join(f"'{name}'" for name in differing)
                + " settings, so its state cannot be continued",
                where=Location(file=str(self.root), extra={name: changes[name] for name in differing}),
                todo="restore the job's previous settings, or run with a new --checkpoint directory "
                "(and a new --output) to replay from scratch",
            )
        raise IncompatibleCheckpointError(
            f"the checkpoint writes to output {stored['output']!r}, not {output!r}",
            where=Location(file=str(self.root)),
            todo=f"run with --output {stored['output']}, or use a new --checkpoint directory",
        )

    # -- the single-writer lock ---------------------------------------------------------------

    @contextmanager
    def lock(self, command: str = "replay run") -> Iterator[LockInfo | None]:
        """Hold the single-writer lock (``replay.store.lock``); yield the info of a dead holder
        whose lock was broken, if any.

        Raises:
            ConcurrentWriterError: a live process holds the lock.
        """
        with single_writer(self.root, command) as stale:
            yield stale

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
        return read_typed(path, RunIntent.from_json) if path.exists() else None

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
        return read_typed(self.root / "commits" / f"{batch:08d}.json", Commit.from_json)

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
                skipped.append(f"commit {batch}: {len(absent)} file(s) it names are missing or unreadable ({shown})")
                bad.append(path)
                continue
            if repair:
                for path in bad:
                    os.replace(path, path.with_name(path.name + ".corrupt"))
                if bad:
                    fsync_dir(self.root / "commits")
            batches = tuple(int(path.name.split(".")[0]) for path in bad)
            return ResumePoint(commit=record, skipped=tuple(skipped), skipped_batches=batches)
        if commits:
            raise CheckpointCorruptError(
                f"none of the checkpoint's {len(commits)} commit(s) is intact: " + "; ".join(skipped),
                where=Location(file=str(self.root / "commits")),
                todo="restore the checkpoint directory from a backup, or start over with a new --checkpoint "
                "and --output (the archive is untouched, so a new replay rebuilds everything)",
            )
        return ResumePoint(commit=None)

    def missing_files(self, commit: Commit, output: str | Path) -> list[str]:
        """The files ``commit`` names that do not exist, its state files whose Parquet footer does
        not read (cut short or emptied by a power loss), and the batch log if it is shorter than
        the commit says."""
        from replay.store import state as _state  # pyarrow: only where a commit is checked

        out = Path(output)
        state = [self.root / f for f in commit.state_files()]
        files = [str(f) for f in state] + [str(out / f) for f in commit.output_files()]
        missing = [f for f in files if not os.path.exists(f)]
        missing += [
            f"{f} (unreadable)"
            for f in state
            if f.suffix == ".parquet" and str(f) not in missing and not _state.readable(f)
        ]
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
        return read_typed(self.root / commit.engine, EngineSnapshot.from_json)

    # -- the batch log --------------------------------------------------------------------------

    def append_log(self, entry: LogEntry, after: LogPointer) -> LogPointer:
        """Append ``entry`` to the batch log after ``after`` (``replay.store.batch_log``); its pointer."""
        return append_log(self.root, entry, after)

    def read_log(self, upto: LogPointer, since: LogPointer | None = None) -> list[LogEntry]:
        """The batch log's entries up to ``upto``, after ``since`` (``replay.store.batch_log``)."""
        return read_log(self.root, upto, since)

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

    def remove_temporaries(self) -> list[str]:
        """Delete the temporary files (``*.tmp``) a writer stopped between writing and renaming left
        in the checkpoint's own directories; only under the checkpoint's lock, which no other writer
        of them holds. Returns the removed paths."""
        removed = []
        for directory in (self.root, *(self.root / name for name in ("commits", "runs", "state", "scan-cache"))):
            for entry in sorted(directory.glob("*.tmp")) if directory.is_dir() else ():
                if entry.is_file():
                    entry.unlink(missing_ok=True)
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
