"""The batch pass's writer: one Spark action writes every table a micro-batch produces.

A micro-batch produces rows for several destinations with different columns: the due windows of
each window aggregation (the ``windows`` table), the windows it keeps open (one state directory
per aggregation) and the late tuples (the ``late`` table). ``replay.engine.pass_query`` unions
them into one frame whose ``_part`` column is the number of the row's destination, and
``replay.engine.aggregate`` runs ``sink(...)`` over it with ``mapInArrow``: each task writes its
rows of each part to one Parquet file of that part's directory (pyarrow, fsynced), and returns
one small row per file (part, file, rows, owned tuples, and how many of its rows hold each value
of ``_first`` when the frame has that column). Collecting those rows is the pass's only Spark
action.

A row goes to one destination, so the union's value columns are shared between destinations: a
``Part`` names the columns its values are in, and the values equal on every row of a part (a
window aggregation's name, an aggregation another one has) are not in the frame at all, only in the
``Part``. Every value column crosses from Spark to Python once per row, null or not, so a column
per value of each destination would cost about twice as much.

Task attempts write files of their own (the attempt number and a random token are in the
name); only the files the successful attempts return are kept (``keep_only``), so a retried
task never leaves a duplicate row behind. The function ``sink`` returns is pickled by value
and needs only pyarrow on the executors.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from replay.store.listing import LISTING, write_listing

__all__ = ["RESULT_SCHEMA", "Part", "Written", "keep_only", "sink", "storage_failure"]

RESULT_SCHEMA = "part string, file string, rows long, owned long, firsts string"


@dataclass(frozen=True, slots=True)
class Part:
    """One destination: its directory, the frame's columns it takes (``(source, name)``), the
    Arrow schema (IPC-serialized) its files are written with, the value of each of the
    schema's other columns on every row (``(name, value)``; ``None``: null), and the frame's
    column holding how many times each row is written (``None``: once). A row that stands for
    several equal ones (a late tuple that occurs more than once) is repeated by the writer: in
    Spark it would cost an array and an ``explode`` on every row of the frame."""

    directory: str
    columns: tuple[tuple[str, str], ...]
    schema: bytes
    constants: tuple[tuple[str, str | None], ...] = ()
    repeat: str | None = None


@dataclass(frozen=True, slots=True)
class Written:
    """One file a task wrote: its part, path, rows, the tuples its rows own (``_owned``) and, per
    value of ``_first``, how many of its rows hold it."""

    part: str
    file: str
    rows: int
    owned: int
    firsts: Mapping[int, int] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: Mapping[str, object]) -> Written:
        firsts = json.loads(str(row["firsts"])) if row["firsts"] else {}
        return cls(
            str(row["part"]),
            str(row["file"]),
            int(str(row["rows"])),
            int(str(row["owned"])),
            {int(k): int(v) for k, v in firsts.items()},
        )


def sink(
    parts: Mapping[str, Part], ids: Mapping[str, int]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function writing the rows whose ``_part`` is ``ids[name]`` to ``parts[name]``
    (a row whose ``_part`` is no part's is counted, not written)."""
    # Rows per row group: Spark hands the rows over in Arrow batches of 10,000 rows, and a row group
    # per batch made the files larger and slower to write and read.
    row_group = 262_144
    plan = {
        ids[name]: (name, p.directory, dict((out, src) for src, out in p.columns), p.schema, dict(p.constants))
        for name, p in parts.items()
    }
    repeats = {ids[name]: p.repeat for name, p in parts.items() if p.repeat is not None}

    def repeated(table: pa.Table, times: pa.ChunkedArray) -> pa.Table:
        """``table`` with each row ``times`` times (null: once), in order."""
        import pyarrow as pa
        import pyarrow.compute as pc

        counts = pc.fill_null(times, 1).cast(pa.int64()).combine_chunks()
        if pc.all(pc.equal(counts, 1)).as_py() is not False:
            return table
        # The parent index of each element of lists of those lengths: row i, ``counts[i]`` times.
        offsets = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(counts)])
        lists = pa.LargeListArray.from_arrays(offsets, pa.nulls(offsets[-1].as_py()))
        return table.take(pc.list_parent_indices(lists))

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import json
        import uuid

        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        context = TaskContext.get()
        task = f"{context.partitionId():05d}-{context.attemptNumber()}" if context else "00000-0"
        token = uuid.uuid4().hex[:12]
        schemas = {part: pa.ipc.read_schema(pa.py_buffer(raw)) for part, (_, _, _, raw, _) in plan.items()}
        writers: dict[str, tuple[pq.ParquetWriter, str]] = {}
        rows: dict[str, int] = {}
        owned: dict[str, int] = {}
        firsts: dict[str, dict[int, int]] = {}
        # A part's rows not written yet, as slices of Spark's batches: written a row group per
        # ``row_group`` rows, with no more than four row groups' worth held in all.
        pending: dict[int, list[pa.RecordBatch]] = {}
        held: dict[int, int] = {}

        def flush(part: int) -> None:
            slices = pending.pop(part, [])
            held.pop(part, None)
            if not slices:
                return
            chunk = pa.Table.from_batches(slices)
            if part in repeats:
                chunk = repeated(chunk, chunk.column(repeats[part]))
            name, directory, sources, _, constants = plan[part]
            schema = schemas[part]
            n = chunk.num_rows
            arrays = [
                chunk.column(sources[f.name])
                if f.name in sources
                else pa.nulls(n, f.type)
                if constants[f.name] is None
                else pa.repeat(pa.scalar(constants[f.name], f.type), n)
                for f in schema
            ]
            table = pa.Table.from_arrays(arrays, names=schema.names).cast(schema)
            if name not in writers:
                os.makedirs(directory, exist_ok=True)
                path = os.path.join(directory, f"part-{task}-{token}-{len(writers)}.parquet")
                # Dictionary-encode the strings only: trying it on every column (pyarrow's default)
                # took about twice as long on a pass's windows, whose numbers rarely repeat.
                strings = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
                writers[name] = (pq.ParquetWriter(path, schema, use_dictionary=strings), path)
            writers[name][0].write_table(table)
            rows[name] = rows.get(name, 0) + n
            if "_owned" in chunk.schema.names:
                owned[name] = owned.get(name, 0) + int(pc.sum(chunk.column("_owned")).as_py() or 0)
            if "_first" in chunk.schema.names:
                counted = firsts.setdefault(name, {})
                for item in pc.value_counts(chunk.column("_first").drop_null()).to_pylist():
                    counted[item["values"]] = counted.get(item["values"], 0) + item["counts"]

        for batch in batches:
            if batch.num_rows == 0:
                continue
            # One sort by part and a slice per part (a filter per part cost a copy of the batch per
            # part: a pass of 20 batches writes 40 parts and more).
            ordered = batch.take(pc.sort_indices(batch.column("_part")))
            runs = pc.run_end_encode(ordered.column("_part"))
            start = 0
            for end, part in zip(runs.run_ends.to_pylist(), runs.values.to_pylist(), strict=True):
                begin, start = start, end
                if part not in plan:
                    continue  # a branch that exists only to be counted (observed metrics)
                pending.setdefault(part, []).append(ordered.slice(begin, end - begin))
                held[part] = held.get(part, 0) + end - begin
                if held[part] >= row_group:
                    flush(part)
                elif sum(held.values()) >= 4 * row_group:  # many parts: a bounded number of rows held
                    for other in list(pending):
                        flush(other)
        for part in list(pending):
            flush(part)
        out: list[tuple[str, str, int, int, str | None]] = []
        for name, (writer, path) in writers.items():
            writer.close()
            descriptor = os.open(path, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            first = json.dumps(firsts[name]) if name in firsts else None
            out.append((name, path, rows[name], owned.get(name, 0), first))
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([o[0] for o in out], pa.string()),
                pa.array([o[1] for o in out], pa.string()),
                pa.array([o[2] for o in out], pa.int64()),
                pa.array([o[3] for o in out], pa.int64()),
                pa.array([o[4] for o in out], pa.string()),
            ],
            names=["part", "file", "rows", "owned", "firsts"],
        )

    return write


def keep_only(directories: Sequence[str], written: Sequence[Written]) -> None:
    """Delete the files in ``directories`` that no successful task attempt returned, and list the
    others in each directory's ``_files.json`` (``replay.store.listing``)."""
    keep = {os.path.abspath(w.file) for w in written}
    for directory in dict.fromkeys(directories):
        root = Path(directory)
        if not root.is_dir():
            continue
        kept = []
        for path in root.iterdir():
            if path.name == LISTING:
                continue
            if str(path.absolute()) in keep:
                kept.append(path.name)
            else:
                path.unlink()
        # Readers read the listed files only (a late attempt's file is never read); its rename
        # fsyncs the directory, whose entries are part of what a commit points to.
        write_listing(root, kept)


# How a Python ``OSError`` about a file reads at the end of a Spark task's traceback, as the driver
# gets it: ``OSError: [Errno 28] No space left on device: '/data/out/...parquet'``.
_TASK_OS_ERROR = re.compile(r"(?m)^\s*(?:\w+\.)*\w*Error: \[Errno (\d+)\] ([^\n]+?): '([^'\n]+)'\s*$")


def storage_failure(error: Exception) -> OSError | None:
    """The ``OSError`` about a file that failed a writing task (a full disk, no permission), as the
    driver's own ``OSError``, so that the command reports it as any other (``storage.io``); ``None``
    when ``error`` is another failure."""
    found = _TASK_OS_ERROR.findall(str(error))
    if not found:
        return None
    number, reason, path = found[-1]
    return OSError(int(number), reason, path)
