"""Output version manifests: written by one function, read by one function that refuses what it cannot read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.core.errors import DataError
from replay.store.outputs import FORMAT_VERSION, read_manifest, write_manifest


def test_a_manifest_reads_back_as_written(tmp_path: Path) -> None:
    version = write_manifest(tmp_path, {"tables": {"windows": ["data/windows/x"]}, "kind": "run"})
    manifest = read_manifest(tmp_path, version)
    assert manifest["format_version"] == FORMAT_VERSION
    assert manifest["tables"] == {"windows": ["data/windows/x"]}


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda text: text[: len(text) // 2], "not valid JSON"),
        (lambda text: json.dumps(json.loads(text) | {"format_version": FORMAT_VERSION + 1}), "format_version"),
        (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "format_version"}), "None"),
    ],
    ids=["truncated", "newer-format", "no-format"],
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
