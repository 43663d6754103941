"""A pass's rows: the archive rows of the copies it reads (every time column a timestamp at
microseconds, whatever its role), each with its copy's decision (``d_*``
columns: the batch that decided it, its thresholds and reasons per key, its weight in the copy
checksum), its event times in microseconds (``_ev<k>``) and per key whether it is late, on time
or outside a backfill range (``_late<k>``, ``_on<k>``, ``_out<k>``; ``_tuple``: not a punctuation
row). ``late_rows`` makes a late tuple's row of the ``late`` table from them.

When the pass needs less than half of the rows of the files it touches, Spark tasks read
exactly its copies' row ranges with the decisions attached (``replay.engine.slices``);
otherwise Spark's Parquet reader reads the files and the copies join the rows by identity (a
buffer with discarded copies also by file, and by row range when a copy shares its file).
Either way a discarded duplicate copy is never read as data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from replay.engine.archive import ArchiveLayout
from replay.engine.archive_rows import read_parquet, time_micros, time_value
from replay.engine.buffers import release_arrow_memory
from replay.engine.passes import PassWork, Reads
from replay.engine.routing import Value, fields_of
from replay.engine.slices import Slice, file_rows, read_slices

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["late_reason", "late_rows", "late_values", "pass_rows", "q", "reason_codes", "reported_path"]


def _packing(reads: Reads) -> tuple[int, int, int] | None:
    """Bit widths ``(origin, sequence, chunk)`` that pack every read copy's identity into one
    non-negative long (``origin << (s + c) | sequence << c | chunk``), or ``None`` when they do
    not fit in 63 bits. Spark joins on one long key (a ``LongHashedRelation``) faster than on
    three columns."""
    if not len(reads):
        return None
    columns = [reads.column(name) for name in ("origin", "sequence", "chunk")]
    if min(int(c.min()) for c in columns) < 0:
        return None
    origin, sequence, chunk = (int(c.max()).bit_length() for c in columns)
    if origin + sequence + chunk > 63:
        return None
    return origin, sequence, chunk


def _pack(origin: Any, sequence: Any, chunk: Any, bits: tuple[int, int, int]) -> Any:
    """A copy's identity packed with the widths of ``_packing`` (the decision table's ``d_id``):
    of integers, or element-wise of int64 arrays (the widths keep every value below 2**63)."""
    _, s_bits, c_bits = bits
    return (origin << (s_bits + c_bits)) | (sequence << c_bits) | chunk


def _packed(origin: Column, sequence: Column, chunk: Column, bits: tuple[int, int, int]) -> Column:
    """``_pack`` as a Spark expression over a row's identity columns; -1 for a row whose identity
    lies outside the bit widths or is null (it matches no copy of the pass, whose identities all
    fit and pack to non-negative longs). Not null: Spark would otherwise filter the rows on the key
    not being null, computing it twice per row."""
    from pyspark.sql import functions as F

    o_bits, s_bits, c_bits = bits
    o, s, c = origin.cast("long"), sequence.cast("long"), chunk.cast("long")
    # Each component is in [0, 2**width) exactly when shifting it right by its width leaves 0 (a
    # negative one leaves -1).
    outside = F.shiftright(o, o_bits).bitwiseOR(F.shiftright(s, s_bits)).bitwiseOR(F.shiftright(c, c_bits))
    packed = F.shiftleft(o, s_bits + c_bits).bitwiseOR(F.shiftleft(s, c_bits)).bitwiseOR(c)
    return F.coalesce(F.when(outside == 0, packed), F.lit(-1).cast("long"))  # not nullable, to Spark too


def _decision_frame(
    spark: SparkSession,
    reads: Reads,
    work: PassWork,
    spark_paths: Mapping[str, str],
    nkeys: int,
    bits: tuple[int, int, int] | None,
    levels: npt.NDArray[np.int32],
) -> DataFrame:
    """One row per copy read, built as an Arrow table from the reads' arrays (no Python object per
    copy, except a file name where the join needs it), with the columns
    the join uses only: with ``bits`` (``_packing``), its packed identity, else its identity's
    three columns; where any copy's check level (``levels``, see ``PassWork.check_level``) is 1
    or more, the file of each copy checked by file (null for the others), and its row range where
    one is 2."""
    import numpy as np
    import pyarrow as pa

    level = int(levels.max(initial=0))
    origin, sequence, chunk = (reads.column(name) for name in ("origin", "sequence", "chunk"))
    columns: dict[str, pa.Array] = {}
    if level >= 1:
        # Only a copy checked by file needs its file: the others' is null. The decision table is
        # shipped inside the tasks that broadcast it, and a path on each of 13k copies made those
        # tasks 1.2 MB.
        files = reads.buffers.files
        shown = [spark_paths.get(f, f) for f in files]
        file_of = np.where(levels >= 1, reads.buffers.file_of, -1)
        columns["d_file"] = pa.DictionaryArray.from_arrays(
            pa.array(file_of, mask=file_of < 0), pa.array(shown, pa.string())
        ).cast(pa.string())
    if bits is None:
        columns["d_origin"] = pa.array(origin)
        columns["d_sequence"] = pa.array(sequence)
        columns["d_chunk"] = pa.array(chunk)
    if level == 2:
        row_start = reads.column("row_start")
        columns["d_lo"] = pa.array(row_start)
        columns["d_hi"] = pa.array(row_start + reads.column("rows") - 1)
    columns["d_weight"] = pa.array(reads.weights(work.checksum_bits))
    if level >= 1:
        columns["d_check"] = pa.array(levels)
    columns["d_batch"] = pa.array(reads.batches)
    if bits is not None:
        columns["d_id"] = pa.array(_pack(origin, sequence, chunk, bits))
    for i in range(nkeys):
        columns[f"d_thr{i}"] = pa.array(np.ascontiguousarray(reads.thresholds[:, i]))
        columns[f"d_reason{i}"] = pa.array(reason_codes(reads, i)[1])
    # A column without nulls is declared not nullable, so that Spark's generated code reads the
    # joined decision without a null check per row and value.
    table = pa.Table.from_arrays(
        list(columns.values()),
        schema=pa.schema(
            [pa.field(name, array.type, nullable=array.null_count > 0) for name, array in columns.items()]
        ),
    )
    frame = spark.createDataFrame(table)
    del columns, table
    release_arrow_memory()  # Spark holds the table now: what the driver built is given back
    return frame


def reason_codes(reads: Reads, i: int) -> tuple[list[str], npt.NDArray[np.int32]]:
    """Key ``i``'s late reasons of the reads as small integers (the ``d_reason<i>`` column) and
    the words they stand for, by code. The decision table is shipped inside the tasks that
    broadcast it: an int per copy instead of a word, and only a late tuple needs the word
    (``late_reason``; a literal when the pass has one reason). A dictionary over the few distinct
    words: ``np.unique`` of the words took 5 ms per 13k copies, this about 0.4 ms (the table and the
    late rows each ask)."""
    import numpy as np

    column: list[str] = reads.reasons[:, i].tolist()
    names = sorted(set(column))
    code = {name: n for n, name in enumerate(names)}
    return names, np.fromiter(map(code.__getitem__, column), dtype=np.int32, count=len(column))


def late_reason(reads: Reads, i: int) -> Column:
    """The late reason of a row of the pass for key ``i``: its ``d_reason<i>`` code as the word."""
    from pyspark.sql import functions as F

    names, _ = reason_codes(reads, i)
    if len(names) <= 1:
        return F.lit(names[0] if names else None).cast("string")
    return F.element_at(F.array(*[F.lit(n) for n in names]), F.col(f"d_reason{i}") + 1)


def late_rows(
    rows: DataFrame, layout: ArchiveLayout, reads: Reads, decided: Column, names: Sequence[str]
) -> list[Column]:
    """Per key, a row of ``rows`` (``pass_rows``) as a tuple of the ``late`` table (its columns
    ``names``) with the batch that decided it (``_batch``), where it is a late tuple for that key
    and ``decided`` (by a batch of the pass); else null."""
    from pyspark.sql import functions as F

    found: list[Column] = []
    for i, key in enumerate(layout.keys):
        values = [
            F.lit(key.name),
            q(layout.origin_id).cast("long"),
            q(layout.sequence_number).cast("long"),
            q(layout.chunk_number).cast("long"),
            *[
                time_value(rows, name, layout.time_columns[name]) if name in layout.time_columns else q(name)
                for name in layout.payload
            ],
            F.timestamp_micros(F.col(f"d_thr{i}")),
            late_reason(reads, i),
        ]
        found.append(
            F.when(
                F.col(f"_late{i}") & decided,
                F.struct(*[v.alias(n) for n, v in zip(names, values, strict=True)], F.col("d_batch").alias("_batch")),
            )
        )
    return found


def late_values(struct: StructType, names: Sequence[str], column: str) -> list[Value]:
    """A late tuple's values in the ``late`` table's order, from the struct column ``column`` of a
    frame of ``struct`` (a ``late_rows`` value, which also carries the batch that decided it)."""
    from pyspark.sql.types import StructType

    late = struct[column].dataType
    assert isinstance(late, StructType)
    return fields_of(StructType([late[n] for n in names]), f"{column}.")


def _few_rows(reads: Reads) -> bool:
    """Whether the pass needs less than half of the rows of the (local) files it reads."""
    import numpy as np

    needed = int(reads.column("rows").sum())
    total = 0
    files = reads.buffers.files
    for index in np.unique(reads.buffers.file_of).tolist():
        file = files[index]
        rows = file_rows(file)
        if rows is None:
            return False
        total += rows
    return needed * 2 < total


def _sliced(spark: SparkSession, reads: Reads, schema: StructType, nkeys: int, bits: int) -> DataFrame:
    """The rows of ``reads`` read by their row ranges (``replay.engine.slices``), decision columns attached."""
    from pyspark.sql.types import IntegerType, LongType, StructField, StructType

    fields = [StructField("d_weight", LongType()), StructField("d_batch", LongType())]
    for i in range(nkeys):
        fields += [StructField(f"d_thr{i}", LongType()), StructField(f"d_reason{i}", IntegerType())]
    codes = [reason_codes(reads, i)[1].tolist() for i in range(nkeys)]
    slices: list[Slice] = []
    for n, (r, weight) in enumerate(zip(reads, reads.weights(bits).tolist(), strict=True)):
        values: list[Any] = [weight, r.batch]
        for i in range(nkeys):
            values += [r.thresholds[i], codes[i][n]]
        slices.append((r.buf.file, r.buf.row_start, r.buf.rows, tuple(values)))
    return read_slices(spark, slices, schema, StructType(fields))


def _joined(
    spark: SparkSession,
    reads: Reads,
    work: PassWork,
    layout: ArchiveLayout,
    schema: StructType,
    spark_paths: Mapping[str, str],
    nkeys: int,
) -> DataFrame:
    """The rows of ``reads`` read by Spark's Parquet reader and joined to the pass's decisions."""
    import numpy as np
    from pyspark.sql import functions as F

    names = reads.buffers.files
    # Read by the files' own names: the path Spark reports for a local file escapes characters
    # (a space is ``%20``) that Spark's reader does not unescape, so that path names no file.
    files = sorted({names[i] for i in np.unique(reads.buffers.file_of).tolist()})
    raw = read_parquet(spark, schema, files)
    bits = _packing(reads)
    # A buffer with discarded copies elsewhere is matched by file too; when a copy shares its
    # file, by row range as well. Row positions are read only then.
    levels = work.check_levels()
    level = int(levels.max(initial=0))
    decisions = _decision_frame(spark, reads, work, spark_paths, nkeys, bits, levels)
    located: list[Column] = []
    if bits is not None:
        # The packed identity is the join's key expression: Spark evaluates it once per row, and
        # the rows need no projection of their own before the join (one analysis less).
        identity = _packed(q(layout.origin_id), q(layout.sequence_number), q(layout.chunk_number), bits)
        on_identity = identity == F.col("d_id")
    else:
        on_identity = (
            (q(layout.origin_id).cast("long") == F.col("d_origin"))
            & (q(layout.sequence_number).cast("long") == F.col("d_sequence"))
            & (q(layout.chunk_number).cast("long") == F.col("d_chunk"))
        )
    if level >= 1:
        located.append(F.input_file_name().alias("_file"))
        same_copy = reported_path(F.col("_file")) == F.col("d_file")
    if level == 2:
        located.append(F.col("_metadata.row_index").alias("_row"))
        same_copy = same_copy & ((F.col("d_check") == 1) | F.col("_row").between(F.col("d_lo"), F.col("d_hi")))
    if level >= 1:
        # In the join's condition, where Spark's optimizer puts it anyway (one analysis less).
        on_identity = on_identity & ((F.col("d_check") == 0) | same_copy)
    return (raw.select("*", *located) if located else raw).join(F.broadcast(decisions), on_identity)


def reported_path(input_file: Column) -> Column:
    """The path Spark reports as a row's ``_metadata.file_path`` (the form of the decision table's
    ``d_file``, ``replay.engine.copies``), from the name ``input_file_name()`` gives its file: the
    same URI but for an empty authority (``file:///a%20b`` is ``file:/a%20b``). ``_metadata``
    costs a struct built on every row; ``input_file_name()`` is the task's current file, and a
    pass's join only converts it for the rows of a copy it checks by file."""
    from pyspark.sql import functions as F

    return F.regexp_replace(input_file, r"^([A-Za-z][A-Za-z0-9+.\-]*):///", "$1:/")


def q(name: str) -> Column:
    """A column by name, quoted (names may hold dots)."""
    from pyspark.sql import functions as F

    return F.col(f"`{name}`")


def pass_rows(
    spark: SparkSession, work: PassWork, layout: ArchiveLayout, schema: StructType, spark_paths: Mapping[str, str]
) -> DataFrame:
    """The rows of ``work.reads`` with their decision, event times in microseconds and per-key flags."""
    from pyspark.sql import functions as F

    nkeys = len(layout.keys)
    reads = work.reads
    range_start, range_end = work.range
    joined = _sliced(spark, reads, schema, nkeys, work.checksum_bits) if _few_rows(reads) else None
    if joined is None:
        joined = _joined(spark, reads, work, layout, schema, spark_paths, nkeys)
    punctuation = q(layout.key).isNull()
    # One projection (one analysis of the plan) for the event times and the flags made from them:
    # the flags repeat the event time's expression, which Spark's generated code computes once per row.
    events = [time_micros(joined, key.event_time, layout.time_columns[key.event_time]) for key in layout.keys]
    flags: list[Column] = []
    for i in range(nkeys):
        ev = events[i]
        punctuation = punctuation & ev.isNull()
        inside = ev.isNotNull()
        if range_start is not None:
            inside = inside & (ev >= F.lit(range_start))
        if range_end is not None:
            inside = inside & (ev < F.lit(range_end))
        flags += [
            (inside & (ev < F.col(f"d_thr{i}"))).alias(f"_late{i}"),
            (inside & (ev >= F.col(f"d_thr{i}"))).alias(f"_on{i}"),
            (ev.isNotNull() & ~inside).alias(f"_out{i}"),
        ]
    # Every time column (payload included) as the windows and the late table take it: a timestamp
    # at microseconds (``replay.engine.schemas.value_struct``), a nanosecond one truncated toward
    # minus infinity; the event times above were computed from the columns as read.
    archive = [
        time_value(joined, name, layout.time_columns[name]).alias(name) if name in layout.time_columns else q(name)
        for name in joined.columns
    ]
    return joined.select(
        *archive, *[ev.alias(f"_ev{i}") for i, ev in enumerate(events)], (~punctuation).alias("_tuple"), *flags
    )
