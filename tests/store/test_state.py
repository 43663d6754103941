"""Buffer metadata in a checkpoint: what ``replay.store.state`` writes reads back as it was."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from hypothesis import given
from hypothesis import strategies as st

from replay.core.buffer import Buffer, PackedBuffers
from replay.store import state
from tests._archives import buffer_fields

_NKEYS = 2


@given(st.lists(buffer_fields(nkeys=_NKEYS), max_size=12), st.data())
def test_buffers_read_back_in_order_from_objects_and_packed_arrays(rows: list[dict[str, Any]], data: Any) -> None:
    """A batch writes buffers from their packed arrays (any slice or selection of a run's array)
    or as objects (the engine's held buffers): either way every field reads back, in order."""
    buffers = [Buffer(**row) for row in rows]
    packed = PackedBuffers.of(buffers, _NKEYS)
    order = data.draw(st.permutations(range(len(buffers))))
    start = data.draw(st.integers(min_value=0, max_value=len(buffers)))
    with tempfile.TemporaryDirectory() as tmp:
        for written, expected in [
            (buffers, buffers),
            (packed, buffers),
            (packed.take(order), [buffers[i] for i in order]),
            (packed[start:], buffers[start:]),
        ]:
            path = Path(tmp) / "buffers.parquet"
            state.write_buffers(path, written, _NKEYS)
            assert state.read_buffers(path, _NKEYS) == expected
            # A missing time is a null in the file, not the packed form's sentinel.
            table = pq.read_table(path)
            assert table["ingest"].to_pylist() == [b.ingest for b in expected]
            for k in range(_NKEYS):
                assert table[f"wm{k}"].to_pylist() == [b.watermarks[k] for b in expected]
                assert table[f"ev{k}_max"].to_pylist() == [b.max_event[k] for b in expected]


@given(st.lists(buffer_fields(nkeys=_NKEYS), max_size=12), st.data())
def test_reads_read_back_with_their_decisions(rows: list[dict[str, Any]], data: Any) -> None:
    buffers = [Buffer(**row) for row in rows]
    threshold = st.tuples(*[st.integers(-(2**63), 2**63 - 1)] * _NKEYS)
    drawn = data.draw(st.lists(threshold, min_size=len(rows), max_size=len(rows)))
    thresholds = np.array(drawn, dtype=np.int64).reshape(len(rows), _NKEYS)
    reasons = np.empty((len(rows), _NKEYS), dtype=object)
    for i in range(len(rows)):
        reasons[i, :] = data.draw(st.tuples(*[st.sampled_from(["watermark", "gap", ""])] * _NKEYS))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "reads.parquet"
        state.write_reads(path, PackedBuffers.of(buffers, _NKEYS), thresholds, reasons, _NKEYS)
        assert state.read_reads(path, _NKEYS) == [
            (buf, tuple(thresholds[i].tolist()), tuple(reasons[i].tolist())) for i, buf in enumerate(buffers)
        ]
