"""Reading a micro-batch's rows by their row ranges, when a batch needs a small part of its files.

The metadata scan knows where every copy it keeps lies: its file and its row range. A batch
whose buffers are spread over many files (an archiver that interleaves its origins, or small
batches of a large archive) needs only a fraction of the rows of the files it touches; Spark's
Parquet reader would read every row of them and drop the others in the join with the batch's
decisions. Here Spark tasks read each file with pyarrow, take exactly the kept copies' row ranges
and attach each copy's decision columns (``d_*``) to its rows, so no join is needed and a
discarded copy is never read. ``replay.engine.aggregate`` chooses this path when a batch needs less than
half of its files' rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from replay.core.paths import local_path

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["Slice", "file_rows", "read_slices"]

# One copy to read: (file, first row, row count, its d_* values in ``names`` order).
Slice = tuple[str, int, int, tuple[Any, ...]]

_ROWS: dict[tuple[str, int, int], int] = {}


def file_rows(path: str) -> int | None:
    """The number of rows of a local Parquet file (from its footer; cached by size and mtime)."""
    import os

    import pyarrow.parquet as pq

    local = local_path(path)
    if local is None:
        return None
    st = os.stat(local)
    key = (local, st.st_size, st.st_mtime_ns)
    if key not in _ROWS:
        _ROWS[key] = pq.read_metadata(local).num_rows
    return _ROWS[key]


def _reader(
    tasks: Sequence[tuple[str, Sequence[tuple[int, int, tuple[Any, ...]]]]], schema: bytes, names: Sequence[str]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    plan = list(tasks)
    decision_names = list(names)

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        target = pa.ipc.read_schema(pa.py_buffer(schema))
        archive_fields = [f for f in target if f.name not in decision_names]
        for batch in batches:
            for index in batch.column("id").to_pylist():
                path, copies = plan[index]
                parquet = pq.ParquetFile(path)
                present = set(parquet.schema_arrow.names)
                table = parquet.read(columns=[f.name for f in archive_fields if f.name in present])
                for row_start, rows, values in copies:
                    part = table.slice(row_start, rows)
                    arrays = []
                    for f in archive_fields:
                        if f.name in present:
                            column = part.column(f.name)
                            if pa.types.is_timestamp(column.type) and pa.types.is_integer(f.type):
                                column = column.cast(pa.int64())  # nanoseconds, read as int64
                            arrays.append(column.cast(f.type))
                        else:
                            arrays.append(pa.nulls(rows, f.type))
                    for name, value in zip(decision_names, values, strict=True):
                        arrays.append(pa.repeat(pa.scalar(value, target.field(name).type), rows))
                    yield from pa.Table.from_arrays(arrays, schema=target).to_batches()

    return read


def read_slices(spark: SparkSession, slices: Sequence[Slice], archive: StructType, decisions: StructType) -> DataFrame:
    """The rows of ``slices`` with the archive's columns (``archive``, the Spark schema of the files)
    followed by the decision columns (``decisions``), read in Spark tasks (one file per task)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    by_file: dict[str, list[tuple[int, int, tuple[Any, ...]]]] = {}
    for path, row_start, rows, values in slices:
        by_file.setdefault(path, []).append((row_start, rows, values))
    tasks = [(local_path(path) or path, copies) for path, copies in sorted(by_file.items())]
    schema = StructType(list(archive.fields) + list(decisions.fields))
    arrow = to_arrow_schema(schema, timezone="UTC")
    names = [f.name for f in decisions.fields]
    parallelism = max(1, min(len(tasks), spark.sparkContext.defaultParallelism * 2))
    return spark.range(len(tasks), numPartitions=parallelism).mapInArrow(
        _reader(tasks, bytes(arrow.serialize()), names), schema
    )
