"""``replay publish``: only validated versions, an atomic flip, range merges and their corrections."""

from __future__ import annotations

import html
import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from replay import parse_config, run
from replay.cli import app
from replay.core.config import JobConfig
from replay.core.errors import PublicationError
from replay.core.rules import RULES_VERSION
from replay.quality.report import write_report
from replay.quality.validate import ValidationOutcome, validate
from replay.store.durable import signed
from replay.store.outputs import current_version, list_versions, read_manifest, read_table
from replay.store.publish import PublishOutcome, publish

pytestmark = [pytest.mark.spark, pytest.mark.slow]

MS = 1_000


@pytest.fixture(scope="module")
def published(
    validated_run: tuple[JobConfig, ValidationOutcome], tmp_path_factory: pytest.TempPathFactory
) -> tuple[JobConfig, Path]:
    """The session's validated output (``conftest.validated_run``: an origin-mode archive replayed and
    validated once) copied, then published once (version 1 published as 2). The tests change copies of it."""
    config, validation = validated_run
    assert validation.success and validation.version == 1
    root = tmp_path_factory.mktemp("publish")
    shutil.copytree(str(config.output), root / "out")
    outcome = publish(root / "out")
    assert (outcome.source, outcome.publication, outcome.previous) == (1, 2, None)
    return config.with_overrides(output=str(root / "out")), root


def test_the_first_publication_adds_every_window_and_changes_nothing_twice(
    published: tuple[JobConfig, Path],
) -> None:
    config, _ = published
    out = Path(str(config.output))
    assert current_version(out) == 2
    windows = read_table(out, "windows", 1)
    fixes = read_table(out, "corrections")
    assert fixes["change"].to_pylist() == ["added"] * windows.num_rows
    again = publish(out)
    assert not again.changed and again.publication == 2 and list_versions(out) == [1, 2]


def test_unvalidated_and_failed_versions_are_refused(
    published: tuple[JobConfig, Path], tmp_path: Path, spark: Any
) -> None:
    config, _ = published
    out = tmp_path / "out"
    shutil.copytree(str(config.output), out)
    run(
        config.with_overrides(output=str(out), checkpoint=str(tmp_path / "ckpt")),
        spark=spark,
        start=0,
        end=1_893_456_000_000_000,
    )
    assert list_versions(out) == [1, 2, 3]
    with pytest.raises(PublicationError) as unvalidated:
        publish(out, 3)
    assert unvalidated.value.code == "publish.unvalidated" and "replay validate" in unvalidated.value.message
    # Break version 3's windows (a window twice): its validation fails, and so does publishing it.
    windows = read_table(out, "windows", 3)
    pq.write_table(pa.concat_tables([windows, windows.slice(0, 1)]), out / "data" / "windows" / "twice.parquet")
    manifest = read_manifest(out, 3)
    manifest = replace(manifest, tables=dict(manifest.tables) | {"windows": ("data/windows/twice.parquet",)})
    # Written as a writer would (with its payload's digest): a version whose data is wrong, not a damaged file.
    document = signed(manifest.to_json(), manifest.format_version)
    (out / "versions" / "000003.json").write_text(json.dumps(document), encoding="utf-8")
    assert not validate(out, 3, suites=["windows"], spark=spark).success
    with pytest.raises(PublicationError) as failed:
        publish(out, 3)
    assert failed.value.code == "publish.failed_validation"
    assert "expect_compound_columns_to_be_unique" in failed.value.message
    assert current_version(out) == 2
    with pytest.raises(PublicationError) as not_a_run:
        publish(out, 2)
    assert not_a_run.value.code == "publish.not_a_run"


def _add_buffer(archive: Path, start: int, end: int) -> None:
    """Archive one more buffer: a new origin's only sequence, with tuples inside ``[start, end)``.

    Its watermark is the archive's highest, so the global watermark (a minimum) does not move.
    """
    table = pa.concat_tables([pq.read_table(p) for p in sorted(archive.glob("*.parquet"))])
    origin = max(table["origin_id"].to_pylist()) + 1
    watermark = max(t.value for t in table["watermark_ts"] if t.is_valid)
    times = [start + 300 * MS, start + 700 * MS, start + 1_300 * MS, end - 200 * MS]
    rows = [
        {
            "origin_id": origin,
            "sequence_number": 1,
            "chunk_number": 1,
            "last_chunk": True,
            "watermark_ts": watermark,
            "idle": False,
            "event_time": t,
            "key": 1 + i % 2,
            "value": 1000.5 + i,
        }
        for i, t in enumerate(times)
    ]
    columns = {name: [r.get(name) for r in rows] for name in table.schema.names}
    pq.write_table(pa.table(columns, schema=table.schema), archive / "zz-added.parquet")


def _ids(table: pa.Table) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {(r["window"], r["key"], r["window_start"]): r for r in table.to_pylist()}


def test_a_range_backfill_after_a_buffer_was_added_corrects_exactly_the_changed_windows(
    published: tuple[JobConfig, Path], tmp_path: Path, spark: Any
) -> None:
    config, _ = published
    out = tmp_path / "out"
    shutil.copytree(str(config.output), out)
    archive = tmp_path / "archive"
    shutil.copytree(config.archive, archive)
    before = read_table(out, "windows", 2)
    starts = sorted({t.value for t in before["window_start"]})
    start = starts[len(starts) // 3] // 1_000_000 * 1_000_000
    end = start + 3_000_000
    _add_buffer(archive, start, end)
    job = config.with_overrides(archive=str(archive), output=str(out), checkpoint=str(tmp_path / "range-ckpt"))

    # A crash between validation and publication leaves the previous publication current.
    run(job, spark=spark, start=start, end=end)
    assert list_versions(out) == [1, 2, 3]
    checked = validate(out, spark=spark)  # by default the newest run's version, not the current publication
    assert checked.version == 3 and checked.success
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("REPLAY_FAULT", "publish:before_flip")
        with pytest.raises(SystemExit):
            publish(out, 3)
    assert current_version(out) == 2 and read_table(out, "windows").equals(before)
    outcome = publish(out, 3)
    assert (outcome.publication, outcome.previous, list_versions(out)) == (4, 2, [1, 2, 3, 4])  # reused, not redone
    assert outcome.merged_rules is None and read_manifest(out, 4).merged_rules is None  # one rules version

    # What a full replay of the changed archive gives inside the range is what must change, and nothing else.
    full_out = tmp_path / "full"
    run(config.with_overrides(archive=str(archive), output=str(full_out), checkpoint=str(tmp_path / "fc")), spark=spark)
    inside = lambda r: r["window_start"].timestamp() * 1e6 >= start and r["window_end"].timestamp() * 1e6 <= end  # noqa: E731
    old = {k: r for k, r in _ids(before).items() if inside(r)}
    new = {k: r for k, r in _ids(read_table(full_out, "windows")).items() if inside(r)}
    expected = {k: "added" for k in new.keys() - old.keys()} | {k: "retracted" for k in old.keys() - new.keys()}
    expected |= {k: "changed" for k in new.keys() & old.keys() if new[k] != old[k]}
    assert expected, "the added buffer must change some windows inside the range"
    fixes = read_table(out, "corrections").to_pylist()
    assert {(r["window"], r["key"], r["window_start"]): r["change"] for r in fixes} == expected
    for r in fixes:
        if r["change"] == "changed":
            key = (r["window"], r["key"], r["window_start"])
            assert (r["before_count"], r["after_count"]) == (old[key]["count"], new[key]["count"])

    # The publication is the previous one with exactly the range's windows replaced.
    published_rows = _ids(read_table(out, "windows"))
    assert published_rows == {k: r for k, r in _ids(before).items() if not inside(r)} | new
    assert outcome.corrections == {c: list(expected.values()).count(c) for c in ("added", "changed", "retracted")}

    # The merged publication validates as a whole, and earlier versions stay readable.
    merged = validate(out, current_version(out), spark=spark, suites=["windows", "reconciliation"])
    assert [s["success"] for s in merged.record["suites"]] == [True, True]
    assert read_table(out, "windows", 2).equals(before)

    # Retention keeps the newest version, the current publication and what it was built from (its source and
    # the publication it corrects), and each checkpoint's newest run version (the range's checkpoint's
    # next run builds on version 3's files); it deletes the rest, and the files only they used.
    assert not publish(out, 3, retain_versions=1).changed
    range_windows = [out / entry for entry in read_manifest(out, 3).tables["windows"]]
    assert range_windows and all(p.exists() for p in range_windows)
    only_two = set(read_manifest(out, 2).all_entries()) - set().union(
        *(read_manifest(out, v).all_entries() for v in (1, 3, 4))
    )
    assert only_two  # the publication's own corrections
    again = publish(out, 1, retain_versions=1)
    assert again.changed and current_version(out) == 5
    assert set(again.removed_versions) == {2} and list_versions(out) == [1, 3, 4, 5]
    assert all(p.exists() for p in range_windows)
    assert not any((out / entry).exists() for entry in only_two)
    assert read_table(out, "windows").equals(read_table(out, "windows", 1))
    assert read_table(out, "windows", 4).num_rows == len(published_rows)


def test_a_range_merged_into_a_publication_of_other_rules_names_both(
    published: tuple[JobConfig, Path], tmp_path: Path, spark: Any
) -> None:
    """A range backfill after an upgrade: the publication it corrects was made by a Replay from
    before rules were versioned (its manifest names none). The merged publication lists both
    versions, and ``replay publish`` says so; publishing a whole replay afterwards lists one again."""
    config, _ = published
    out = tmp_path / "out"
    shutil.copytree(str(config.output), out)
    for v in (1, 2):  # as an earlier Replay wrote them: no rules field
        old = read_manifest(out, v)
        document = signed({k: x for k, x in old.to_json().items() if k != "rules"}, old.format_version)
        (out / "versions" / f"{v:06d}.json").write_text(json.dumps(document), encoding="utf-8")
        assert read_manifest(out, v).rules is None
    before = read_table(out, "windows", 2)
    starts = sorted({t.value for t in before["window_start"]})
    start = starts[len(starts) // 2] // 1_000_000 * 1_000_000
    run(config.with_overrides(output=str(out), checkpoint=str(tmp_path / "range")), spark=spark, start=start)
    assert validate(out, 3, spark=spark).success

    published_cli = CliRunner().invoke(app, ["publish", str(out), "--version", "3"])
    assert published_cli.exit_code == 0, published_cli.output
    merged = read_manifest(out, current_version(out))
    assert published_cli.stdout.startswith(
        f"published version 3 of {out} as version {merged.version} (previous: version 2); corrections: "
    )
    assert merged.merged_range == (start, None) and merged.rules == RULES_VERSION
    assert merged.merged_rules == (None, RULES_VERSION)
    said = (
        f"rules from before they were versioned, rules {RULES_VERSION}: the merged range's rows by rules "
        f"{RULES_VERSION}, the others"
    )
    assert f"note: the publication's rows were computed by {said}" in published_cli.stderr
    assert "replay the whole archive into a new --checkpoint" in published_cli.stderr
    assert json.loads((out / "versions" / f"{merged.version:06d}.json").read_text())["merged_rules"] == [
        None,
        RULES_VERSION,
    ]

    page = html.unescape(write_report(out, None, tmp_path / "report").read_text())
    assert said in page

    # Publishing the run again names the mix again; a whole replay (no range) has one set of rules.
    assert publish(out, 3).merged_rules == (None, RULES_VERSION)
    run(config.with_overrides(output=str(out), checkpoint=str(tmp_path / "whole")), spark=spark)
    whole = list_versions(out)[-1]
    assert validate(out, whole, spark=spark).success
    outcome = publish(out, whole)
    assert outcome.changed and outcome.merged_rules is None
    assert read_manifest(out, outcome.publication).merged_rules is None


def test_a_range_finds_the_late_rows_event_time_under_the_archives_own_column_name() -> None:
    """The late table keeps the archive's column names: with ``columns: {event_time: ts}`` the
    range is applied to ``ts``."""
    from replay.store.publish import _late_in_range

    config = parse_config({"archive": "unused", "columns": {"event_time": "ts"}})
    times = pa.array([1_000_000, 7_000_000, None], type=pa.timestamp("us", tz="UTC"))
    table = pa.table({"wm_key": ["default"] * 3, "ts": times})
    assert _late_in_range(table, config, 5_000_000, 10_000_000).to_pylist() == [False, True, False]


@pytest.mark.parametrize("time_unit", ["native", "ms"])
def test_a_range_replaces_the_late_rows_whose_own_key_event_time_is_inside_it(time_unit: str) -> None:
    from replay.store.publish import _late_in_range

    config = parse_config(
        {
            "archive": "unused",
            "time_unit": time_unit,
            "watermarks": {"a": {"event_time": "t1"}, "b": {"event_time": "t2"}},
        }
    )
    seconds = [(1, 9), (5, 1), (10, 5), (None, 5), (5, None)]
    keys = ["a", "b", "a", "b", "a"]
    if time_unit == "ms":
        columns = [
            pa.array([None if v is None else v * 1000 for v in c], pa.int64()) for c in zip(*seconds, strict=True)
        ]
    else:
        columns = [
            pa.array([None if v is None else v * 1_000_000 for v in c], pa.timestamp("us", tz="UTC"))
            for c in zip(*seconds, strict=True)
        ]
    table = pa.table({"wm_key": keys, "t1": columns[0], "t2": columns[1]})
    # [5 s, 10 s): row 0 (a: t1 = 1) out, row 1 (b: t2 = 1) out, row 2 (a: t1 = 10) out (end is open),
    # row 3 (b: t2 = 5) in although its t1 is null, row 4 (a: t1 = 5) in although its t2 is null.
    inside = _late_in_range(table, config, 5_000_000, 10_000_000)
    assert inside.to_pylist() == [False, False, False, True, True]


def test_an_outcome_is_told_in_one_sentence() -> None:
    """What ``replay publish`` prints and the Airflow task logs: the source, the new publication,
    the previous one (or none), the corrections and the versions retention removed."""

    def outcome(source: int, publication: int, previous: int | None, changed: bool, **rest: Any) -> PublishOutcome:
        corrections = rest.pop("corrections", {})
        return PublishOutcome(
            output="/o",
            source=source,
            publication=publication,
            previous=previous,
            changed=changed,
            corrections=corrections,
            removed_versions=rest.pop("removed", ()),
        )

    first = outcome(1, 2, None, True, corrections={"added": 3, "changed": 0, "retracted": 1})
    assert first.describe() == (
        "published version 1 of /o as version 2 (previous: none); corrections: 3 added, 0 changed, 1 retracted"
    )
    later = outcome(5, 6, 2, True, corrections={"added": 0, "changed": 2, "retracted": 0}, removed=(1, 2))
    assert later.describe() == (
        "published version 5 of /o as version 6 (previous: version 2); corrections: 0 added, 2 changed, "
        "0 retracted; removed versions 1, 2"
    )
    again = outcome(5, 6, 6, False)
    assert again.describe() == "version 5 is already published (current: version 6)"
