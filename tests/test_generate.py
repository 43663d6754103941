"""Tests of ``replay.generate``: the synthetic archive keeps the promises docs/archive.md and docs/semantics.md make."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replay.generate import generate_archive
from replay.generate_options import DEFAULT_START, GenerateOptions, GenerateSummary

META = ("last_chunk", "watermark_ts", "ingest_ts", "idle")
Ident = tuple[int, int, int]


def gen(tmp_path: Path, name: str = "a", **kw: Any) -> tuple[GenerateSummary, Path]:
    out = tmp_path / name
    return generate_archive(out, GenerateOptions(**kw)), out


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Every row in file order, timestamps as int microseconds, plus ``file`` (index) and ``row`` (position)."""
    rows: list[dict[str, Any]] = []
    for i, f in enumerate(sorted(path.glob("*.parquet"))):
        t = pq.read_table(f)
        cols = {
            n: (c.cast(pa.int64()) if pa.types.is_timestamp(c.type) else c).to_pylist()
            for n, c in zip(t.column_names, t.columns, strict=True)
        }
        for r, vals in enumerate(zip(*cols.values(), strict=True)):
            rows.append({**dict(zip(cols, vals, strict=True)), "file": i, "row": r})
    return rows


def ident(row: dict[str, Any]) -> Ident:
    return row["origin_id"], row["sequence_number"], row["chunk_number"]


def copies(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Maximal runs of consecutive rows of one buffer identity within one file (docs/archive.md)."""
    runs: list[list[dict[str, Any]]] = []
    for r in rows:
        if runs and runs[-1][-1]["file"] == r["file"] and ident(runs[-1][-1]) == ident(r):
            runs[-1].append(r)
        else:
            runs.append([r])
    return runs


def buffers(rows: list[dict[str, Any]]) -> dict[Ident, list[dict[str, Any]]]:
    """One copy (the first in file order) per identity."""
    out: dict[Ident, list[dict[str, Any]]] = {}
    for run in copies(rows):
        out.setdefault(ident(run[0]), run)
    return out


def sequences(rows: list[dict[str, Any]]) -> dict[int, dict[int, list[list[dict[str, Any]]]]]:
    """origin -> sequence -> its chunks (one copy each)."""
    seqs: dict[int, dict[int, list[list[dict[str, Any]]]]] = defaultdict(lambda: defaultdict(list))
    for (o, s, _), run in sorted(buffers(rows).items()):
        seqs[o][s].append(run)
    return seqs


def content(run: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(tuple((k, v) for k, v in r.items() if k not in ("file", "row", "ingest_ts")) for r in run)


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    kw = dict(tuples=3000, files=2, gaps=2, duplicates=2, conflicts=1, late_fraction=0.05, multi_chunk_fraction=0.3)
    _, a = gen(tmp_path, "a", **kw)
    _, b = gen(tmp_path, "b", **kw)
    _, c = gen(tmp_path, "c", seed=1, **kw)
    names = [p.name for p in sorted(a.glob("*"))]
    assert names == ["part-00000.parquet", "part-00001.parquet"]
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)
    assert all((a / n).read_bytes() != (c / n).read_bytes() for n in names)


@pytest.mark.parametrize(
    ("kw", "has_wm", "has_ingest", "key_type"),
    [
        ({}, True, True, pa.int64()),
        ({"ingest_ts": False}, True, False, pa.int64()),
        ({"watermarks": False}, False, True, pa.int64()),
        ({"key_type": "string", "ingest_ts": False, "watermarks": False}, False, False, pa.string()),
    ],
)
def test_columns_and_types(
    tmp_path: Path, kw: dict[str, Any], has_wm: bool, has_ingest: bool, key_type: pa.DataType
) -> None:
    _, out = gen(tmp_path, tuples=500, **kw)
    ts = pa.timestamp("us", tz="UTC")
    expected = [
        ("origin_id", pa.int64()),
        ("sequence_number", pa.int64()),
        ("chunk_number", pa.int32()),
        ("last_chunk", pa.bool_()),
    ]
    expected += [("watermark_ts", ts)] * has_wm + [("ingest_ts", ts)] * has_ingest
    expected += [("idle", pa.bool_()), ("event_time", ts), ("key", key_type), ("value", pa.float64())]
    schema = pq.read_schema(out / "part-00000.parquet")
    assert [(f.name, f.type) for f in schema] == expected
    rows = read_rows(out)
    assert all(r["key"] is not None and r["event_time"] is not None for r in rows)
    assert 0 < sum(r["value"] is None for r in rows) < len(rows) * 0.05


@pytest.mark.parametrize("chunk_base", [0, 1])
def test_chunks_numbered_without_holes_and_one_last_chunk(tmp_path: Path, chunk_base: int) -> None:
    _, out = gen(tmp_path, tuples=8000, multi_chunk_fraction=0.6, chunk_base=chunk_base, duplicates=2, files=2)
    rows = read_rows(out)
    for run in copies(rows):
        assert len({tuple(r[m] for m in META) for r in run}) == 1, "one buffer, one set of metadata"
    counts = []
    for seqs in sequences(rows).values():
        assert sorted(seqs) == list(range(1, len(seqs) + 1))
        for chunks in seqs.values():
            numbers = sorted(c[0]["chunk_number"] for c in chunks)
            assert numbers == list(range(chunk_base, chunk_base + len(chunks)))
            last = [c[0]["chunk_number"] for c in chunks if c[0]["last_chunk"]]
            assert last == [numbers[-1]]
            assert all(len(c) >= 1 for c in chunks)
            counts.append(len(chunks))
    assert {1, 2, 3} <= set(counts)


def test_gaps_are_missing_and_nothing_else(tmp_path: Path) -> None:
    summary, out = gen(tmp_path, origins=3, tuples=6000, buffer_tuples=100, gaps=5)
    assert len(summary.gaps) == 5
    seqs = sequences(read_rows(out))
    for origin in (1, 2, 3):
        present = set(seqs[origin])
        missing = {s for o, s in summary.gaps if o == origin}
        assert present | missing == set(range(1, 21)) and not present & missing
        assert 1 not in missing and 20 not in missing


@pytest.mark.parametrize(("files", "ingest_ts"), [(1, True), (1, False), (3, True)])
def test_duplicates_identical_conflicts_different(tmp_path: Path, files: int, ingest_ts: bool) -> None:
    summary, out = gen(
        tmp_path, tuples=4000, files=files, ingest_ts=ingest_ts, duplicates=3, conflicts=2, multi_chunk_fraction=0.5
    )
    assert len(summary.duplicates) == 3 and len(summary.conflicts) == 2
    by_ident: dict[Ident, list[list[dict[str, Any]]]] = defaultdict(list)
    for run in copies(read_rows(out)):
        by_ident[ident(run[0])].append(run)
    twice = {i for i, runs in by_ident.items() if len(runs) > 1}
    assert twice == set(summary.duplicates) | set(summary.conflicts)
    assert all(len(runs) <= 2 for runs in by_ident.values())
    for i in twice:
        first, second = sorted(by_ident[i], key=lambda run: (run[0].get("ingest_ts", 0), run[0]["file"], run[0]["row"]))
        assert (content(first) == content(second)) == (i in summary.duplicates)
        assert len(first) == len(second)
        if ingest_ts:
            assert second[0]["ingest_ts"] > first[0]["ingest_ts"]
        if files > 1:
            assert first[0]["file"] != second[0]["file"]


def test_copies_never_adjacent_to_their_original_in_a_tiny_archive(tmp_path: Path) -> None:
    summary, out = gen(tmp_path, origins=1, tuples=300, buffer_tuples=100, duplicates=2, conflicts=1)
    runs = copies(read_rows(out))
    assert len(runs) == 6 and summary.buffers == 3
    assert all(ident(a[0]) != ident(b[0]) for a, b in itertools.pairwise(runs))


def test_watermarks_are_true_promises(tmp_path: Path) -> None:
    _, out = gen(tmp_path, origins=3, tuples=9000, multi_chunk_fraction=0.7, gaps=3, duplicates=2, files=2)
    differ = last_not_max = 0
    for seqs in sequences(read_rows(out)).values():
        promised = None
        for s in sorted(seqs):
            chunks = sorted(seqs[s], key=lambda c: c[0]["chunk_number"])
            wms = [c[0]["watermark_ts"] for c in chunks]
            events = [r["event_time"] for c in chunks for r in c]
            if promised is not None:
                assert min(events) >= promised, f"sequence {s} has a tuple behind an earlier watermark"
                assert max(wms) >= promised, f"sequence {s} watermark regresses"
            promised = max(wms)
            differ += len(set(wms)) > 1
            last_not_max += wms[-1] < max(wms)
    assert differ and last_not_max


@pytest.mark.parametrize("watermarks", [True, False])
def test_late_fraction(tmp_path: Path, watermarks: bool) -> None:
    summary, out = gen(
        tmp_path, origins=4, tuples=20_000, late_fraction=0.1, gaps=4, watermarks=watermarks, multi_chunk_fraction=0.3
    )
    assert abs(summary.late_tuples / summary.tuples - 0.1) < 0.02
    behind_wm = behind_event = 0
    for seqs in sequences(read_rows(out)).values():
        wm = event_wm = None
        for s in sorted(seqs):
            events = [r["event_time"] for c in seqs[s] for r in c]
            if wm is not None or event_wm is not None:
                behind_wm += sum(e < wm for e in events) if watermarks else 0
                # Jitter alone puts tuples up to `disorder` (2 s) behind an event-time watermark; late ones >= 1 min.
                behind_event += sum(e < event_wm - 2_000_000 for e in events)
            if watermarks:
                wm = max(c[0]["watermark_ts"] for c in seqs[s])
            event_wm = max(event_wm or events[0], *events)
    if watermarks:
        assert behind_wm == summary.late_tuples
    assert behind_event == summary.late_tuples


def test_idle_origins_end_with_a_punctuation_buffer(tmp_path: Path) -> None:
    summary, out = gen(tmp_path, origins=4, tuples=8000, idle=2, chunk_base=0, multi_chunk_fraction=0.4)
    assert summary.idle_origins == (3, 4)
    rows = read_rows(out)
    seqs = sequences(rows)
    for origin, by_seq in seqs.items():
        last = max(by_seq)
        idle_rows = [r for r in rows if r["origin_id"] == origin and r["idle"]]
        tuples = sum(len(c) for s, chunks in by_seq.items() for c in chunks if s != last or origin < 3)
        if origin < 3:
            assert not idle_rows and tuples == 2000
            continue
        assert tuples == 1000
        (chunk,) = by_seq[last]
        (p,) = chunk
        assert p["idle"] and p["last_chunk"] and p["chunk_number"] == 0 and idle_rows == [p]
        assert p["event_time"] is None and p["key"] is None and p["value"] is None
        assert p["watermark_ts"] == max(c[0]["watermark_ts"] for c in by_seq[last - 1])
        assert p["ingest_ts"] > max(r["ingest_ts"] for r in rows if r["origin_id"] == origin and not r["idle"])


def test_files_interleave_origins_and_keep_buffers_whole(tmp_path: Path) -> None:
    summary, out = gen(tmp_path, origins=4, tuples=8000, files=4, multi_chunk_fraction=0.5, duplicates=2)
    assert sorted(p.name for p in out.iterdir()) == [f"part-0000{i}.parquet" for i in range(4)]
    rows = read_rows(out)
    for f in range(4):
        assert len({r["origin_id"] for r in rows if r["file"] == f}) >= 3
    assert len(copies(rows)) == summary.buffers + 2, "each copy of a buffer is one contiguous run"


def test_arrival_order_is_not_sequence_order(tmp_path: Path) -> None:
    _, out = gen(tmp_path, origins=3, tuples=6000, multi_chunk_fraction=0.5)
    arrivals = sorted((run[0]["ingest_ts"], ident(run[0])) for run in copies(read_rows(out)))
    seen: dict[int, tuple[int, int]] = {}
    overtaken = 0
    for _, (o, s, c) in arrivals:
        overtaken += (s, c) < seen.get(o, (0, 0))
        seen[o] = max(seen.get(o, (0, 0)), (s, c))
    assert overtaken > 0
    assert len({o for _, (o, _, _) in arrivals[:50]}) == 3, "origins interleave"


def test_summary_counts_and_progress(tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    opts = GenerateOptions(tuples=5000, files=2, gaps=2, duplicates=1, conflicts=1, idle=1, late_fraction=0.02)
    summary = generate_archive(tmp_path / "a", opts, progress=lambda d, t: calls.append((d, t)))
    rows = read_rows(tmp_path / "a")
    assert summary.rows == len(rows) == calls[-1][0] == calls[-1][1]
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert summary.buffers == len(buffers(rows))
    assert summary.tuples == sum(1 for run in buffers(rows).values() for r in run if r["event_time"] is not None)
    assert summary.path == str(tmp_path / "a") and summary.files == 2
    assert min(r["event_time"] for r in rows if r["event_time"] is not None) >= DEFAULT_START - 10 * 60 * 10**6
    assert all(v * 64 == int(v * 64) for r in rows if (v := r["value"]) is not None)
    assert summary.to_dict()["gaps"] == [list(g) for g in summary.gaps]


@pytest.mark.parametrize(
    ("kw", "option"),
    [
        ({"origins": 0}, "origins"),
        ({"tuples": 3}, "tuples"),
        ({"buffer_tuples": 0}, "buffer_tuples"),
        ({"keys": 0}, "keys"),
        ({"seed": -1}, "seed"),
        ({"gaps": 1000}, "gaps"),
        ({"gaps": -1}, "gaps"),
        ({"duplicates": 10_000}, "duplicates"),
        ({"conflicts": 10_000}, "conflicts"),
        ({"late_fraction": 1.0}, "late_fraction"),
        ({"late_fraction": float("nan")}, "late_fraction"),
        ({"multi_chunk_fraction": 1.5}, "multi_chunk_fraction"),
        ({"files": 0}, "files"),
        ({"files": 1000}, "files"),
        ({"idle": 5}, "idle"),
        ({"chunk_base": 2}, "chunk_base"),
        ({"key_type": "float"}, "key_type"),
        ({"start": 2**62}, "start"),
        ({"tuple_interval": 0}, "tuple_interval"),
        ({"disorder": -1}, "disorder"),
        ({"origins": 2.5}, "origins"),
        ({"tuples": True}, "tuples"),
        ({"ingest_ts": "yes"}, "ingest_ts"),
    ],
)
def test_invalid_options_name_the_option(kw: dict[str, Any], option: str) -> None:
    with pytest.raises(ValueError, match=rf"^{option} "):
        GenerateOptions(**kw)


def test_refuses_a_directory_with_parquet_files(tmp_path: Path) -> None:
    gen(tmp_path, "a", tuples=200)
    with pytest.raises(ValueError, match="already holds Parquet files"):
        gen(tmp_path, "a", tuples=200)
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        gen(tmp_path, "f", tuples=200)
