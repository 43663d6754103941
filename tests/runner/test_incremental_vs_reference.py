"""Incremental ``replay run``s against ``replay.reference.model``, run after run.

Hypothesis draws the archives of ``tests/engine/test_vs_reference.py`` (chunks out of order, gaps,
idle markers, duplicates, conflicts, regressions, disorder, re-delivered copies with earlier or
later ingest times) and a window job, splits some files in two between buffers, and cuts the
files into two or three runs: the files of each run are written just before it, as an archiver
delivers them between scheduled replays. After every run the published ``windows`` and ``late``
tables and the open windows must be the model's for the files so far, told which files each
earlier run read (a buffer belongs to the first run that finds it; a copy a later run finds is
compared with the one already consumed, even where it would have come first in one run over every
file). A run that fails must fail as the model does over the same files, with the same error.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import Phase, assume, event, given, settings
from hypothesis import strategies as st

from replay.core.config import parse_config
from replay.core.errors import ReplayError
from replay.runner.loop import run
from tests._archives import write_archive
from tests.engine.test_vs_reference import archives
from tests.runner.test_job_vs_reference import job_view, reference_view, same_windows, window_jobs

pytestmark = pytest.mark.spark

Drawn = tuple[list[list[dict[str, Any]]], dict[str, Any], dict[str, pa.DataType]]


def _identity(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["origin_id"], row["sequence_number"], row["chunk_number"])


def _split(rows: list[dict[str, Any]], data: st.DataObject) -> list[list[dict[str, Any]]]:
    """``rows`` as one file, or as two cut between two buffers (never inside one: its rows in two
    files would be two copies of it), so that more archives spread over three runs."""
    cuts = [i for i in range(1, len(rows)) if _identity(rows[i]) != _identity(rows[i - 1])]
    at = data.draw(st.sampled_from([None, *cuts]), label="split")
    return [rows] if at is None else [rows[:at], rows[at:]]


@settings(
    max_examples=int(os.environ.get("REPLAY_DEEP_EXAMPLES", "10")),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    deadline=None,
)
@given(archives(), window_jobs(), st.data())
def test_incremental_runs_equal_the_reference_after_each_run(
    spark: Any, drawn: Drawn, jobs: dict[str, Any], data: st.DataObject
) -> None:
    files, job, types = drawn
    files = [part for rows in files for part in _split(rows, data)]
    assume(len(files) >= 2)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(files) - 1), min_size=1, max_size=2), label="cuts"))
    runs = [files[a:b] for a, b in zip([0, *cuts], [*cuts, len(files)], strict=True)]
    root = Path(tempfile.mkdtemp(prefix="replay-incremental-"))
    try:
        config = parse_config({"archive": str(root / "archive"), "output": str(root / "out")} | job | jobs)
        read: list[list[Path]] = []
        written = 0
        for number, delivered in enumerate(runs):
            paths = []
            for rows in delivered:
                paths.append(write_archive(root / "archive", rows, name=f"part-{written:05d}.parquet", types=types))
                written += 1
            try:
                expected = reference_view(config, read)
            except ReplayError as error:
                event(f"run {number + 1} of {len(runs)}: {type(error).__name__}")
                with pytest.raises(ReplayError) as raised:
                    run(config, spark=spark)
                found = (type(raised.value), raised.value.origin, raised.value.sequence)
                assert found == (type(error), error.origin, error.sequence)
                return
            actual = job_view(config, spark)
            same_windows(actual["windows"], expected["windows"])
            assert actual["late_columns"] == expected["late_columns"]
            assert actual["late"] == expected["late"], f"run {number + 1}"
            assert actual["open"] == expected["open"], f"run {number + 1}"
            read.append(paths)
        event(f"{len(runs)} runs, windows emitted: {min(len(expected['windows']), 3)}+")
    finally:
        shutil.rmtree(root)
