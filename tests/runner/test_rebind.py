"""Which setting changes a checkpoint takes. One that holds no commit yet (its first run failed)
takes any: following an error's advice (``on_conflict: keep_first``, another ``--output``) works
on the next run. One with commits takes a change from a strict policy to its lenient one, under
which its batches are what the new setting would have committed, and refuses the others."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from replay.core.errors import (
    ConflictingDuplicateError,
    IncompatibleCheckpointError,
    WatermarkRegressionError,
)
from replay.core.rules import RULES_VERSION
from replay.runner.loop import run
from replay.store.checkpoint import CheckpointStore
from replay.store.durable import write_record
from replay.store.outputs import list_versions, read_manifest
from tests._archives import buffer_rows, write_archive
from tests.runner._jobs import SECOND, T0, results, small_job

pytestmark = pytest.mark.spark

_NOT_PAYLOAD = ("format_version", "sha256", "rules")


def _conflicting(archive: Path) -> None:
    """Origin 1's sequence 1 archived twice with different tuples."""
    write_archive(archive, buffer_rows(1, 1, watermark=T0 + SECOND, events=[(T0 + 1, 1, 1.0)]), name="a.parquet")
    write_archive(archive, buffer_rows(1, 1, watermark=T0 + SECOND, events=[(T0 + 2, 1, 9.0)]), name="b.parquet")
    rows = buffer_rows(1, 2, watermark=T0 + 3 * SECOND, events=[(T0 + 3 * SECOND // 2, 2, 2.0)])
    write_archive(archive, rows, name="c.parquet")


def test_a_checkpoint_without_a_commit_takes_the_settings_the_error_advised(spark: Any, tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    _conflicting(archive)
    with pytest.raises(ConflictingDuplicateError) as raised:
        run(small_job(tmp_path, archive), spark=spark)
    assert "on_conflict: keep_first" in str(raised.value)
    store = CheckpointStore(tmp_path / "ckpt")
    assert store.identity() is not None and store.commits() == []

    advised = small_job(tmp_path, archive, on_conflict="keep_first")
    summary = run(advised, spark=spark)
    assert any("on_conflict 'fail' -> 'keep_first' (it held no commit yet)" in note for note in summary.notes)
    fresh = small_job(tmp_path / "fresh", archive, on_conflict="keep_first")
    run(fresh, spark=spark)
    assert results(advised) == results(fresh)


def test_a_checkpoint_without_a_commit_takes_another_output(spark: Any, tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    _conflicting(archive)
    with pytest.raises(ConflictingDuplicateError):
        run(small_job(tmp_path, archive).with_overrides(output=str(tmp_path / "elsewhere")), spark=spark)
    (archive / "b.parquet").unlink()
    summary = run(small_job(tmp_path, archive), spark=spark)
    assert summary.version == 1 and any("output" in note and "no commit" in note for note in summary.notes)


def test_a_checkpoint_with_commits_takes_a_lenient_policy_and_goes_on_as_if_it_had_had_it(
    spark: Any, tmp_path: Path
) -> None:
    archive = tmp_path / "archive"
    rows = buffer_rows(1, 1, watermark=T0 + 2 * SECOND, events=[(T0 + 1, 1, 1.0), (T0 + SECOND, 2, 2.0)])
    rows += buffer_rows(2, 1, watermark=T0 + 2 * SECOND, events=[(T0 + 2, 1, 4.0)])
    write_archive(archive, rows, name="part-00000.parquet")
    strict = small_job(tmp_path, archive)
    run(strict, spark=spark)
    store = CheckpointStore(tmp_path / "ckpt")
    committed = store.commits()
    # A new file whose watermark goes back: origin 1's sequence 2 promises less than sequence 1 did.
    rows = buffer_rows(1, 2, watermark=T0 + SECOND, events=[(T0 + 3 * SECOND, 1, 8.0)])
    rows += buffer_rows(1, 3, watermark=T0 + 5 * SECOND, events=[(T0 + 4 * SECOND, 2, 16.0)])
    rows += buffer_rows(2, 2, watermark=T0 + 5 * SECOND)
    write_archive(archive, rows, name="part-00001.parquet")
    with pytest.raises(WatermarkRegressionError) as raised:
        run(strict, spark=spark)
    assert "watermark_regression: clamp" in str(raised.value) and store.commits() == committed

    for refused in ({"gap_policy": "skip"}, {"on_conflict": "keep_first", "gap_policy": "skip"}):
        with pytest.raises(IncompatibleCheckpointError) as incompatible:
            run(small_job(tmp_path, archive, watermark_regression="clamp", **refused), spark=spark)
        assert "gap_policy" in str(incompatible.value)
    lenient = small_job(tmp_path, archive, watermark_regression="clamp")
    summary = run(lenient, spark=spark)
    assert any("watermark_regression 'fail' -> 'clamp'" in note for note in summary.notes)
    fresh = small_job(tmp_path / "fresh", archive, watermark_regression="clamp")
    run(fresh, spark=spark)
    assert results(lenient) == results(fresh)
    # Back to the strict policy: the clamped regression is committed, which 'fail' would have refused.
    with pytest.raises(IncompatibleCheckpointError) as back:
        run(strict, spark=spark)
    assert "watermark_regression" in str(back.value)


def test_the_batches_before_a_regression_commit_and_the_lenient_policy_goes_on_from_them(
    spark: Any, tmp_path: Path
) -> None:
    """A regression found while a pass's fourth batch is fed: its first three batches commit, the
    fourth does not; with ``clamp`` the run goes on from them, as a fresh ``clamp`` run would."""
    archive = tmp_path / "archive"
    rows = []
    for seq, mark in ((1, 2), (2, 3), (3, 4), (4, 1), (5, 6)):  # sequence 4's watermark goes back
        rows += buffer_rows(1, seq, watermark=T0 + mark * SECOND, events=[(T0 + seq * SECOND, seq % 2, float(seq))])
    write_archive(archive, rows)
    strict = small_job(tmp_path, archive, micro_batch={"max_buffers": 1})
    with pytest.raises(WatermarkRegressionError) as raised:
        run(strict, spark=spark)
    assert (raised.value.where.origin, raised.value.where.sequence) == (1, 4)
    store = CheckpointStore(tmp_path / "ckpt")
    assert store.commits() == [1, 2, 3]
    lenient = small_job(tmp_path, archive, watermark_regression="clamp", micro_batch={"max_buffers": 1})
    summary = run(lenient, spark=spark)
    assert summary.resumed and summary.batches == 2
    fresh = small_job(tmp_path / "fresh", archive, watermark_regression="clamp")
    run(fresh, spark=spark)
    assert results(lenient) == results(fresh)


def test_a_checkpoint_committed_under_earlier_rules_is_refused_and_left_as_it_was(spark: Any, tmp_path: Path) -> None:
    """A checkpoint from a Replay whose rules differed (here: one from before rules were versioned)
    is not continued: its commits would mix two sets of rules in one output."""
    archive = tmp_path / "archive"
    write_archive(archive, buffer_rows(1, 1, watermark=T0 + 2 * SECOND, events=[(T0 + 1, 1, 0.1)]), name="a.parquet")
    job = small_job(tmp_path, archive)
    run(job, spark=spark)
    store = CheckpointStore(tmp_path / "ckpt")
    identity = store.identity()
    assert identity is not None and identity["rules"] == RULES_VERSION
    assert job.output is not None and read_manifest(job.output, list_versions(job.output)[-1]).rules == RULES_VERSION
    write_record(store.root / "checkpoint.json", {k: v for k, v in identity.items() if k not in _NOT_PAYLOAD})
    committed, published = store.commits(), results(job)
    write_archive(archive, buffer_rows(1, 2, watermark=T0 + 4 * SECOND, events=[(T0 + 3, 1, 0.2)]), name="b.parquet")
    with pytest.raises(IncompatibleCheckpointError) as raised:
        run(job, spark=spark)
    assert "before they were versioned" in str(raised.value) and "new --checkpoint" in str(raised.value)
    assert store.commits() == committed and results(job) == published
