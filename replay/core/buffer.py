"""A buffer's metadata, the unit that progress, deduplication and the ledger count in.

One record per buffer identity (origin, sequence, chunk), made by the metadata scan
(``replay.engine.buffers``) from the archive's metadata columns; tuples never reach it.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["NULL_TIME", "Buffer", "Conflict", "DuplicateCopy", "pack_buffers"]

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

    A run holds one per buffer of the archive until its batch is committed, so the integer fields
    are packed into one ``bytes`` value: about 190 bytes a buffer, where a field per Python object
    took about 440 (7.4 against 16.5 MiB for the 39,000 buffers of 30M tuples). Immutable,
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
        """A buffer from one record of ``pack_buffers``."""
        buffer = cls.__new__(cls)
        object.__setattr__(buffer, "_packed", packed)
        object.__setattr__(buffer, "file", file)
        object.__setattr__(buffer, "content_hash", content_hash)
        return buffer

    def _key_times(self) -> tuple[int, ...]:
        n = (len(self._packed) - _HEAD.size) // 24
        return _keys(n).unpack_from(self._packed, _HEAD.size)

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


def pack_buffers(
    columns: dict[str, npt.NDArray[np.int64]],
    watermarks: Sequence[npt.NDArray[np.int64]],
    min_event: Sequence[npt.NDArray[np.int64]],
    max_event: Sequence[npt.NDArray[np.int64]],
) -> tuple[bytes, int]:
    """Many buffers' integer fields packed at once, as ``Buffer`` keeps them: ``(records, width)``,
    buffer ``i`` being ``records[i * width:(i + 1) * width]`` (``Buffer.from_packed``). ``columns``:
    ``origin, sequence, chunk, row_start, tuples, rows, ingest, last_chunk, idle`` as int64 arrays;
    per key its watermarks and event time bounds; a missing time is ``NULL_TIME``. No Python object
    is made per value, which is what building a ``Buffer`` per record cost the metadata scan."""
    import numpy as np

    n = len(watermarks)
    fields = [(name, "<i8") for name in ("origin", "sequence", "chunk", "row_start", "tuples", "rows", "ingest")]
    fields.append(("flags", "u1"))
    fields += [(f"t{i}", "<i8") for i in range(3 * n)]
    dtype = np.dtype(fields)  # packed, as _HEAD and _keys(n): no padding
    assert dtype.itemsize == _HEAD.size + _keys(n).size
    records = np.zeros(len(columns["origin"]), dtype=dtype)
    for name, _ in fields[:7]:
        records[name] = columns[name]
    records["flags"] = np.where(columns["last_chunk"] != 0, _LAST_CHUNK, 0) | np.where(columns["idle"] != 0, _IDLE, 0)
    for i, values in enumerate((*watermarks, *min_event, *max_event)):
        records[f"t{i}"] = values
    return records.tobytes(), dtype.itemsize


@dataclass(frozen=True, slots=True, kw_only=True)
class DuplicateCopy:
    """An identical copy that was discarded in favour of the first one."""

    origin: int
    sequence: int
    chunk: int
    file: str
    row_start: int
    tuples: int
    kept_file: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Conflict:
    """A copy whose content differs from the first copy of the same identity."""

    origin: int
    sequence: int
    chunk: int
    kept_file: str
    kept_row: int
    other_file: str
    other_row: int
    other_tuples: int = 0
