"""Checkpoint records: written with their payload's sha256, read back only when intact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.checkpoint import RECORD_FORMAT_VERSION, CheckpointStore, read_record, write_record
from replay.errors import CheckpointCorruptError, CheckpointStateError


def test_a_record_reads_back_as_written(tmp_path: Path) -> None:
    write_record(tmp_path / "r.json", {"batch": 3, "nested": {"a": [1, 2]}})
    assert read_record(tmp_path / "r.json") == {
        "format_version": RECORD_FORMAT_VERSION,
        "batch": 3,
        "nested": {"a": [1, 2]},
    }


@pytest.mark.parametrize(
    ("damage", "fault"),
    [
        (lambda text: text[: len(text) // 2], "not valid JSON"),
        (lambda text: "", "not valid JSON"),
        (lambda text: json.dumps(json.loads(text) | {"batch": 4}), "sha256"),  # edited, hash kept
        (lambda text: "[1, 2]", "JSON object"),
    ],
    ids=["truncated", "emptied", "edited", "not-an-object"],
)
def test_a_damaged_record_is_checkpoint_corrupt_naming_the_file(tmp_path: Path, damage: object, fault: str) -> None:
    path = tmp_path / "r.json"
    write_record(path, {"batch": 3})
    path.write_text(damage(path.read_text()))  # type: ignore[operator]
    with pytest.raises(CheckpointCorruptError) as raised:
        read_record(path)
    assert fault in raised.value.message and raised.value.file == str(path)
    assert raised.value.code == "checkpoint.corrupt" and "new --checkpoint" in raised.value.todo


def test_a_missing_record_is_checkpoint_corrupt(tmp_path: Path) -> None:
    with pytest.raises(CheckpointCorruptError, match="is missing"):
        read_record(tmp_path / "gone.json")


def test_records_of_format_1_read_without_a_checksum_and_unknown_formats_are_refused(tmp_path: Path) -> None:
    (tmp_path / "old.json").write_text(json.dumps({"format_version": 1, "batch": 2}))
    assert read_record(tmp_path / "old.json") == {"format_version": 1, "batch": 2}
    (tmp_path / "new.json").write_text(json.dumps({"format_version": 99, "batch": 2}))
    with pytest.raises(CheckpointStateError, match="unsupported checkpoint format version 99"):
        read_record(tmp_path / "new.json")


def _commit(batch: int, buffers: str) -> dict[str, object]:
    return {
        "batch": batch,
        "outputs": {"windows": [], "late": [], "progress": []},
        "batches": [{"buffers": buffers}],
        "open_state": {},
    }


def test_resume_point_falls_back_to_the_newest_intact_commit(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    for batch in (1, 2, 3, 4):
        (tmp_path / f"b{batch}").touch()
        store.commit(batch, _commit(batch, f"b{batch}"))
    (tmp_path / "commits" / "00000004.json").write_text("{")  # truncated
    (tmp_path / "b3").unlink()  # commit 3 names a file that is gone

    def missing(commit: object) -> list[str]:
        return store.missing_files(commit, tmp_path / "out")  # type: ignore[arg-type]

    looked = store.resume_point(missing, repair=False)
    assert looked.commit is not None and looked.commit["batch"] == 2
    assert [line.split(":")[0] for line in looked.skipped] == ["commit 4", "commit 3"]
    assert store.commits() == [1, 2, 3, 4]  # reading repairs nothing
    repaired = store.resume_point(missing, repair=True)
    assert repaired == looked
    assert store.commits() == [1, 2]
    assert sorted(p.name for p in (tmp_path / "commits").glob("*.corrupt")) == [
        "00000003.json.corrupt",
        "00000004.json.corrupt",
    ]


def test_resume_point_without_any_intact_commit_stops(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    assert store.resume_point(lambda c: [], repair=True).commit is None  # a new checkpoint
    store.commit(1, _commit(1, "b1"))
    (tmp_path / "commits" / "00000001.json").write_text("")
    with pytest.raises(CheckpointCorruptError, match="none of the checkpoint's 1 commit"):
        store.resume_point(lambda c: [], repair=True)
    assert store.commits() == [1]  # nothing renamed when there is nothing to resume from
