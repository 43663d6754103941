"""The archive's rules for buffers (docs/archive.md#buffers-and-punctuation-rows), checked on the
metadata scan's per-copy records before anything is replayed: every identity present and in
range, the rows of a buffer agreeing on their metadata, one last chunk per sequence."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from replay.core.buffer import Buffer, PackedBuffers
from replay.core.errors import BadBufferError, Location
from replay.core.timeutil import format_ts
from replay.engine.archive import ArchiveLayout

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["check_copies", "check_copy", "check_sequences"]


def check_copies(records: pa.Table, layout: ArchiveLayout, chunk_base: int) -> None:
    """``check_copy`` of every copy's record of the metadata scan, in their order: the rules are
    first tested on the table's columns, and only the records that may break one (none, in an
    archive that keeps them) become Python dicts, checked one by one.

    Raises:
        BadBufferError: as ``check_copy``, for the first record that breaks a rule.
    """
    import pyarrow.compute as pc

    if not records.num_rows:
        return
    ids = [records[name] for name in ("origin", "sequence", "chunk")]
    tests = [pc.is_null(c) for c in ids]
    tests += [pc.less(ids[0], 1), pc.less(ids[1], 1), pc.less(ids[2], chunk_base)]
    rows = records["rows"]
    for name, _, required in _metadata(layout):
        count, low, high = records[f"{name}_n"], records[f"{name}_min"], records[f"{name}_max"]
        if required:
            tests.append(pc.less(count, rows))
        tests.append(pc.and_(pc.greater(count, 0), pc.less(count, rows)))
        tests.append(pc.not_equal(low, high))  # null where both are: no values, the counts' case
    # A null test is a null identity (its own test) or a buffer without values of a column.
    suspect = pc.fill_null(tests[0], False)
    for test in tests[1:]:
        suspect = pc.or_(suspect, pc.fill_null(test, False))
    if not pc.any(suspect).as_py():
        return
    for rec in records.filter(suspect).to_pylist():
        check_copy(rec, layout, chunk_base)


def _metadata(layout: ArchiveLayout) -> list[tuple[str, str, bool]]:
    """The metadata every row of a buffer repeats: (record field, column, required)."""
    metadata = [("last_chunk", layout.last_chunk, True)]
    if layout.ingest_ts is not None:
        metadata.append(("ingest", layout.ingest_ts, True))
    if layout.idle is not None:
        metadata.append(("idle", layout.idle, False))
    for index, key in enumerate(layout.keys):
        if key.watermark is not None:
            metadata.append((f"wm{index}", key.watermark, False))
    if layout.metadata_watermark is not None:  # the archive's watermark_ts, which no key reads
        metadata.append(("wm_ts", layout.metadata_watermark, False))
    return metadata


def check_copy(rec: dict[str, Any], layout: ArchiveLayout, chunk_base: int) -> None:
    """One copy's record (``replay.engine.scan``): its identity present and in range, and its rows
    agreeing on every metadata column (null where required only when all are).

    Raises:
        BadBufferError: naming the file, origin, sequence, chunk and column.
    """
    file = rec["_file"]
    where = {"file": file, "origin": rec["origin"], "sequence": rec["sequence"], "chunk": rec["chunk"]}
    for role, value in (
        ("origin_id", rec["origin"]),
        ("sequence_number", rec["sequence"]),
        ("chunk_number", rec["chunk"]),
    ):
        if value is None:
            column = getattr(layout, role)
            raise BadBufferError(
                f"column '{column}' ({role}) is null on some rows",
                where=Location(file=file, column=column),
                todo="every row needs origin_id, sequence_number and chunk_number; fix or remove those rows",
                code="archive.null_identity",
            )
    if rec["origin"] < 1:
        raise BadBufferError(
            f"origin_id {rec['origin']} is below 1",
            where=Location(**where, column=layout.origin_id),
            todo="origin ids start at 1; fix the archiver's origin numbering or map the right column",
            code="archive.bad_origin",
        )
    if rec["sequence"] < 1:
        raise BadBufferError(
            f"sequence_number {rec['sequence']} is below 1",
            where=Location(**where, column=layout.sequence_number),
            todo="sequence numbers start at 1 per origin; fix the archiver or remove these rows",
            code="archive.bad_sequence",
        )
    if rec["chunk"] < chunk_base:
        raise BadBufferError(
            f"chunk_number {rec['chunk']} is below chunk_base {chunk_base}",
            where=Location(**where, column=layout.chunk_number),
            todo="set 'chunk_base: 0' if this archive counts chunks from 0 (a checkpoint that committed batches "
            "under chunk_base 1 then needs a new --checkpoint and --output), else fix the archiver",
            code="archive.bad_chunk",
        )
    for name, column, required in _metadata(layout):
        count, low, high = rec[f"{name}_n"], rec[f"{name}_min"], rec[f"{name}_max"]
        if required and count < rec["rows"]:
            raise BadBufferError(
                f"column '{column}' is null on {rec['rows'] - count} of the buffer's {rec['rows']} rows",
                where=Location(**where, column=column),
                todo=f"every row of a buffer needs a '{column}' value; fix the archiver or remove the buffer",
                code="archive.null_metadata",
            )
        if 0 < count < rec["rows"] or low != high:
            if column in layout.time_columns:  # microseconds since the epoch: shown as ISO 8601 UTC
                low, high = format_ts(low), format_ts(high)
            raise BadBufferError(
                f"the rows of one buffer disagree on '{column}' (values from {low} to {high}, {count} of "
                f"{rec['rows']} non-null)",
                where=Location(**where, column=column),
                todo="all rows of a buffer must carry the same metadata; fix the archiver or remove the buffer",
                code="archive.metadata_disagrees",
            )


def check_sequences(buffers: Sequence[Buffer]) -> None:
    """At most one last chunk per sequence, and no chunk beyond it.

    Packed buffers in identity order (the metadata scan's, ``PackedBuffers``) are checked on their
    arrays, and only a sequence that breaks a rule is looked at buffer by buffer.

    Raises:
        BadBufferError: naming the origin, sequence, chunk and file.
    """
    if isinstance(buffers, PackedBuffers):
        buffers = _offending(buffers)
    by_sequence: dict[tuple[int, int], list[Buffer]] = defaultdict(list)
    for buf in buffers:
        by_sequence[(buf.origin, buf.sequence)].append(buf)
    for (origin, sequence), chunks in by_sequence.items():
        lasts = [b for b in chunks if b.last_chunk]
        if len(lasts) > 1:
            raise BadBufferError(
                f"the sequence has {len(lasts)} last chunks: {sorted(b.chunk for b in lasts)}",
                where=Location(origin=origin, sequence=sequence, file=lasts[1].file, chunk=lasts[1].chunk),
                todo="exactly one chunk per sequence (the highest) may set last_chunk; fix the archiver",
                code="archive.two_last_chunks",
            )
        if lasts:
            beyond = [b for b in chunks if b.chunk > lasts[0].chunk]
            if beyond:
                raise BadBufferError(
                    f"chunk {beyond[0].chunk} lies beyond the sequence's last chunk {lasts[0].chunk}",
                    where=Location(origin=origin, sequence=sequence, chunk=beyond[0].chunk, file=beyond[0].file),
                    todo="the last chunk must carry the highest chunk number; fix the archiver",
                    code="archive.chunk_beyond_last",
                )


def _offending(buffers: PackedBuffers) -> list[Buffer]:
    """The buffers of the first sequence of ``buffers`` (in identity order) with two last chunks or a
    chunk beyond its last one; none when every sequence keeps the rules."""
    import numpy as np

    n = len(buffers)
    if n == 0:
        return []
    origin, sequence, chunk = (buffers.column(name) for name in ("origin", "sequence", "chunk"))
    same_origin, same_sequence = origin[1:] == origin[:-1], sequence[1:] == sequence[:-1]
    ascending = (origin[1:] > origin[:-1]) | (
        same_origin & ((sequence[1:] > sequence[:-1]) | (same_sequence & (chunk[1:] > chunk[:-1])))
    )
    if not ascending.all():
        return list(buffers)  # not in identity order: every buffer, by sequence
    starts = np.flatnonzero(np.r_[True, ~(same_origin & same_sequence)])
    last = buffers.last_chunks().astype(np.int64)
    lasts = np.add.reduceat(last, starts)
    ends = np.r_[starts[1:], n] - 1
    # In identity order a sequence's chunks ascend: a chunk beyond the last chunk exists exactly when
    # the sequence has a last chunk and its highest chunk is not it.
    bad = (lasts > 1) | ((lasts == 1) & (last[ends] == 0))
    if not bad.any():
        return []
    group = int(np.flatnonzero(bad)[0])
    return list(buffers[int(starts[group]) : int(ends[group]) + 1])
