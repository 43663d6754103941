"""Replay's errors survive pickling whole (a kept driver sends them to its client): the class, the
code, the location and the message."""

from __future__ import annotations

import pickle

import pytest

from replay.core import errors
from replay.core.errors import Location, ReplayError

KINDS = [getattr(errors, name) for name in errors.__all__ if name not in ("Location",)]


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
