"""The checkpoint's records as typed values (docs/outputs.md#checkpoints).

Each record is a frozen dataclass with ``to_json`` and ``from_json``; ``replay.store.checkpoint``
writes each kind with one function and reads it with one function, adding ``format_version``
and the sha256 of the payload, checked on read. Nothing else reads these files by string key:
``replay status``, the Airflow plugin's hook and the run loop all go through those functions.

A commit is **fixed in size**: it points at files and carries totals, whatever the number of
batches before it. What grows with the history is appended, never rewritten:

- the batch log (``batches.jsonl``): one line per committed batch (its buffers' state file,
  its output files, its ledger row), chained by sha256 so that the commit's pointer checks
  every line before it;
- per batch, the metadata of the buffers it fed (``state/b<batch>-<token>-buffers.parquet``),
  read back only when a buffer that was replayed already arrives again.

A run's cut into micro-batches is recorded once, in its ``RunIntent``, before its first batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["Commit", "EngineSnapshot", "LogEntry", "LogPointer", "RunIntent"]


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


class _Record:
    """``to_json``: the fields as JSON values (tuples as lists, nested records as objects)."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            out[f.name] = value.to_json() if isinstance(value, _Record) else _plain(value)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class LogPointer(_Record):
    """How far the batch log reaches for a commit: lines, bytes, and the sha256 chain after its
    last line (``chain(n) = sha256(chain(n-1) + line n)``, the empty string before the first)."""

    lines: int = 0
    size: int = 0
    chain: str = ""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LogPointer:
        return cls(lines=int(data["lines"]), size=int(data["size"]), chain=str(data["chain"]))


@dataclass(frozen=True, slots=True, kw_only=True)
class LogEntry(_Record):
    """One committed batch in the batch log: what the history needs of it later.

    ``outputs``: the batch's own files, relative to the output (``windows`` and ``late``: a
    directory or ``None`` when the batch wrote none; ``progress``: a file). ``buffers``: its
    buffers' metadata, relative to the checkpoint. ``ledger``: its row of the ledger table.
    """

    batch: int
    run: int
    token: str
    finish: bool
    join: Mapping[str, tuple[int, ...]]
    buffers: str
    outputs: Mapping[str, str | None]
    ledger: Mapping[str, Any]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LogEntry:
        return cls(
            batch=int(data["batch"]),
            run=int(data["run"]),
            token=str(data["token"]),
            finish=bool(data["finish"]),
            join={k: tuple(v) for k, v in data["join"].items()},
            buffers=str(data["buffers"]),
            outputs=dict(data["outputs"]),
            ledger=dict(data["ledger"]),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunIntent(_Record):
    """Written before a run's first batch: the archive files it reads and its cut (the number of
    buffers of each batch), so that a run interrupted anywhere is redone with the same batches;
    and each file's stamp ([size, modification time]) taken before the run scanned it, which the
    run's last commit records as consumed if the file still has it (``None``: an intent written
    before stamps were recorded)."""

    run: int
    first_batch: int
    files: tuple[str, ...]
    cuts: tuple[int, ...]
    stamps: Mapping[str, tuple[int, int]] | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunIntent:
        stamps = data.get("stamps")
        return cls(
            run=int(data["run"]),
            first_batch=int(data["first_batch"]),
            files=tuple(data["files"]),
            cuts=tuple(int(c) for c in data["cuts"]),
            stamps=None if stamps is None else {str(f): (int(s[0]), int(s[1])) for f, s in stamps.items()},
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSnapshot(_Record):
    """The progress engine as a commit left it (``state/b<batch>-<token>-engine.json``): its
    values, the identities of the buffers it holds that are not decided yet, the progress
    report (watermarks, stream cut, gaps, ...) and the path Spark reports for each file that
    holds a buffer still in flight."""

    engine: Mapping[str, Any]
    undecided: tuple[tuple[int, int, int], ...]
    progress: Mapping[str, Any]
    spark_paths: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EngineSnapshot:
        return cls(
            engine=dict(data["engine"]),
            undecided=tuple((int(i[0]), int(i[1]), int(i[2])) for i in data["undecided"]),
            progress=dict(data["progress"]),
            spark_paths=dict(data.get("spark_paths", {})),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Commit(_Record):
    """One committed batch. Paths are relative to the checkpoint (state) or to the output (``outputs``).

    ``consumed``: a state file listing every archive file a finished run consumed, with its size
    and modification time (``None`` before the first run finishes). ``discarded``: every copy
    discarded so far (duplicates and conflicting copies; ``None``: none). ``engine`` and ``held``:
    the engine snapshot and the buffers it holds. ``open_state``: per window spec, the directory of
    its open windows (``None``: none open). ``carry``: when the batch was not the last of its pass
    (docs/outputs.md#passes), the copies-and-decisions files of the pass's batches up to it, whose
    on-time tuples complete ``open_state`` (at most a pass's batches, so the commit stays bounded).
    ``outputs``: the batch's own output files. ``archive_schema``: the archive's columns as the
    runs so far read them (an encoded Arrow schema, the union of their files'), which a later run's
    new files must agree with (``None`` in checkpoints written before it was kept).
    """

    batch: int
    run: int
    token: str
    finish: bool
    lateness: str
    range: tuple[int | None, int | None]
    log: LogPointer
    consumed: str | None
    discarded: str | None
    engine: str
    held: str
    open_state: Mapping[str, str | None]
    outputs: Mapping[str, str | None]
    ledger: Mapping[str, Any]
    pending_buffers: int
    pending_tuples: int
    schemas: Mapping[str, str]
    carry: tuple[str, ...] = ()
    archive_schema: str | None = None

    def state_files(self) -> list[str]:
        """Every file or directory under the checkpoint this commit needs (relative paths)."""
        files = [self.engine, self.held, *(d for d in self.open_state.values() if d), *self.carry]
        return files + [f for f in (self.consumed, self.discarded) if f]

    def output_files(self) -> list[str]:
        """The batch's own output files and directories (relative to the output)."""
        return [p for p in self.outputs.values() if p]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Commit:
        lo, hi = data["range"]
        return cls(
            batch=int(data["batch"]),
            run=int(data["run"]),
            token=str(data["token"]),
            finish=bool(data["finish"]),
            lateness=str(data["lateness"]),
            range=(lo, hi),
            log=LogPointer.from_json(data["log"]),
            consumed=data["consumed"],
            discarded=data["discarded"],
            engine=str(data["engine"]),
            held=str(data["held"]),
            open_state=dict(data["open_state"]),
            outputs=dict(data["outputs"]),
            ledger=dict(data["ledger"]),
            pending_buffers=int(data["pending_buffers"]),
            pending_tuples=int(data["pending_tuples"]),
            schemas=dict(data["schemas"]),
            carry=tuple(str(f) for f in data.get("carry", ())),
            archive_schema=data.get("archive_schema"),
        )
