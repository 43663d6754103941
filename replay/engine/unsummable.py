"""Where a value that cannot be summed sits, asked only after a pass failed on one.

A window's exact float sum stops the job on a NaN, an infinity or a value of magnitude 2^63 or
more (``replay.engine.float_sum``). Spark's error names the column only; a user with one such
value among millions of rows needs its buffer. ``first`` reads the failed pass's rows again,
keeps the on-time tuples (the only ones a window sums) whose value in the column cannot be
summed, and returns the first of them by buffer identity with how many there are: one more Spark
job, on the error path only. The hot path is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replay.core.config import JobConfig
from replay.engine.archive import ArchiveLayout
from replay.engine.float_sum import LIMIT
from replay.engine.passes import Reads
from replay.engine.rows import q

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Found", "first"]


@dataclass(frozen=True, slots=True)
class Found:
    """The first value of a column that cannot be summed, by (origin, sequence, chunk), among a
    pass's on-time tuples: its buffer's copy (file and row range, as the scan recorded them), the
    batch that decided it (``None``: a copy carried from an earlier run for its open windows),
    the value as text, and how many such values the pass holds."""

    file: str
    origin: int
    sequence: int
    chunk: int
    rows: tuple[int, int]
    batch: int | None
    value: str
    count: int

    def extra(self) -> Mapping[str, object]:
        """What an error's ``Location`` says beyond the file and the identity: the copy's rows in
        its file, the batch and the value."""
        said: dict[str, object] = {"rows": f"{self.rows[0]} to {self.rows[1]}"}
        if self.batch is not None:
            said["batch"] = self.batch
        said["value"] = self.value
        return said


def first(rows: DataFrame, reads: Reads, config: JobConfig, layout: ArchiveLayout, column: str) -> Found | None:
    """The first value of ``column`` that cannot be summed among the on-time tuples of ``rows`` (a
    pass's rows, ``replay.engine.rows.pass_rows``) for the keys whose windows sum it; ``None``
    when there is none (the failure came from elsewhere)."""
    from pyspark.sql import functions as F

    keys = {k.name: i for i, k in enumerate(layout.keys)}
    summing = {
        keys[w.wm_key] for w in config.windows for a in w.aggregations if a.fn in ("sum", "mean") and a.column == column
    }
    if not summing:
        return None
    on_time = F.lit(False)
    for i in sorted(summing):
        on_time = on_time | F.col(f"_on{i}")
    value = q(column).cast("double")
    # ``F.abs(NaN) < LIMIT`` is false: Spark orders NaN above everything.
    bad = value.isNotNull() & ~(F.abs(value) < F.lit(LIMIT)) & on_time
    identity = F.struct(
        q(layout.origin_id).cast("long").alias("o"),
        q(layout.sequence_number).cast("long").alias("s"),
        q(layout.chunk_number).cast("long").alias("c"),
        F.col("d_batch").alias("b"),
        value.cast("string").alias("v"),
    )
    (row,) = rows.where(bad).agg(F.min(identity).alias("first"), F.count(F.lit(1)).alias("n")).collect()
    if not row["n"]:
        return None
    found = row["first"]
    return _located(reads, found["o"], found["s"], found["c"], found["b"], found["v"], int(row["n"]))


def _located(reads: Reads, origin: int, sequence: int, chunk: int, batch: int, value: str, count: int) -> Found | None:
    """``Found`` for the copy of (``origin``, ``sequence``, ``chunk``) the pass read for ``batch``."""
    import numpy as np

    match = (
        (reads.column("origin") == origin)
        & (reads.column("sequence") == sequence)
        & (reads.column("chunk") == chunk)
        & (reads.batches == batch)
    )
    at = np.flatnonzero(match)
    if not len(at):
        return None
    buf = reads.buffers[int(at[0])]
    return Found(
        file=buf.file,
        origin=origin,
        sequence=sequence,
        chunk=chunk,
        rows=(buf.row_start, buf.row_start + buf.rows - 1),
        batch=batch if batch > 0 else None,
        value=value,
        count=count,
    )
