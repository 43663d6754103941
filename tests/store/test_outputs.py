"""Output version manifests and the publication pointer: each written by one function, read by one
function that refuses what it cannot read (truncated, edited, newer) as ``output.corrupt`` naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from replay.core.errors import DataError
from replay.store import outputs
from replay.store.durable import signed
from replay.store.outputs import (
    MANIFEST_FORMAT_VERSION,
    Manifest,
    Publication,
    current_version,
    read_current,
    read_manifest,
    write_current,
    write_manifest,
)


def test_a_manifest_reads_back_as_written(tmp_path: Path) -> None:
    version = write_manifest(tmp_path, Manifest(tables={"windows": ("data/windows/x",)}, kind="run")).version
    manifest = read_manifest(tmp_path, version)
    assert manifest.format_version == MANIFEST_FORMAT_VERSION and "sha256" not in manifest.to_json()
    assert manifest.tables == {"windows": ("data/windows/x",)}
    # What a reader got can be written again as a new version (the payload's digest is recomputed).
    assert read_manifest(tmp_path, write_manifest(tmp_path, manifest).version).tables == manifest.tables


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda text: text[: len(text) // 2], "not valid JSON"),
        (lambda text: json.dumps(json.loads(text) | {"format_version": MANIFEST_FORMAT_VERSION + 1}), "format_version"),
        (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "format_version"}), "None"),
        (lambda text: json.dumps(json.loads(text) | {"kind": "publication"}), "sha256"),
        (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "sha256"}), "sha256"),
    ],
    ids=["truncated", "newer-format", "no-format", "edited", "digest-removed"],
)
def test_a_manifest_that_cannot_be_read_is_output_corrupt_naming_the_file(
    tmp_path: Path, damage: object, said: str
) -> None:
    version = write_manifest(tmp_path, Manifest(tables={}, kind="run")).version
    path = next(tmp_path.rglob(f"{version:06d}.json"))
    path.write_text(damage(path.read_text()))  # type: ignore[operator]
    with pytest.raises(DataError) as caught:
        read_manifest(tmp_path, version)
    assert caught.value.code == "output.corrupt"
    assert said in str(caught.value) and str(path) in str(caught.value)


def test_a_manifest_of_the_first_format_without_a_digest_still_reads(tmp_path: Path) -> None:
    version = write_manifest(tmp_path, Manifest(tables={}, kind="run")).version
    path = next(tmp_path.rglob(f"{version:06d}.json"))
    older = {k: v for k, v in json.loads(path.read_text()).items() if k != "sha256"} | {"format_version": 1}
    path.write_text(json.dumps(older))
    assert read_manifest(tmp_path, version).kind == "run"


RUN: dict[str, Any] = {
    "version": 1,
    "created": "2026-01-02T03:04:05Z",
    "kind": "run",
    "checkpoint": "ckpt",
    "checkpoint_id": "c0ffee",
    "batch": 7,
    "run": 2,
    "range": [None, 1_700_000_000_000_000],
    "lateness": "origin",
    "tables": {"windows": ["data/windows/a", "data/windows/b"], "late": [], "progress": ["p"], "integrity": ["i"]},
    "schemas": {"windows": "ff00", "integrity": "aa"},
    "watermarks": [{"key": "default", "effective": -(2**63), "global": None, "participants": [1, 2]}],
    "counts": {"tuples_read": 10, "late": [1], "emitted_windows": {"w": 3}},
    "config": {"archive": "a", "nested": {"x": [1, 2.5, None, "é"]}},
    "files": ["f1", "f2"],
    "origins": [{"origin": 1, "complete_prefix": 5, "pending_buffers": 0}],
    "ledger_batches": [{"batch": 1, "read_xor": 3}],
    "log": {"lines": 3, "size": 100, "chain": "deadbeef"},
    "rules": 1,
}
PUBLICATION = RUN | {"version": 2, "kind": "publication", "source": 1, "previous": None, "merged_range": None}
MERGED = PUBLICATION | {"previous": 2, "merged_range": [5, None], "merged_rules": [None, 1]}


@pytest.mark.parametrize("payload", [RUN, PUBLICATION, MERGED], ids=["run", "publication", "merged"])
def test_a_manifest_is_written_byte_for_byte_as_earlier_replays_wrote_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, payload: dict[str, Any]
) -> None:
    """What the typed record writes is the JSON object earlier Replays wrote and read: the same keys (a
    publication's null ``previous`` and ``merged_range`` included), sorted, indented, with its sha256."""
    expected = json.dumps(signed(payload, MANIFEST_FORMAT_VERSION), indent=1, sort_keys=True)
    (tmp_path / "versions").mkdir()
    (tmp_path / "versions" / "000001.json").write_text(expected)
    manifest = read_manifest(tmp_path, 1)
    assert manifest.to_json() == payload | {"format_version": MANIFEST_FORMAT_VERSION}
    monkeypatch.setattr(outputs.time, "strftime", lambda *_: payload["created"])
    written = write_manifest(tmp_path, manifest)
    assert written.version == 2 and read_manifest(tmp_path, 2) == written
    again = json.dumps(signed(payload | {"version": 2}, MANIFEST_FORMAT_VERSION), indent=1, sort_keys=True)
    assert (tmp_path / "versions" / "000002.json").read_text() == again


def test_a_manifest_of_the_first_format_missing_later_fields_reads_typed(tmp_path: Path) -> None:
    later = ("kind", "config", "files", "origins", "ledger_batches", "log", "rules")
    older = {k: v for k, v in RUN.items() if k not in later}
    (tmp_path / "versions").mkdir()
    (tmp_path / "versions" / "000001.json").write_text(json.dumps(older | {"format_version": 1}))
    manifest = read_manifest(tmp_path, 1)
    assert manifest.kind == "run" and manifest.format_version == 1 and manifest.batch == 7
    assert manifest.config is None and manifest.ledger_batches is None and manifest.log is None
    assert manifest.rules is None
    assert manifest.range == (None, 1_700_000_000_000_000) and manifest.entries("windows") == (
        "data/windows/a",
        "data/windows/b",
    )


def test_a_manifest_is_checked_at_construction(tmp_path: Path) -> None:
    for wrong in (
        {"kind": "copy"},
        {"tables": {"nowhere": ()}},
        {"tables": {"windows": "data/windows/a"}},
        {"kind": "publication"},  # without its source
        {"source": 1},  # a run's version
        {"merged_rules": (None, 1)},  # a run's version
        {"format_version": MANIFEST_FORMAT_VERSION + 1},
    ):
        with pytest.raises((TypeError, ValueError)):
            Manifest(**({"tables": {}} | wrong))
    # An unknown field in a file is not something Replay wrote: output.corrupt, naming the file.
    (tmp_path / "versions").mkdir()
    path = tmp_path / "versions" / "000001.json"
    path.write_text(json.dumps(signed(RUN | {"extra": 1}, MANIFEST_FORMAT_VERSION)))
    with pytest.raises(DataError) as caught:
        read_manifest(tmp_path, 1)
    assert caught.value.code == "output.corrupt" and "extra" in str(caught.value) and str(path) in str(caught.value)


def test_the_publication_pointer_reads_back_typed_and_refuses_damage(tmp_path: Path) -> None:
    assert read_current(tmp_path) is None and current_version(tmp_path) is None
    pointer = Publication(version=3, source=2, previous=None, published="2026-01-01T00:00:00Z")
    write_current(tmp_path, pointer)
    assert read_current(tmp_path) == pointer and current_version(tmp_path) == 3
    path = tmp_path / "current"
    text = path.read_text()
    for damaged, said in (
        (text[: len(text) // 2], "not valid JSON"),
        (json.dumps(json.loads(text) | {"version": 1}), "sha256"),
        ("[]", "format_version"),
    ):
        path.write_text(damaged)
        with pytest.raises(DataError) as caught:
            current_version(tmp_path)
        assert caught.value.code == "output.corrupt" and said in str(caught.value) and str(path) in str(caught.value)
        assert "replay publish" in caught.value.todo
