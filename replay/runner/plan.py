"""The batch plan: which files a run reads, which buffers may hold tuples of a backfill range,
and how the new buffers are cut into micro-batches (docs/outputs.md#micro-batches)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TypeVar

from replay.core.buffer import Buffer, PackedBuffers
from replay.core.config import JobConfig
from replay.core.paths import local_path

__all__ = [
    "CHANGED",
    "changed_notes",
    "cut_batches",
    "file_stamp",
    "plan_batches",
    "plan_passes",
    "relevant",
    "stamped",
    "unchanged",
]

B = TypeVar("B", bound=Sequence[Buffer])  # a list of buffers, or packed ones


#: The stamp a run records for a file that changed while it read it: no file has it, so the next
#: run scans the file again.
CHANGED = (-1, -1)


def file_stamp(path: str) -> list[int]:
    """A file's ``[size, modification time in ns]``; ``[0, 0]`` for a remote file (not compared:
    a remote file is consumed by its path, docs/outputs.md#files-rewritten-in-place)."""
    local = local_path(path)
    if local is None:
        return [0, 0]
    st = os.stat(local)
    return [st.st_size, st.st_mtime_ns]


def stamped(files: Sequence[str]) -> dict[str, list[int]]:
    """``file_stamp`` of each of ``files``."""
    return {path: file_stamp(path) for path in files}


def changed_notes(changed: Sequence[str]) -> list[str]:
    """The run's warnings on the files that changed while it read them (``unchanged``)."""
    return [
        f"{path} changed while this run read it (size or modification time): it is not recorded as consumed, so "
        "the next run scans it again and replays the buffers it holds that were not replayed"
        for path in changed
    ]


def unchanged(stamps: Mapping[str, Sequence[int]]) -> tuple[dict[str, list[int]], list[str]]:
    """Of files stamped before a run scanned them (``stamps``), those that still have their stamp
    (with it) and those that changed since, or are gone: a run records only the former as consumed."""
    kept: dict[str, list[int]] = {}
    changed: list[str] = []
    for path, stamp in stamps.items():
        try:
            now = file_stamp(path)
        except OSError:
            now = None
        if now == list(stamp):
            kept[path] = now
        else:
            changed.append(path)
    return kept, changed


def relevant(buf: Buffer, start: int | None, end: int | None) -> bool:
    """Whether a buffer may hold a tuple with an event time in ``[start, end)`` for some key."""
    if start is None and end is None:
        return True
    for lo, hi in zip(buf.min_event, buf.max_event, strict=True):
        if lo is None or hi is None:
            continue
        if (start is None or hi >= start) and (end is None or lo < end):
            return True
    return False


def _tuples(buffers: Sequence[Buffer]) -> list[int]:
    if isinstance(buffers, PackedBuffers):
        return buffers.column("tuples").tolist()  # type: ignore[no-any-return]
    return [b.tuples for b in buffers]


def plan_batches(buffers: B, config: JobConfig, first: int | None) -> list[B]:
    """Cut ``buffers`` into batches of at most ``max_buffers`` buffers and ``max_tuples`` tuples
    (at least one buffer each); ``first`` fixes the size of the first batch (a redone intent).
    The batches are slices of ``buffers`` (of packed buffers: views, no copy)."""
    max_buffers = config.micro_batch.max_buffers
    max_tuples = config.micro_batch.max_tuples
    tuples = _tuples(buffers)
    cuts: list[int] = []  # batch sizes
    at = 0
    if first is not None:
        cuts.append(min(first, len(tuples)))
        at = cuts[0]
    size = total = 0
    for n in tuples[at:]:
        full = (max_buffers is not None and size >= max_buffers) or (
            max_tuples is not None and size > 0 and total + n > max_tuples
        )
        if full:
            cuts.append(size)
            size = total = 0
        size += 1
        total += n
    if size or not cuts:
        cuts.append(size)
    return _cut(buffers, cuts)


def _cut(buffers: B, cuts: Sequence[int]) -> list[B]:
    batches, at = [], 0
    for size in cuts:
        batches.append(buffers[at : at + size])
        at += size
    return batches  # type: ignore[return-value]


def cut_batches(buffers: B, cuts: Sequence[int]) -> list[B] | None:
    """``buffers`` cut into batches of the sizes a run's intent recorded, or ``None`` when they do
    not add up (the archive changed under an interrupted run)."""
    if sum(cuts) != len(buffers) or not cuts:
        return None
    return _cut(buffers, cuts)


def plan_passes(batches: Sequence[Sequence[Buffer]], config: JobConfig) -> list[range]:
    """The run's batches (their buffers, in order) grouped into passes of consecutive batches: at
    most ``max_batches_per_pass`` batches and ``max_tuples_per_pass`` tuples each (a batch larger
    than that is a pass of its own)."""
    limit_batches = config.micro_batch.max_batches_per_pass
    limit_tuples = config.micro_batch.max_tuples_per_pass
    out: list[range] = []
    start, tuples = 0, 0
    for index, batch in enumerate(batches):
        size = sum(_tuples(batch))
        full = index - start >= limit_batches or (
            limit_tuples is not None and index > start and tuples + size > limit_tuples
        )
        if full:
            out.append(range(start, index))
            start, tuples = index, 0
        tuples += size
    if len(batches) > start:
        out.append(range(start, len(batches)))
    return out
