"""An archive file rewritten in place while a run reads it (the archiver adds buffers to it): the
run records each file as consumed with the stamp (size, modification time) it had before the
scan read it, and only if the file still has it when the run ends. A file changed in between is
named in the run's notes and not consumed, so the next run scans it again and replays its new
buffers: the tables equal a fresh run's over the final files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from replay.runner.loop import run
from replay.store.checkpoint import CheckpointStore
from replay.store.outputs import read_manifest
from tests._archives import buffer_rows, write_archive
from tests.runner._jobs import SECOND, T0, results, small_job

pytestmark = pytest.mark.spark


def _rows(sequences: range) -> list[dict[str, Any]]:
    rows = []
    for sequence in sequences:
        for origin in (1, 2):
            at = T0 + sequence * SECOND
            events = [(at - SECOND // 4, origin, 1.0 * sequence), (at - 3 * SECOND // 4, 3, 0.5)]
            rows += buffer_rows(origin, sequence, watermark=at, events=events)
    return rows


def test_a_file_rewritten_during_a_run_is_not_consumed_and_the_next_run_replays_its_new_buffers(
    spark: Any, tmp_path: Path
) -> None:
    archive = tmp_path / "archive"
    early = write_archive(archive, _rows(range(1, 3)), name="part-00000.parquet")
    write_archive(archive, _rows(range(3, 5)), name="part-00001.parquet")
    before = early.stat()
    # Four batches of two buffers, a pass each: the first file is read by the first two.
    config = small_job(tmp_path, archive, micro_batch={"max_buffers": 2, "max_batches_per_pass": 1})

    def rewrite(step: str, done: int, total: int) -> None:
        if step == "batch" and done == 2:  # its buffers replayed, the run not finished
            assert total == 4
            write_archive(archive, _rows(range(1, 3)) + _rows(range(5, 6)), name=early.name)

    first = run(config, spark=spark, on_event=rewrite)
    assert first.batches == 4 and early.stat().st_size != before.st_size
    assert config.checkpoint is not None
    intent = CheckpointStore(Path(config.checkpoint)).run_intent(1)
    assert intent is not None and intent.stamps is not None
    assert intent.stamps[str(early)] == (before.st_size, before.st_mtime_ns)  # taken before the scan
    assert config.output is not None and str(early) in (read_manifest(config.output, 1).files or ())  # it was read

    second = run(config, spark=spark)  # before the fix: nothing new, the two buffers lost
    assert second.buffers == 2 and second.version == 2 and not second.notes
    assert [n for n in first.notes if "changed while this run read it" in n] == [
        f"{early} changed while this run read it (size or modification time): it is not recorded as consumed, so "
        "the next run scans it again and replays the buffers it holds that were not replayed"
    ]
    assert run(config, spark=spark).batches == 0  # consumed now

    fresh = tmp_path / "fresh"
    shutil.copytree(archive, fresh / "archive")
    whole = small_job(fresh, fresh / "archive")
    run(whole, spark=spark)
    assert results(config) == results(whole)


def test_a_file_keeps_its_stamp_until_it_changes_or_goes(tmp_path: Path) -> None:
    """What a run's last commit records as consumed: a file that still has the stamp taken before
    the scan (a resumed run takes its intent's); not one touched since, nor one gone."""
    from replay.runner.plan import stamped, unchanged

    file = write_archive(tmp_path, _rows(range(1, 2)), name="a.parquet")
    stamps = stamped([str(file)])
    assert unchanged(stamps) == (stamps, [])
    stat = file.stat()
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert unchanged(stamps) == ({}, [str(file)])
    file.unlink()
    assert unchanged(stamps) == ({}, [str(file)])  # gone: not consumed either
