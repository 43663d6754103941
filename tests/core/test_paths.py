"""Local locations: a URI's local path, and output and checkpoint locations that cannot be directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.core.errors import ConfigError
from replay.core.paths import check_directory, local_path


def test_local_paths() -> None:
    assert local_path("/data/a") == "/data/a"
    assert local_path("file:///data/a%20b") == "/data/a b"
    assert local_path("s3a://bucket/a") is None


def test_a_location_that_is_a_file_or_under_one_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    check_directory("output", str(tmp_path / "missing" / "out"))  # created when first written
    check_directory("output", str(tmp_path))
    check_directory("checkpoint", "s3a://bucket/ckpt")  # not checked here: the store says
    with pytest.raises(ConfigError) as itself:
        check_directory("checkpoint", str(tmp_path / "a-file"))
    assert itself.value.code == "config.not_a_directory" and "is a file" in str(itself.value)
    with pytest.raises(ConfigError) as under:
        check_directory("output", f"file://{tmp_path / 'a-file' / 'out' / 'deeper'}")
    assert under.value.file == str(tmp_path / "a-file") and under.value.where.field == "output"
    assert "--output" in str(under.value)
