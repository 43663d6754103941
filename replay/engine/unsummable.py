"""Where a pass's sums failed, asked only after they did (``Locator``).

A window's exact float sum stops the job on a NaN, an infinity or a value of magnitude 2^63 or
more (``replay.engine.float_sum``). Spark's error names the column only; a user with one such
value among millions of rows needs its buffer. ``Locator.first`` reads the failed pass's rows
again, keeps the on-time tuples (the only ones a window sums) whose value in the column cannot
be summed, and returns the first of them by buffer identity with how many there are.

A window's sum beyond its exact type (a long's 2^63, a decimal's 38 digits) stops the job too, and
Spark's error does not say which sum it was. ``Locator.overflowing`` sums the pass's on-time
tuples per window again, one summed column at a time, and says which overflow.

Each is one more Spark job per question, on the error path only: the pass's query is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replay.core.config import Aggregation, JobConfig
from replay.engine.aggregations import summed_columns
from replay.engine.archive import ArchiveLayout
from replay.engine.float_sum import LIMIT, OVERFLOW
from replay.engine.passes import Reads
from replay.engine.rows import q
from replay.engine.windows import WindowColumns, partials

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Found", "Locator"]


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


@dataclass(frozen=True, slots=True)
class Locator:
    """The questions ``float_sum.failure`` asks of a failed pass: its rows (``rows.pass_rows``), the
    copies it read, the job and, per window aggregation (by its index in the job), its physical
    columns as the pass used them."""

    rows: DataFrame
    reads: Reads
    config: JobConfig
    layout: ArchiveLayout
    windows: Mapping[int, WindowColumns]

    def first(self, column: str) -> Found | None:
        """The first value of ``column`` that cannot be summed among the on-time tuples for the keys
        whose windows sum it; ``None`` when there is none (the failure came from elsewhere)."""
        from pyspark.sql import functions as F

        index = self.layout.key_index
        summing = {index[w.wm_key] for w in self.config.windows if column in summed_columns(w.aggregations)}
        if not summing:
            return None
        on_time = F.lit(False)
        for i in sorted(summing):
            on_time = on_time | F.col(f"_on{i}")
        value = q(column).cast("double")
        # ``F.abs(NaN) < LIMIT`` is false: Spark orders NaN above everything.
        bad = value.isNotNull() & ~(F.abs(value) < F.lit(LIMIT)) & on_time
        layout = self.layout
        identity = F.struct(
            q(layout.origin_id).cast("long").alias("o"),
            q(layout.sequence_number).cast("long").alias("s"),
            q(layout.chunk_number).cast("long").alias("c"),
            F.col("d_batch").alias("b"),
            value.cast("string").alias("v"),
        )
        (row,) = self.rows.where(bad).agg(F.min(identity).alias("first"), F.count(F.lit(1)).alias("n")).collect()
        if not row["n"]:
            return None
        found = row["first"]
        return _located(self.reads, found["o"], found["s"], found["c"], found["b"], found["v"], int(row["n"]))

    def overflowing(self) -> list[tuple[str, str]]:
        """The (window aggregation, column) pairs whose sum over the pass's on-time tuples, per
        window, does not fit its exact type: each summed once more on its own. Windows carried
        open from an earlier run are not among them: a sum that overflows only once merged with
        theirs is not found (an empty list)."""
        from pyspark.sql import functions as F

        found: list[tuple[str, str]] = []
        for s, spec in enumerate(self.config.windows):
            for column in summed_columns(spec.aggregations):
                alone = spec.model_copy(update={"aggregations": [Aggregation(fn="sum", column=column)]})
                on_time = F.col(f"_on{self.layout.key_index[spec.wm_key]}")
                try:
                    partials(self.rows, alone, self.windows[s], on_time=on_time).write.format("noop").mode(
                        "overwrite"
                    ).save()
                except Exception as error:
                    if not any(tag in str(error) for tag in OVERFLOW):
                        raise
                    found.append((spec.name, column))
        return found


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
