"""The metadata scan's readers: a file read in batches of any size, in the driver's threads or in
Spark tasks, gives the same per-copy records and the same content hashes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from replay.core.config import parse_config
from replay.core.errors import ArchiveReadError
from replay.engine import copies as copies_module
from replay.engine import scan as scan_module
from replay.engine.archive import ArchiveLayout, inspect_schema
from replay.engine.copies import content_hashes
from replay.engine.readers import driver_threads
from replay.engine.scan import scan_file, scan_files
from replay.engine.scan_columns import scan_columns
from replay.generate import generate_archive
from replay.generate_options import GenerateOptions

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> ArchiveLayout:
    """Multi-chunk buffers, an idle origin's punctuation rows (a null key and event time), late
    tuples and buffers archived twice, in three files."""
    archive = tmp_path_factory.mktemp("scan") / "archive"
    generate_archive(
        archive,
        GenerateOptions(
            origins=3,
            tuples=2_400,
            buffer_tuples=30,
            seed=5,
            duplicates=4,
            late_fraction=0.05,
            multi_chunk_fraction=0.5,
            idle=1,
            files=3,
        ),
    )
    return inspect_schema(parse_config({"archive": str(archive)}))


@pytest.mark.parametrize("batch_rows", [1, 2, 7, 64])
def test_a_file_read_in_batches_gives_each_copy_one_record(
    layout: ArchiveLayout, batch_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy that a batch's edge cuts (every copy, at one row a batch) is one record again, with
    the counts, bounds and row range of the file read whole."""
    columns = scan_columns(layout, event_times=True)
    whole = [scan_file(path, columns) for path in layout.files]
    monkeypatch.setattr(scan_module, "_BATCH_ROWS", batch_rows)
    cut = [scan_file(path, columns) for path in layout.files]
    for path, expected, got in zip(layout.files, whole, cut, strict=True):
        assert expected.num_rows > 30, path
        assert got.equals(expected), path
    # Nulls where a copy has none of a value (punctuation rows: no event time) survive the joins.
    assert any(r["ev0_min"] is None for t in whole for r in t.to_pylist())


def test_the_driver_threads_and_spark_tasks_read_the_same(
    layout: ArchiveLayout, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the driver's threads (``replay inspect`` with a local master) the scan and the content
    hashes run no Spark job, and give the records and hashes Spark tasks give (a run's)."""
    columns = scan_columns(layout, event_times=True)
    by_identity: dict[tuple[int, int, int], list[tuple[str, int, int]]] = {}
    tracker = spark.sparkContext.statusTracker()
    jobs = len(tracker.getJobIdsForGroup(None))
    local = scan_files(spark, layout.files, columns, threads=2)
    for r in local.to_pylist():
        by_identity.setdefault((r["origin"], r["sequence"], r["chunk"]), []).append(
            (r["_file"], r["row_min"], r["rows"])
        )
    repeated = [(f, o, s, c, row, n) for (o, s, c), seen in by_identity.items() if len(seen) > 1 for f, row, n in seen]
    assert len(repeated) >= 8  # the duplicates, with their first copies
    local_hashes, _ = content_hashes(spark, layout, repeated, threads=2)
    assert len(tracker.getJobIdsForGroup(None)) == jobs  # read without a Spark job

    in_tasks = scan_files(spark, layout.files, columns)
    task_hashes, _ = content_hashes(spark, layout, repeated)
    assert len(tracker.getJobIdsForGroup(None)) > jobs
    assert in_tasks.sort_by([("_file", "ascending"), ("row_min", "ascending")]).equals(
        local.sort_by([("_file", "ascending"), ("row_min", "ascending")])
    )
    assert task_hashes == local_hashes and len(local_hashes) == len(repeated)


@pytest.mark.parametrize("batch_rows", [1, 5, 32_768])
def test_a_copy_hashed_from_batches_has_the_hash_of_its_rows(
    layout: ArchiveLayout, spark: Any, batch_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hashing keeps only the rows around each copy as the batches go by; a copy cut by a
    batch's edge, or spanning several batches, hashes as read whole; a range that no longer holds
    its copy (a row more) gets no hash."""
    columns = scan_columns(layout, event_times=True)
    records = [r for path in layout.files for r in scan_file(path, columns).to_pylist()]
    wanted = [(r["_file"], r["origin"], r["sequence"], r["chunk"], r["row_min"], r["rows"]) for r in records[:40:3]]
    wrong = [(f, o, s, c, row, n + 1) for f, o, s, c, row, n in wanted[:2]]
    expected, _ = content_hashes(spark, layout, wanted)
    monkeypatch.setattr(copies_module, "_HASH_BATCH_ROWS", batch_rows)
    got, _ = content_hashes(spark, layout, [*wanted, *wrong])
    assert got == expected and len(got) == len(wanted)


@pytest.mark.parametrize("place", ["driver threads", "spark tasks"])
def test_a_file_that_cannot_be_read_is_named(
    tmp_path: Path, layout: ArchiveLayout, spark: Any, place: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "cut.parquet"
    data = Path(layout.files[0]).read_bytes()
    bad.write_bytes(data[: len(data) // 2])  # after its footer was read: cut short since
    threads = 2 if place == "driver threads" else None
    with pytest.raises(ArchiveReadError, match="cannot read the file's metadata columns") as err:
        scan_files(spark, [layout.files[1], str(bad)], scan_columns(layout, event_times=True), threads=threads)
    assert err.value.file == str(bad) and "What to do" in str(err.value)


@pytest.mark.parametrize("place", ["driver threads", "spark tasks"])
def test_a_copy_in_a_file_with_damaged_pages_is_a_one_line_error_naming_it(
    tmp_path: Path, layout: ArchiveLayout, spark: Any, place: str
) -> None:
    """pyarrow's error is on two lines and Spark appends its SQL state: the error keeps the reader's
    lines (both) on one, and not Spark's."""
    import shutil

    from tests._archives import damage_pages

    damaged = tmp_path / "damaged.parquet"
    shutil.copy(layout.files[0], damaged)
    damage_pages(damaged, column="event_time")
    columns = scan_columns(layout, event_times=True)
    record = scan_file(layout.files[0], columns).to_pylist()[0]
    copy = (str(damaged), record["origin"], record["sequence"], record["chunk"], record["row_min"], record["rows"])
    with pytest.raises(ArchiveReadError) as err:
        content_hashes(spark, layout, [copy], threads=2 if place == "driver threads" else None)
    what = err.value.what
    assert err.value.file == str(damaged) and what.startswith("cannot read the rows of a buffer archived")
    assert what.isprintable() and "SQLSTATE" not in what and "Traceback" not in what  # one line: no "\n"
    assert "Deserializing page header failed" in what, what  # pyarrow's second line


@pytest.mark.parametrize(
    ("master", "threads"),
    [
        ("local", 1),
        ("local[3]", 3),
        ("local[2, 4]", 2),
        ("spark://127.0.0.1:7077", None),
        ("yarn", None),
        ("local-cluster[2,1,1024]", None),
    ],
)
def test_the_driver_reads_with_a_local_masters_cores(master: str, threads: int | None) -> None:
    assert driver_threads(None, master) == threads
    assert (driver_threads(None, "local[*]") or 0) >= 1 and driver_threads(None, None) is None


def test_inspect_with_a_local_master_starts_no_session(
    layout: ArchiveLayout, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``replay inspect`` needs no SparkSession when the driver reads: the same report as with one."""
    from replay.engine import spark as spark_module
    from replay.engine.inspection import inspect_archive

    config = parse_config({"archive": layout.root})
    with_session = inspect_archive(config, spark=spark).to_dict()

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("a session was asked for")

    monkeypatch.setattr(spark_module, "get_session", refuse)
    steps: list[tuple[str, int, int]] = []
    without = inspect_archive(config, on_step=lambda *s: steps.append(s)).to_dict()
    assert without == with_session and with_session["integrity"]["duplicates"]
    # Progress file by file: the metadata of each file, then the files read again for the hashes.
    buffers = [(done, total) for name, done, total in steps if name == "buffers"]
    files = len(layout.files)
    assert buffers[: files + 1] == [(done, files) for done in range(files + 1)]
    assert buffers[-1][0] == buffers[-1][1] > files  # the duplicates' files were read again
    assert [done for done, _ in buffers] == sorted(done for done, _ in buffers)
