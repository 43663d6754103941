"""One exception tree for everything Replay refuses to do.

Every error carries a stable ``code`` (documented in ``docs/errors.md``), the
structured location it is about (file, origin, sequence, chunk, column, field)
and a message in three parts: what went wrong, where, and what to do about it.

``DataError`` subclasses mean the archive or the state is bad: the CLI exits
with 1. ``ConfigError`` subclasses mean the user asked for something invalid:
the CLI exits with 2 (the same code as a usage error).
"""

from __future__ import annotations

import dataclasses
import errno
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, ParamSpec, TypeVar

__all__ = [
    "ArchiveReadError",
    "ArchiveSchemaError",
    "BadBufferError",
    "CheckpointCorruptError",
    "CheckpointStateError",
    "ConcurrentWriterError",
    "ConfigError",
    "ConflictingDuplicateError",
    "DataError",
    "DriverError",
    "EmptyArchiveError",
    "IncompatibleCheckpointError",
    "LedgerError",
    "Location",
    "PublicationError",
    "ReplayError",
    "StorageError",
    "WatermarkRegressionError",
    "storage_errors",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Location:
    """Where an error is: any subset of these may be known."""

    file: str | None = None
    origin: int | None = None
    sequence: int | None = None
    chunk: int | None = None
    column: str | None = None
    field: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        parts = []
        for name in ("file", "origin", "sequence", "chunk", "column", "field"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name} {value!s}" if name != "file" else f"file {value}")
        parts.extend(f"{k} {v}" for k, v in self.extra.items())
        return ", ".join(parts)


class ReplayError(Exception):
    """Root of every error Replay raises on purpose.

    Attributes:
        code: a stable identifier, e.g. ``"archive.missing_column"``.
        what: one sentence saying what went wrong.
        where: the location the error is about.
        todo: what the user should do.
        exit_code: the CLI exit code (1 data, 2 configuration or usage).
    """

    code: ClassVar[str] = "replay.error"
    exit_code: ClassVar[int] = 1

    def __init__(
        self,
        what: str,
        *,
        todo: str,
        where: Location | None = None,
        code: str | None = None,
    ) -> None:
        self.what = what.rstrip(".")
        self.todo = todo.rstrip(".")
        self.where = where or Location()
        if code is not None:
            self.code = code  # type: ignore[misc]  # instance override of the class default
        super().__init__(self.message)

    @property
    def message(self) -> str:
        loc = self.where.describe()
        text = f"[{self.code}] {self.what}."
        if loc:
            text += f" Where: {loc}."
        return text + f" What to do: {self.todo}."

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as what it was built from (``Exception`` would pickle only the message): an error
        raised in a kept driver reaches its client whole (``replay.driver``)."""
        return (_rebuilt, (type(self), self.what, self.todo, self.where, self.code))

    # Convenience accessors so callers (and tests) need not go through ``where``.
    @property
    def file(self) -> str | None:
        return self.where.file

    @property
    def origin(self) -> int | None:
        return self.where.origin

    @property
    def sequence(self) -> int | None:
        return self.where.sequence

    @property
    def chunk(self) -> int | None:
        return self.where.chunk

    @property
    def column(self) -> str | None:
        return self.where.column

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form, used by ``--json`` output and reports."""
        loc = {k: getattr(self.where, k) for k in ("file", "origin", "sequence", "chunk", "column", "field")}
        return {
            "code": self.code,
            "what": self.what,
            "where": {k: v for k, v in loc.items() if v is not None} | self.where.extra,
            "todo": self.todo,
        }


def _rebuilt(kind: type[ReplayError], what: str, todo: str, where: Location, code: str) -> ReplayError:
    return kind(what, todo=todo, where=where, code=code)


class ConfigError(ReplayError):
    """The job configuration (YAML, CLI option or Airflow param) is invalid."""

    code = "config.invalid"
    exit_code = 2


class DataError(ReplayError):
    """The archive (or persisted state) violates the contract."""

    code = "data.invalid"
    exit_code = 1


class EmptyArchiveError(DataError):
    code = "archive.empty"


class ArchiveReadError(DataError):
    """A file cannot be listed or read (unreadable, truncated, not Parquet)."""

    code = "archive.unreadable"


class ArchiveSchemaError(DataError):
    """A required column is missing or has the wrong type."""

    code = "archive.schema"


class BadBufferError(DataError):
    """A buffer's identity or metadata breaks docs/archive.md#buffers-and-punctuation-rows."""

    code = "archive.bad_buffer"


class ConflictingDuplicateError(DataError):
    """The same buffer identity was archived twice with different content."""

    code = "archive.conflicting_duplicate"


class WatermarkRegressionError(DataError):
    """A sequence watermark is below its predecessor's under ``watermark_regression: fail``."""

    code = "progress.watermark_regression"


class IncompatibleCheckpointError(ConfigError):
    """The checkpoint was written by a job whose results would differ from this one's."""

    code = "checkpoint.incompatible"


class ConcurrentWriterError(ReplayError):
    """Another live process holds the checkpoint's single-writer lock."""

    code = "checkpoint.locked"
    exit_code = 1


class CheckpointStateError(DataError):
    """The checkpoint's persisted state is unreadable or inconsistent with the archive."""

    code = "checkpoint.state"


class CheckpointCorruptError(CheckpointStateError):
    """A checkpoint file is truncated, edited or missing: its checksum or a file it names does not hold."""

    code = "checkpoint.corrupt"


class PublicationError(DataError):
    """``replay publish`` refused a version: not validated, failed validation, or not a run's version."""

    code = "publish.refused"


class LedgerError(DataError):
    """A batch's ledger does not balance: a buffer or a tuple was lost or counted twice."""

    code = "ledger.mismatch"


class DriverError(ReplayError):
    """The kept driver (``replay.driver``) cannot be reached, takes no more runs, or ended during a
    run: an operational failure, which a retry may get past (the Airflow operator's is retried)."""

    code = "driver.error"
    exit_code = 1


class StorageError(ReplayError):
    """A file Replay reads or writes could not be: a location that is not a directory, no
    permission, no space left. Operational: the run can be retried once the storage is fixed."""

    code = "storage.io"
    exit_code = 1


_P = ParamSpec("_P")
_R = TypeVar("_R")


def storage_errors(after: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Turn an ``OSError`` about a file (one that names it) raised by the decorated command into a
    ``StorageError`` naming the file, the system's reason, and ``after``: what is left, such as
    "nothing of the batch in progress was committed"."""

    def decorate(command: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(command)
        def guarded(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            try:
                return command(*args, **kwargs)
            except OSError as exc:
                if exc.filename is None:
                    raise
                reason = exc.strerror or str(exc)
                name = errno.errorcode.get(exc.errno or 0)
                raise StorageError(
                    f"{exc.filename}: {reason}" + (f" ({name})" if name else "") + f"; {after}",
                    where=Location(file=str(exc.filename)),
                    todo="make sure the directories on this path are directories, that this user may read and "
                    "write there, and that the disk has free space; then run the command again",
                ) from exc

        return guarded

    return decorate
