"""An output version's manifest as a typed value (docs/outputs.md#output-location).

A manifest lists, for each table of a version, the data files and directories that make it up
(relative to the output root), with what the version was built from. ``write_manifest`` and
``read_manifest`` (``replay.store.outputs``) write and read it; nothing reads a manifest by
string key. On disk it is one JSON object (``versions/<version>.json``, keys sorted, indented
by one space) holding ``Manifest.to_json()`` and the sha256 of its payload.

Manifests of every earlier Replay still read: format 1 (no sha256) and, in it, the fields
earlier Replays did not write yet (``kind``, ``config``, ``files``, ``origins``,
``ledger_batches``, ``log``) are ``None``, and a missing ``kind`` is ``"run"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from replay.store.records import LogPointer

__all__ = ["KINDS", "MANIFEST_FORMAT_VERSION", "TABLES", "Manifest"]

#: The tables of an output version, in the order ``replay digest`` lists them.
TABLES = ("windows", "late", "progress", "integrity", "corrections")
#: Manifests and the publication pointer: version 2 added the payload's sha256 (required from 2 on).
MANIFEST_FORMAT_VERSION = 2
#: What wrote a version: a run of the job, or ``replay publish``.
KINDS = ("run", "publication")

_Range = tuple[int | None, int | None]


def _plain(value: Any) -> Any:
    """A field's value as JSON values: tuples as lists, mappings as dicts, a log pointer as its object."""
    if isinstance(value, LogPointer):
        return value.to_json()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _range(value: Any) -> _Range | None:
    if value is None:
        return None
    lo, hi = value
    return (None if lo is None else int(lo), None if hi is None else int(hi))


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _rules(value: Any) -> tuple[int | None, ...] | None:
    return None if value is None else tuple(_optional_int(v) for v in value)


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _paths(value: Any) -> tuple[str, ...]:
    if isinstance(value, str | bytes) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{value!r} is not a list of paths")
    return tuple(value)


def _records(value: Any) -> tuple[Mapping[str, Any], ...] | None:
    return None if value is None else tuple(dict(v) for v in value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    """One output version: its tables' files, their schemas, and what it was built from.

    ``version`` and ``created`` (ISO 8601 UTC) are given by ``write_manifest``, which replaces
    whatever the record it is handed holds there (``0`` and ``""``: not written yet), and writes
    the newest ``format_version``.

    A run's version (``kind="run"``): ``checkpoint`` and ``checkpoint_id`` it was committed in,
    its last ``batch`` and ``run``, the event-time ``range`` ``[start, end)`` it replayed
    (``None`` on either side: unbounded), the ``lateness`` mode, the ``watermarks`` (one object
    per watermark key, from the progress report) and ``counts`` (the ledger's totals). What
    validation needs once the checkpoint's commits are pruned: the job ``config`` (as
    ``JobConfig.model_dump(mode="json")``), the archive ``files`` it consumed, the ``origins``
    of the progress report and ``ledger_batches`` (the ledger row of every batch). ``log``: how
    far the checkpoint's batch log reached, so the next version reads only the batches after it.
    ``rules``: the version of the rules the tables were computed by (``replay.core.rules``;
    ``None`` in a version written before rules were versioned).

    A publication (``kind="publication"``, written by ``replay publish``) holds its ``source``
    run version's fields, ``previous`` (the publication it replaced, ``None`` for the first) and
    ``merged_range`` (the range whose rows replaced the previous publication's, ``None`` when it
    did not merge), and its own ``tables`` and ``schemas``. ``merged_rules``: a merged publication
    that kept rows of a previous publication computed by other rules than its source's names every
    rules version among its rows, ascending (``None``, rules from before they were versioned,
    first); otherwise ``None``, and ``rules`` covers all of its rows.

    Checked at construction: a known ``kind`` and ``format_version``, known table names, a
    publication's ``source``, and no publication fields on a run's version. Sequences are kept
    as tuples, so a record built with lists equals the one read back.
    """

    tables: Mapping[str, tuple[str, ...]]
    schemas: Mapping[str, str] = field(default_factory=dict)
    kind: str = "run"
    version: int = 0
    created: str = ""
    format_version: int = MANIFEST_FORMAT_VERSION
    checkpoint: str | None = None
    checkpoint_id: str | None = None
    batch: int | None = None
    run: int | None = None
    range: _Range | None = None
    lateness: str | None = None
    watermarks: tuple[Mapping[str, Any], ...] | None = None
    counts: Mapping[str, Any] | None = None
    config: Mapping[str, Any] | None = None
    files: tuple[str, ...] | None = None
    origins: tuple[Mapping[str, Any], ...] | None = None
    ledger_batches: tuple[Mapping[str, Any], ...] | None = None
    log: LogPointer | None = None
    rules: int | None = None
    source: int | None = None
    previous: int | None = None
    merged_range: _Range | None = None
    merged_rules: tuple[int | None, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if not 1 <= self.format_version <= MANIFEST_FORMAT_VERSION:
            raise ValueError(f"format_version {self.format_version!r} is not 1 to {MANIFEST_FORMAT_VERSION}")
        if self.version < 0:
            raise ValueError(f"version {self.version} is negative")
        unknown = sorted((set(self.tables) | set(self.schemas)) - set(TABLES))
        if unknown:
            raise ValueError(f"unknown tables {unknown} (tables: {', '.join(TABLES)})")
        if self.kind == "publication" and self.source is None:
            raise ValueError("a publication names its source version")
        publication_fields = (self.source, self.previous, self.merged_range, self.merged_rules)
        if self.kind == "run" and any(value is not None for value in publication_fields):
            raise ValueError("a run's version has no source, previous, merged_range or merged_rules (a publication's)")
        # Sequences as tuples (given as lists by a writer, read as lists from JSON): a frozen record.
        normal: dict[str, Any] = {
            "tables": {k: _paths(v) for k, v in self.tables.items()},
            "schemas": dict(self.schemas),
        }
        for name in ("watermarks", "origins", "ledger_batches", "files", "range", "merged_range", "merged_rules"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                normal[name] = tuple(value)
        for name, value in normal.items():
            object.__setattr__(self, name, value)

    def to_json(self) -> dict[str, Any]:
        """The manifest as written (everything but ``sha256``, which the writer adds).

        A field that is ``None`` is left out, as earlier Replays wrote no key for it, except a
        publication's ``previous`` and ``merged_range``, which are written as ``null``.
        """
        out: dict[str, Any] = {}
        for f in fields(self):
            name, value = f.name, getattr(self, f.name)
            if value is None and not (self.kind == "publication" and name in ("previous", "merged_range")):
                continue
            out[name] = _plain(value)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Manifest:
        """A manifest from its JSON object (``sha256`` may be there or not; it is checked by the reader).

        Raises:
            KeyError: no ``tables``, ``version`` or ``created``.
            TypeError, ValueError: a field of the wrong type, an unknown field, or a check of the
                record failed.
        """
        unknown = sorted(set(data) - {f.name for f in fields(cls)} - {"sha256"})
        if unknown:
            raise ValueError(f"unknown fields {unknown}")
        log = data.get("log")
        return cls(
            tables={str(k): _paths(v) for k, v in data["tables"].items()},
            schemas=dict(data.get("schemas") or {}),
            kind=str(data.get("kind", "run")),
            version=int(data["version"]),
            created=str(data["created"]),
            format_version=int(data.get("format_version", MANIFEST_FORMAT_VERSION)),
            checkpoint=_optional_str(data.get("checkpoint")),
            checkpoint_id=_optional_str(data.get("checkpoint_id")),
            batch=_optional_int(data.get("batch")),
            run=_optional_int(data.get("run")),
            range=_range(data.get("range")),
            lateness=_optional_str(data.get("lateness")),
            watermarks=_records(data.get("watermarks")),
            counts=None if data.get("counts") is None else dict(data["counts"]),
            config=None if data.get("config") is None else dict(data["config"]),
            files=None if data.get("files") is None else _paths(data["files"]),
            origins=_records(data.get("origins")),
            ledger_batches=_records(data.get("ledger_batches")),
            log=None if log is None else LogPointer.from_json(log),
            rules=_optional_int(data.get("rules")),
            source=_optional_int(data.get("source")),
            previous=_optional_int(data.get("previous")),
            merged_range=_range(data.get("merged_range")),
            merged_rules=_rules(data.get("merged_rules")),
        )

    def entries(self, table: str) -> tuple[str, ...]:
        """The data files and directories of ``table`` (relative to the output root; none: empty)."""
        return self.tables.get(table, ())

    def all_entries(self) -> set[str]:
        """Every data file and directory of every table."""
        return {entry for entries in self.tables.values() for entry in entries}
