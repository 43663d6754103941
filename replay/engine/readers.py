"""Where files are read: in Spark tasks, or in the driver's threads.

``read_in_tasks`` runs one reading function over a list of files and collects the Arrow tables
it returns. A run reads in Spark tasks (``mapInArrow`` over the list, one file per task at a
time, pyarrow inside), so on a cluster the files are read by the executors and only what the
function returns reaches the driver. ``replay inspect`` with a local master reads in the
driver's threads instead (``driver_threads``: the executors would be the driver's own
machine) and starts no SparkSession at all; ``read_progress`` reports those reads file by file.
The metadata scan (``replay.engine.scan``) and the copies' content hashes
(``replay.engine.copies``) read through here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from replay.core.errors import ArchiveReadError, Location

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["driver_threads", "one_line", "read_in_tasks", "read_progress"]

_ERROR_MARK = "<<replay-scan>>"
# Tasks of a ``read_in_tasks`` job per core: a Python task costs tens of milliseconds before its
# first file, so one wave of tasks beats two (40 files' metadata: 0.49 s against 0.54 s with two
# per core, 0.61 s with three; medians of six, 2 cores).
_TASKS_PER_CORE = 1


def driver_threads(spark: SparkSession | None, master: str | None = None) -> int | None:
    """How many of the driver's threads ``replay inspect`` reads with: the cores of a local master
    (``local``, ``local[N]``, ``local[*]``, ``local[N, F]``: ``spark``'s, else ``master``),
    ``None`` for any other master (the reading runs in Spark tasks) or when neither is known."""
    if spark is not None:
        master = spark.sparkContext.master
    if master == "local":
        return 1
    if master is None or not (master.startswith("local[") and master.endswith("]")):
        return None  # another master, or ``local-cluster[...]`` (executors of their own)
    inside = master[len("local[") : -1].split(",")[0].strip()
    if inside == "*":
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        return max(1, int(inside))
    except ValueError:
        return None


class _Tally:
    """Files read out of files planned, over every ``read_in_tasks`` in a ``read_progress`` block."""

    def __init__(self, report: Callable[[int, int], None]) -> None:
        self.report = report
        self.done = 0
        self.planned = 0

    def plan(self, files: int) -> None:
        self.planned += files
        self.report(self.done, self.planned)

    def finished(self) -> None:
        self.done += 1
        self.report(self.done, self.planned)


_TALLY: ContextVar[_Tally | None] = ContextVar("replay_read_progress", default=None)


@contextmanager
def read_progress(report: Callable[[int, int], None] | None) -> Iterator[None]:
    """While the block runs, report (files read, files planned) of the reads in the driver's
    threads (``read_in_tasks`` with ``threads``), counted over every read in the block and called
    from the calling thread as each file finishes. Reads in Spark tasks report through
    ``replay.engine.spark.job_progress`` instead. No-op when ``report`` is ``None``."""
    if report is None:
        yield
        return
    token = _TALLY.set(_Tally(report))
    try:
        yield
    finally:
        _TALLY.reset(token)


def one_line(reason: str) -> str:
    """A reader's error (pyarrow's: "Couldn't deserialize thrift: ...\\nDeserializing page header
    failed.") on one printable line, without what Spark appends to it (its SQL state, the JVM's
    stack)."""
    kept = []
    for line in reason.splitlines():
        line = line.strip()
        if line.startswith(("SQLSTATE", "JVM stacktrace", "at ")):
            break
        if line:
            kept.append(line)
    text = " ".join(kept)  # and a control character a damaged page's bytes put in it, escaped
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def read_in_tasks(
    spark: SparkSession | None,
    tasks: Sequence[tuple[str, Any]],
    read: Callable[[str, Any], pa.Table],
    schema: pa.Schema,
    *,
    failure: str,
    shown: Mapping[str, str] | None = None,
    threads: int | None = None,
) -> pa.Table:
    """``read(path, work)`` of every task ``(path, work)``, their tables collected in ``schema``.

    With ``threads``, in that many of the driver's threads (``spark`` may then be ``None``); else in
    Spark tasks, one Spark job (one file per task at a time, pyarrow inside: on a cluster the
    executors read the files).

    Raises:
        ArchiveReadError: ``read`` failed on a file: "``failure``: the reason", naming the file
            (``shown``: the name to give a task's path, when it differs).
    """
    if not tasks:
        return schema.empty_table()
    plan = list(tasks)

    def failed(path: str, reason: str) -> ArchiveReadError:
        return ArchiveReadError(
            f"{failure}: {one_line(reason)}",
            where=Location(file=(shown or {}).get(path, path)),
            todo="restore the file from the archiver, or move it out of the archive directory; nothing was committed",
        )

    if threads is not None:
        from concurrent.futures import ThreadPoolExecutor, as_completed

        def one(task: tuple[str, Any]) -> pa.Table:
            try:
                return read(*task).cast(schema)
            except Exception as exc:
                raise failed(task[0], str(exc)) from None

        tally = _TALLY.get()
        with ThreadPoolExecutor(max_workers=min(threads, len(plan)), thread_name_prefix="replay-read") as pool:
            futures = [pool.submit(one, task) for task in plan]
            try:
                if tally is not None:
                    tally.plan(len(plan))
                    for _ in as_completed(futures):
                        tally.finished()
                # In the plan's order: the records do not depend on which thread finished first.
                return pa.concat_tables([future.result() for future in futures])
            except BaseException:
                for future in futures:  # a file that cannot be read ends the scan: read no more
                    future.cancel()
                raise
    assert spark is not None, "read_in_tasks: no session and no threads"

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column("id").to_pylist():
                path, work = plan[index]
                try:
                    table = read(path, work)
                except Exception as exc:  # named for the driver, which turns it into ArchiveReadError
                    raise RuntimeError(f"{_ERROR_MARK}{path}{_ERROR_MARK}{exc}") from exc
                yield from table.to_batches()

    from pyspark.sql.pandas.types import from_arrow_schema

    parallelism = max(1, min(len(plan), spark.sparkContext.defaultParallelism * _TASKS_PER_CORE))
    frame = spark.range(len(plan), numPartitions=parallelism)
    try:
        result = frame.mapInArrow(run, from_arrow_schema(schema)).toArrow()
    except Exception as exc:
        text = str(exc)
        if _ERROR_MARK not in text:
            raise
        _, path, reason = text.split(_ERROR_MARK, 2)
        raise failed(path, reason) from None
    return result.cast(schema)
