"""Synthetic archives for ``replay generate``: buffers with chosen gaps, copies, disorder and late data.

All times are integer microseconds since the epoch, UTC (see ``replay.core.timeutil``). The archive follows
docs/archive.md#columns with the default column names, one row per tuple:

``origin_id`` int64 (1..N), ``sequence_number`` int64, ``chunk_number`` int32, ``last_chunk`` bool,
``watermark_ts`` (optional), ``ingest_ts`` (optional), ``idle`` bool, ``event_time``, ``key`` (int64 or
string), ``value`` float64 (about 1% null). Timestamps are ``timestamp[us, tz=UTC]``.

What the data promises, so that tests on it mean something:

- Each origin's tuples form sequences of ``buffer_tuples`` tuples; some sequences are split into 2 or 3
  chunks. Event times grow by about ``tuple_interval`` per tuple (each origin at its own rate, within
  +-10%) plus a jitter in ``[0, disorder)``.
- Every sequence watermark (the maximum over its chunks; the other chunks carry lower values, and the
  last chunk is not necessarily the maximum) is a true promise: every tuple of a later sequence that is
  not one of the ``late_tuples`` has an event time at or above it. Sequence watermarks never decrease.
- A late tuple lies 1 to 5 minutes behind the lower of the two readings of its origin's previous
  (present) sequence watermark, the ``watermark_ts`` one and the event-time one, so it is late in origin
  mode whichever reading a job uses. The first sequence of an origin and the last tuple of each sequence
  are never late. (With event-time watermarks the jitter alone also puts tuples up to ``disorder``
  behind their origin's watermark; ``late_tuples`` counts only the tuples moved on purpose.)
- ``ingest_ts`` of a buffer is its largest event time (or its last tuple's nominal time) plus a delay of
  0 to 5 s, so buffers of different origins interleave and chunks may arrive out of sequence order.
- Values are multiples of 1/64 in [-1000, 1000): float64 sums of them are exact in any order.
- The same options give byte-identical files.

``GenerateOptions`` and ``GenerateSummary`` (what is asked, checked, and what was written) are in
``replay.generate_options``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from replay.core.errors import storage_errors
from replay.core.timeutil import MICROS_PER_SECOND
from replay.generate_options import GenerateOptions, GenerateSummary, origin_tuples

__all__ = ["generate_archive"]

_MINUTE = 60 * MICROS_PER_SECOND
_ROW_GROUP_ROWS = 1 << 20
_INGEST_DELAY = 5 * MICROS_PER_SECOND  # max delay between a buffer's event times and its arrival
_COPY_DELAY = (MICROS_PER_SECOND, _MINUTE)  # a re-delivered copy arrives this much later
_LATE_BEHIND = (_MINUTE, 5 * _MINUTE)  # how far a late tuple lies behind its origin's watermark
_NULL_VALUES = 0.01
_VALUE_SCALE = 64
_TS = pa.timestamp("us", tz="UTC")


def _prepare_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ValueError(f"out {out} exists and is not a directory; choose a directory path")
    out.mkdir(parents=True, exist_ok=True)
    found = sorted(str(p.relative_to(out)) for p in out.rglob("*.parquet"))
    if found:
        raise ValueError(
            f"out {out} already holds Parquet files ({found[0]}, {len(found)} in all); "
            "choose an empty directory or remove them"
        )


def _separate_copies(order: np.ndarray, ident: np.ndarray) -> np.ndarray:
    """Reorder one file's buffers so no copy sits next to its original (the two would read as one copy)."""
    if order.size < 2 or not np.any(ident[order[1:]] == ident[order[:-1]]):
        return order
    items = order.tolist()
    i = 0
    while i < len(items) - 1:
        if ident[items[i]] != ident[items[i + 1]]:
            i += 1
            continue
        moved = items.pop(i + 1)
        if i + 2 <= len(items):
            items.insert(i + 2, moved)  # after the next buffer
        elif i >= 1:
            items.insert(i - 1, moved)  # at the end: before the original's predecessor
        else:
            raise AssertionError("a file holding only a buffer and its copy cannot keep them apart")
        i = max(i - 1, 0)
    return np.asarray(items, dtype=order.dtype)


@storage_errors("the archive may be incomplete: generate it again into an empty directory")
def generate_archive(
    out: str | Path, options: GenerateOptions, *, progress: Callable[[int, int], None] | None = None
) -> GenerateSummary:
    """Write a synthetic archive to ``out`` as ``part-00000.parquet`` ... and say what is in it.

    ``progress(done, total)`` is called after each row group (about 1M rows) with rows written so far
    and rows in all (copies and punctuation rows included).

    Raises:
        ValueError: ``out`` is a file or already holds Parquet files.
    """
    o = options
    out = Path(out)
    _prepare_dir(out)
    # One stream per aspect, so that e.g. adding gaps leaves the event times alone.
    r_rate, r_time, r_tuple, r_gap, r_late, r_chunk, r_ingest, r_copy = (
        np.random.default_rng(s) for s in np.random.SeedSequence(o.seed).spawn(8)
    )
    i64 = np.int64

    # Tuples, origin by origin: event time = start + i * interval(origin) + jitter.
    n = origin_tuples(o.origins, o.tuples, o.idle)
    off = np.concatenate(([0], np.cumsum(n)))
    total = int(off[-1])
    # A random rate per origin is drawn as a float and rounded once to whole microseconds; every
    # time below is built from it in int64.
    iv = np.maximum(1, np.rint(o.tuple_interval * r_rate.uniform(0.9, 1.1, o.origins))).astype(i64)
    event = np.empty(total, i64)
    for i in range(o.origins):
        ev = np.arange(n[i], dtype=i64)
        ev *= iv[i]
        ev += o.start
        if o.disorder:
            ev += r_time.integers(0, o.disorder, n[i])
        event[off[i] : off[i + 1]] = ev
    key_idx = r_tuple.integers(0, o.keys, total, dtype=np.int32)
    value = r_tuple.integers(-1000 * _VALUE_SCALE, 1000 * _VALUE_SCALE, total, dtype=np.int32).astype(np.float64)
    value /= _VALUE_SCALE
    value_null = r_tuple.random(total, dtype=np.float32) < _NULL_VALUES

    # Sequences (every origin's are contiguous). The watermark of a sequence ending before local tuple
    # b is at most start + b * interval, below every later tuple's event time; then made non-decreasing.
    k = -(-n // o.buffer_tuples)
    s_off = np.concatenate(([0], np.cumsum(k)))
    s_org = np.repeat(np.arange(o.origins), k)
    s_num = np.arange(s_off[-1], dtype=i64) - s_off[s_org] + 1
    s_lo = (s_num - 1) * o.buffer_tuples
    s_hi = np.minimum(s_num * o.buffer_tuples, n[s_org])
    s_start, s_len = off[s_org] + s_lo, s_hi - s_lo
    wm = o.start + s_hi * iv[s_org] - r_time.integers(0, o.disorder + 1, s_num.size)
    for i in range(o.origins):
        wm[s_off[i] : s_off[i + 1]] = np.maximum.accumulate(wm[s_off[i] : s_off[i + 1]])

    interior = np.flatnonzero((s_num > 1) & (s_num < k[s_org]))
    gone = np.sort(r_gap.choice(interior, o.gaps, replace=False)) if o.gaps else np.empty(0, i64)
    kept = np.ones(s_num.size, bool)
    kept[gone] = False
    kept_tuples = int(s_len[kept].sum())

    # Late tuples: behind min(watermark, event-time watermark) of the previous present sequence.
    late_tuples = 0
    can_late = kept & (s_num > 1) & (s_len > 1)
    eligible = int((s_len[can_late] - 1).sum())
    if o.late_fraction and eligible:
        late = np.repeat(can_late, s_len)
        late[s_start + s_len - 1] = False
        late &= r_late.random(total, dtype=np.float32) < min(1.0, o.late_fraction * kept_tuples / eligible)
        seq_max = np.maximum.reduceat(np.where(late, np.iinfo(i64).min, event), s_start)
        threshold = np.zeros(s_num.size, i64)
        for i in range(o.origins):
            idx = s_off[i] + np.flatnonzero(kept[s_off[i] : s_off[i + 1]])
            event_wm = np.maximum.accumulate(seq_max[idx])
            threshold[idx[1:]] = np.minimum(wm[idx[:-1]], event_wm[:-1])
        rows = np.flatnonzero(late)
        del late
        seq_of = np.searchsorted(s_start, rows, side="right") - 1
        event[rows] = threshold[seq_of] - r_late.integers(*_LATE_BEHIND, rows.size)
        late_tuples = int(rows.size)

    # Chunks of the present sequences: 2 or 3 for a fraction of them, at random cut points.
    ks = np.flatnonzero(kept)
    ln = s_len[ks]
    nch = np.ones(ks.size, i64)
    if o.multi_chunk_fraction:
        multi = r_chunk.random(ks.size) < o.multi_chunk_fraction
        nch[multi] = r_chunk.integers(2, 4, int(multi.sum()))
        nch = np.minimum(nch, ln)
    two, three = nch == 2, nch == 3
    c_first = np.cumsum(nch) - nch
    c_seq = np.repeat(ks, nch)
    c_idx = np.arange(c_seq.size, dtype=i64) - np.repeat(c_first, nch)
    c_last = c_idx == np.repeat(nch - 1, nch)
    rel = np.zeros(c_seq.size, i64)
    rel[c_first[two] + 1] = r_chunk.integers(1, ln[two])
    cut1 = r_chunk.integers(1, ln[three] - 1)
    rel[c_first[three] + 1] = cut1
    rel[c_first[three] + 2] = r_chunk.integers(cut1 + 1, ln[three])
    rel_end = np.append(rel[1:], 0)
    rel_end[c_last] = ln
    c_start, c_len = s_start[c_seq] + rel, rel_end - rel
    c_org = s_org[c_seq]
    c_wm = wm[c_seq] - r_chunk.integers(1, max(o.disorder, o.tuple_interval) + 1, c_seq.size)
    c_wm[c_first + r_chunk.integers(0, nch)] = wm[ks]  # one chunk, any of them, carries the maximum

    c_end = c_start + c_len
    bounds = np.unique(np.concatenate((c_start, c_end[c_end < total])))
    c_max = np.maximum.reduceat(event, bounds)[np.searchsorted(bounds, c_start)]
    nominal = o.start + (c_end - 1 - off[c_org]) * iv[c_org]
    c_ing = np.maximum(c_max, nominal) + r_ingest.integers(0, _INGEST_DELAY + 1, c_seq.size)

    # Idle punctuation: one row, the next sequence, the origin's last watermark, after its last buffer.
    p_org = np.arange(o.origins - o.idle, o.origins)
    last_ing = np.full(o.origins, np.iinfo(i64).min)
    np.maximum.at(last_ing, c_org, c_ing)
    p_ing = last_ing[p_org] + r_ingest.integers(MICROS_PER_SECOND, _INGEST_DELAY + 1, o.idle)

    # The buffer table: originals (chunks, then punctuation), then copies.
    nb = c_seq.size + o.idle
    ncopy = o.duplicates + o.conflicts
    pick = r_copy.choice(c_seq.size, ncopy, replace=False) if ncopy else np.empty(0, i64)
    ident = np.concatenate((np.arange(nb), pick))
    b_org = np.concatenate((c_org, p_org))[ident] + 1
    b_seq = np.concatenate((s_num[c_seq], k[p_org] + 1))[ident]
    b_chunk = (np.concatenate((c_idx, np.zeros(o.idle, i64))) + o.chunk_base).astype(np.int32)[ident]
    b_last = np.concatenate((c_last, np.ones(o.idle, bool)))[ident]
    b_wm = np.concatenate((c_wm, wm[s_off[p_org + 1] - 1]))[ident]
    b_idle = np.concatenate((np.zeros(c_seq.size, bool), np.ones(o.idle, bool)))[ident]
    b_src = np.concatenate((c_start, np.full(o.idle, -1, i64)))[ident]
    b_len = np.concatenate((c_len, np.ones(o.idle, i64)))[ident]
    b_ing = np.concatenate((c_ing, p_ing, c_ing[pick] + r_copy.integers(*_COPY_DELAY, ncopy)))
    b_kind = np.concatenate((np.zeros(nb, np.int8), np.ones(o.duplicates, np.int8), np.full(o.conflicts, 2, np.int8)))
    b_patch = np.full(ident.size, -1, i64)  # the row of a conflicting copy whose value changes
    b_patch[nb + o.duplicates :] = r_copy.integers(0, b_len[nb + o.duplicates :])

    # Arrival order; originals dealt to files in contiguous blocks, copies to another file.
    order = np.lexsort((b_kind, b_chunk, b_seq, b_org, b_ing))
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    b_file = np.zeros(ident.size, i64)
    b_file[order[order < nb]] = np.arange(nb) * o.files // nb
    if o.files > 1 and ncopy:
        b_file[nb:] = (b_file[pick] + r_copy.integers(1, o.files, ncopy)) % o.files
    layout = np.lexsort((rank, b_file))
    per_file = np.split(layout, np.cumsum(np.bincount(b_file, minlength=o.files))[:-1])

    fields = [
        pa.field("origin_id", pa.int64()),
        pa.field("sequence_number", pa.int64()),
        pa.field("chunk_number", pa.int32()),
        pa.field("last_chunk", pa.bool_()),
        *([pa.field("watermark_ts", _TS)] if o.watermarks else []),
        *([pa.field("ingest_ts", _TS)] if o.ingest_ts else []),
        pa.field("idle", pa.bool_()),
        pa.field("event_time", _TS),
        pa.field("key", pa.int64() if o.key_type == "int" else pa.string()),
        pa.field("value", pa.float64()),
    ]
    schema = pa.schema(fields)
    key_names = None
    if o.key_type == "string":
        key_names = pa.array([f"k{j:0{len(str(o.keys - 1))}d}" for j in range(o.keys)], pa.string())

    def table(bi: np.ndarray) -> pa.Table:
        lens = b_len[bi]
        first = np.cumsum(lens) - lens
        rep = np.repeat(np.arange(bi.size), lens)
        punct = b_src[bi][rep] < 0
        rows = b_src[bi][rep] + (np.arange(rep.size) - first[rep])
        rows[punct] = 0
        val, null = value[rows], value_null[rows] | punct
        patched = np.flatnonzero(b_kind[bi] == 2)
        pos = first[patched] + b_patch[bi[patched]]
        val[pos] = np.where(null[pos], 0.25, val[pos] + 1.0)
        null[pos] = False
        keys = key_idx[rows]
        cols = {
            "origin_id": pa.array(b_org[bi][rep]),
            "sequence_number": pa.array(b_seq[bi][rep]),
            "chunk_number": pa.array(b_chunk[bi][rep]),
            "last_chunk": pa.array(b_last[bi][rep]),
            "watermark_ts": pa.array(b_wm[bi][rep].view("datetime64[us]"), _TS),
            "ingest_ts": pa.array(b_ing[bi][rep].view("datetime64[us]"), _TS),
            "idle": pa.array(b_idle[bi][rep]),
            "event_time": pa.array(event[rows].view("datetime64[us]"), _TS, mask=punct),
            "key": (
                pa.array(keys.astype(i64), mask=punct)
                if key_names is None
                else key_names.take(pa.array(keys, mask=punct))
            ),
            "value": pa.array(val, mask=null),
        }
        return pa.Table.from_arrays([cols[f.name] for f in fields], schema=schema)

    rows_total, done = int(b_len.sum()), 0
    tmp_paths = [out / f".part-{f:05d}.parquet.tmp" for f in range(o.files)]
    try:
        for f, buffers in enumerate(per_file):
            buffers = _separate_copies(buffers, ident)
            group = (np.cumsum(b_len[buffers]) - 1) // _ROW_GROUP_ROWS
            with pq.ParquetWriter(tmp_paths[f], schema, compression="snappy", write_statistics=True) as writer:
                for piece in np.split(buffers, np.flatnonzero(np.diff(group)) + 1):
                    t = table(piece)
                    writer.write_table(t, row_group_size=max(1, t.num_rows))
                    done += t.num_rows
                    if progress is not None:
                        progress(done, rows_total)
        for f, tmp in enumerate(tmp_paths):
            os.replace(tmp, out / f"part-{f:05d}.parquet")
    finally:
        for tmp in tmp_paths:
            tmp.unlink(missing_ok=True)

    def idents(sel: np.ndarray) -> tuple[tuple[int, int, int], ...]:
        return tuple(sorted((int(b_org[j]), int(b_seq[j]), int(b_chunk[j])) for j in sel))

    return GenerateSummary(
        path=str(out),
        files=o.files,
        rows=rows_total,
        tuples=kept_tuples,
        buffers=nb,
        gaps=tuple((int(s_org[g]) + 1, int(s_num[g])) for g in gone),
        duplicates=idents(np.arange(nb, nb + o.duplicates)),
        conflicts=idents(np.arange(nb + o.duplicates, ident.size)),
        idle_origins=tuple(int(p) + 1 for p in p_org),
        late_tuples=late_tuples,
    )
