"""Replay's errors survive pickling whole (a kept driver sends them to its client): the class, the
code, the location and the message."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from replay.core import errors
from replay.core.errors import Location, ReplayError

EXPORTED = [getattr(errors, name) for name in errors.__all__]
KINDS = [kind for kind in EXPORTED if isinstance(kind, type) and issubclass(kind, ReplayError)]


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)
def test_every_error_pickles_whole(kind: type[ReplayError]) -> None:
    where = Location(file="part-00001.parquet", origin=3, sequence=17, chunk=2, column="watermark_ts")
    error = kind("something went wrong.", todo="fix it.", where=where, code=f"{kind.code}.test")
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is kind
    assert (back.code, back.message, back.to_dict(), back.exit_code) == (
        error.code,
        error.message,
        error.to_dict(),
        error.exit_code,
    )
    assert str(back) == str(error)


def test_an_error_with_its_class_code_keeps_it() -> None:
    error = errors.CheckpointCorruptError("x", todo="y", where=Location(extra={"batch": 4}))
    back = pickle.loads(pickle.dumps(error))
    assert (back.code, back.message, back.where) == ("checkpoint.corrupt", error.message, error.where)


def test_storage_errors_name_the_file_the_reason_and_what_is_left(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")

    @errors.storage_errors("nothing was committed")
    def write(path: Path) -> None:
        (path / "out").mkdir(parents=True)

    with pytest.raises(errors.StorageError) as failed:
        write(tmp_path / "a-file")
    error = failed.value
    assert (error.code, error.exit_code, error.file) == ("storage.io", 1, str(tmp_path / "a-file" / "out"))
    assert "Not a directory (ENOTDIR); nothing was committed" in error.message
    assert isinstance(error.__cause__, NotADirectoryError)
    assert write(tmp_path / "dir") is None and (tmp_path / "dir" / "out").is_dir()

    @errors.storage_errors("nothing was committed")
    def other(exc: Exception) -> None:
        raise exc

    with pytest.raises(OSError, match="no file named") as bare:  # not about a file: left as it is
        other(OSError("no file named"))
    assert type(bare.value) is OSError
    with pytest.raises(errors.ConfigError):  # Replay's own errors pass through
        other(errors.ConfigError("x", todo="y"))
