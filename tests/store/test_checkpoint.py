"""Checkpoint records: written with their payload's sha256, read back only when intact."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from replay.core.errors import CheckpointCorruptError, CheckpointStateError, IncompatibleCheckpointError
from replay.core.rules import CHANGES, RULES_VERSION
from replay.store.checkpoint import CheckpointStore
from replay.store.durable import RECORD_FORMAT_VERSION, read_record, write_record
from replay.store.records import Commit, EngineSnapshot, LogEntry, LogPointer


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


def _commit(batch: int, held: str, log: LogPointer | None = None) -> Commit:
    return Commit(
        batch=batch,
        run=1,
        token="t",
        finish=True,
        lateness="origin",
        range=(None, None),
        log=log or LogPointer(),
        consumed=None,
        discarded=None,
        engine=held,
        held=held,
        open_state={},
        outputs={"windows": None, "late": None, "progress": None},
        ledger={},
        pending_buffers=0,
        pending_tuples=0,
        schemas={},
    )


def test_a_commit_reads_back_as_the_same_typed_record(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    commit = _commit(3, "b3", LogPointer(lines=2, size=10, chain="ab"))
    store.commit(commit)
    assert store.commit_record(3) == commit and store.latest() == commit


def test_a_commit_of_an_earlier_format_is_refused_with_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / "00000001.json").write_text(json.dumps({"format_version": 1, "batch": 1}))
    with pytest.raises(CheckpointStateError, match="earlier Replay") as raised:
        CheckpointStore(tmp_path).latest()
    assert "new --checkpoint" in raised.value.todo


def test_a_commit_without_its_fields_is_checkpoint_corrupt(tmp_path: Path) -> None:
    write_record(tmp_path / "commits" / "00000001.json", {"batch": 1})
    with pytest.raises(CheckpointCorruptError, match="fields of its kind"):
        CheckpointStore(tmp_path).latest()


def _committed(store: CheckpointStore, batch: int) -> None:
    """Commit ``batch`` with an engine snapshot that reads intact."""
    commit = _commit(batch, f"b{batch}")
    store.write_snapshot(commit.engine, EngineSnapshot(engine={}, undecided=(), progress={}))
    store.commit(commit)


def test_resume_point_falls_back_to_the_newest_intact_commit(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    for batch in (1, 2, 3, 4, 5):
        _committed(store, batch)
    (tmp_path / "commits" / "00000005.json").write_text("{")  # truncated
    (tmp_path / "b4").unlink()  # commit 4 names a file that is gone
    snapshot = json.loads((tmp_path / "b3").read_text())
    (tmp_path / "b3").write_text(json.dumps(snapshot | {"undecided": [[1, 2, 3]]}))  # edited, hash kept

    looked = store.resume_point(tmp_path / "out", repair=False)
    assert looked.commit is not None and looked.commit.batch == 2
    assert [line.split(":")[0] for line in looked.skipped] == ["commit 5", "commit 4", "commit 3"]
    assert "engine snapshot" in looked.skipped[2] and "sha256" in looked.skipped[2]
    assert store.commits() == [1, 2, 3, 4, 5]  # reading repairs nothing
    repaired = store.resume_point(tmp_path / "out", repair=True)
    assert repaired == looked
    assert store.commits() == [1, 2]
    assert sorted(p.name for p in (tmp_path / "commits").glob("*.corrupt")) == [
        "00000003.json.corrupt",
        "00000004.json.corrupt",
        "00000005.json.corrupt",
    ]


def test_resume_point_without_any_intact_commit_stops(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    assert store.resume_point(tmp_path / "out", repair=True).commit is None  # a new checkpoint
    _committed(store, 1)
    (tmp_path / "commits" / "00000001.json").write_text("")
    with pytest.raises(CheckpointCorruptError, match="none of the checkpoint's 1 commit"):
        store.resume_point(tmp_path / "out", repair=True)
    assert store.commits() == [1]  # nothing renamed when there is nothing to resume from


def _entry(batch: int) -> LogEntry:
    return LogEntry(
        batch=batch,
        run=1,
        token="t",
        finish=False,
        join={"k": (1, 2)},
        buffers=f"state/b{batch:08d}-t-buffers.parquet",
        outputs={"windows": None, "late": None, "progress": f"data/progress/b{batch}.parquet"},
        ledger={"batch_tuples": batch},
    )


def test_the_batch_log_reads_back_up_to_a_commit_and_drops_an_uncommitted_line(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    first = store.append_log(_entry(1), LogPointer())
    second = store.append_log(_entry(2), first)
    assert store.read_log(second) == [_entry(1), _entry(2)]
    assert store.read_log(first) == [_entry(1)]  # an older commit sees only its prefix
    store.append_log(_entry(3), second)  # a batch that never committed
    redone = store.append_log(_entry(3), second)  # redone: the stray line is replaced
    assert store.read_log(redone) == [_entry(1), _entry(2), _entry(3)]
    assert len((tmp_path / "batches.jsonl").read_bytes().splitlines()) == 3


def test_the_batch_log_reads_from_an_earlier_pointer_and_refuses_a_foreign_one(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    first = store.append_log(_entry(1), LogPointer())
    third = store.append_log(_entry(3), store.append_log(_entry(2), first))
    assert store.read_log(third, since=first) == [_entry(2), _entry(3)]
    with pytest.raises(CheckpointCorruptError, match="sha256 chain"):
        store.read_log(third, since=LogPointer(lines=1, size=first.size, chain="0" * 64))


@pytest.mark.parametrize(
    "damage",
    [lambda b: b.replace(b'"batch_tuples":1', b'"batch_tuples":7'), lambda b: b[:-5]],
    ids=["edited", "truncated"],
)
def test_a_damaged_batch_log_is_checkpoint_corrupt(tmp_path: Path, damage: object) -> None:
    store = CheckpointStore(tmp_path)
    pointer = store.append_log(_entry(2), store.append_log(_entry(1), LogPointer()))
    log = tmp_path / "batches.jsonl"
    log.write_bytes(damage(log.read_bytes()))  # type: ignore[operator]
    with pytest.raises(CheckpointCorruptError, match=r"batches\.jsonl") as raised:
        store.read_log(pointer)
    assert raised.value.file == str(log)


def test_a_commit_whose_batch_log_is_shorter_than_its_pointer_is_incomplete(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    (tmp_path / "b1").touch()
    pointer = store.append_log(_entry(1), LogPointer())
    store.commit(_commit(1, "b1", pointer))
    assert store.missing_files(_commit(1, "b1", pointer), tmp_path / "out") == []
    (tmp_path / "batches.jsonl").write_bytes(b"")
    assert store.missing_files(_commit(1, "b1", pointer), tmp_path / "out") == [str(tmp_path / "batches.jsonl")]


def test_leftovers_after_the_commit_go_and_files_an_output_version_lists_stay(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt")
    state = tmp_path / "ckpt" / "state"
    windows = tmp_path / "out" / "data" / "windows"
    for directory, names in (
        (state, ["b00000001-aa-held.parquet", "b00000002-bb-held.parquet", "b00000002-bb-open-w"]),
        (windows, ["c1-b00000001-aa", "c1-b00000002-bb", "c1-b00000003-cc", "c2-b00000009-dd"]),
    ):
        directory.mkdir(parents=True)
        for name in names:
            (directory / name).mkdir() if name.endswith(("-w", "aa", "bb", "cc", "dd")) else (directory / name).touch()
    removed = store.remove_leftovers(1, {windows: "c1-b"}, keep={str(windows / "c1-b00000003-cc")})
    assert sorted(Path(p).name for p in removed) == [
        "b00000002-bb-held.parquet",
        "b00000002-bb-open-w",
        "c1-b00000002-bb",
    ]
    assert sorted(p.name for p in windows.iterdir()) == ["c1-b00000001-aa", "c1-b00000003-cc", "c2-b00000009-dd"]


def test_prune_keeps_the_newest_commits_and_the_files_they_still_need(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    (tmp_path / "state").mkdir()
    for batch in (1, 2, 3):
        (tmp_path / "state" / f"h{batch}").touch()
        (tmp_path / "state" / f"d{batch}").touch()
        store.commit(
            dataclasses.replace(_commit(batch, f"state/h{batch}"), discarded="state/d1")  # all share one list
        )
    assert store.prune(2, {}) == [1]
    assert store.commits() == [2, 3]
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["d1", "d2", "d3", "h2", "h3"]


def _bound(root: Path, *, rules: object, committed: bool) -> CheckpointStore:
    """A checkpoint whose identity says it was written under rules ``rules`` (``None``: it says
    nothing, as before rules were versioned), with a commit or without."""
    store = CheckpointStore(root)
    identity = store.bind(fingerprint="f", fields={"windows": []}, output="out")
    assert identity["rules"] == RULES_VERSION
    stored = {k: v for k, v in identity.items() if k not in ("format_version", "sha256", "rules")}
    write_record(root / "checkpoint.json", stored if rules is None else {**stored, "rules": rules})
    if committed:
        (root / "commits").mkdir()
        (root / "commits" / "00000001.json").write_text("{}")
    return store


@pytest.mark.parametrize(
    ("rules", "said"),
    [
        (None, "rules from before they were versioned"),
        (RULES_VERSION - 1, f"rules {RULES_VERSION - 1}"),
        (RULES_VERSION + 1, f"a newer Replay (rules {RULES_VERSION + 1}"),
    ],
)
def test_a_checkpoint_with_commits_under_other_rules_is_refused_saying_what_changed(
    tmp_path: Path, rules: object, said: str
) -> None:
    store = _bound(tmp_path, rules=rules, committed=True)
    with pytest.raises(IncompatibleCheckpointError) as raised:
        store.bind(fingerprint="f", fields={"windows": []}, output="out")
    text = str(raised.value)
    assert said in text and raised.value.code == "checkpoint.incompatible"
    if rules != RULES_VERSION + 1:
        assert CHANGES[RULES_VERSION] in text and "new --checkpoint" in text
    assert read_record(tmp_path / "checkpoint.json").get("rules") == rules  # refused, not rebound


def test_a_checkpoint_without_a_commit_takes_this_replays_rules(tmp_path: Path) -> None:
    store = _bound(tmp_path, rules=None, committed=False)
    identity = store.bind(fingerprint="f", fields={"windows": []}, output="out")
    assert identity["rules"] == RULES_VERSION and f"rules None -> {RULES_VERSION}" in identity["rebound"]
    assert read_record(tmp_path / "checkpoint.json")["rules"] == RULES_VERSION
    assert "rebound" not in store.bind(fingerprint="f", fields={"windows": []}, output="out")
