"""Durable files: atomic writes, and checkpoint records that carry the sha256 of their payload.

Every JSON document of a checkpoint or an output location is written by ``write_json_atomic``
(temporary file, fsync, rename, fsync of the directory) and carries ``format_version``; every
Parquet file the driver writes there (a checkpoint's state files, the output's progress,
integrity and publication files) by ``write_parquet_atomic``, the same way. A
checkpoint record (``write_record``) also carries the sha256 of its payload, checked by
``read_record``: a truncated or edited file is ``checkpoint.corrupt``, never a raw parse error
and never silently trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

from replay.core.errors import CheckpointCorruptError, CheckpointStateError, DataError, Location

if TYPE_CHECKING:
    import pyarrow as pa

T = TypeVar("T")

__all__ = [
    "FORMAT_VERSION",
    "RECORD_FORMAT_VERSION",
    "corrupt",
    "damaged_output",
    "fsync_dir",
    "read_json",
    "read_record",
    "read_typed",
    "replacing",
    "signed",
    "temporary",
    "write_json_atomic",
    "write_parquet_atomic",
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
    text = (
        json.dumps(document, sort_keys=True, separators=(",", ":"))
        if compact
        else json.dumps(document, indent=1, sort_keys=True)
    )
    _replace(path, lambda handle: handle.write(text.encode("utf-8")))


def temporary(path: Path) -> Path:
    """The temporary name ``path`` is written under before its rename: hidden, and its own for
    each process and thread, so that two writers of one path never write one temporary file."""
    return path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")


def write_parquet_atomic(table: pa.Table, path: Path, *, sync_dir: bool = True) -> None:
    """Write ``table`` to ``path`` as Parquet so that a reader, or a restart after a power loss,
    sees the old file or the whole new one: a temporary file, fsync, rename, and (``sync_dir``)
    fsync of the directory. A caller writing several files of one directory may pass
    ``sync_dir=False`` and call ``fsync_dir`` once after the last."""
    import pyarrow.parquet as pq

    _replace(path, lambda handle: pq.write_table(table, handle), sync_dir=sync_dir)


def _replace(path: Path, fill: Callable[[BinaryIO], object], *, sync_dir: bool = True) -> None:
    """Replace ``path`` by what ``fill`` writes: under ``temporary(path)``, fsynced, renamed, and
    (``sync_dir``) the rename made durable by an fsync of the directory."""
    with replacing(path, sync_dir=sync_dir) as tmp, open(tmp, "wb") as handle:
        fill(handle)
        handle.flush()
        os.fsync(handle.fileno())


@contextmanager
def replacing(path: Path, *, sync_dir: bool) -> Iterator[Path]:
    """``temporary(path)``, for the block to write; renamed over ``path`` when the block ends, and
    removed if writing or renaming it fails, so that a reader sees the old file or the whole new
    one and a failure leaves nothing behind. ``sync_dir``: the rename made durable by an fsync of
    the directory (the block fsyncs what it wrote); a file whose loss only costs work again (a
    scan cache entry) skips both."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary(path)
    try:
        yield tmp
        os.replace(tmp, path)
        if sync_dir:
            fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)  # gone after the rename; else what a failed write left


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def payload_digest(payload: Mapping[str, Any]) -> str:
    """sha256 of a record's payload (everything but ``format_version`` and ``sha256``), canonical JSON."""
    body = {k: v for k, v in payload.items() if k not in ("format_version", "sha256")}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def signed(payload: Mapping[str, Any], format_version: int) -> dict[str, Any]:
    """``payload`` as a document of ``format_version`` carrying its ``sha256`` (``payload_digest``)."""
    body = {k: v for k, v in payload.items() if k not in ("format_version", "sha256")}
    return {"format_version": format_version, "sha256": payload_digest(body), **body}


def write_record(path: Path, payload: Mapping[str, Any]) -> None:
    """Write a checkpoint record atomically, with ``format_version`` and the payload's ``sha256``."""
    write_json_atomic(path, signed(payload, RECORD_FORMAT_VERSION), compact=True)


def corrupt(path: Path, what: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"checkpoint file {path.name} {what}",
        where=Location(file=str(path)),
        todo="restore the checkpoint directory from a backup, or start over with a new --checkpoint "
        "and --output (the archive is untouched, so a new replay rebuilds everything)",
    )


def damaged_output(message: str, path: Path) -> DataError:
    """``output.corrupt``: a file an output's version or directory lists is gone or unreadable."""
    return DataError(
        message,
        where=Location(file=str(path)),
        todo="restore the output directory from a backup, or replay into a new --output (and --checkpoint); "
        "the archive is untouched",
        code="output.corrupt",
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
        raise corrupt(path, "is missing") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise corrupt(path, f"is not valid JSON (truncated or overwritten): {exc}") from exc
    if not isinstance(document, dict):
        raise corrupt(path, "does not hold a JSON object")
    version = document.get("format_version")
    if version in (2, RECORD_FORMAT_VERSION):
        if document.get("sha256") != payload_digest(document):
            raise corrupt(path, "does not match its sha256: it was changed after it was written")
        return {k: v for k, v in document.items() if k != "sha256"}
    if version == 1:  # written before records carried checksums
        return document
    raise CheckpointStateError(
        f"unsupported checkpoint format version {version!r} (this replay reads 1 to {RECORD_FORMAT_VERSION})",
        where=Location(file=str(path)),
        todo="use the replay version that wrote this checkpoint, or start a new checkpoint directory",
    )


def read_json(path: Path) -> dict[str, Any]:
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


def read_typed(path: Path, parse: Callable[[Mapping[str, Any]], T]) -> T:
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
        raise corrupt(path, f"does not hold the fields of its kind ({type(exc).__name__}: {exc})") from exc
