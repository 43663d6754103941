"""What a pass (``replay.engine.aggregate.run_pass``) is asked to do and what it reports back, as
values: its batches (``Step``), the copies it reads with their decisions (``Read``), the whole
request (``PassWork``) and each batch's result (``WorkResult``: ``Counts`` and, per window
aggregation, ``SpecCounts``). The ledger's copy ids are defined here too."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, overload

from replay.core.buffer import NULL_TIME, Buffer, PackedBuffers

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "Counts",
    "PassWork",
    "Read",
    "Reads",
    "SpecCounts",
    "Step",
    "WorkResult",
    "buffer_copy_id",
    "checksum_bits",
    "copy_id",
    "copy_ids",
]

_MASK63 = (1 << 63) - 1


def copy_id(origin: int, sequence: int, chunk: int, file: str, row_start: int) -> int:
    """A 63-bit hash naming one copy of a buffer (the ledger XORs these)."""
    digest = hashlib.blake2b(f"{origin}/{sequence}/{chunk}/{file}/{row_start}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & _MASK63


def buffer_copy_id(buf: Buffer) -> int:
    return copy_id(buf.origin, buf.sequence, buf.chunk, buf.file, buf.row_start)


def copy_ids(buffers: PackedBuffers) -> list[int]:
    """Every buffer's ``buffer_copy_id``, from the packed columns (no ``Buffer`` object each: a
    batch of 13k buffers in about half the time)."""
    names = buffers.files
    files = [names[i] for i in buffers.file_of.tolist()]
    columns = [buffers.column(name).tolist() for name in ("origin", "sequence", "chunk")]
    starts = buffers.column("row_start").tolist()
    return [copy_id(o, s, c, f, r) for o, s, c, f, r in zip(*columns, files, starts, strict=True)]


def checksum_bits(rows: int) -> int:
    """How many low bits of a copy id its weight in the copy checksum of a pass of ``rows`` rows keeps
    (``Reads.weights``): as many as a sum over those rows leaves room for in a long, so that Spark
    sums one long per row rather than the id's two 32-bit halves (an aggregate less per row). 39 bits
    for 10M rows: a copy read in place of another changes the sum unless their weights agree."""
    return max(1, 63 - rows.bit_length())


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One micro-batch of a pass: its number, per key (layout order) the watermark its windows are
    emitted by after it (``E_k``, or lower while an origin-mode run holds windows open for origins
    outside ``G_k``, ``replay.runner.hold``; a window ending by it is emitted at this batch, unless
    an earlier one of the pass reached it), and where its ``windows`` and ``late`` rows go."""

    batch: int
    effective: tuple[int, ...]
    windows_dir: str
    late_dir: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Read:
    """A copy whose tuples the pass reads, with its decision (``replay.core.progress.Decision``:
    per key the lateness threshold of its tuples and the reason a late one is given) and the batch
    that decided it. ``batch`` 0: a carried copy (decided and accounted for by a committed batch;
    its tuples only rebuild the open windows, see ``PassWork.floor``). A run holds one per copy
    its pass reads, so the decision's thresholds and reasons are kept, not the ``Decision``."""

    buf: Buffer
    thresholds: tuple[int, ...]
    reasons: tuple[str, ...]
    batch: int


class Reads(Sequence[Read]):
    """Many ``Read``s kept as arrays: the copies packed (``PackedBuffers``), per key a column of
    thresholds and one of reasons, the deciding batch and the copy id (computed once, for the
    decision table and the ledger). A pass holds the reads of all its batches until its Spark
    action: as objects that was about 400 bytes a copy, and the driver's memory grew with the
    pass (docs/performance.md#time-and-driver-memory-by-archive-size). Items are made on reading and are not kept; the
    decision table and the ledger read the arrays."""

    __slots__ = ("batches", "buffers", "copy_ids", "reasons", "thresholds")

    def __init__(
        self,
        buffers: PackedBuffers,
        thresholds: npt.NDArray[np.int64],
        reasons: npt.NDArray[np.object_],
        batches: npt.NDArray[np.int64],
        copy_ids: npt.NDArray[np.int64],
    ) -> None:
        if not len(buffers) == len(thresholds) == len(reasons) == len(batches) == len(copy_ids):
            raise ValueError("a read has one copy, one threshold and reason per key, a batch and a copy id")
        self.buffers, self.thresholds, self.reasons = buffers, thresholds, reasons
        self.batches, self.copy_ids = batches, copy_ids

    @classmethod
    def of(cls, reads: Iterable[Read], nkeys: int, copy_ids: Sequence[int] | None = None) -> Reads:
        """``reads`` as arrays; ``copy_ids``: their ``buffer_copy_id``, where the caller has them."""
        import numpy as np

        items = list(reads)
        n = len(items)
        thresholds = np.array([r.thresholds for r in items], dtype=np.int64).reshape(n, nkeys)
        reasons = np.empty((n, nkeys), dtype=object)
        for i, r in enumerate(items):
            reasons[i, :] = r.reasons
        return cls(
            PackedBuffers.of([r.buf for r in items], nkeys),
            thresholds,
            reasons,
            np.fromiter((r.batch for r in items), dtype=np.int64, count=n),
            np.fromiter(
                (buffer_copy_id(r.buf) for r in items) if copy_ids is None else copy_ids, dtype=np.int64, count=n
            ),
        )

    @classmethod
    def concat(cls, parts: Sequence[Reads], nkeys: int) -> Reads:
        import numpy as np

        parts = [p for p in parts if len(p)] or list(parts[:1])
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls.of([], nkeys)
        return cls(
            PackedBuffers.concat([p.buffers for p in parts], nkeys),
            np.concatenate([p.thresholds for p in parts]),
            np.concatenate([p.reasons for p in parts]),
            np.concatenate([p.batches for p in parts]),
            np.concatenate([p.copy_ids for p in parts]),
        )

    def __len__(self) -> int:
        return len(self.batches)

    @overload
    def __getitem__(self, index: int) -> Read: ...

    @overload
    def __getitem__(self, index: slice) -> Reads: ...

    def __getitem__(self, index: int | slice) -> Read | Reads:
        if isinstance(index, slice):  # views of the arrays, no copy
            return Reads(
                self.buffers[index],
                self.thresholds[index],
                self.reasons[index],
                self.batches[index],
                self.copy_ids[index],
            )
        return Read(
            buf=self.buffers[index],
            thresholds=tuple(self.thresholds[index].tolist()),
            reasons=tuple(self.reasons[index].tolist()),
            batch=int(self.batches[index]),
        )

    def __iter__(self) -> Iterator[Read]:
        for i in range(len(self)):
            yield self[i]

    def column(self, name: str) -> npt.NDArray[np.int64]:
        """A packed field of every copy read (``PackedBuffers.column``)."""
        return self.buffers.column(name)

    def weights(self, bits: int) -> npt.NDArray[np.int64]:
        """Each copy's weight in the copy checksum: the low ``bits`` bits of its copy id."""
        return self.copy_ids & ((1 << bits) - 1)

    def checksums(self, batch: int | None = None, *, bits: int) -> tuple[int, int, int]:
        """What Spark must count over the rows of these copies (of ``batch`` only, when given): rows,
        tuples and the copy checksum, each row adding its copy's weight (``weights``: ``bits`` as
        ``PassWork.checksum_bits`` gives them, so that Spark's sum fits in a long)."""
        mine = slice(None) if batch is None else self.batches == batch
        rows: list[int] = self.column("rows")[mine].tolist()
        weights: list[int] = self.weights(bits)[mine].tolist()
        tuples = int(self.column("tuples")[mine].sum())
        return sum(rows), tuples, sum(n * w for n, w in zip(rows, weights, strict=True))

    def may_hold_late(self) -> npt.NDArray[np.bool_]:
        """Per copy: decided by a batch of the pass, with tuples, and for some key an event time
        below its threshold or none known (the scan did not read its event times)."""
        import numpy as np

        n, nkeys = self.thresholds.shape
        below = np.zeros(n, dtype=bool)
        for i in range(nkeys):
            low = self.buffers.min_event_column(i)
            below |= (low == NULL_TIME) | (low < self.thresholds[:, i])
        return (self.batches > 0) & (self.column("tuples") > 0) & below


@dataclass(frozen=True, slots=True, kw_only=True)
class PassWork:
    """What one pass (one Spark action over one or more consecutive micro-batches) must do.

    ``reads``: the copies whose tuples the pass's batches decided, and the carried ones.
    ``steps``: the pass's batches, in order. ``floor``: per key, what windows were emitted by at
    the commit the pass continues from (``E_k``, or its hold): a window ending by it was emitted
    by a committed batch, so the carried copies' tuples never rebuild it. ``open_state``: per
    window name, the directory of the open windows carried in, or ``None``. ``state_dirs``: per
    window name, where the pass writes the open windows it carries out; ``counts_dir``: where a
    pass of several batches writes their counts (read back and removed by ``run_pass``).
    ``range``: a backfill's ``[start, end)`` in microseconds.
    ``checked``: identities with other (discarded) copies in the archive, with those copies'
    files. Rows are matched to a copy by identity alone, by identity and file when the other
    copies are in other files, and by file and row range when one shares the copy's file.
    """

    reads: Reads
    steps: Sequence[Step]
    floor: tuple[int, ...]
    open_state: Mapping[str, str | None]
    state_dirs: Mapping[str, str]
    counts_dir: str
    range: tuple[int | None, int | None] = (None, None)
    checked: Mapping[tuple[int, int, int], frozenset[str]] = field(default_factory=dict)

    @property
    def checksum_bits(self) -> int:
        """``checksum_bits`` of the pass's rows."""
        return checksum_bits(int(self.reads.column("rows").sum()))

    def check_level(self, buf: Buffer) -> int:
        """0: rows match ``buf`` by identity; 1: by identity and file; 2: and by row range too."""
        others = self.checked.get(buf.identity)
        if not others:
            return 0
        return 2 if buf.file in others else 1

    def check_levels(self) -> npt.NDArray[np.int32]:
        """``check_level`` of every copy of ``reads``, in order (on the reads' columns: a ``Buffer``
        object only for a copy whose identity has other copies)."""
        import numpy as np

        buffers = self.reads.buffers
        levels = np.zeros(len(buffers), dtype=np.int32)
        if not self.checked:
            return levels
        checked = self.checked
        for at, identity in enumerate(buffers.identities()):
            if identity in checked:
                levels[at] = self.check_level(buffers[at])
        return levels


@dataclass(frozen=True, slots=True, kw_only=True)
class Counts:
    """What Spark saw of the batch's copies, summed: rows, tuples, the copy checksum (the sum over
    rows of each row's copy weight, ``Reads.weights`` of ``checksum_bits``), and per key the late,
    on-time and outside-range tuples."""

    rows: int
    tuples: int
    checksum: int
    checksum_bits: int
    late: tuple[int, ...]
    on_time: tuple[int, ...]
    outside: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class SpecCounts:
    """Windows of one aggregation after the batch: emitted now, still open, and the tuples they own;
    ``windowed``: the batch's on-time tuples that entered one of its windows."""

    windowed: int = 0
    emitted: int = 0
    emitted_owned: int = 0
    open: int = 0
    open_owned: int | None = 0  # None: not measured (a batch inside a pass; the ledger derives it)
    open_dir: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkResult:
    counts: Counts | None = None
    specs: dict[str, SpecCounts] = field(default_factory=dict)
    windows_written: bool = False
    late_written: bool = False
    late_rows: int = 0
