"""The files a checkpoint or an output names are durable before anything names them, read back whole
or give the error naming them, and concurrent writers of one output take turns."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replay.core.buffer import Buffer
from replay.core.errors import CheckpointCorruptError, DataError
from replay.store import state
from replay.store.durable import write_json_atomic, write_parquet_atomic
from replay.store.lock import one_publisher
from replay.store.outputs import Manifest, read_manifest, read_table, table_files, write_manifest
from replay.store.state import Discarded
from tests._archives import buffer


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The paths ``os.fsync`` is called on, in order (a directory's path for a directory)."""
    seen: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    yield seen


def _buffers() -> list[Buffer]:
    return [buffer(sequence=s, row_start=s) for s in (1, 2)]


WRITERS: dict[str, Callable[[Path], None]] = {
    "buffers": lambda path: state.write_buffers(path, _buffers(), 1),
    "discarded": lambda path: state.write_discarded(
        path,
        [Discarded(kind="duplicate", origin=1, sequence=1, chunk=0, file="f", row_start=0, tuples=1, kept_file="g")],
    ),
    "consumed": lambda path: state.write_consumed(path, {"f.parquet": [10, 20]}),
}
READERS: dict[str, Callable[[Path], object]] = {
    "buffers": lambda path: state.read_buffers(path, 1),
    "discarded": state.read_discarded,
    "consumed": state.read_consumed,
}


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names an fd through /proc")
@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_a_state_file_is_fsynced_under_a_temporary_name_then_renamed(
    tmp_path: Path, kind: str, synced: list[str]
) -> None:
    path = tmp_path / "state" / f"b1-{kind}.parquet"
    WRITERS[kind](path)
    assert len(synced) == 1 and synced[0].startswith(str(path.parent / f".{path.name}.")), synced
    assert not Path(synced[0]).exists() and [p.name for p in path.parent.iterdir()] == [path.name]
    assert READERS[kind](path)  # and it reads back


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names an fd through /proc")
def test_an_output_data_file_is_fsynced_and_so_is_its_directory(tmp_path: Path, synced: list[str]) -> None:
    path = tmp_path / "data" / "progress" / "x.parquet"
    write_parquet_atomic(pa.table({"a": [1]}), path)
    assert [Path(p).parent for p in synced] == [path.parent, path.parent.parent], synced
    assert synced[1] == str(path.parent)


@pytest.mark.parametrize(
    "damage",
    [lambda b: b"", lambda b: b[: len(b) // 2], lambda b: b[:-8] + b"XXXXXXXX", lambda b: b"PAR1" * 8],
    ids=["empty", "cut", "footer-overwritten", "garbage"],
)
@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_a_state_file_that_does_not_read_back_whole_is_checkpoint_corrupt_naming_it(
    tmp_path: Path, kind: str, damage: Callable[[bytes], bytes]
) -> None:
    path = tmp_path / f"b1-{kind}.parquet"
    WRITERS[kind](path)
    assert state.readable(path)
    path.write_bytes(damage(path.read_bytes()))
    assert not state.readable(path)
    with pytest.raises(CheckpointCorruptError) as caught:
        READERS[kind](path)
    assert str(path) in str(caught.value) and "Traceback" not in str(caught.value)
    path.unlink()
    with pytest.raises(CheckpointCorruptError, match="is missing"):
        READERS[kind](path)


def test_two_threads_writing_one_record_never_share_a_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "current"
    failures: list[BaseException] = []

    def write(n: int) -> None:
        try:
            for i in range(200):
                write_json_atomic(path, {"writer": n, "i": i})
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert json.loads(path.read_text())["i"] == 199
    assert [p.name for p in tmp_path.iterdir()] == ["current"]


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path: Path) -> None:
    """The table cannot be written (not a table): the error is the writer's, the file keeps its old
    content, and the temporary file the write began is gone."""
    path = tmp_path / "progress.parquet"
    old = pa.table({"x": [1, 2]})
    write_parquet_atomic(old, path)
    with pytest.raises(AttributeError, match="schema"):
        write_parquet_atomic("not a table", path)  # type: ignore[arg-type]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert pq.read_table(path).equals(old)


def test_a_version_whose_listed_file_is_gone_is_output_corrupt_not_fewer_rows(tmp_path: Path) -> None:
    for name in ("a", "b"):
        write_parquet_atomic(pa.table({"x": [1]}), tmp_path / "data" / "windows" / name / "part.parquet")
    entries = ("data/windows/a", "data/windows/b")
    version = write_manifest(tmp_path, Manifest(tables={"windows": entries}, kind="run")).version
    assert read_table(tmp_path, "windows", version).num_rows == 2
    (tmp_path / "data" / "windows" / "b" / "part.parquet").unlink()
    (tmp_path / "data" / "windows" / "b").rmdir()
    reads = (
        lambda: read_table(tmp_path, "windows", version),
        lambda: table_files(tmp_path, read_manifest(tmp_path, version), "windows"),
    )
    for read in reads:
        with pytest.raises(DataError) as caught:
            read()
        assert caught.value.code == "output.corrupt"
        assert "data/windows/b" in str(caught.value) and f"version {version}" in str(caught.value)


def test_a_publish_waits_for_another_publish_of_the_same_output(tmp_path: Path) -> None:
    """Held by one publisher, the output's publication lock keeps a second waiting until it is
    released: the second then reads the publication the first left."""
    tmp_path.mkdir(exist_ok=True)
    order: list[str] = []
    with one_publisher(tmp_path):
        second = threading.Thread(target=lambda: _publish_after(tmp_path, order))
        second.start()
        time.sleep(0.5)
        order.append("first done")
    second.join(10)
    assert order == ["first done", "second in"]


def _publish_after(output: Path, order: list[str]) -> None:
    with one_publisher(output):
        order.append("second in")


def test_a_listed_directory_reads_its_listed_files_only_and_a_listed_file_gone_is_output_corrupt(
    tmp_path: Path,
) -> None:
    from replay.store.listing import write_listing

    folder = tmp_path / "data" / "windows" / "a"
    for name in ("part-1.parquet", "part-2.parquet", "stray.parquet"):
        write_parquet_atomic(pa.table({"x": [1]}), folder / name)
    write_listing(folder, ["part-1.parquet", "part-2.parquet"])
    version = write_manifest(tmp_path, Manifest(tables={"windows": ("data/windows/a",)}, kind="run")).version
    assert read_table(tmp_path, "windows", version).num_rows == 2  # not the stray file
    (folder / "part-2.parquet").unlink()
    with pytest.raises(DataError) as caught:
        read_table(tmp_path, "windows", version)
    assert caught.value.code == "output.corrupt" and "part-2.parquet" in str(caught.value)
    (folder / "_files.json").write_text('{"format_version": 1, "fi')
    with pytest.raises(DataError, match="does not list"):
        read_table(tmp_path, "windows", version)
