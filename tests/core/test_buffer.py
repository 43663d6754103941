"""``Buffer`` keeps its integer fields packed: every field reads back as it was given."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay.core.buffer import NULL_TIME, Buffer, PackedBuffers, pack_records
from replay.core.errors import BadBufferError
from replay.core.progress import arrival_order
from replay.engine.copy_checks import check_sequences
from tests._archives import buffer_fields


@given(buffer_fields())
def test_every_field_reads_back(fields: dict[str, Any]) -> None:
    buf = Buffer(**fields)
    assert buf.fields() == fields
    assert buf.identity == (fields["origin"], fields["sequence"], fields["chunk"])
    assert buf.head() == (*buf.identity, fields["ingest"], fields["last_chunk"], fields["idle"])
    assert pickle.loads(pickle.dumps(buf)) == buf
    assert buf.replace() == buf and hash(buf.replace()) == hash(buf)


@given(buffer_fields(), buffer_fields())
def test_equal_exactly_when_every_field_is(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert (Buffer(**a) == Buffer(**b)) == (a == b)


@given(st.lists(buffer_fields(nkeys=2), min_size=1, max_size=20))
def test_packed_columns_are_the_buffers_of_their_rows(rows: list[dict[str, Any]]) -> None:
    """``pack_records`` (the metadata scan's path: no Python object per value) packs each row as
    the constructor does: the ``PackedBuffers`` over them reads back each row's ``Buffer``."""

    def column(name: str) -> np.ndarray:
        return np.array([NULL_TIME if r[name] is None else int(r[name]) for r in rows], dtype=np.int64)

    def times(name: str, k: int) -> np.ndarray:
        return np.array([NULL_TIME if r[name][k] is None else r[name][k] for r in rows], dtype=np.int64)

    names = ("origin", "sequence", "chunk", "row_start", "tuples", "rows", "ingest", "last_chunk", "idle")
    records = pack_records(
        {name: column(name) for name in names},
        [times("watermarks", k) for k in range(2)],
        [times("min_event", k) for k in range(2)],
        [times("max_event", k) for k in range(2)],
    )
    packed = PackedBuffers(
        records,
        np.arange(len(rows), dtype=np.int32),
        [row["file"] for row in rows],
        np.array([i if row["content_hash"] else -1 for i, row in enumerate(rows)], dtype=np.int32),
        [row["content_hash"] for row in rows],
    )
    for buffer, row in zip(packed, rows, strict=True):
        assert buffer == Buffer(**row)
        assert buffer.fields() == row


def test_immutable_and_checked() -> None:
    fields = {
        "origin": 1,
        "sequence": 2,
        "chunk": 0,
        "last_chunk": True,
        "watermarks": (10,),
        "min_event": (None,),
        "max_event": (None,),
        "ingest": None,
        "idle": False,
        "tuples": 3,
        "rows": 3,
        "file": "a.parquet",
        "row_start": 0,
        "content_hash": "",
    }
    buf = Buffer(**fields)
    with pytest.raises(AttributeError, match="immutable"):
        buf.sequence = 3
    assert buf.replace(ingest=5).ingest == 5 and buf.ingest is None
    with pytest.raises(TypeError, match="no field"):
        buf.replace(seq=3)
    with pytest.raises(ValueError, match="64-bit"):
        Buffer(**(fields | {"sequence": 2**63}))
    with pytest.raises(ValueError, match="per key"):
        Buffer(**(fields | {"min_event": (None, None)}))
    assert "sequence=2" in repr(buf)


_SMALL = st.integers(min_value=-3, max_value=3)


@st.composite
def _run_buffers(draw: st.DrawFn) -> list[Buffer]:
    """Buffers of one scan: distinct identities from a small space (so orders tie on some fields),
    a few files and hashes, times that may be missing."""
    identities = draw(st.lists(st.tuples(_SMALL, _SMALL, st.integers(0, 3)), unique=True, max_size=25))
    small_time = st.none() | st.integers(min_value=-5, max_value=5)
    return [
        Buffer(
            origin=o,
            sequence=s,
            chunk=c,
            last_chunk=draw(st.booleans()),
            watermarks=(draw(small_time), draw(small_time)),
            min_event=(draw(small_time), draw(small_time)),
            max_event=(draw(small_time), draw(small_time)),
            ingest=draw(small_time),
            idle=draw(st.booleans()),
            tuples=draw(st.integers(0, 9)),
            rows=draw(st.integers(1, 9)),
            file=draw(st.sampled_from(["a.parquet", "b.parquet", "c/d.parquet"])),
            row_start=draw(st.integers(0, 99)),
            content_hash=draw(st.sampled_from(["", "v2:aa", "v2:bb"])),
        )
        for o, s, c in identities
    ]


@given(_run_buffers(), st.data())
def test_packed_buffers_are_the_buffers_they_were_made_of(buffers: list[Buffer], data: st.DataObject) -> None:
    """A run holds its buffers packed (``PackedBuffers``): every item, slice and selection reads back
    the ``Buffer`` it was made of, and its orders are the ones the progress engine feeds in."""
    packed = PackedBuffers.of(buffers, nkeys=2)
    assert list(packed) == buffers and packed == buffers and len(packed) == len(buffers)
    assert [packed[i] for i in range(len(buffers))] == buffers
    lo = data.draw(st.integers(0, len(buffers)))
    hi = data.draw(st.integers(lo, len(buffers)))
    assert list(packed[lo:hi]) == buffers[lo:hi]
    at = data.draw(st.lists(st.integers(0, max(len(buffers) - 1, 0)), max_size=10)) if buffers else []
    assert list(packed.take(at)) == [buffers[i] for i in at]
    assert packed.column("tuples").tolist() == [b.tuples for b in buffers]
    assert packed.identities() == [b.identity for b in buffers]
    assert packed[lo:hi].identities() == [b.identity for b in buffers[lo:hi]]
    for key in range(2):
        expected = [NULL_TIME if b.watermarks[key] is None else b.watermarks[key] for b in buffers]
        assert packed.watermark_column(key).tolist() == expected
    assert packed.last_chunks().tolist() == [b.last_chunk for b in buffers]
    assert list(packed.arrival_order()) == arrival_order(buffers)
    assert list(packed.sequence_order()) == sorted(buffers, key=lambda b: (b.sequence, b.origin, b.chunk))
    clock = data.draw(st.integers(-6, 6))
    moved = [b if b.ingest is None or b.ingest >= clock else b.replace(ingest=clock) for b in buffers]
    assert list(packed.ingest_at_least(clock)) == moved
    assert list(packed) == buffers  # moving the ingest times made a copy


def _sequence_error(buffers: list[Buffer] | PackedBuffers) -> str | None:
    try:
        check_sequences(buffers)
    except BadBufferError as exc:
        return f"{exc} {exc.where} {exc.code}"
    return None


@given(_run_buffers())
def test_packed_sequences_are_checked_as_buffer_objects_are(buffers: list[Buffer]) -> None:
    """The scan checks its packed buffers (in identity order) on their arrays: the same verdict, and
    the same error, as the check of ``Buffer`` objects."""
    ordered = sorted(buffers, key=lambda b: b.identity)
    assert _sequence_error(PackedBuffers.of(ordered, nkeys=2)) == _sequence_error(ordered)
    assert _sequence_error(PackedBuffers.of(buffers, nkeys=2)) == _sequence_error(buffers)  # any order
