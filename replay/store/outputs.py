"""The output location: versioned tables (docs/outputs.md#output-location).

Layout of an output directory::

    data/<table>/<checkpoint id>-b<batch>-<token>[.parquet]   files written by committed batches
    versions/<version>.json                                  one manifest per run: its tables' files
    versions/<version>.validation.json                       the validation verdict of a version (``replay validate``)
    current                                                  the publication pointer (``replay publish``)

A version is a manifest (a typed ``Manifest``, ``replay.store.manifest``): for each table
(``windows``, ``late``, ``progress``, ``integrity``, ``corrections``) the data files and
directories that make it up, relative to the output root. Files are shared between
versions (an incremental run's version is the previous one plus the new batches' files),
never rewritten, so every earlier version stays readable. Manifests are written atomically
and numbered with an exclusive create, so two checkpoints writing to one output cannot take
the same number.

A manifest and the publication pointer carry the sha256 of their payload, checked on read
(``read_manifest``, ``read_current``): a truncated or edited one is ``output.corrupt`` naming
the file, never a raw parse error and never silently trusted. Manifests written before they
carried it (format version 1) are read as they are. Readers get a typed ``Manifest``, never the
JSON object.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from replay.core.errors import ConfigError, DataError, Location
from replay.store.durable import (
    FORMAT_VERSION,
    damaged_output,
    fsync_dir,
    payload_digest,
    signed,
    write_json_atomic,
)
from replay.store.listing import listed
from replay.store.manifest import MANIFEST_FORMAT_VERSION, TABLES, Manifest

__all__ = [
    "MANIFEST_FORMAT_VERSION",
    "TABLES",
    "Manifest",
    "Publication",
    "current_version",
    "decode_schema",
    "encode_schema",
    "latest_run_version",
    "latest_version",
    "list_versions",
    "read_current",
    "read_manifest",
    "read_table",
    "read_validation",
    "resolve_version",
    "table_files",
    "write_current",
    "write_manifest",
    "write_validation",
]


def _corrupt(path: Path, what: str, todo: str) -> DataError:
    return DataError(
        f"{path.name} of output {path.parent.parent if path.parent.name == 'versions' else path.parent} {what}",
        where=Location(file=str(path)),
        todo=todo,
        code="output.corrupt",
    )


def _read_checked(path: Path, todo: str) -> dict[str, Any]:
    """A manifest or the pointer, whole and as written: JSON, a known format, its sha256 matching.

    Raises:
        OSError: no such file.
        DataError: ``output.corrupt``, naming the file.
    """
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise _corrupt(path, f"is not valid JSON (truncated or overwritten: {exc})", todo) from None
    found = document.get("format_version") if isinstance(document, dict) else None
    if not isinstance(found, int):
        raise _corrupt(path, f"has format_version {found!r}: it is not what Replay wrote there", todo)
    if found > MANIFEST_FORMAT_VERSION:
        raise _corrupt(
            path,
            f"has format_version {found!r}; this Replay reads {MANIFEST_FORMAT_VERSION} and below",
            "read this output with the Replay version that wrote it, or upgrade Replay",
        )
    if found >= 2 and document.get("sha256") != payload_digest(document):
        raise _corrupt(path, "does not match its sha256: it was changed after it was written", todo)
    return {k: v for k, v in document.items() if k != "sha256"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Publication:
    """The publication pointer (``current``): the published version, the run version it was built
    from, the publication it replaced, and when. Written by ``write_current``, read by ``read_current``."""

    version: int
    source: int
    previous: int | None
    published: str

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "source": self.source, "previous": self.previous, "published": self.published}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Publication:
        previous = data.get("previous")
        return cls(
            version=int(data["version"]),
            source=int(data["source"]),
            previous=None if previous is None else int(previous),
            published=str(data["published"]),
        )


def _versions_dir(output: Path) -> Path:
    return output / "versions"


def list_versions(output: str | Path) -> list[int]:
    """Version numbers present at ``output``, ascending."""
    directory = _versions_dir(Path(output))
    if not directory.exists():
        return []
    return sorted(int(p.stem) for p in directory.glob("*.json") if p.stem.isdigit())


def latest_version(output: str | Path) -> int | None:
    versions = list_versions(output)
    return versions[-1] if versions else None


def latest_run_version(output: str | Path) -> int | None:
    """The newest version a run wrote (not a publication), or ``None``: what to validate and publish next."""
    root = Path(output)
    runs = [v for v in list_versions(root) if read_manifest(root, v).kind == "run"]
    return runs[-1] if runs else None


def write_current(output: str | Path, publication: Publication) -> None:
    """Point ``current`` at ``publication``, atomically (the one function that writes the pointer)."""
    write_json_atomic(Path(output) / "current", signed(publication.to_json(), MANIFEST_FORMAT_VERSION))


def read_current(output: str | Path) -> Publication | None:
    """The publication pointer, or ``None`` when nothing is published (the one function that reads it).

    Raises:
        DataError: ``output.corrupt``: the pointer is truncated, edited or not a pointer.
    """
    path = Path(output) / "current"
    todo = (
        "publish again ('replay publish OUTPUT --version V' with the version to serve), which rewrites "
        "the pointer; every version stays readable meanwhile with --version"
    )
    try:
        document = _read_checked(path, todo)
    except FileNotFoundError:
        return None
    try:
        return Publication.from_json(document)
    except (KeyError, TypeError, ValueError) as exc:
        raise _corrupt(path, f"does not hold a publication ({type(exc).__name__}: {exc})", todo) from None


def current_version(output: str | Path) -> int | None:
    """The published version (the ``current`` pointer), or ``None`` when nothing is published."""
    publication = read_current(output)
    return None if publication is None else publication.version


def resolve_version(output: str | Path, version: int | None) -> int:
    """``version``, or the published one, or the newest one.

    Raises:
        ConfigError: the output has no versions, or not the one asked for.
    """
    versions = list_versions(output)
    if not versions:
        raise ConfigError(
            "the output location holds no version",
            where=Location(file=str(output)),
            todo="run 'replay run' first, or point at the output directory a run wrote",
            code="output.no_version",
        )
    if version is None:
        current = current_version(output)
        return current if current is not None else versions[-1]
    if version not in versions:
        raise ConfigError(
            f"version {version} does not exist (versions: {', '.join(map(str, versions))})",
            where=Location(file=str(output), field="version"),
            todo="pick one of the listed versions",
            code="output.no_version",
        )
    return version


def read_manifest(output: str | Path, version: int) -> Manifest:
    """A version's manifest (the one function that reads one).

    Raises:
        OSError: no such version file.
        DataError: ``output.corrupt``: the file is not a whole JSON manifest, does not match its
            sha256 (edited), was written in a format this Replay does not read (newer), or does
            not hold the fields of a manifest.
    """
    path = _versions_dir(Path(output)) / f"{version:06d}.json"
    todo = "restore the file from a backup, or delete the version's manifest and run again to write a new one"
    document = _read_checked(path, todo)
    try:
        return Manifest.from_json(document)
    except (KeyError, TypeError, ValueError) as exc:
        raise _corrupt(path, f"does not hold a manifest ({type(exc).__name__}: {exc})", todo) from None


def write_manifest(output: str | Path, manifest: Manifest) -> Manifest:
    """Write ``manifest`` as a new version with the next free number; return it as written.

    The version written is ``manifest`` with its number, the time of writing (``created``) and
    the newest ``format_version``, and the sha256 of its payload on disk.
    """
    directory = _versions_dir(Path(output))
    directory.mkdir(parents=True, exist_ok=True)
    while True:
        version = (latest_version(output) or 0) + 1
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        written = replace(manifest, version=version, created=created, format_version=MANIFEST_FORMAT_VERSION)
        document = signed(written.to_json(), MANIFEST_FORMAT_VERSION)
        tmp = directory / f".{version:06d}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, directory / f"{version:06d}.json")  # fails if another writer took the number
        except FileExistsError:
            continue
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(directory)
        return written


def _validation_path(output: Path, version: int) -> Path:
    return _versions_dir(output) / f"{version:06d}.validation.json"


def read_validation(output: str | Path, version: int) -> dict[str, Any] | None:
    """The validation record of ``version`` (written by ``replay validate``), or ``None`` if never validated.

    The record: ``format_version``, ``version``, ``success``, ``validated_at`` (ISO 8601 UTC),
    ``data_docs`` (the Data Docs index, relative to the output root), and ``suites``: a list of
    ``{name, success, evaluated, failed, expectations: [{type, column, description, success,
    unexpected_count, observed_value, unexpected_examples}]}``.
    """
    path = _validation_path(Path(output), version)
    if not path.exists():
        return None
    with open(path, encoding="utf-8") as handle:
        record: dict[str, Any] = json.load(handle)
    return record


def write_validation(output: str | Path, version: int, record: Mapping[str, Any]) -> Path:
    """Replace the validation record of ``version`` atomically (temporary file, fsync, rename)."""
    path = _validation_path(Path(output), version)
    write_json_atomic(path, {"format_version": FORMAT_VERSION, "version": version, **record})
    return path


def encode_schema(schema: pa.Schema) -> str:
    """A schema as the hex text manifests keep (so an empty table still has its columns)."""
    return bytes(schema.serialize().to_pybytes()).hex()


def decode_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(text)))


def _parquet_files(output: Path, entries: Sequence[str], version: int | None = None) -> list[str]:
    """The Parquet files of a version's entries (a file, or a directory of files).

    Raises:
        DataError: ``output.corrupt``: an entry the manifest lists is gone (a version is never
            written before its files, and its files are never deleted before it): reading on
            would give fewer rows than the version has.
    """
    named = "a version" if version is None else f"version {version}"

    def gone(path: Path, shown: Path | str) -> DataError:
        return damaged_output(f"{shown} of output {output} is missing, though {named} lists it", path)

    files: list[str] = []
    for entry in entries:
        path = output / entry
        if path.is_dir():
            listing = listed(path)
            if listing is None:  # written before directories were listed: all of it
                files += sorted(str(p) for p in path.rglob("*.parquet") if not p.name.startswith(("_", ".")))
                continue
            absent = [p for p in listing if not p.exists()]
            if absent:
                raise gone(absent[0], absent[0].relative_to(output))
            files += [str(p) for p in listing]
        elif path.exists():
            files.append(str(path))
        else:
            raise gone(path, entry)
    return files


def table_files(output: str | Path, manifest: Manifest, table: str) -> list[str]:
    """The Parquet files of ``table`` in a version's ``manifest``."""
    return _parquet_files(Path(output), manifest.entries(table), manifest.version)


def read_table(output: str | Path, table: str, version: int | None = None) -> pa.Table:
    """One table of a version as an Arrow table (rows in storage order).

    Raises:
        ConfigError: an unknown table name, or no such version.
    """
    import pyarrow.dataset as ds  # here: it pulls in pandas, which importing replay must not

    if table not in TABLES:
        raise ConfigError(
            f"unknown table {table!r}",
            where=Location(field="table"),
            todo=f"use one of: {', '.join(TABLES)}",
            code="output.unknown_table",
        )
    root = Path(output)
    manifest = read_manifest(root, resolve_version(root, version))
    files = _parquet_files(root, manifest.entries(table), manifest.version)
    schema = pa.schema([])
    if manifest.schemas.get(table):
        schema = decode_schema(manifest.schemas[table])
    if not files:
        return schema.empty_table()
    schemas = [pq.read_schema(f) for f in files]
    unified = pa.unify_schemas([schema, *schemas]) if len(schema) else pa.unify_schemas(schemas)
    return ds.dataset(files, schema=unified, format="parquet").to_table()
