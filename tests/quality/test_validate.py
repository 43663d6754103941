"""``replay validate``: the GX suites pass on a correct output and fail, by name, on broken ones."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from replay.cli import app
from replay.core.config import JobConfig
from replay.core.errors import CheckpointStateError
from replay.quality.validate import ValidationOutcome, validate
from replay.store.durable import signed
from replay.store.outputs import Manifest, latest_version, read_manifest, read_table, read_validation

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def validated(validated_run: tuple[JobConfig, ValidationOutcome]) -> tuple[JobConfig, ValidationOutcome]:
    """The session's validated output (``conftest.validated_run``); the tests below break copies of it."""
    return validated_run


def test_every_suite_passes_on_a_correct_output(validated: tuple[JobConfig, ValidationOutcome]) -> None:
    config, outcome = validated
    assert config.output is not None
    assert outcome.success, outcome.failures
    names = [s["name"] for s in outcome.record["suites"]]
    assert names == ["windows", "progress", "integrity", "reconciliation"]
    assert all(s["evaluated"] >= 3 and s["failed"] == 0 for s in outcome.record["suites"])
    # The reconciliation compared every emitted window with the recomputation, and found them all.
    windows = read_table(config.output, "windows")
    presence = next(e for s in outcome.record["suites"] for e in s["expectations"] if e["column"] == "presence")
    assert presence["success"] and presence["element_count"] >= windows.num_rows > 10
    assert read_validation(config.output, outcome.version) == json.loads(
        json.dumps({"format_version": 1, "version": outcome.version, **outcome.record})
    )
    assert Path(outcome.data_docs).is_file()
    # One build of the Data Docs rendered every suite and its result for this version.
    site = Path(outcome.data_docs).parent
    for name in names:
        assert (site / "expectations" / f"{name}.html").is_file(), name
        assert list((site / "validations" / name / f"version-{outcome.version}").rglob("*.html")), name


def _rewrite(output: Path, version: int, manifest: Manifest) -> None:
    """Write ``manifest`` over a version's as a writer would: with its payload's sha256."""
    document = signed(manifest.to_json(), manifest.format_version)
    (output / "versions" / f"{version:06d}.json").write_text(json.dumps(document), encoding="utf-8")


def _broken(output: str, to: Path, table: str, mutate: Callable[[pa.Table], pa.Table]) -> str:
    """A copy of ``output`` whose newest version has ``table`` replaced by ``mutate(table)``."""
    shutil.copytree(output, to, ignore=shutil.ignore_patterns("_validation", "*.validation.json"))
    version = latest_version(to)
    assert version is not None
    broken = mutate(read_table(to, table, version))
    pq.write_table(broken, to / "data" / table / "broken.parquet")
    manifest = read_manifest(to, version)
    manifest = replace(manifest, tables=dict(manifest.tables) | {table: (f"data/{table}/broken.parquet",)})
    _rewrite(to, version, manifest)
    return str(to)


def _remove_window(t: pa.Table) -> pa.Table:
    return pa.concat_tables([t.slice(0, 3), t.slice(4)])


def _change_count(t: pa.Table) -> pa.Table:
    counts = t["count"].to_pylist()
    row = next(i for i, c in enumerate(counts) if c is not None)
    counts[row] += 1
    return t.set_column(t.schema.get_field_index("count"), "count", pa.array(counts, pa.int64()))


def _duplicate_window(t: pa.Table) -> pa.Table:
    return pa.concat_tables([t, t.slice(5, 1)])


def _watermark_back(t: pa.Table) -> pa.Table:
    last = pc.max(t["batch"]).as_py()
    earlier = t.filter(pc.and_(pc.less(t["batch"], last), pc.is_valid(t["global_watermark"])))
    assert earlier.num_rows, "the fixture needs a global watermark before the last batch"
    lower = pc.min(earlier["global_watermark"]).cast(pa.int64()).as_py() - 1_000_000
    values = [
        lower if b == last else g
        for b, g in zip(t["batch"].to_pylist(), t["global_watermark"].cast(pa.int64()).to_pylist(), strict=True)
    ]
    column = pa.array(values, pa.int64()).cast(t.schema.field("global_watermark").type)
    return t.set_column(t.schema.get_field_index("global_watermark"), "global_watermark", column)


def _add_conflict(t: pa.Table) -> pa.Table:
    row = {name: [None] for name in t.schema.names} | {
        "kind": ["conflict"],
        "origin_id": [1],
        "sequence_number": [2],
        "chunk_number": [1],
        "detail": ["planted by the test"],
    }
    return pa.concat_tables([t, pa.table(row, schema=t.schema)])


BROKEN = {
    # case: (table, mutation, suite, failing (expectation type, column))
    "window removed": ("windows", _remove_window, "reconciliation", ("expect_column_values_to_be_in_set", "presence")),
    "count changed": (
        "windows",
        _change_count,
        "reconciliation",
        ("expect_column_values_to_be_null", "count_mismatch"),
    ),
    "window duplicated": (
        "windows",
        _duplicate_window,
        "windows",
        ("expect_compound_columns_to_be_unique", ["window", "key", "window_start"]),
    ),
    "watermark backwards": (
        "progress",
        _watermark_back,
        "progress",
        ("expect_column_pair_values_a_to_be_greater_than_b", "global_us"),
    ),
    "conflict planted": ("integrity", _add_conflict, "integrity", ("expect_column_values_to_be_between", "conflicts")),
}


@pytest.fixture(scope="module")
def reconciliation_without_a_window(
    validated: tuple[JobConfig, ValidationOutcome], tmp_path_factory: pytest.TempPathFactory, spark: Any
) -> ValidationOutcome:
    """The reconciliation suite on a copy with one emitted window removed: two tests read this one verdict."""
    config, _ = validated
    assert config.output is not None
    output = _broken(config.output, tmp_path_factory.mktemp("no-window") / "out", "windows", _remove_window)
    return validate(output, suites=["reconciliation"], spark=spark)


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_suite_fails_on_a_broken_output_naming_the_expectation(
    case: str,
    validated: tuple[JobConfig, ValidationOutcome],
    tmp_path: Path,
    spark: Any,
    request: pytest.FixtureRequest,
) -> None:
    config, _ = validated
    assert config.output is not None
    table, mutate, suite, (kind, column) = BROKEN[case]
    if case == "window removed":  # the very check the next test reads too: run it once
        assert (table, mutate, suite) == ("windows", _remove_window, "reconciliation")
        outcome = request.getfixturevalue("reconciliation_without_a_window")
    else:
        output = _broken(config.output, tmp_path / "out", table, mutate)
        outcome = validate(output, suites=[suite], spark=spark)
    assert not outcome.success
    failed = {(e["type"], json.dumps(e["column"])) for s, e in outcome.failures}
    assert (kind, json.dumps(column)) in failed, outcome.failures
    assert {s for s, _ in outcome.failures} == {suite}


def test_the_reconciliation_names_the_windows_and_the_ledger_it_disagrees_with(
    reconciliation_without_a_window: ValidationOutcome,
) -> None:
    outcome = reconciliation_without_a_window
    assert not outcome.success
    by_column = {e["column"]: e for _, e in outcome.failures}
    assert by_column["presence"]["unexpected_count"] == 1
    assert by_column["presence"]["unexpected_examples"] == ["in the recomputation, not emitted"]
    assert "emitted windows, the table has" in by_column["ledger_tables"]["unexpected_examples"][0]


def test_the_cli_exits_1_and_names_the_failed_expectation(
    validated: tuple[JobConfig, ValidationOutcome], tmp_path: Path, spark: Any
) -> None:
    config, _ = validated
    assert config.output is not None
    output = _broken(config.output, tmp_path / "out", "windows", _duplicate_window)
    result = CliRunner().invoke(app, ["validate", output, "--suite", "windows"])
    assert result.exit_code == 1, result.output
    assert "expect_compound_columns_to_be_unique" in result.stderr
    assert read_validation(output, 1) is not None and not read_validation(output, 1)["success"]  # type: ignore[index]


def test_a_version_without_validation_facts_is_refused(
    validated: tuple[JobConfig, ValidationOutcome], tmp_path: Path
) -> None:
    config, _ = validated
    assert config.output is not None
    to = tmp_path / "old"
    shutil.copytree(config.output, to, ignore=shutil.ignore_patterns("_validation"))
    manifest = replace(read_manifest(to, 1), ledger_batches=None, format_version=1)
    # As an earlier Replay wrote it: the first manifest format, without a digest.
    (to / "versions" / "000001.json").write_text(json.dumps(manifest.to_json()), encoding="utf-8")
    with pytest.raises(CheckpointStateError) as caught:
        validate(to)
    assert caught.value.code == "output.not_validatable"


def test_the_data_docs_keep_a_bounded_history(
    validated: tuple[JobConfig, ValidationOutcome], tmp_path: Path, spark: Any
) -> None:
    config, _ = validated
    assert config.output is not None
    out = tmp_path / "out"
    shutil.copytree(config.output, out, ignore=shutil.ignore_patterns("_validation"))
    manifest = read_manifest(out, 1)
    config = copy.deepcopy(dict(manifest.config or {}))
    config["validation"]["docs_history"] = 2  # a judging setting, not part of the fingerprint
    _rewrite(out, 1, replace(manifest, config=config))
    gx = out / "_validation" / "gx" / "uncommitted"
    counts = []
    for _ in range(3):
        assert validate(out, suites=["integrity"], spark=spark).record["suites"][0]["success"]
        results = list((gx / "validations" / "integrity").rglob("*.json"))
        pages = list((gx / "data_docs" / "local_site" / "validations" / "integrity").rglob("*.html"))
        counts.append((len(results), len(pages)))
    assert counts == [(1, 1), (2, 2), (2, 2)]
    assert (gx / "data_docs" / "local_site" / "index.html").is_file()


def test_a_buffer_archived_twice_in_one_file_is_recomputed_once(tmp_path: Path, spark: Any) -> None:
    """The recomputation tells a file's copies apart by runs of consecutive rows: a buffer whose second
    copy sits later in the same file is one kept copy and one duplicate, as the engine has it."""
    from replay import GenerateOptions, generate_archive, run
    from tests.conftest import validated_job

    archive = tmp_path / "archive"
    generate_archive(
        archive, GenerateOptions(origins=2, tuples=400, buffer_tuples=20, keys=3, seed=5, files=2, ingest_ts=False)
    )
    first = sorted(archive.glob("*.parquet"))[0]
    table = pq.read_table(first)
    same = pc.and_(
        pc.and_(
            pc.equal(table["origin_id"], table["origin_id"][0]),
            pc.equal(table["sequence_number"], table["sequence_number"][0]),
        ),
        pc.equal(table["chunk_number"], table["chunk_number"][0]),
    )
    copy_rows = table.filter(same)
    assert 0 < copy_rows.num_rows < table.num_rows
    pq.write_table(pa.concat_tables([table, copy_rows]), first)  # the second copy after other buffers' rows

    config = validated_job(archive, tmp_path)
    summary = run(config, spark=spark)
    assert summary.duplicate_copies == 1
    assert config.output is not None
    outcome = validate(config.output, suites=["reconciliation"], spark=spark)
    assert not outcome.failures
    (suite,) = outcome.record["suites"]
    assert suite["name"] == "reconciliation" and suite["success"] and suite["evaluated"] >= 3
