"""A buffer's metadata, the unit that progress, deduplication and the ledger count in.

One record per buffer identity (origin, sequence, chunk), made by the metadata scan
(``replay.engine.buffers``) from the archive's metadata columns; tuples never reach it.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["NULL_TIME", "Buffer", "PackedBuffers", "pack_records"]

# A missing time, packed: the smallest 64-bit integer, which no archive time reaches (nanoseconds
# are floored to microseconds, milliseconds multiplied); reads back as ``None``.
NULL_TIME = _NULL = -(2**63)
_HEAD = struct.Struct("<7qB")  # origin, sequence, chunk, row start, tuples, rows, ingest; flags
_LAST_CHUNK, _IDLE = 1, 2
_NAMES = (
    "origin",
    "sequence",
    "chunk",
    "last_chunk",
    "watermarks",
    "min_event",
    "max_event",
    "ingest",
    "idle",
    "tuples",
    "rows",
    "file",
    "row_start",
    "content_hash",
)


@functools.cache
def _keys(n: int) -> struct.Struct:
    """The packing of ``n`` keys' watermarks, min and max event times."""
    return struct.Struct(f"<{3 * n}q")


def _times(values: tuple[int, ...]) -> tuple[int | None, ...]:
    return tuple(None if v == _NULL else v for v in values)


class Buffer:
    """One buffer (the kept copy of an identity) and its metadata.

    Times are integer microseconds, UTC. Per-key tuples are in ``ArchiveLayout.keys`` order:
    ``watermarks[i]`` is the buffer's watermark for key ``i`` (its watermark column, or for
    event-time watermarks the max event time of its tuples; ``None`` when it has none).

    The integer fields are packed into one ``bytes`` value: about 190 bytes a buffer, where a field
    per Python object took about 440. A run does not keep one per buffer: the buffers it has not
    fed yet stay in one array (``PackedBuffers``, about 90 bytes a buffer), and a ``Buffer`` is
    made when one is read (the progress engine's feed, a pass's ledger). Immutable,
    compared and hashed by value; ``replace`` makes a changed copy. Reading a field unpacks it
    (a few hundred nanoseconds): the progress engine reads each buffer's fields a few times.
    """

    __slots__ = ("_packed", "content_hash", "file")

    _packed: bytes
    file: str
    content_hash: str

    def __init__(
        self,
        *,
        origin: int,
        sequence: int,
        chunk: int,
        last_chunk: bool,
        watermarks: tuple[int | None, ...],
        min_event: tuple[int | None, ...],
        max_event: tuple[int | None, ...],
        ingest: int | None,
        idle: bool,
        tuples: int,
        rows: int,
        file: str,
        row_start: int,
        content_hash: str,
    ) -> None:
        n = len(watermarks)
        if len(min_event) != n or len(max_event) != n:
            raise ValueError(
                f"a buffer has one watermark and event time bound per key: {watermarks}, {min_event}, {max_event}"
            )
        times = [_NULL if v is None else v for v in (*watermarks, *min_event, *max_event)]
        flags = (_LAST_CHUNK if last_chunk else 0) | (_IDLE if idle else 0)
        try:
            packed = _HEAD.pack(
                origin, sequence, chunk, row_start, tuples, rows, _NULL if ingest is None else ingest, flags
            ) + _keys(n).pack(*times)
        except struct.error as exc:
            raise ValueError(
                f"a buffer's numbers must be 64-bit integers ({origin}, {sequence}, {chunk}): {exc}"
            ) from exc
        object.__setattr__(self, "_packed", packed)
        object.__setattr__(self, "file", file)
        object.__setattr__(self, "content_hash", content_hash)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Buffer is immutable: use replace(), not .{name} = ...")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Buffer is immutable: cannot delete .{name}")

    @classmethod
    def from_packed(cls, packed: bytes, file: str, content_hash: str) -> Buffer:
        """A buffer from the bytes of one record of ``pack_records``."""
        buffer = cls.__new__(cls)
        object.__setattr__(buffer, "_packed", packed)
        object.__setattr__(buffer, "file", file)
        object.__setattr__(buffer, "content_hash", content_hash)
        return buffer

    def _key_times(self) -> tuple[int, ...]:
        n = (len(self._packed) - _HEAD.size) // 24
        return _keys(n).unpack_from(self._packed, _HEAD.size)

    def head(self) -> tuple[int, int, int, int | None, bool, bool]:
        """``(origin, sequence, chunk, ingest, last_chunk, idle)`` from one unpacking: what the
        progress engine reads of every buffer it is fed (each property unpacks on its own)."""
        origin, sequence, chunk, _, _, _, ingest, flags = _HEAD.unpack_from(self._packed)
        time = None if ingest == _NULL else ingest
        return origin, sequence, chunk, time, bool(flags & _LAST_CHUNK), bool(flags & _IDLE)

    @property
    def origin(self) -> int:
        return _HEAD.unpack_from(self._packed)[0]  # type: ignore[no-any-return]

    @property
    def sequence(self) -> int:
        return _HEAD.unpack_from(self._packed)[1]  # type: ignore[no-any-return]

    @property
    def chunk(self) -> int:
        return _HEAD.unpack_from(self._packed)[2]  # type: ignore[no-any-return]

    @property
    def identity(self) -> tuple[int, int, int]:
        origin, sequence, chunk = _HEAD.unpack_from(self._packed)[:3]
        return (origin, sequence, chunk)

    @property
    def row_start(self) -> int:
        return _HEAD.unpack_from(self._packed)[3]  # type: ignore[no-any-return]

    @property
    def tuples(self) -> int:
        return _HEAD.unpack_from(self._packed)[4]  # type: ignore[no-any-return]

    @property
    def rows(self) -> int:
        return _HEAD.unpack_from(self._packed)[5]  # type: ignore[no-any-return]

    @property
    def ingest(self) -> int | None:
        value = _HEAD.unpack_from(self._packed)[6]
        return None if value == _NULL else value

    @property
    def last_chunk(self) -> bool:
        return bool(self._packed[_HEAD.size - 1] & _LAST_CHUNK)

    @property
    def idle(self) -> bool:
        return bool(self._packed[_HEAD.size - 1] & _IDLE)

    @property
    def watermarks(self) -> tuple[int | None, ...]:
        times = self._key_times()
        return _times(times[: len(times) // 3])

    @property
    def min_event(self) -> tuple[int | None, ...]:
        times = self._key_times()
        n = len(times) // 3
        return _times(times[n : 2 * n])

    @property
    def max_event(self) -> tuple[int | None, ...]:
        times = self._key_times()
        n = len(times) // 3
        return _times(times[2 * n :])

    def fields(self) -> dict[str, Any]:
        """The buffer's fields by name, as the constructor takes them."""
        return {name: getattr(self, name) for name in _NAMES}

    def replace(self, **changes: Any) -> Buffer:
        """A copy with ``changes`` (field name -> value)."""
        unknown = set(changes) - set(_NAMES)
        if unknown:
            raise TypeError(f"Buffer has no field(s) {sorted(unknown)}")
        return Buffer(**(self.fields() | changes))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Buffer):
            return NotImplemented
        return (self._packed, self.file, self.content_hash) == (other._packed, other.file, other.content_hash)

    def __hash__(self) -> int:
        return hash((self._packed, self.file, self.content_hash))

    def __repr__(self) -> str:
        return "Buffer(" + ", ".join(f"{name}={getattr(self, name)!r}" for name in _NAMES) + ")"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Buffer.from_packed, (self._packed, self.file, self.content_hash))


@functools.cache
def _dtype(n: int) -> np.dtype[Any]:
    """The numpy record of a buffer with ``n`` keys: the bytes of ``_HEAD`` and ``_keys(n)``, no padding."""
    import numpy as np

    fields = [(name, "<i8") for name in ("origin", "sequence", "chunk", "row_start", "tuples", "rows", "ingest")]
    fields.append(("flags", "u1"))
    fields += [(f"t{i}", "<i8") for i in range(3 * n)]
    dtype = np.dtype(fields)
    assert dtype.itemsize == _HEAD.size + _keys(n).size
    return dtype


def pack_records(
    columns: dict[str, npt.NDArray[np.int64]],
    watermarks: Sequence[npt.NDArray[np.int64]],
    min_event: Sequence[npt.NDArray[np.int64]],
    max_event: Sequence[npt.NDArray[np.int64]],
) -> npt.NDArray[Any]:
    """Many buffers' integer fields packed at once, as ``Buffer`` keeps them: one numpy record per
    buffer, whose bytes are its ``Buffer``'s (``PackedBuffers``). ``columns``: ``origin, sequence,
    chunk, row_start, tuples, rows, ingest, last_chunk, idle`` as int64 arrays; per key its watermarks
    and event time bounds; a missing time is ``NULL_TIME``. No Python object is made per value, which
    is what building a ``Buffer`` per record cost the metadata scan."""
    import numpy as np

    n = len(watermarks)
    dtype = _dtype(n)
    records = np.zeros(len(columns["origin"]), dtype=dtype)
    for name in ("origin", "sequence", "chunk", "row_start", "tuples", "rows", "ingest"):
        records[name] = columns[name]
    records["flags"] = np.where(columns["last_chunk"] != 0, _LAST_CHUNK, 0) | np.where(columns["idle"] != 0, _IDLE, 0)
    for i, values in enumerate((*watermarks, *min_event, *max_event)):
        records[f"t{i}"] = values
    return records


class PackedBuffers(Sequence[Buffer]):
    """A sequence of buffers kept as one numpy array of their packed fields (``pack_records``), with
    one file index and one content-hash index (``-1``: none) per buffer: about 90 bytes a buffer
    with one key, where a ``Buffer`` object took about 190
    (docs/performance.md#time-and-driver-memory-by-archive-size). A ``Buffer`` is made when an item
    is read and is not kept; slicing and ``take`` share the files and hashes. This is how a run
    holds the buffers it has not fed yet."""

    __slots__ = ("_file_of", "_files", "_hash_of", "_hashes", "_records")

    def __init__(
        self,
        records: npt.NDArray[Any],
        file_of: npt.NDArray[np.int32],
        files: Sequence[str],
        hash_of: npt.NDArray[np.int32] | None = None,
        hashes: Sequence[str] = (),
    ) -> None:
        import numpy as np

        if hash_of is None:
            hash_of = np.full(len(records), -1, dtype=np.int32)
        if not len(records) == len(file_of) == len(hash_of):
            raise ValueError("a packed buffer has one file and one hash index")
        self._records, self._file_of, self._files = records, file_of, files
        self._hash_of, self._hashes = hash_of, hashes

    @classmethod
    def concat(cls, parts: Sequence[PackedBuffers], nkeys: int = 0) -> PackedBuffers:
        """``parts`` one after the other."""
        import numpy as np

        if not parts:
            return cls.of([], nkeys)
        if len(parts) == 1:
            return parts[0]
        files: dict[str, int] = {}
        hashes: dict[str, int] = {}
        file_of, hash_of = [], []
        for part in parts:
            fmap = np.array([files.setdefault(f, len(files)) for f in part._files] or [0], dtype=np.int32)
            hmap = np.array([hashes.setdefault(h, len(hashes)) for h in part._hashes] + [-1], dtype=np.int32)
            file_of.append(fmap[part._file_of])
            hash_of.append(hmap[part._hash_of])  # -1 indexes the last entry: -1 again
        return cls(
            np.concatenate([part._records for part in parts]),
            np.concatenate(file_of),
            list(files),
            np.concatenate(hash_of),
            list(hashes),
        )

    @classmethod
    def of(cls, buffers: Iterable[Buffer], nkeys: int = 0) -> PackedBuffers:
        """``buffers`` packed (``nkeys``: their number of keys, for an empty sequence)."""
        import numpy as np

        items = list(buffers)
        if items:
            nkeys = len(items[0].watermarks)
        dtype = _dtype(nkeys)
        records = np.frombuffer(b"".join(b._packed for b in items), dtype=dtype) if items else np.zeros(0, dtype)
        files: dict[str, int] = {}
        hashes: dict[str, int] = {}
        file_of = np.array([files.setdefault(b.file, len(files)) for b in items], dtype=np.int32)
        hash_of = np.array(
            [hashes.setdefault(b.content_hash, len(hashes)) if b.content_hash else -1 for b in items], dtype=np.int32
        )
        return cls(records.copy(), file_of, list(files), hash_of, list(hashes))

    def __len__(self) -> int:
        return len(self._records)

    @overload
    def __getitem__(self, index: int) -> Buffer: ...

    @overload
    def __getitem__(self, index: slice) -> PackedBuffers: ...

    def __getitem__(self, index: int | slice) -> Buffer | PackedBuffers:
        if isinstance(index, slice):
            return PackedBuffers(
                self._records[index], self._file_of[index], self._files, self._hash_of[index], self._hashes
            )
        h = int(self._hash_of[index])
        return Buffer.from_packed(
            self._records[index].tobytes(), self._files[self._file_of[index]], self._hashes[h] if h >= 0 else ""
        )

    def __iter__(self) -> Iterator[Buffer]:
        for i in range(len(self._records)):
            yield self[i]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedBuffers({list(self)!r})"

    def column(self, name: str) -> npt.NDArray[np.int64]:
        """One packed field of every buffer (``origin``, ``sequence``, ``chunk``, ``row_start``,
        ``tuples``, ``rows``, ``ingest``; ``NULL_TIME`` for a missing time), a view."""
        return self._records[name]

    def identities(self) -> list[tuple[int, int, int]]:
        """Every buffer's ``(origin, sequence, chunk)``, from the packed columns (no ``Buffer`` each)."""
        columns = (self._records[name].tolist() for name in ("origin", "sequence", "chunk"))
        return list(zip(*columns, strict=True))

    def watermark_column(self, key: int) -> npt.NDArray[np.int64]:
        """Key ``key``'s watermark of every buffer (``NULL_TIME``: none), a view."""
        return self._records[f"t{key}"]

    @property
    def file_of(self) -> npt.NDArray[np.int32]:
        """Each buffer's file, as its position in ``files``."""
        return self._file_of

    @property
    def files(self) -> Sequence[str]:
        """The files ``file_of`` points into (shared by slices and selections; some may be unused)."""
        return self._files

    @property
    def hash_of(self) -> npt.NDArray[np.int32]:
        """Each buffer's content hash, as its position in ``hashes`` (``-1``: none)."""
        return self._hash_of

    @property
    def hashes(self) -> Sequence[str]:
        """The content hashes ``hash_of`` points into."""
        return self._hashes

    def min_event_column(self, key: int) -> npt.NDArray[np.int64]:
        """Key ``key``'s smallest event time of every buffer (``NULL_TIME``: none known), a view."""
        return self._records[f"t{self._nkeys() + key}"]

    def max_event_column(self, key: int) -> npt.NDArray[np.int64]:
        """Key ``key``'s largest event time of every buffer (``NULL_TIME``: none known), a view."""
        return self._records[f"t{2 * self._nkeys() + key}"]

    def _nkeys(self) -> int:
        return (self._records.dtype.itemsize - _HEAD.size) // 24

    def last_chunks(self) -> npt.NDArray[np.bool_]:
        """Whether each buffer is its sequence's last chunk."""
        return (self._records["flags"] & _LAST_CHUNK) != 0  # type: ignore[no-any-return]

    def idles(self) -> npt.NDArray[np.bool_]:
        """Whether each buffer is an idle marker."""
        return (self._records["flags"] & _IDLE) != 0  # type: ignore[no-any-return]

    def take(self, indices: npt.NDArray[np.intp] | Sequence[int]) -> PackedBuffers:
        """The buffers at ``indices``, in their order."""
        import numpy as np

        at = np.asarray(indices, dtype=np.intp)
        return PackedBuffers(self._records[at], self._file_of[at], self._files, self._hash_of[at], self._hashes)

    def ingest_at_least(self, clock: int) -> PackedBuffers:
        """The buffers with an ``ingest_ts`` before ``clock`` moved to it (none stays none)."""

        records = self._records.copy()
        ingest = records["ingest"]
        ingest[(ingest != _NULL) & (ingest < clock)] = clock
        return PackedBuffers(records, self._file_of, self._files, self._hash_of, self._hashes)

    def arrival_order(self) -> PackedBuffers:
        """Sorted by (``ingest_ts``, origin, sequence, chunk), a missing ingest first: what
        ``replay.core.progress.arrival_order`` does with ``Buffer`` objects."""
        import numpy as np

        r = self._records
        return self.take(np.lexsort((r["chunk"], r["sequence"], r["origin"], r["ingest"])))

    def sequence_order(self) -> PackedBuffers:
        """Sorted by (sequence, origin, chunk): the order origin mode feeds buffers in."""
        import numpy as np

        r = self._records
        return self.take(np.lexsort((r["chunk"], r["origin"], r["sequence"])))
