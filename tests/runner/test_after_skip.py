"""A buffer of a sequence that ``gap_policy: skip`` closed in an earlier run, found by a later run
(its file was written late): it is not fed (its sequence is in the complete prefix), the
``integrity`` table reports it as ``after_skip``, the run's notes count it, and the run and the
runs after it go on. The tables equal the reference model's, told which files each run read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from replay.core.errors import ConflictingDuplicateError
from replay.quality.validate import validate
from replay.reference.model import run_reference
from replay.runner.loop import run
from replay.store.outputs import read_table
from tests._archives import buffer_rows, write_archive
from tests.runner._jobs import SECOND, T0, small_job
from tests.runner.test_job_vs_reference import job_view, reference_view, same_windows

pytestmark = pytest.mark.spark


def _buffer(origin: int, sequence: int, ingest: int | None) -> list[dict[str, Any]]:
    """Origin ``origin``'s sequence ``sequence``: watermark ``sequence`` s, three tuples around it
    (one of them late behind its predecessor's watermark for sequences past the first)."""
    at = T0 + sequence * SECOND
    events = [(at - SECOND // 4, origin, 1.0 * sequence), (at - SECOND // 2, 2, 0.5), (at - 3 * SECOND // 2, 3, 2.0)]
    extra = {} if ingest is None else {"ingest": ingest}
    return buffer_rows(origin, sequence, watermark=at, events=events, **extra)


def _file(archive: Path, name: str, buffers: list[tuple[int, int, int]], arrival: bool) -> Path:
    rows = [r for o, s, i in buffers for r in _buffer(o, s, T0 + i * SECOND if arrival else None)]
    return write_archive(archive, rows, name=name)


@pytest.mark.parametrize("arrival", [False, True], ids=["origin", "arrival"])
def test_a_buffer_of_a_skipped_sequence_found_later_is_reported_and_the_runs_go_on(
    spark: Any, tmp_path: Path, arrival: bool
) -> None:
    archive = tmp_path / "archive"
    # (origin, sequence, ingest in seconds): origin 1 misses sequence 2 in the first run.
    first = _file(archive, "part-00000.parquet", [(1, 1, 1), (2, 1, 1), (2, 2, 2), (1, 3, 3), (2, 3, 3)], arrival)
    mode = "arrival" if arrival else "origin"
    config = small_job(tmp_path, archive, gap_policy="skip", lateness=mode, validation={"max_late_fraction": 1.0})
    assert config.output is not None
    run(config, spark=spark)
    # The missing sequence arrives in a file of its own, with an ingest time before the clock, and
    # the origins go on in another.
    late = _file(archive, "part-00001.parquet", [(1, 2, 2)], arrival)
    second = _file(archive, "part-00002.parquet", [(1, 4, 4), (2, 4, 4)], arrival)
    summary = run(config, spark=spark)  # progress.buffer_seen_twice before the fix
    assert summary.buffers == 2 and summary.version == 2
    assert any("1 buffer(s) (3 tuples)" in note and "after_skip" in note for note in summary.notes)
    integrity = read_table(config.output, "integrity").to_pylist()
    found = [r for r in integrity if r["kind"] == "after_skip"]
    assert [(r["origin_id"], r["sequence_number"], r["chunk_number"], r["tuples"], r["file"]) for r in found] == [
        (1, 2, 1, 3, late.name)
    ]
    assert found[0]["other_file"] is None and "gap_policy: skip" in found[0]["detail"]
    assert [(r["origin_id"], r["sequence_number"]) for r in integrity if r["kind"] == "skipped"] == [(1, 2)]
    # Validation knows the kind, and its recomputation leaves the late buffer out, as the run did.
    outcome = validate(config.output, spark=spark)
    assert outcome.success, outcome.failures

    earlier = [[first]]
    expected = reference_view(config, earlier)
    ref = run_reference(archive, config, earlier=earlier)
    assert ref.after_skip == {(1, 2, 1)} and ref.skipped == {(1, 2)}
    actual = job_view(config, spark)  # a third run: nothing new, the same tables
    same_windows(actual["windows"], expected["windows"])
    assert actual["late"] == expected["late"] and actual["open"] == expected["open"]

    # A third run with more buffers reads on; the late file is consumed and stays so.
    third = _file(archive, "part-00003.parquet", [(1, 5, 5), (2, 5, 5)], arrival)
    summary = run(config, spark=spark)
    assert summary.buffers == 2 and summary.version == 3
    earlier = [[first], [first, late, second]]
    expected = reference_view(config, earlier)
    actual = job_view(config, spark)
    same_windows(actual["windows"], expected["windows"])
    assert actual["late"] == expected["late"] and actual["open"] == expected["open"]
    assert third.exists()
    after = [r for r in read_table(config.output, "integrity").to_pylist() if r["kind"] == "after_skip"]
    assert len(after) == 1


def test_one_run_over_every_file_skips_nothing_and_differs_from_the_incremental_runs(tmp_path: Path) -> None:
    """The reference model over the same files in one run fills the gap: no ``after_skip``, no
    ``skipped``; told of the earlier run, it closes the gap there and drops the late buffer."""
    archive = tmp_path / "archive"
    first = _file(archive, "part-00000.parquet", [(1, 1, 1), (2, 1, 1), (1, 3, 3), (2, 3, 3)], False)
    _file(archive, "part-00001.parquet", [(1, 2, 2), (2, 2, 2)], False)
    config = small_job(tmp_path, archive, gap_policy="skip")
    whole = run_reference(archive, config)
    assert not whole.after_skip and not whole.skipped
    split = run_reference(archive, config, earlier=[[first]])
    assert split.after_skip == {(1, 2, 1), (2, 2, 1)} and split.skipped == {(1, 2), (2, 2)}
    assert split.pending_tuples == whole.pending_tuples == 0
    assert split.windows != whole.windows  # the late buffers' tuples are in no window


@pytest.mark.parametrize(
    ("copy", "on_conflict"),
    [("same", "fail"), ("other", "fail"), ("other", "keep_first")],
    ids=["identical", "differs-fail", "differs-keep-first"],
)
def test_a_later_copy_of_a_buffer_found_after_its_skip_is_compared_with_the_first(
    spark: Any, tmp_path: Path, copy: str, on_conflict: str
) -> None:
    """A buffer found as ``after_skip`` in one run and archived again in a later run: the later copy
    is a duplicate of the first or a conflict with it (failing the run under ``on_conflict: fail``),
    as one run over every file finds it and as the reference model says; before, it was taken for
    one more ``after_skip`` and a conflict went unseen."""
    archive = tmp_path / "archive"
    first = _file(archive, "part-00000.parquet", [(1, 1, 1), (2, 1, 1), (2, 2, 2), (1, 3, 3), (2, 3, 3)], False)
    config = small_job(tmp_path, archive, gap_policy="skip", on_conflict=on_conflict)
    assert config.output is not None
    run(config, spark=spark)
    late = _file(archive, "part-00001.parquet", [(1, 2, 2)], False)
    run(config, spark=spark)  # (1, 2, 1) after_skip
    rows = _buffer(1, 2, None)
    if copy == "other":
        rows[0] = rows[0] | {"value": rows[0]["value"] + 1}
    again = write_archive(archive, rows, name="part-00002.parquet")
    earlier = [[first], [first, late]]
    if copy == "other" and on_conflict == "fail":
        with pytest.raises(ConflictingDuplicateError) as expected:
            run_reference(archive, config, earlier=earlier)
        with pytest.raises(ConflictingDuplicateError) as raised:
            run(config, spark=spark)
        assert (raised.value.origin, raised.value.sequence, raised.value.chunk) == (1, 2, 1)
        assert (expected.value.origin, expected.value.sequence) == (1, 2)
        assert late.name in str(raised.value) and again.name in str(raised.value)
        return
    run(config, spark=spark)
    ref = run_reference(archive, config, earlier=earlier)
    integrity = read_table(config.output, "integrity").to_pylist()
    found = [
        (r["kind"], r["file"], r["other_file"]) for r in integrity if r["sequence_number"] == 2 and r["origin_id"] == 1
    ]
    kind = "duplicate" if copy == "same" else "conflict"
    kinds = [("skipped", None, None), ("after_skip", late.name, None), (kind, again.name, late.name)]
    assert sorted(found) == sorted(kinds)
    if copy == "same":
        assert ref.duplicate_copies.get(1) == 1 and not ref.conflicts
    else:
        assert ref.conflicts == {(1, 2, 1)}
    assert ref.after_skip == {(1, 2, 1)}
