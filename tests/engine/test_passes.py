"""A pass's reads kept as arrays (``replay.engine.passes.Reads``): every read comes back as it
was given, concatenation keeps order, and the array rules agree with the per-copy ones."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from replay.core.buffer import Buffer, PackedBuffers
from replay.engine.passes import Read, Reads, buffer_copy_id, checksum_bits, copy_ids

_TIME = st.none() | st.integers(min_value=-5, max_value=5)


@st.composite
def _reads(draw: st.DrawFn, nkeys: int = 2) -> list[Read]:
    identities = draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(0, 2)), max_size=12))
    return [
        Read(
            buf=Buffer(
                origin=o,
                sequence=s,
                chunk=c,
                last_chunk=draw(st.booleans()),
                watermarks=tuple(draw(_TIME) for _ in range(nkeys)),
                min_event=tuple(draw(_TIME) for _ in range(nkeys)),
                max_event=tuple(draw(_TIME) for _ in range(nkeys)),
                ingest=draw(_TIME),
                idle=False,
                tuples=draw(st.integers(0, 3)),
                rows=draw(st.integers(1, 3)),
                file=draw(st.sampled_from(["a.parquet", "b.parquet"])),
                row_start=draw(st.integers(0, 9)),
                content_hash=draw(st.sampled_from(["", "v2:aa"])),
            ),
            thresholds=tuple(draw(st.integers(-6, 6)) for _ in range(nkeys)),
            reasons=tuple(draw(st.sampled_from(["", "behind_origin", "behind_global"])) for _ in range(nkeys)),
            batch=draw(st.integers(0, 3)),
        )
        for o, s, c in identities
    ]


@given(_reads(), _reads())
def test_reads_come_back_as_given_and_concatenate_in_order(first: list[Read], second: list[Read]) -> None:
    a, b = Reads.of(first, nkeys=2), Reads.of(second, nkeys=2)
    assert list(a) == first and len(a) == len(first)
    assert a.copy_ids.tolist() == [buffer_copy_id(r.buf) for r in first]
    both = Reads.concat([a, b], nkeys=2)
    assert list(both) == first + second
    assert both.copy_ids.tolist() == a.copy_ids.tolist() + b.copy_ids.tolist()
    assert list(Reads.concat([Reads.of([], nkeys=2), b], nkeys=2)) == second
    cut = len(first)  # a batch's reads are a slice of its pass's
    assert list(both[:cut]) == first and list(both[cut:]) == second
    assert both[cut:].copy_ids.tolist() == b.copy_ids.tolist()


@given(_reads())
def test_only_copies_below_a_threshold_may_hold_late_tuples(reads: list[Read]) -> None:
    """A copy decided in the pass, with tuples, whose smallest event time for some key is below that
    key's threshold (or unknown) may hold a late tuple; no other can."""
    expected = [
        r.batch > 0
        and r.buf.tuples > 0
        and any(lo is None or lo < thr for lo, thr in zip(r.buf.min_event, r.thresholds, strict=True))
        for r in reads
    ]
    assert Reads.of(reads, nkeys=2).may_hold_late().tolist() == expected


@given(_reads(), st.integers(0, 2**40), st.integers(0, 3))
def test_the_copy_checksum_fits_a_long_and_follows_each_copy(reads: list[Read], more_rows: int, batch: int) -> None:
    """Spark sums one weight per row (``checksum_bits``): however many rows a pass reads, the sum
    stays below 2**63, and it is each copy's weight times its rows, batch by batch."""
    packed = Reads.of(reads, nkeys=2)
    rows = sum(r.buf.rows for r in reads) + more_rows
    bits = checksum_bits(rows)
    assert rows * ((1 << bits) - 1) < 2**63 and bits >= 63 - rows.bit_length()
    weights = packed.weights(bits).tolist()
    assert all(
        0 <= w < 1 << bits and w == buffer_copy_id(r.buf) % (1 << bits) for w, r in zip(weights, reads, strict=True)
    )
    mine = [(r, w) for r, w in zip(reads, weights, strict=True) if r.batch == batch]
    expected = (
        sum(r.buf.rows for r, _ in mine),
        sum(r.buf.tuples for r, _ in mine),
        sum(r.buf.rows * w for r, w in mine),
    )
    assert packed.checksums(batch, bits=bits) == expected


@given(_reads(), st.data())
def test_check_levels_on_the_columns_agree_with_check_level(reads: list[Read], data: st.DataObject) -> None:
    """Which copies the pass matches by identity only, by file too, or by row range too, read off the
    reads' columns, is ``check_level`` of each copy."""
    from replay.engine.passes import PassWork

    identities = [r.buf.identity for r in reads] + [(9, 9, 9)]
    checked = {
        identity: frozenset(data.draw(st.sets(st.sampled_from(["a.parquet", "b.parquet", "c.parquet"]), min_size=1)))
        for identity in data.draw(st.lists(st.sampled_from(identities), max_size=4))
    }
    packed = Reads.of(reads, nkeys=2)
    work = PassWork(reads=packed, steps=[], floor=(), open_state={}, state_dirs={}, counts_dir="", checked=checked)
    assert work.check_levels().tolist() == [work.check_level(r.buf) for r in reads]


@given(_reads(), _reads())
def test_copy_ids_from_the_packed_columns_are_each_buffers_copy_id(first: list[Read], second: list[Read]) -> None:
    # Two packings concatenated: the files are positions in a shared list, as a run's batches have them.
    packed = PackedBuffers.concat(
        [PackedBuffers.of((r.buf for r in first), 2), PackedBuffers.of((r.buf for r in second), 2)]
    )
    assert copy_ids(packed) == [buffer_copy_id(buf) for buf in packed]
    assert copy_ids(packed[1:]) == [buffer_copy_id(buf) for buf in packed[1:]]
