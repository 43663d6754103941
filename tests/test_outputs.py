"""Output version manifests and the publication pointer: each written by one function, read by one
function that refuses what it cannot read (truncated, edited, newer) as ``output.corrupt`` naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.core.errors import DataError
from replay.store.outputs import (
    MANIFEST_FORMAT_VERSION,
    Publication,
    current_version,
    read_current,
    read_manifest,
    write_current,
    write_manifest,
)


def test_a_manifest_reads_back_as_written(tmp_path: Path) -> None:
    version = write_manifest(tmp_path, {"tables": {"windows": ["data/windows/x"]}, "kind": "run"})
    manifest = read_manifest(tmp_path, version)
    assert manifest["format_version"] == MANIFEST_FORMAT_VERSION and "sha256" not in manifest
    assert manifest["tables"] == {"windows": ["data/windows/x"]}
    # What a reader got can be written again as a new version (the payload's digest is recomputed).
    assert read_manifest(tmp_path, write_manifest(tmp_path, manifest))["tables"] == manifest["tables"]


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
    version = write_manifest(tmp_path, {"tables": {}, "kind": "run"})
    path = next(tmp_path.rglob(f"{version:06d}.json"))
    path.write_text(damage(path.read_text()))  # type: ignore[operator]
    with pytest.raises(DataError) as caught:
        read_manifest(tmp_path, version)
    assert caught.value.code == "output.corrupt"
    assert said in str(caught.value) and str(path) in str(caught.value)


def test_a_manifest_of_the_first_format_without_a_digest_still_reads(tmp_path: Path) -> None:
    version = write_manifest(tmp_path, {"tables": {}, "kind": "run"})
    path = next(tmp_path.rglob(f"{version:06d}.json"))
    older = {k: v for k, v in json.loads(path.read_text()).items() if k != "sha256"} | {"format_version": 1}
    path.write_text(json.dumps(older))
    assert read_manifest(tmp_path, version)["kind"] == "run"


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
