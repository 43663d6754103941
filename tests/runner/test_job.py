"""``replay run``: determinism across batch plans, incremental runs, backfill ranges, checkpoint safety.

Equal digests of the ``windows``, ``late`` and ``integrity`` tables are the proof
(docs/semantics.md#determinism); ``progress`` depends on the batch plan by definition. Crash and
lock tests live in ``test_job_crash.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from replay.core.config import JobConfig, parse_config
from replay.core.errors import ConfigError, ConflictingDuplicateError, IncompatibleCheckpointError, LedgerError
from replay.core.timeutil import parse_timestamp
from replay.engine import pass_counts
from replay.engine.archive import inspect_schema
from replay.engine.buffers import scan_buffers
from replay.engine.passes import Reads
from replay.generate import generate_archive
from replay.generate_options import GenerateOptions
from replay.runner.loop import run
from replay.store.checkpoint import CheckpointStore
from replay.store.digest import canonical_lines, digest
from replay.store.outputs import read_table
from tests._archives import FEATURED, buffer_rows, write_archive
from tests.runner.test_job_vs_reference import job_view, reference_view

pytestmark = pytest.mark.spark

DETERMINISTIC = ("windows", "late", "integrity")


def job(archive: Path, out: Path, **settings: Any) -> JobConfig:
    base: dict[str, Any] = {
        "archive": str(archive),
        "output": str(out / "out"),
        "checkpoint": str(out / "ckpt"),
        "windows": [
            {
                "name": "tumbling",
                "size": "500ms",
                "aggregations": [{"fn": "count"}, {"fn": "sum", "column": "value"}, {"fn": "max", "column": "value"}],
            },
            {
                "name": "sliding",
                "kind": "sliding",
                "size": "1s",
                "slide": "250ms",
                "offset": "100ms",
                "aggregations": [{"fn": "mean", "column": "value"}, {"fn": "approx_count_distinct", "column": "key"}],
            },
        ],
    }
    return parse_config(base | settings)


def digests(config: JobConfig) -> dict[str, str]:
    assert config.output is not None
    found = digest(config.output)
    return {t: found[t] for t in DETERMINISTIC}


def _generated(factory: pytest.TempPathFactory, name: str, **options: Any) -> Path:
    """A small generated archive with gaps, duplicates, late data and chunked sequences."""
    path = factory.mktemp("archive") / name
    generate_archive(path, dataclasses.replace(FEATURED, **options))
    return path


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _generated(tmp_path_factory, "a", seed=11)


@pytest.fixture(scope="module")
def origin_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _generated(tmp_path_factory, "o", seed=5, ingest_ts=False)


# The batch-plan test replays its archive once per plan, every buffer its own batch among them, and a
# batch has a fixed cost of a few seconds: these archives hold the same tuples over the same event time
# as the ones above, with every feature (a gap, two duplicates, late tuples, chunked sequences, three
# origins), in buffers of 100 tuples: 12 or 13 buffers instead of about 30.
@pytest.fixture(scope="module")
def plan_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _generated(tmp_path_factory, "pa", seed=2, buffer_tuples=100)


@pytest.fixture(scope="module")
def plan_origin_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _generated(tmp_path_factory, "po", seed=14, buffer_tuples=100, ingest_ts=False)


@contextlib.contextmanager
def shuffle_partitions(spark: Any, n: int) -> Iterator[None]:
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", str(n))
    try:
        yield
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)


@pytest.mark.parametrize("fixture", ["plan_archive", "plan_origin_archive"])
def test_any_batch_plan_gives_the_same_digests(
    request: pytest.FixtureRequest, tmp_path: Path, spark: Any, fixture: str
) -> None:
    source: Path = request.getfixturevalue(fixture)
    gap_policy = "skip" if fixture == "plan_origin_archive" else "wait"  # skip: closing gaps at the end is covered too
    whole = job(source, tmp_path / "whole", gap_policy=gap_policy)
    summary = run(whole, spark=spark)
    assert summary.batches == 1 and summary.windows_emitted > 0 and sum(summary.late_tuples.values()) > 0
    assert summary.duplicate_copies > 0 and summary.buffers >= 10
    expected = digests(whole)
    # Small and larger batches (every buffer its own batch for one archive), each with another number of
    # shuffle partitions than the whole run's 2, so the digests are also independent of how Spark
    # partitions the work, and in passes of several batches per Spark action or of one (docs/outputs.md#passes).
    plans = ((1, 1, 5), (4, 3, 1)) if fixture == "plan_archive" else ((2, 1, 2), (5, 3, 32))
    for max_buffers, partitions, per_pass in plans:
        config = job(
            source,
            tmp_path / f"b{max_buffers}",
            micro_batch={"max_buffers": max_buffers, "max_batches_per_pass": per_pass},
            gap_policy=gap_policy,
        )
        with shuffle_partitions(spark, partitions):
            summary = run(config, spark=spark)
        assert summary.batches == -(-summary.buffers // max_buffers) > 1  # ceil(buffers / max_buffers)
        assert digests(config) == expected, (
            f"max_buffers {max_buffers}, {partitions} shuffle partitions, {per_pass} batches per pass"
        )
    by_tuples = job(source, tmp_path / "t", micro_batch={"max_tuples": 300}, gap_policy=gap_policy)
    summary = run(by_tuples, spark=spark)
    assert summary.batches > 1
    assert digests(by_tuples) == expected


_TUMBLING_ONLY = [
    {"name": "tumbling", "size": "500ms", "aggregations": [{"fn": "count"}, {"fn": "sum", "column": "value"}]},
    {"name": "seconds", "size": "1s", "aggregations": [{"fn": "max", "column": "value"}]},
]


def _batch_ledgers(config: JobConfig) -> list[tuple[int, dict[str, Any]]]:
    store = CheckpointStore(Path(config.checkpoint))
    commit = store.latest()
    assert commit is not None
    return [(entry.batch, dict(entry.ledger)) for entry in store.read_log(commit.log)]


def test_a_pass_derives_each_batchs_counts_as_a_counting_branch_counts_them(
    tmp_path: Path, spark: Any, plan_archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass of several batches with one watermark key and tumbling windows takes each batch's
    counts from the pass's totals and the batch's rows outside every window
    (``pass_counts.derived``); the batch log's ledger rows, the summary and the outputs equal those
    of the same run counting every batch's rows in a branch of their own."""
    taken: list[bool] = []
    derives = pass_counts.derives

    def spy(*args: Any) -> bool:
        taken.append(derives(*args))
        return taken[-1]

    monkeypatch.setattr(pass_counts, "derives", spy)
    settings: dict[str, Any] = {"windows": _TUMBLING_ONLY, "micro_batch": {"max_buffers": 2, "max_batches_per_pass": 4}}
    derived = job(plan_archive, tmp_path / "derived", **settings)
    summary = run(derived, spark=spark)
    assert summary.batches > 4 and sum(summary.late_tuples.values()) > 0 and summary.duplicate_copies > 0
    assert taken and all(taken)  # every pass derived its batches' counts
    monkeypatch.setattr(pass_counts, "derives", lambda *args: False)
    counted = job(plan_archive, tmp_path / "counted", **settings)
    other = run(counted, spark=spark)
    same = ("batches", "buffers", "tuples_read", "windows_emitted", "open_windows", "late_tuples", "pending_tuples")
    assert [getattr(other, f) for f in same] == [getattr(summary, f) for f in same]
    assert _batch_ledgers(derived) == _batch_ledgers(counted)
    assert digests(derived) == digests(counted)


def test_a_pass_whose_batches_do_not_add_up_to_what_spark_read_commits_nothing(
    tmp_path: Path, spark: Any, plan_archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass's totals are what Spark read: when the batches' derived counts (the scan's rows for
    each) differ from them, the pass stops with a ledger error before any of its batches commits."""
    checksums = Reads.checksums

    def one_row_more(self: Reads, batch: int | None = None, *, bits: int) -> tuple[int, int, int]:
        rows, tuples, checksum = checksums(self, batch, bits=bits)
        return (rows + 1 if batch == 2 else rows), tuples, checksum

    monkeypatch.setattr(Reads, "checksums", one_row_more)
    config = job(
        plan_archive,
        tmp_path / "j",
        windows=_TUMBLING_ONLY,
        micro_batch={"max_buffers": 2, "max_batches_per_pass": 32},
    )
    with pytest.raises(LedgerError, match="'rows' over the rows of batches 1 to") as raised:
        run(config, spark=spark)
    assert raised.value.code == "ledger.mismatch" and "archiver" in raised.value.todo
    assert CheckpointStore(Path(config.checkpoint)).latest() is None


def _split_by_ingest(source: Path, first: Path, second: Path) -> None:
    """Rewrite an archive as two halves by ingest time (whole buffers), for an incremental run."""
    table = pa.concat_tables([pq.read_table(p) for p in sorted(source.glob("*.parquet"))])
    ingest = table["ingest_ts"]
    cut = pc.quantile(pc.cast(ingest, pa.int64()), q=0.5)[0].as_py()
    early = pc.less(pc.cast(ingest, pa.int64()), cut)
    first.mkdir(parents=True)
    pq.write_table(table.filter(early), first / "part-00000.parquet")
    second.mkdir(parents=True)
    pq.write_table(table.filter(pc.invert(early)), second / "part-00001.parquet")


def test_a_run_reports_its_metadata_scan_by_spark_tasks(
    archive: Path, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``on_event`` hears the scan's Spark tasks as they finish (polled every millisecond here,
    every half second in a run), then its end, not only a start and an end."""
    from replay.engine.spark import job_progress
    from replay.runner import loop

    monkeypatch.setattr(loop, "job_progress", functools.partial(job_progress, interval=0.001))
    events: list[tuple[str, int, int]] = []
    run(job(archive, tmp_path), on_event=lambda *event: events.append(event))
    scan = [(done, total) for step, done, total in events if step == "scan"]
    assert scan[0] == (0, 1)
    assert scan[-1][0] == scan[-1][1] > 1  # the end, in Spark's tasks
    assert any(done < total for done, total in scan[1:-1] if total > 1)  # tasks seen before they all ended


def test_an_archive_whose_path_uri_escapes_matches_copies_by_file(tmp_path: Path, spark: Any) -> None:
    """Copies of one buffer in two files are told apart by the path Spark reports for each file,
    which escapes a space as ``%20``; the files are still read by their own names (reading the
    reported path found no file), and the outputs are those of the same archive at a plain path."""
    options = GenerateOptions(origins=3, tuples=1_200, buffer_tuples=40, keys=5, seed=2, duplicates=3, files=3)
    escaped = tmp_path / "an archive #1"
    generate_archive(escaped, options)
    plain = tmp_path / "plain"
    shutil.copytree(escaped, plain)
    summary = run(job(escaped, tmp_path / "escaped run"), spark=spark)
    assert summary.duplicate_copies == 3
    run(job(plain, tmp_path / "plain run"), spark=spark)
    assert digests(job(escaped, tmp_path / "escaped run")) == digests(job(plain, tmp_path / "plain run"))


def test_an_incremental_run_equals_one_full_run(tmp_path: Path, spark: Any) -> None:
    archive = tmp_path / "source"
    options = GenerateOptions(origins=3, tuples=1_200, buffer_tuples=40, keys=5, seed=2, duplicates=2, files=2)
    generate_archive(archive, dataclasses.replace(options, late_fraction=0.05, multi_chunk_fraction=0.3))
    halves = tmp_path / "halves"
    _split_by_ingest(archive, halves / "h1", halves / "h2")
    growing = tmp_path / "growing"
    growing.mkdir()
    shutil.copy(halves / "h1" / "part-00000.parquet", growing)
    incremental = job(growing, tmp_path / "inc", micro_batch={"max_buffers": 10})
    first = run(incremental, spark=spark)
    assert first.version == 1 and first.open_windows > 0
    again = run(incremental, spark=spark)
    assert again.batches == 0 and again.version == 1 and not again.new_version  # nothing new: nothing changes
    shutil.copy(halves / "h2" / "part-00001.parquet", growing)
    second = run(incremental, spark=spark)
    assert second.version == 2 and 0 < second.buffers < first.buffers + second.buffers

    full_source = tmp_path / "full"
    shutil.copytree(growing, full_source)
    full = job(full_source, tmp_path / "full_run")
    run(full, spark=spark)
    assert digests(incremental) == digests(full)
    # The first version stays readable and holds fewer windows.
    assert incremental.output is not None
    assert read_table(incremental.output, "windows", 1).num_rows < read_table(incremental.output, "windows", 2).num_rows


def test_an_incremental_run_in_origin_mode_fills_gaps_and_equals_one_full_run(
    origin_archive: Path, tmp_path: Path, spark: Any
) -> None:
    files = sorted(origin_archive.glob("*.parquet"))
    growing = tmp_path / "growing"
    growing.mkdir()
    shutil.copy(files[0], growing)
    incremental = job(growing, tmp_path / "inc", micro_batch={"max_buffers": 6})
    first = run(incremental, spark=spark)
    assert first.pending_tuples > 0  # behind the gaps left by the missing files
    for f in files[1:]:
        shutil.copy(f, growing)
    run(incremental, spark=spark)
    full = job(origin_archive, tmp_path / "full")
    run(full, spark=spark)
    assert digests(incremental) == digests(full)


def test_an_incompatible_configuration_is_refused_naming_the_fields(archive: Path, tmp_path: Path, spark: Any) -> None:
    config = job(archive, tmp_path)
    run(config, spark=spark)
    changed = config.with_overrides(gap_policy="skip", lateness="origin")
    with pytest.raises(IncompatibleCheckpointError) as raised:
        run(changed, spark=spark)
    assert "'gap_policy'" in raised.value.message and "'lateness'" in raised.value.message
    assert raised.value.exit_code == 2
    # A window's setting is named down to the field that differs.
    windows = [w.model_dump(mode="json") for w in config.windows]
    windows[0]["size"] = "2s"
    with pytest.raises(IncompatibleCheckpointError) as resized:
        run(config.with_overrides(windows=windows), spark=spark)
    assert resized.value.where.extra == {"windows": f"[{config.windows[0].name}].size '500ms' -> '2s'"}
    # Settings that do not change results are fine.
    run(config.with_overrides(micro_batch={"max_buffers": 2}, retain=3), spark=spark)


def test_a_run_gives_the_objects_it_froze_back_to_the_collector(
    archive: Path, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run leaves the objects alive when it starts out of Python's cyclic collections
    (``gc.freeze``) and gives them back when it ends, also when it fails; objects the caller froze
    stay frozen."""
    import gc

    from replay.runner import loop

    during: list[int] = []
    batches = loop.process

    def counted(*args: Any, **kwargs: Any) -> Any:
        during.append(gc.get_freeze_count())
        return batches(*args, **kwargs)

    monkeypatch.setattr(loop, "process", counted)
    before = gc.get_freeze_count()
    config = job(archive, tmp_path)
    run(config, spark=spark)
    assert during and min(during) > before
    assert gc.get_freeze_count() == before
    with pytest.raises(IncompatibleCheckpointError):
        run(config.with_overrides(lateness="origin"), spark=spark)
    assert gc.get_freeze_count() == before
    gc.freeze()  # the caller's own
    try:
        frozen = gc.get_freeze_count()
        run(config, spark=spark)
        # Still frozen: a frozen object that dies leaves the count, so a few may have gone.
        assert gc.get_freeze_count() > frozen * 0.9 and frozen > before
    finally:
        gc.unfreeze()


def test_a_run_leaves_no_jvm_object_to_pythons_collector(archive: Path, tmp_path: Path, spark: Any) -> None:
    """py4j's proxy of a JVM object and its method handles form a reference cycle, and the proxy keeps
    the JVM object (a DataFrame's Dataset, its plans, their broadcast relations) until Python's
    collector finds the cycle. A run collects its own cycles before it returns: left to the
    collector's generations, a session that ran a small job 20 times held 296 MiB of JVM heap after
    full collections instead of 69 MiB (``./dev.sh bench soak``)."""
    import gc

    from py4j.java_gateway import JavaObject

    gc.collect()  # what the test session left
    run(job(archive, tmp_path), spark=spark)
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the next collection finds unreachable stays in gc.garbage
    try:
        gc.collect()
        held = [garbage for garbage in gc.garbage if isinstance(garbage, JavaObject)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert held == []


def _rows_where(lines: list[str], keep: Callable[[dict[str, Any]], bool]) -> list[str]:
    return [line for line in lines if keep(json.loads(line))]


def test_a_backfill_range_gives_exactly_the_full_runs_windows_inside_it(
    archive: Path, tmp_path: Path, spark: Any
) -> None:
    full = job(archive, tmp_path / "full", gap_policy="skip")
    run(full, spark=spark)
    assert full.output is not None
    start, end = "2025-12-31T23:57:00Z", "2026-01-01T00:00:01.500Z"
    ranged = job(archive, tmp_path / "range", micro_batch={"max_buffers": 4}, gap_policy="skip")
    summary = run(ranged, start=parse_timestamp(start), end=parse_timestamp(end), spark=spark)
    assert summary.windows_emitted > 0
    assert ranged.output is not None
    lo, hi = parse_timestamp(start), parse_timestamp(end)
    windows = canonical_lines(read_table(ranged.output, "windows"), precise=True)
    expected = _rows_where(
        canonical_lines(read_table(full.output, "windows"), precise=True),
        lambda r: parse_timestamp(r["window_start"]) >= lo and parse_timestamp(r["window_end"]) <= hi,
    )
    assert windows == expected and windows
    late = canonical_lines(read_table(ranged.output, "late"), precise=True)
    expected_late = _rows_where(
        canonical_lines(read_table(full.output, "late"), precise=True),
        lambda r: lo <= parse_timestamp(r["event_time"]) < hi,  # [start, end) for tuples
    )
    assert late == expected_late and late


def _redeliver(source: Path, target: Path, *, change: bool) -> tuple[int, int, int]:
    """Write ``target``: the rows of one buffer that ``source`` holds a single copy of (the largest
    such), archived again later (ingest one hour on); with ``change``, one value differs.
    Returns the buffer's identity."""
    runs: dict[tuple[int, int, int], int] = {}  # identity -> copies (runs of consecutive rows)
    sizes: dict[tuple[int, int, int], int] = {}
    tables = [pq.read_table(p) for p in sorted(source.glob("*.parquet"))]
    for table in tables:
        previous = None
        for identity in zip(
            table["origin_id"].to_pylist(),
            table["sequence_number"].to_pylist(),
            table["chunk_number"].to_pylist(),
            strict=True,
        ):
            if identity != previous:
                runs[identity] = runs.get(identity, 0) + 1
            sizes[identity] = sizes.get(identity, 0) + 1
            previous = identity
    chosen = max((i for i in sorted(runs) if runs[i] == 1), key=lambda i: sizes[i])
    table = pa.concat_tables(tables)
    origin, sequence, chunk = chosen
    rows = table.filter(
        pc.and_(
            pc.and_(pc.equal(table["origin_id"], origin), pc.equal(table["sequence_number"], sequence)),
            pc.equal(table["chunk_number"], chunk),
        )
    )
    later = pc.add(rows["ingest_ts"].cast(pa.int64()), 3_600_000_000).cast(rows.schema.field("ingest_ts").type)
    rows = rows.set_column(rows.schema.get_field_index("ingest_ts"), "ingest_ts", later)
    if change:
        values = rows["value"].to_pylist()
        values[0] = (values[0] or 0) + 1
        rows = rows.set_column(rows.schema.get_field_index("value"), "value", pa.array(values, rows["value"].type))
    pq.write_table(rows, target)
    return chosen


@pytest.mark.parametrize("change", [False, True], ids=["identical", "different"])
def test_a_buffer_archived_again_in_a_later_run_is_a_duplicate_or_a_conflict(
    archive: Path, tmp_path: Path, spark: Any, change: bool
) -> None:
    growing = tmp_path / "growing"
    shutil.copytree(archive, growing)
    incremental = job(growing, tmp_path / "inc", on_conflict="keep_first")
    run(incremental, spark=spark)
    identity = _redeliver(archive, growing / "zz-again.parquet", change=change)
    second = run(incremental, spark=spark)
    assert second.buffers == 0  # nothing new to replay: the copy is discarded
    assert incremental.output is not None
    integrity = [
        json.loads(line) for line in canonical_lines(read_table(incremental.output, "integrity"), precise=True)
    ]
    again = [r for r in integrity if (r["file"] or "").endswith("zz-again.parquet")]
    assert len(again) == 1, integrity
    assert again[0]["kind"] == ("conflict" if change else "duplicate")
    assert (again[0]["origin_id"], again[0]["sequence_number"], again[0]["chunk_number"]) == identity

    # The same files in one run: the same verdict, the same outputs.
    full = job(growing, tmp_path / "full", on_conflict="keep_first")
    run(full, spark=spark)
    assert digests(incremental) == digests(full)
    if change:  # under on_conflict: fail (the default) the second run stops, naming both copies
        strict_archive = tmp_path / "strict"
        shutil.copytree(archive, strict_archive)
        strict = job(strict_archive, tmp_path / "strict_run")
        run(strict, spark=spark)
        shutil.copy(growing / "zz-again.parquet", strict_archive)
        with pytest.raises(ConflictingDuplicateError, match="already replayed") as raised:
            run(strict, spark=spark)
        assert "zz-again.parquet" in str(raised.value)


@pytest.mark.parametrize("files", [1, 4], ids=["copies-in-the-same-file", "copies-in-other-files"])
def test_copies_of_a_buffer_are_read_once_wherever_they_are(tmp_path: Path, spark: Any, files: int) -> None:
    """Rows are matched to the kept copy by file and row range when another copy shares its file,
    by file alone when the other copies are elsewhere: either way the reference model's tables."""
    archive = tmp_path / "archive"
    options = GenerateOptions(
        origins=2, tuples=600, buffer_tuples=30, keys=4, seed=3, duplicates=3, conflicts=2, files=files
    )
    generate_archive(archive, dataclasses.replace(options, late_fraction=0.05))
    config = job(archive, tmp_path, on_conflict="keep_first")  # one batch: it reads every file
    scan = scan_buffers(spark, inspect_schema(config), config, strict=False)
    same_file = [d.file == d.kept_file for d in scan.duplicates] + [c.other_file == c.kept_file for c in scan.conflicts]
    assert len(same_file) == 5 and all(same_file) == (files == 1) and any(same_file) == (files == 1)
    assert job_view(config, spark) == reference_view(config)


def test_identities_too_large_to_pack_into_one_join_key_are_matched_column_by_column(
    tmp_path: Path, spark: Any
) -> None:
    """A pass joins the archive's rows to its copies on one long key packing origin, sequence and
    chunk when they fit in 63 bits; with origin ids of 60 bits they do not, and the rows are matched
    on the three columns: the same tables as the reference model."""
    source, archive = tmp_path / "source", tmp_path / "archive"
    generate_archive(source, dataclasses.replace(FEATURED, duplicates=2))
    archive.mkdir()
    widths = [0, 0, 0]
    for path in sorted(source.glob("*.parquet")):
        table = pq.read_table(path)
        big = pc.add(pc.multiply(table["origin_id"].cast(pa.int64()), 2**58), 7)
        table = table.set_column(table.schema.get_field_index("origin_id"), "origin_id", big)
        pq.write_table(table, archive / path.name)
        for i, name in enumerate(("origin_id", "sequence_number", "chunk_number")):
            widths[i] = max(widths[i], int(pc.max(table[name]).as_py()).bit_length())
    assert sum(widths) > 63
    config = job(archive, tmp_path, on_conflict="keep_first", micro_batch={"max_buffers": 7})
    assert job_view(config, spark) == reference_view(config)


@pytest.mark.parametrize(
    ("start", "end", "field"),
    [
        (2_000_000, 1_000_000, "start"),  # empty: [start, end) needs start < end
        (1_000_000, 1_000_000, "start"),
        (0, 2**62, "end"),  # beyond the year 9999
        (-(2**62), 0, "start"),
    ],
)
def test_a_bad_backfill_range_is_a_configuration_error(
    archive: Path, tmp_path: Path, start: int, end: int, field: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        run(job(archive, tmp_path), start=start, end=end)
    assert caught.value.where.field == field and caught.value.exit_code == 2
    assert not (tmp_path / "ckpt").exists()  # refused before anything is written


@pytest.mark.parametrize("max_buffers", [None, 1], ids=["one-batch", "a-batch-per-buffer"])
def test_a_late_tuple_that_occurs_several_times_is_written_as_often(
    tmp_path: Path, spark: Any, max_buffers: int | None
) -> None:
    """A pass with one watermark key groups each distinct late tuple once and writes it as many
    times as it occurs: a buffer holding the same late tuple three times gives three rows of the
    ``late`` table, as the reference model does, in one batch and in a pass of several."""
    t0, second = parse_timestamp("2026-01-01T00:00:00Z"), 1_000_000
    late = (t0 + second // 2, 1, 2.0)
    rows = buffer_rows(1, 1, watermark=t0 + 2 * second, events=[(t0 + 2 * second, 1, 1.0)])
    rows += buffer_rows(1, 2, watermark=t0 + 3 * second, events=[late, late, (t0 + 3 * second, 2, 5.0), late])
    rows += buffer_rows(1, 3, watermark=t0 + 4 * second, events=[(t0 + second, 2, 3.0), (t0 + 4 * second, 2, 1.0)])
    archive = tmp_path / "archive"
    write_archive(archive, rows)
    config = job(archive, tmp_path, micro_batch={"max_buffers": max_buffers})
    view = job_view(config, spark)
    assert view == reference_view(config)
    assert view["late"].count(view["late"][0]) == 3  # the repeated tuple, three times
    assert len(view["late"]) == 4


@pytest.mark.parametrize(
    ("max_buffers", "windows"),
    [(None, None), (2, None), (2, _TUMBLING_ONLY)],
    ids=["one-batch", "batches-counted", "batches-derived"],
)
def test_rows_moved_between_copies_after_the_scan_fail_the_ledger(
    tmp_path: Path,
    spark: Any,
    monkeypatch: pytest.MonkeyPatch,
    max_buffers: int | None,
    windows: list[dict[str, Any]] | None,
) -> None:
    """A file rewritten between the metadata scan and the pass so that a row of one buffer now
    carries the identity of another buffer of the same batch: Spark reads as many rows and tuples
    as the scan counted, for the batch and for the pass, but the copy checksum differs, and the
    pass fails the ledger with nothing committed: in one batch, in a pass whose batches are
    counted each, and in one whose batches' counts are derived from the pass's totals."""
    import replay.runner.batch as batch_module

    t0, second = parse_timestamp("2026-01-01T00:00:00Z"), 1_000_000
    rows: list[dict[str, Any]] = []
    for sequence in (1, 2, 3):  # batches of two buffers: {1, 2} and {3}
        at = t0 + (sequence - 1) * second
        rows += buffer_rows(1, sequence, watermark=at, events=[(at + i, 1, 1.0) for i in range(3)])
    path = write_archive(tmp_path / "archive", rows)
    settings: dict[str, Any] = {"micro_batch": {"max_buffers": max_buffers, "max_batches_per_pass": 32}}
    config = job(tmp_path / "archive", tmp_path, **settings, **({"windows": windows} if windows else {}))
    run_pass = batch_module.run_pass

    def rewritten_first(*args: Any, **kwargs: Any) -> Any:
        table = pq.read_table(path)
        sequences = table.column("sequence_number").to_pylist()
        sequences[sequences.index(2)] = 1  # the first row of sequence 2 now says sequence 1
        pq.write_table(table.set_column(1, "sequence_number", pa.array(sequences, pa.int64())), path)
        return run_pass(*args, **kwargs)

    monkeypatch.setattr(batch_module, "run_pass", rewritten_first)
    with pytest.raises(LedgerError, match=r"read other (copies|rows) than") as raised:
        run(config, spark=spark)
    assert "archiver" in raised.value.todo
    assert CheckpointStore(Path(config.checkpoint)).latest() is None
