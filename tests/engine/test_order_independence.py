"""Origin mode depends only on the set of buffers: shuffling files, buffers and rows changes nothing."""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from replay.core.config import parse_config
from replay.engine.archive import inspect_schema, resolve_lateness
from replay.engine.buffers import scan_buffers
from replay.engine.inspection import track_progress
from replay.generate import generate_archive
from replay.generate_options import GenerateOptions

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("origin") / "archive"
    generate_archive(
        out,
        GenerateOptions(
            origins=3,
            tuples=900,
            buffer_tuples=20,
            keys=4,
            seed=3,
            gaps=2,
            duplicates=2,
            late_fraction=0.05,
            multi_chunk_fraction=0.4,
            files=2,
            ingest_ts=False,
            idle=1,
        ),
    )
    return out


def outcome(archive: Path, spark: Any) -> tuple[Any, ...]:
    config = parse_config({"archive": str(archive), "gap_policy": "skip"})
    layout = inspect_schema(config)
    scan = scan_buffers(spark, layout, config)
    snapshot, decisions = track_progress(config, layout, resolve_lateness(config, layout), scan.buffers, strict=True)
    buffers = sorted((b.identity, b.watermarks, b.tuples, b.content_hash) for b in scan.buffers)
    duplicates = sorted((d.origin, d.sequence, d.chunk, d.tuples) for d in scan.duplicates)
    return snapshot, sorted((d.origin, d.sequence, d.chunk, d.thresholds) for d in decisions), buffers, duplicates


def rewrite(source: Path, directory: Path, rnd: random.Random, files: int) -> None:
    """The same buffers (each copy's rows kept together), shuffled across and within files."""
    tables = [pq.read_table(p) for p in sorted(source.glob("*.parquet"))]
    table = pa.concat_tables(tables)
    names = ("origin_id", "sequence_number", "chunk_number")
    ids = list(zip(*(table.column(c).to_pylist() for c in names), strict=True))
    runs: list[list[int]] = []
    offset = 0
    for part in tables:  # a copy is a run of rows within one file
        start = offset
        for i in range(offset + 1, offset + part.num_rows + 1):
            if i == offset + part.num_rows or ids[i] != ids[start]:
                runs.append(list(range(start, i)))
                start = i
        offset += part.num_rows
    rnd.shuffle(runs)
    parts: list[list[int]] = [[] for _ in range(files)]
    for run in runs:
        rnd.shuffle(run)
        target = parts[rnd.randrange(files)]
        if target and ids[target[-1]] == ids[run[0]]:
            parts.append(target := [])  # copies apart: adjacent rows of one identity are one copy
        target.extend(run)
    for index, rows in enumerate(p for p in parts if p):
        pq.write_table(table.take(pa.array(rows, pa.int64())), directory / f"shuffled-{index}.parquet")


@settings(max_examples=4, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(st.randoms(use_true_random=False), st.integers(1, 4))
def test_shuffling_files_buffers_and_rows_changes_nothing(
    source: Path, spark: Any, rnd: random.Random, files: int
) -> None:
    root = Path(tempfile.mkdtemp(prefix="replay-shuffle-"))
    try:
        rewrite(source, root, rnd, files)
        assert outcome(root, spark) == outcome(source, spark)
    finally:
        shutil.rmtree(root)
