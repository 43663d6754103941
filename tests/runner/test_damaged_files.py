"""A file whose footer reads but whose data pages do not (damaged on disk or in transfer) passes the
metadata scan and fails in the pass's Spark tasks. The run reports it as ``archive.unreadable``
naming the file, commits nothing of the pass, and goes on once the file is moved out (nothing of the
run committed: planned again) or restored (batches committed: the same cut)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from replay.core.errors import ArchiveReadError
from replay.runner.loop import run
from replay.store.checkpoint import CheckpointStore
from tests._archives import buffer_rows, damage_pages, write_archive
from tests.runner._jobs import SECOND, T0, results, small_job

pytestmark = pytest.mark.spark


def _sequences(archive: Path, name: str, first: int, last: int) -> Path:
    rows = []
    for seq in range(first, last + 1):
        events = [(T0 + seq * SECOND - 10 - i, i % 7, i * 1.37 + seq) for i in range(300)]
        rows += buffer_rows(1, seq, watermark=T0 + seq * SECOND, events=events)
    return write_archive(archive, rows, name=name)


def test_a_damaged_file_is_named_and_moving_it_out_lets_the_run_go_on(spark: Any, tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    _sequences(archive, "a.parquet", 1, 3)
    damaged = _sequences(archive, "b.parquet", 4, 5)
    damage_pages(damaged)
    config = small_job(tmp_path, archive)
    with pytest.raises(ArchiveReadError) as raised:
        run(config, spark=spark)
    error = raised.value
    assert error.code == "archive.unreadable" and error.file == str(damaged)
    assert "footer reads but its data does not" in str(error) and "nothing of the batch" in str(error)
    assert CheckpointStore(tmp_path / "ckpt").commits() == []

    shutil.move(damaged, tmp_path / "quarantined.parquet")
    summary = run(config, spark=spark)
    assert summary.buffers == 3 and any("planned again" in note for note in summary.notes)
    fresh = small_job(tmp_path / "fresh", archive)
    run(fresh, spark=spark)
    assert results(config) == results(fresh)


@pytest.mark.parametrize("per_pass", [1, 32])
def test_a_run_that_committed_batches_needs_its_files_back(spark: Any, tmp_path: Path, per_pass: int) -> None:
    """The batches before the damaged file's commit, each its own pass or all in one pass (whose
    Spark action failed on the file: the batches before it are aggregated again without it)."""
    archive = tmp_path / "archive"
    _sequences(archive, "a.parquet", 1, 3)
    damaged = _sequences(archive, "b.parquet", 4, 5)
    intact = damaged.read_bytes()
    damage_pages(damaged)
    config = small_job(tmp_path, archive, micro_batch={"max_buffers": 1, "max_batches_per_pass": per_pass})
    with pytest.raises(ArchiveReadError, match="footer reads"):
        run(config, spark=spark)
    store = CheckpointStore(tmp_path / "ckpt")
    assert store.commits() == [1, 2, 3]  # sequences 1 to 3; sequence 4's batch failed

    damaged.unlink()
    with pytest.raises(ArchiveReadError, match="run 1 reads are gone") as gone:
        run(config, spark=spark)
    assert gone.value.file == str(damaged) and "restore the file" in str(gone.value)
    assert store.commits() == [1, 2, 3]

    damaged.write_bytes(intact)  # an intact copy under the same name
    assert run(config, spark=spark).resumed
    fresh = small_job(tmp_path / "fresh", archive)
    run(fresh, spark=spark)
    assert results(config) == results(fresh)
