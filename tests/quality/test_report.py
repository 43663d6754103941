"""``replay report``: one self-contained HTML page per output version.

A generated archive with gaps, duplicates, a conflict and late data is replayed
in several micro-batches; the page is then parsed (tags balance, section
headings, every image a real PNG) and compared with the output's own tables: the
gaps it lists are the integrity table's, there is a lateness histogram for each
origin with late rows, and an archive without late data says so.
"""

from __future__ import annotations

import base64
import io
import os
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from PIL import Image

from replay.core.config import parse_config
from replay.core.errors import ConfigError
from replay.generate import generate_archive
from replay.generate_options import GenerateOptions
from replay.quality.report import write_report
from replay.runner.loop import run
from replay.store.outputs import Manifest, read_manifest, read_table, write_manifest, write_validation
from replay.store.publish import publish

CHROMIUM = Path("/usr/bin/chromium")
SECTIONS = ["Summary", "Watermark timeline", "Lateness", "Integrity", "Validation", "Corrections"]
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Page(HTMLParser):
    """What a test needs from the report: structure errors, headings, images, tables by id, the text."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.errors: list[str] = []
        self.stack: list[tuple[str, dict[str, str]]] = []
        self.headings: dict[str, list[str]] = {"h1": [], "h2": [], "h3": []}
        self.images: list[tuple[dict[str, str], dict[str, str]]] = []  # (img attributes, enclosing figure's)
        self.tables: dict[str, list[list[str]]] = {}
        self.tags: Counter[str] = Counter()
        self.links: list[str] = []
        self._text: list[str] = []
        self._heading: list[str] | None = None
        self._cell: list[str] | None = None
        self._table: str | None = None
        self.feed(html)
        self.close()
        if self.stack:
            self.errors.append(f"unclosed at the end: {[tag for tag, _ in self.stack]}")

    @property
    def text(self) -> str:
        return " ".join(" ".join(self._text).split())

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        self.tags[tag] += 1
        if tag == "img":
            figure = next((a for t, a in reversed(self.stack) if t == "figure"), {})
            self.images.append((values, figure))
        if tag == "a" and "href" in values:
            self.links.append(values["href"])
        if tag in _VOID:
            return
        self.stack.append((tag, values))
        if tag in self.headings:
            self._heading = []
        elif tag == "table":
            self._table = values.get("id")
            if self._table:
                self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID:
            return
        if not self.stack or self.stack[-1][0] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1][0] if self.stack else 'nothing'}")
            return
        self.stack.pop()
        if tag in self.headings and self._heading is not None:
            self.headings[tag].append(" ".join(" ".join(self._heading).split()))
            self._heading = None
        elif tag == "table":
            self._table = None
        elif tag in ("td", "th") and self._cell is not None and self._table:
            self.tables[self._table][-1].append(" ".join(" ".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self.stack and self.stack[-1][0] in ("style", "title"):
            return
        self._text.append(data)
        for part in (self._heading, self._cell):
            if part is not None:
                part.append(data)


def png_of(src: str) -> Image.Image:
    prefix = "data:image/png;base64,"
    assert src.startswith(prefix), src[:60]
    image = Image.open(io.BytesIO(base64.b64decode(src[len(prefix) :], validate=True)))
    image.load()
    assert image.format == "PNG"
    return image


def body_rows(table: list[list[str]]) -> list[list[str]]:
    """The rows after the header row, without a trailing "… N more" row."""
    return [row for row in table[1:] if not (len(row) == 1 and row[0].startswith("…"))]


@dataclass(frozen=True, slots=True, kw_only=True)
class Replayed:
    archive: Path
    output: Path
    checkpoint: Path


def replay(tmp: Path, spark: Any, options: GenerateOptions, **settings: Any) -> Replayed:
    archive = tmp / "archive"
    generate_archive(archive, options)
    config = parse_config(
        {
            "archive": str(archive),
            "output": str(tmp / "out"),
            "checkpoint": str(tmp / "ckpt"),
            "windows": [
                {
                    "name": "per_5s",
                    "size": "5s",
                    "aggregations": [
                        {"fn": "count"},
                        {"fn": "sum", "column": "value"},
                        {"fn": "min", "column": "value"},
                        {"fn": "max", "column": "value"},
                        {"fn": "mean", "column": "value"},
                    ],
                }
            ],
        }
        | settings
    )
    run(config, spark=spark)
    return Replayed(archive=archive, output=tmp / "out", checkpoint=tmp / "ckpt")


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Replayed:
    """About 20k tuples from 4 origins: 2 gaps, 3 duplicates, 1 conflict (kept first), 2 % late, several batches."""
    options = GenerateOptions(
        origins=4,
        tuples=20_000,
        buffer_tuples=100,
        keys=8,
        seed=3,
        gaps=2,
        duplicates=3,
        conflicts=1,
        late_fraction=0.02,
        multi_chunk_fraction=0.2,
        files=3,
    )
    return replay(
        tmp_path_factory.mktemp("report"), spark, options, on_conflict="keep_first", micro_batch={"max_buffers": 40}
    )


@pytest.fixture(scope="module")
def report(replayed: Replayed, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Page]:
    path = write_report(replayed.output, replayed.checkpoint, tmp_path_factory.mktemp("html") / "report")
    return path, Page(path.read_text(encoding="utf-8"))


@pytest.mark.spark
def test_the_page_is_well_formed_self_contained_html_with_every_section(
    replayed: Replayed, report: tuple[Path, Page]
) -> None:
    path, page = report
    assert path.name == "index.html" and path.parent.name == "report"
    assert page.errors == []
    assert page.tags["html"] == page.tags["head"] == page.tags["body"] == 1
    assert page.headings["h2"] == [*SECTIONS, "Checkpoint"]
    assert str(replayed.output) in page.text
    # Nothing to fetch: no script, no external stylesheet or font, links only inside the page.
    html = path.read_text(encoding="utf-8")
    assert page.tags["script"] == 0 and page.tags["link"] == 0
    assert "http://" not in html and "https://" not in html and "url(" not in html and "@import" not in html
    assert all(href.startswith("#") for href in page.links), page.links
    assert page.images
    for attrs, _ in page.images:
        image = png_of(attrs["src"])
        assert image.width > 100 and image.height > 100
        assert (int(attrs["width"]), int(attrs["height"])) == image.size
        assert attrs["alt"].strip()


@pytest.mark.spark
def test_the_summary_numbers_are_the_manifests(replayed: Replayed, report: tuple[Path, Page]) -> None:
    _, page = report
    counts = read_manifest(replayed.output, 1).counts
    assert counts["discarded_copies"] > 0 and sum(counts["late"]) > 0
    text = page.text
    assert f"Tuples read {counts['tuples_read']:,}" in text
    assert f"Windows emitted {sum(counts['emitted_windows'].values()):,}" in text
    assert f"Windows open {sum(counts['open_windows'].values()):,}" in text
    assert f"Late tuples {sum(counts['late']):,}" in text
    assert f"Duplicates {counts['discarded_copies']:,}" in text


@pytest.mark.spark
def test_one_watermark_timeline_per_key_over_every_batch(replayed: Replayed, report: tuple[Path, Page]) -> None:
    _, page = report
    progress = read_table(replayed.output, "progress")
    batches = len(set(progress.column("batch").to_pylist()))
    assert batches > 1  # the fixture's max_buffers cuts the run into several batches
    timelines = [(attrs, figure) for attrs, figure in page.images if "timeline" in figure.get("class", "")]
    assert [figure["data-key"] for _, figure in timelines] == sorted(set(progress.column("wm_key").to_pylist()))
    for attrs, _ in timelines:
        assert f"over {batches} micro-batch(es)" in attrs["alt"]


@pytest.mark.spark
def test_the_integrity_section_lists_the_gaps_and_copies_of_the_integrity_table(
    replayed: Replayed, report: tuple[Path, Page]
) -> None:
    _, page = report
    integrity = read_table(replayed.output, "integrity")
    kinds = Counter(integrity.column("kind").to_pylist())
    assert kinds["gap"] == 2 and kinds["duplicate"] == 3 and kinds["conflict"] == 1
    gaps = integrity.filter(pc.equal(integrity.column("kind"), "gap"))
    expected = sorted(
        zip(gaps.column("origin_id").to_pylist(), gaps.column("sequence_number").to_pylist(), strict=True)
    )
    table = page.tables["integrity-gap"]
    assert table[0] == ["origin_id", "sequence_number"]
    assert sorted((int(o), int(s)) for o, s in body_rows(table)) == expected
    for kind in ("duplicate", "conflict"):
        assert len(body_rows(page.tables[f"integrity-{kind}"])) == kinds[kind]
    assert "integrity-incomplete" not in page.tables  # no such rows, no such table
    for kind in ("gap", "incomplete", "skipped", "regression", "duplicate", "conflict"):
        assert f"{kind} {kinds.get(kind, 0):,}" in page.text


@pytest.mark.spark
def test_a_lateness_histogram_for_each_origin_with_late_rows(replayed: Replayed, report: tuple[Path, Page]) -> None:
    _, page = report
    late = read_table(replayed.output, "late")
    assert late.num_rows > 0
    per_origin = Counter(zip(late.column("wm_key").to_pylist(), late.column("origin_id").to_pylist(), strict=True))
    drawn = {
        (figure["data-key"], int(figure["data-origin"])): attrs["alt"]
        for attrs, figure in page.images
        if "histogram" in figure.get("class", "")
    }
    assert set(drawn) == set(per_origin)
    for (key, origin), n in per_origin.items():
        assert f"origin {origin}, key {key}: {n} late tuple(s)" in drawn[(key, origin)]


@pytest.mark.spark
def test_the_checkpoint_section_shows_the_stream_cut(replayed: Replayed, report: tuple[Path, Page]) -> None:
    _, page = report
    progress = read_table(replayed.output, "progress")
    last = progress.filter(pc.equal(progress.column("batch"), pc.max(progress.column("batch"))))
    expected = sorted(
        zip(
            last.column("origin_id").to_pylist(),
            last.column("cut_sequence").to_pylist(),
            last.column("cut_chunk").to_pylist(),
            strict=True,
        )
    )
    assert sorted(tuple(int(v) for v in row) for row in body_rows(page.tables["stream-cut"])) == expected


@pytest.mark.spark
def test_validation_results_and_the_data_docs_link(replayed: Replayed, tmp_path: Path) -> None:
    output = tmp_path / "out"
    shutil.copytree(replayed.output, output)
    docs = output / "_validation" / "docs" / "index.html"
    docs.parent.mkdir(parents=True, exist_ok=True)
    docs.write_text("<html></html>", encoding="utf-8")
    expectation = {"description": "", "unexpected_examples": [], "error": None}
    write_validation(
        output,
        1,
        {
            "success": False,
            "validated_at": "2026-01-02T03:04:05Z",
            "data_docs": "_validation/docs/index.html",
            "suites": [
                {
                    "name": "windows",
                    "success": True,
                    "evaluated": 1,
                    "failed": 0,
                    "expectations": [
                        expectation
                        | {"type": "expect_column_values_to_not_be_null", "column": "key", "success": True}
                        | {"unexpected_count": 0, "observed_value": None}
                    ],
                },
                {
                    "name": "integrity",
                    "success": False,
                    "evaluated": 2,
                    "failed": 1,
                    "expectations": [
                        expectation
                        | {"type": "expect_column_values_to_be_between", "column": "gaps", "success": False}
                        | {"unexpected_count": 2, "observed_value": 2, "unexpected_examples": [[4, 57]]},
                        expectation
                        | {"type": "expect_column_values_to_be_between", "column": "conflicts", "success": True}
                        | {"unexpected_count": 0, "observed_value": {"max": 0}},
                    ],
                },
            ],
        },
    )
    path = write_report(output, None, tmp_path / "deep" / "report")
    page = Page(path.read_text(encoding="utf-8"))
    assert page.errors == []
    assert "FAILED validated at 2026-01-02T03:04:05Z" in page.text and "not validated" not in page.text.lower()
    (link,) = [href for href in page.links if not href.startswith("#")]
    assert not os.path.isabs(link)
    assert (path.parent / link).resolve() == docs.resolve()
    assert "Suite integrity failed 2 evaluated, 1 failed" in page.text
    assert "expect_column_values_to_be_between" in page.text and "[[4, 57]]" in page.text


@pytest.mark.spark
def test_the_corrections_table_per_change(replayed: Replayed, tmp_path: Path) -> None:
    """A version whose corrections are written by hand: added, changed (before and after) and retracted rows."""
    output = tmp_path / "out"
    shutil.copytree(replayed.output, output)
    ts = pa.timestamp("us", tz="UTC")
    start = 1_767_225_600_000_000
    corrections = pa.table(
        {
            "change": ["added", "changed", "retracted", "added"],
            "window": ["per_5s"] * 4,
            "wm_key": ["default"] * 4,
            "key": [1, 2, 3, 4],
            "window_start": pa.array([start, start, start + 5_000_000, start], ts),
            "window_end": pa.array([start + 5_000_000, start + 5_000_000, start + 10_000_000, start + 5_000_000], ts),
            "before_count": [None, 7, 3, None],
            "after_count": [5, 8, None, 1],
        }
    )
    pq.write_table(corrections, output / "corrections.parquet")
    manifest = read_manifest(output, 1)
    manifest = replace(manifest, tables=dict(manifest.tables) | {"corrections": ("corrections.parquet",)})
    assert write_manifest(output, manifest).version == 2

    page = Page(write_report(output, None, tmp_path / "v2").read_text(encoding="utf-8"))
    assert page.errors == []
    rows = body_rows(page.tables["corrections-rows"])
    assert page.tables["corrections-rows"][0] == corrections.column_names and len(rows) == 4
    assert [row[0] for row in rows] == ["added", "added", "changed", "retracted"]
    assert rows[2][4:] == ["2026-01-01T00:00:00.000Z", "2026-01-01T00:00:05.000Z", "7", "8"]
    assert "added 2" in page.text and "changed 1" in page.text and "retracted 1" in page.text

    older = Page(write_report(output, None, tmp_path / "v1", version=1).read_text(encoding="utf-8"))
    assert "No corrections (not a publication, or nothing changed)" in older.text


@pytest.mark.spark
def test_a_publication_shows_its_source_validation_and_its_corrections(replayed: Replayed, tmp_path: Path) -> None:
    output = tmp_path / "out"
    shutil.copytree(replayed.output, output)
    suite = {"name": "windows", "success": True, "evaluated": 0, "failed": 0, "expectations": []}
    write_validation(output, 1, {"success": True, "validated_at": "2026-01-02T03:04:05Z", "suites": [suite]})
    outcome = publish(output, 1)
    assert outcome.publication == 2 and outcome.previous is None

    page = Page(write_report(output, None, tmp_path / "current").read_text(encoding="utf-8"))
    assert page.errors == []
    assert "published (current)" in page.text and "not published" not in page.text
    assert "publication of version 1, the first" in page.text
    assert "PASSED version 1 (this publication's source) validated at 2026-01-02T03:04:05Z" in page.text
    windows = read_table(output, "windows", 1).num_rows
    assert windows > 0 and outcome.corrections == {"added": windows, "changed": 0, "retracted": 0}
    assert f"added {windows:,}" in page.text and "changed 0" in page.text
    assert len(body_rows(page.tables["corrections-rows"])) == min(windows, 100)

    older = Page(write_report(output, None, tmp_path / "v1", version=1).read_text(encoding="utf-8"))
    assert "not published (the current publication is version 2)" in older.text
    assert "PASSED validated at 2026-01-02T03:04:05Z" in older.text


@pytest.mark.spark
def test_an_archive_without_late_data_says_no_late_tuples(tmp_path: Path, spark: Any) -> None:
    # Origin mode (no ingest_ts): the generator's watermarks are true promises, so nothing is late.
    options = GenerateOptions(origins=2, tuples=2_000, buffer_tuples=100, seed=5, ingest_ts=False)
    quiet = replay(tmp_path, spark, options)
    assert read_table(quiet.output, "late").num_rows == 0
    path = write_report(quiet.output, None, tmp_path / "report")
    page = Page(path.read_text(encoding="utf-8"))
    assert page.errors == []
    assert page.headings["h2"] == SECTIONS  # no checkpoint given: no checkpoint section
    assert "No late tuples in this version." in page.text
    assert not [figure for _, figure in page.images if "histogram" in figure.get("class", "")]
    assert f"Not validated yet — run replay validate {quiet.output}" in page.text
    assert "No integrity findings" in page.text
    # One batch: the timeline is still drawn (markers, a band one batch wide).
    (timeline,) = [attrs for attrs, figure in page.images if "timeline" in figure.get("class", "")]
    assert "over 1 micro-batch(es)" in timeline["alt"]
    image = png_of(timeline["src"]).convert("RGB")
    assert len(image.getcolors(maxcolors=1 << 20) or []) > 10


@pytest.mark.spark
def test_errors_name_what_is_missing(replayed: Replayed, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as nothing:
        write_report(tmp_path / "nowhere", None, tmp_path / "report")
    assert nothing.value.code == "output.no_version"
    with pytest.raises(ConfigError) as version:
        write_report(replayed.output, None, tmp_path / "report", version=9)
    assert version.value.code == "output.no_version"
    with pytest.raises(ConfigError) as checkpoint:
        write_report(replayed.output, tmp_path / "no-checkpoint", tmp_path / "report")
    assert checkpoint.value.code == "checkpoint.missing"
    assert not (tmp_path / "report" / "index.html").exists()


@pytest.mark.spark
@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no headless browser at {CHROMIUM}")
def test_the_page_renders_in_headless_chromium(report: tuple[Path, Page], tmp_path: Path) -> None:
    path, _ = report
    shot = tmp_path / "report.png"
    result = subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1280,3000",
            path.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert shot.exists(), result.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 3000)
    colours = image.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 1
    # Not a blank page or an error page: the background colour covers less than 90 % of it.
    assert max(n for n, _ in colours) < 0.9 * image.width * image.height


def hand_built_output(root: Path) -> Path:
    """A version written by hand, no Spark: two keys (one without any watermark), 14 origins over 3 batches,
    late rows under ``time_unit: ms`` whose lateness is 1.5 s or 3 s, and 250 gaps plus one regression."""
    start, second = 1_767_225_600_000, 1_000  # epoch milliseconds
    ts = pa.timestamp("us", tz="UTC")
    rows: list[tuple[Any, ...]] = []
    for key, batch, origin in [(k, b, o) for k in ("default", "ingest") for b in (1, 2, 3) for o in range(1, 15)]:
        local = None if key == "ingest" or (batch == 1 and origin == 14) else (start + batch * origin * second) * 1000
        counted = batch > 1 and key == "default"
        rows.append((batch, key, origin, local, (start + batch * second) * 1000 if counted else None))
    batch, wm_key, origin_id, local, global_ = map(list, zip(*rows, strict=True))
    (root / "data").mkdir(parents=True)
    progress = {"batch": batch, "wm_key": wm_key, "origin_id": origin_id, "local_watermark": pa.array(local, ts)}
    progress |= {name: pa.array(global_, ts) for name in ("global_watermark", "time_window_lower")}
    progress |= {"time_window_upper": pa.array(global_, ts)}
    pq.write_table(pa.table(progress), root / "data" / "progress.parquet")
    late_origins = [3, 3, 7, 12, 12, 12]
    pq.write_table(
        pa.table(
            {
                "wm_key": ["default"] * 6,
                "origin_id": late_origins,
                "sequence_number": [2] * 6,
                "chunk_number": [1] * 6,
                "ts_ms": [start + 5 * second - (1_500 if i % 2 else 3 * second) for i in range(6)],
                "violated_watermark": pa.array([(start + 5 * second) * 1000] * 6, ts),
                "reason": ["behind_origin_watermark", "behind_global_watermark"] * 3,
            }
        ),
        root / "data" / "late.parquet",
    )
    kinds = ["gap"] * 250 + ["regression"]
    pq.write_table(
        pa.table(
            {
                "kind": kinds,
                "origin_id": [1 + i % 14 for i in range(251)],
                "sequence_number": list(range(10, 261)),
                "detail": [None] * 250 + ["<b>held</b> at 00:00:01"],
            }
        ),
        root / "data" / "integrity.parquet",
    )
    tables = {t: (f"data/{t}.parquet",) for t in ("progress", "late", "integrity")}
    write_manifest(
        root,
        Manifest(
            kind="run",
            lateness="origin",
            tables=tables,
            watermarks=({"key": "default", "global": None, "participants": list(range(1, 15))},),
            counts={"tuples_read": 1000, "late": [6, 0]},
            config={
                "archive": "somewhere",
                "time_unit": "ms",
                "columns": {"event_time": "ts_ms"},
                "watermarks": None,
            },
        ),
    )
    return root


def test_a_hand_built_version_with_two_keys_many_origins_and_a_long_integrity_table(tmp_path: Path) -> None:
    output = hand_built_output(tmp_path / "out")
    page = Page(write_report(output, None, tmp_path / "report").read_text(encoding="utf-8"))
    assert page.errors == []
    timelines = [figure["data-key"] for _, figure in page.images if "timeline" in figure.get("class", "")]
    assert timelines == ["default", "ingest"]
    ingest = next(attrs["alt"] for attrs, figure in page.images if figure.get("data-key") == "ingest")
    assert "14 origin(s)" in ingest and "14 origin(s) without a watermark yet" in ingest
    # The event-time column comes through the column mapping, in epoch milliseconds (time_unit: ms).
    drawn = {int(f["data-origin"]): a["alt"] for a, f in page.images if "histogram" in f.get("class", "")}
    assert sorted(drawn) == [3, 7, 12]
    assert "origin 3, key default: 2 late tuple(s), lateness from 1.500 s to 3.000 s" in drawn[3]
    assert "origin 7, key default: 1 late tuple(s), lateness from 3.000 s to 3.000 s" in drawn[7]
    gaps = page.tables["integrity-gap"]
    assert len(body_rows(gaps)) == 200 and gaps[-1] == ["… 50 more"]
    assert page.tables["integrity-regression"][1][-1] == "<b>held</b> at 00:00:01"  # shown as text, escaped
    assert "gap 250" in page.text and "regression 1" in page.text and "14 origins (1 to 14)" in page.text


def test_importing_the_report_module_loads_no_plotting_or_templating() -> None:
    code = (
        "import sys, replay.quality.report; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'matplotlib', 'jinja2', 'pyspark', 'PIL'}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
