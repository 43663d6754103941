"""``replay status`` and the run summary report each window stage's output watermark,
``min(E_k, end of the oldest open window - 1 ms)``: no window before it is still to come."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from replay.core.config import parse_config
from replay.core.rules import RULES_VERSION
from replay.core.timeutil import format_ts, parse_timestamp
from replay.runner.loop import run
from replay.store.status import checkpoint_status
from tests._archives import buffer_rows, write_archive

pytestmark = pytest.mark.spark

T0 = parse_timestamp("2026-01-01T00:00:00Z")
MS = 1_000
SECOND = 1_000_000


@pytest.mark.parametrize(
    ("watermark", "events", "expected"),
    [
        # The window [0 s, 1 s) stays open: E_k is 500 us short of its end, so its end - 1 ms is the lower.
        (T0 + SECOND - MS // 2, [(T0 + 200 * MS, 1, 1.0)], T0 + SECOND - MS),
        # The window [1 s, 2 s) stays open, far ahead of E_k: E_k is the lower.
        (T0 + 1300 * MS, [(T0 + 200 * MS, 1, 1.0), (T0 + 1500 * MS, 2, 2.0)], T0 + 1300 * MS),
        # No window is open: E_k.
        (T0 + 3 * SECOND, [(T0 + 200 * MS, 1, 1.0)], T0 + 3 * SECOND),
    ],
)
def test_the_output_watermark_is_e_k_or_just_before_the_oldest_open_window(
    spark: Any, tmp_path: Path, watermark: int, events: list[tuple[int, int, float]], expected: int
) -> None:
    write_archive(tmp_path / "archive", buffer_rows(1, 1, watermark=watermark, events=events))
    config = parse_config(
        {
            "archive": str(tmp_path / "archive"),
            "output": str(tmp_path / "out"),
            "checkpoint": str(tmp_path / "ckpt"),
            "windows": [
                {"name": "tumbling", "size": "1s", "aggregations": [{"fn": "count"}]},
                {"name": "sliding", "kind": "sliding", "size": "2s", "slide": "1s", "aggregations": [{"fn": "count"}]},
            ],
        }
    )
    summary = run(config, spark=spark)
    status = checkpoint_status(tmp_path / "ckpt")
    assert status["rules"] == RULES_VERSION
    assert status["keys"][0]["effective"] == format_ts(watermark)
    # The sliding windows [-1 s, 1 s) and [0 s, 2 s) hold the first event; the oldest open one ends
    # at 1 s when it is open (E_k below 1 s), else the one ending at 2 s, if E_k is below that.
    sliding = min(watermark, T0 + (SECOND if watermark < T0 + SECOND else 2 * SECOND) - MS)
    if watermark >= T0 + 2 * SECOND:
        sliding = watermark
    assert summary.output_watermarks == {"tumbling": expected, "sliding": sliding}
    assert status["output_watermarks"] == {"tumbling": format_ts(expected), "sliding": format_ts(sliding)}
