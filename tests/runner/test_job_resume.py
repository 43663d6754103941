"""What resuming costs: a run continues from the last commit's engine snapshot, so the checkpoint
files it opens do not grow with the number of batches committed before it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from replay.runner.loop import run
from replay.store.digest import digest
from tests._archives import buffer_rows, write_archive
from tests.runner._jobs import SECOND, T0, small_job

pytestmark = pytest.mark.spark

_opened: list[str] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    # ("open", (path, mode, flags)): builtins.open gives a mode string, os.open None and its flags.
    if event != "open" or _opened is None or not isinstance(args[0], str | bytes | os.PathLike):
        return
    mode, flags = args[1], args[2]
    reading = ("r" in mode and "+" not in mode) if isinstance(mode, str) else (flags & os.O_ACCMODE) == os.O_RDONLY
    if reading:
        _opened.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # an audit hook cannot be removed; it records only inside ``_opening``


@contextmanager
def _opening(under: Path) -> Iterator[list[str]]:
    """The files opened for reading (through Python's ``open``, which every checkpoint read goes
    through) below ``under`` while the block runs; directories and files written are left out."""
    global _opened
    _opened = []
    found: list[str] = []
    try:
        yield found
    finally:
        found += [p for p in _opened if Path(p).resolve().is_relative_to(under.resolve()) and Path(p).is_file()]
        _opened = None


def _history(archive: Path, batches: int) -> None:
    """One buffer with tuples, then ``batches - 1`` punctuation buffers that promise nothing new:
    a long history of small committed batches, each one buffer."""
    rows = buffer_rows(1, 1, watermark=T0 + SECOND, events=[(T0 + SECOND // 2, 1, 1.0)])
    for seq in range(2, batches + 1):
        rows += buffer_rows(1, seq, watermark=None)
    write_archive(archive, rows, name="part-00000.parquet")


def _resume_after(spark: Any, root: Path, batches: int) -> tuple[list[str], dict[str, str]]:
    archive = root / "archive"
    _history(archive, batches)
    config = small_job(root, archive, micro_batch={"max_buffers": 1})
    assert run(config, spark=spark).batches == batches
    # A new file: the next sequence, with a tuple and a watermark that closes the first windows.
    write_archive(
        archive,
        buffer_rows(1, batches + 1, watermark=T0 + 10 * SECOND, events=[(T0 + 2 * SECOND, 2, 2.0)]),
        name="part-00001.parquet",
    )
    with _opening(root / "ckpt") as opened:
        summary = run(config, spark=spark)
    assert summary.batches == 1 and summary.windows_emitted == 2
    assert config.output is not None
    return opened, digest(config.output)


def test_resume_opens_as_many_checkpoint_files_after_200_batches_as_after_10(spark: Any, tmp_path: Path) -> None:
    short, _ = _resume_after(spark, tmp_path / "short", 10)
    long, long_digests = _resume_after(spark, tmp_path / "long", 200)

    def kinds(paths: list[str]) -> list[str]:
        return sorted(Path(p).parent.name + "/" + Path(p).name.split("-", 1)[-1] for p in paths)

    # The checkpoint's identity, the retained commits (pruning keeps the files they need), the last
    # commit's engine snapshot and its list of consumed files, and the batch log (the output
    # version lists every batch's files); never a buffer record of the batches before.
    assert len(long) == len(short), (kinds(short), kinds(long))
    retained = {f"{n:08d}.json" for n in range(200 - 9, 201)}
    for path in map(Path, long):
        assert (
            path.name == "checkpoint.json"
            or (path.parent.name == "commits" and path.name in retained)
            or path.name == "batches.jsonl"
            or (path.name.startswith("b00000200-") and path.name.endswith(("-engine.json", "-held.parquet")))
            or (path.name.startswith(("b00000200-", "b00000201-")) and path.name.endswith("-files.parquet"))
        ), kinds(long)
    # The same answer as one run over both files in one batch.
    fresh = small_job(tmp_path / "fresh", tmp_path / "long" / "archive")
    run(fresh, spark=spark)
    assert fresh.output is not None
    once = digest(fresh.output)
    for table in ("windows", "late"):
        assert long_digests[table] == once[table]
