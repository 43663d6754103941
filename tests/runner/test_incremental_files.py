"""An incremental run's new files. They are read with the archive's columns as the earlier runs read
them: a file whose column has another type is refused before anything of it is read (it would
otherwise mix the types in the tables, or fail deep in Spark), and a file without an optional
column reads it as null, as a run over the whole archive does. Files without a row are nothing new."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replay.core.errors import ArchiveSchemaError, BadBufferError
from replay.runner.loop import run
from replay.store.checkpoint import CheckpointStore
from replay.store.digest import digest
from replay.store.outputs import list_versions
from tests._archives import archive_table, buffer_rows, write_archive
from tests.runner._jobs import SECOND, T0, small_job

pytestmark = pytest.mark.spark


def _first(archive: Path) -> None:
    rows = buffer_rows(1, 1, watermark=T0 + SECOND, events=[(T0 + SECOND // 2, 1, 1.5), (T0 + SECOND // 4, 2, 2.5)])
    rows += buffer_rows(2, 1, watermark=T0 + SECOND, events=[(T0 + SECOND // 3, 1, 4.0)])
    write_archive(archive, rows, name="part-00000.parquet")


def _second_rows(value: bool = True) -> list[dict[str, Any]]:
    events = [(T0 + 3 * SECOND // 2, 1, 8.0), (T0 + 5 * SECOND // 2, 3, 16.0)]
    rows = buffer_rows(1, 2, watermark=T0 + 3 * SECOND, events=events)
    rows += buffer_rows(2, 2, watermark=T0 + 3 * SECOND, events=[(T0 + 2 * SECOND, 2, 32.0)])
    if not value:
        for row in rows:
            row.pop("value", None)
    return rows


@pytest.mark.parametrize(
    ("column", "kind"),
    [("key", pa.string()), ("value", pa.int64()), ("sequence_number", pa.int32())],
)
def test_a_new_file_with_another_type_is_refused_and_the_run_goes_on_once_it_is_rewritten(
    spark: Any, tmp_path: Path, column: str, kind: pa.DataType
) -> None:
    archive = tmp_path / "archive"
    _first(archive)
    config = small_job(tmp_path, archive)
    run(config, spark=spark)
    assert config.output is not None and config.checkpoint is not None
    before = CheckpointStore(config.checkpoint).commits()
    rows = _second_rows()
    if column == "key":
        rows = [{**row, "key": str(row["key"])} for row in rows]
    elif column == "value":
        rows = [{**row, "value": int(row["value"])} for row in rows]
    odd = write_archive(archive, rows, name="part-00001.parquet", types={column: kind})

    with pytest.raises(ArchiveSchemaError) as raised:
        run(config, spark=spark)
    error = raised.value
    assert error.code == "archive.type_mismatch" and error.where.file == str(odd) and error.where.column == column
    assert "earlier runs" in str(error) and "nothing of it was read" in str(error)
    assert CheckpointStore(config.checkpoint).commits() == before and list_versions(config.output) == [1]

    write_archive(archive, _second_rows(), name="part-00001.parquet")  # rewritten with the archive's types
    assert run(config, spark=spark).buffers == 2
    whole = small_job(tmp_path / "whole", archive)
    run(whole, spark=spark)
    assert whole.output is not None
    assert digest(config.output) == digest(whole.output) | {"progress": digest(config.output)["progress"]}


def test_a_new_file_without_an_optional_column_reads_it_as_null_as_a_run_over_the_whole_archive(
    spark: Any, tmp_path: Path
) -> None:
    archive = tmp_path / "archive"
    _first(archive)
    config = small_job(tmp_path, archive)
    run(config, spark=spark)
    write_archive(archive, _second_rows(value=False), name="part-00001.parquet")
    summary = run(config, spark=spark)
    assert summary.buffers == 2 and summary.windows_emitted > 0
    whole = small_job(tmp_path / "whole", archive)
    run(whole, spark=spark)
    assert config.output is not None and whole.output is not None
    incremental, full = digest(config.output), digest(whole.output)
    assert {t: incremental[t] for t in ("windows", "late", "integrity")} == {
        t: full[t] for t in ("windows", "late", "integrity")
    }


def test_new_files_without_a_row_are_nothing_new(spark: Any, tmp_path: Path) -> None:
    """An archiver's empty file (a footer, no row) is no error for an incremental run: nothing new."""
    archive = tmp_path / "archive"
    _first(archive)
    config = small_job(tmp_path, archive)
    run(config, spark=spark)
    assert config.output is not None
    before = digest(config.output)
    pq.write_table(archive_table(_second_rows()).slice(0, 0), archive / "part-00001.parquet")
    summary = run(config, spark=spark)
    assert summary.batches == 0 and not summary.new_version and digest(config.output) == before
    assert any("1 new file(s) hold no rows" in note for note in summary.notes)
    write_archive(archive, _second_rows(), name="part-00002.parquet")
    assert run(config, spark=spark).buffers == 2


def _chunk(sequence: int, chunk: int, last: bool) -> list[dict[str, Any]]:
    return buffer_rows(1, sequence, chunk, last=last, watermark=T0 + sequence * SECOND, events=[(T0 + chunk, 1, 1.0)])


@pytest.mark.parametrize(
    ("first", "second", "code", "said"),
    [
        ([(1, 1, False), (1, 2, True)], (1, 3, True), "archive.two_last_chunks", "after its sequence was complete"),
        ([(1, 1, False), (1, 2, True)], (1, 3, False), "archive.chunk_beyond_last", "after its sequence was complete"),
        ([(1, 2, True)], (1, 3, True), "archive.two_last_chunks", "2 last chunks: [2, 3]"),
        ([(1, 2, True)], (1, 3, False), "archive.chunk_beyond_last", "chunk 3 lies beyond the sequence's last chunk 2"),
        ([(1, 1, False), (1, 3, False)], (1, 2, True), "archive.chunk_beyond_last", "chunk 3 lies beyond"),
    ],
    ids=["complete-then-last", "complete-then-chunk", "held-last-then-last", "held-last-then-chunk", "held-then-last"],
)
def test_a_new_chunk_that_breaks_the_chunk_rules_with_an_earlier_runs_chunks_is_refused(
    spark: Any, tmp_path: Path, first: list[tuple[int, int, bool]], second: tuple[int, int, bool], code: str, said: str
) -> None:
    """Within one run the scan checks the chunk rules (one last chunk per sequence, the highest);
    across runs the engine does, against the sequences it completed and the chunks it holds. Before,
    a chunk of a completed sequence was called a deduplication bug, and one beyond a held last chunk
    left its sequence incomplete forever. Nothing of the run is committed, and once the file is taken
    out the next run goes on."""
    archive = tmp_path / "archive"
    write_archive(archive, [row for spec in first for row in _chunk(*spec)], name="part-00000.parquet")
    config = small_job(tmp_path, archive)
    run(config, spark=spark)
    assert config.checkpoint is not None and config.output is not None
    committed, versions = CheckpointStore(config.checkpoint).commits(), list_versions(config.output)
    bad = write_archive(archive, _chunk(*second), name="part-00001.parquet")
    with pytest.raises(BadBufferError) as raised:
        run(config, spark=spark)
    error = raised.value
    assert (error.code, error.origin, error.sequence, error.chunk) == (code, 1, 1, second[1])
    assert said in str(error) and error.where.file == str(bad)
    assert CheckpointStore(config.checkpoint).commits() == committed and list_versions(config.output) == versions
    bad.unlink()
    write_archive(archive, _chunk(2, 1, True), name="part-00002.parquet")
    assert run(config, spark=spark).batches >= 1
