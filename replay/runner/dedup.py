"""Deduplication against the checkpoint and the arrival order of a run's new buffers
(docs/archive.md#copies-duplicates-and-conflicts, docs/semantics.md#lateness)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

from replay.core.buffer import PackedBuffers
from replay.core.config import JobConfig
from replay.core.errors import ConflictingDuplicateError, Location
from replay.core.vocabulary import ConflictPolicy, IntegrityKind, Lateness
from replay.engine.buffers import Buffer, BufferScan, Conflict, DuplicateCopy
from replay.engine.copies import Copy, same_content
from replay.runner.resume import State
from replay.store import state as _state
from replay.store.checkpoint import CheckpointStore

__all__ = ["after_skip_notes", "deduplicate", "discard", "other_copies"]


Hasher = Callable[[Sequence[Copy]], Mapping[tuple[str, int], str]]


def deduplicate(
    scan: BufferScan, state: State, store: CheckpointStore, config: JobConfig, mode: str, hasher: Hasher
) -> tuple[PackedBuffers, list[_state.Discarded]]:
    """The scanned buffers this run feeds, in arrival order (sequence order in origin mode), and the
    copies it discards. The buffers stay packed (``PackedBuffers``): the driver holds no ``Buffer``
    object per buffer it has not fed yet.

    A buffer already replayed that arrives again is compared by content with the replayed copy;
    ``hasher`` computes the content hashes the scan did not (``(file, origin, sequence, chunk,
    row_start, rows)`` to hash, by ``(file, row_start)``), re-reading the replayed copy's rows.

    Raises:
        ConflictingDuplicateError: a buffer already replayed arrives again with other content,
            under ``on_conflict: fail``.
        BadBufferError: a new chunk breaks the chunk rules together with the chunks earlier runs
            fed (``ProgressState.check_new_chunks``).
    """
    # Deduplicate against the checkpoint: a copy already consumed (its file was re-read) is
    # skipped; another copy of a known buffer is a duplicate, or a conflict. Only an identity
    # the engine has seen can be either, so the history is read only when the scan meets one.
    seen = state.engine.seen
    if (
        state.engine.seen_any(scan.buffers)
        or any(seen((d.origin, d.sequence, d.chunk)) for d in scan.duplicates)
        or any(seen((c.origin, c.sequence, c.chunk)) for c in scan.conflicts)
    ):
        state.load_history(store)
    discarded: list[_state.Discarded] = []
    # ``None``: nothing replayed yet and no copy discarded, so every scanned buffer is new.
    new_at = _against_history(scan, state, config, hasher, discarded) if state.known or state.known_copies else None
    for dup in scan.duplicates:
        if (dup.file, dup.row_start) not in state.known_copies:
            discarded.append(discard(IntegrityKind.DUPLICATE, dup, dup.file, dup.row_start, dup.tuples, dup.kept_file))
    for con in scan.conflicts:
        if (con.other_file, con.other_row) not in state.known_copies:
            discarded.append(
                discard(IntegrityKind.CONFLICT, con, con.other_file, con.other_row, con.other_tuples, con.kept_file)
            )

    new = scan.buffers if new_at is None else scan.buffers.take(new_at)
    state.engine.check_new_chunks(new)
    if mode == Lateness.ARRIVAL:
        clock = state.engine.clock
        if clock is not None:
            # Buffers that reach an incremental run with an ingest_ts before the checkpoint's
            # clock arrive now, for the replay (docs/semantics.md).
            new = new.ingest_at_least(clock)
        return new.arrival_order(), discarded  # as ``replay.core.progress.arrival_order``
    return new.sequence_order(), discarded


def _against_history(
    scan: BufferScan, state: State, config: JobConfig, hasher: Hasher, discarded: list[_state.Discarded]
) -> list[int]:
    """The positions in ``scan.buffers`` of the buffers not replayed before; a copy of a replayed
    buffer goes to ``discarded`` as a duplicate or a conflict (a copy consumed before is skipped),
    and a buffer never replayed of a sequence ``gap_policy: skip`` closed in an earlier run as
    ``after_skip`` (its sequence is in its origin's complete prefix: it cannot be fed any more). A
    copy of a buffer an earlier run found as ``after_skip`` is compared with that first copy as with
    a replayed one: what one run over every file would have found (its first copy kept, the later
    one a duplicate or a conflict); when the first copy's file no longer holds it, it is
    ``after_skip`` too."""
    new_at: list[int] = []  # positions in ``scan.buffers``
    # The first copy an earlier run found of a buffer it did not feed (``after_skip``): a later copy
    # is compared with it, as with a replayed one (the checkpoint did not keep its rows: -1).
    first_found: dict[tuple[int, int, int], _state.Discarded] = {}
    for c in state.discarded:
        if c.kind == IntegrityKind.AFTER_SKIP:
            first_found.setdefault((c.origin, c.sequence, c.chunk), c)
    again: list[Copy] = []
    for buf in scan.buffers:
        if (buf.file, buf.row_start) in state.known_copies:
            continue
        if buf.identity in state.known:
            again += [(c.file, *c.identity, c.row_start, c.rows) for c in (buf, state.known[buf.identity])]
        elif buf.identity in first_found:
            earlier = first_found[buf.identity]
            again += [
                (buf.file, *buf.identity, buf.row_start, buf.rows),
                (earlier.file, *buf.identity, earlier.row_start, -1),
            ]
    closed = {(s.origin, s.sequence) for s in state.engine.skipped}
    hashes = dict(hasher(again)) if again else {}
    for at, buf in enumerate(scan.buffers):
        if (buf.file, buf.row_start) in state.known_copies:
            continue
        mine = hashes.get((buf.file, buf.row_start), buf.content_hash)
        known = state.known.get(buf.identity)
        found = first_found.get(buf.identity) if known is None else None
        same = None if found is None else same_content(mine, hashes.get((found.file, found.row_start), ""))
        if found is not None and same is not None:
            kind = _judged(buf, same, config, f"in {found.file} (row {found.row_start}, not replayed: after_skip)")
            discarded.append(discard(kind, buf, buf.file, buf.row_start, buf.tuples, found.file))
        elif known is None:
            # A copy of a buffer found before whose copy is gone stays what that one was: after_skip.
            if (buf.origin, buf.sequence) in closed and state.engine.seen(buf.identity):
                discarded.append(discard(IntegrityKind.AFTER_SKIP, buf, buf.file, buf.row_start, buf.tuples, ""))
            else:
                new_at.append(at)
        else:
            kept = hashes.get((known.file, known.row_start), known.content_hash)
            compared = same_content(mine, kept)
            if compared is None:
                # The replayed copy's file no longer holds it (and the checkpoint's hash of it was made
                # by another version of the hashing, or never): compare what the checkpoint recorded.
                compared = (known.rows, known.tuples, known.last_chunk, known.watermarks) == (
                    buf.rows,
                    buf.tuples,
                    buf.last_chunk,
                    buf.watermarks,
                )
            kind = _judged(buf, compared, config, f"in {known.file} (row {known.row_start}, already replayed)")
            discarded.append(discard(kind, buf, buf.file, buf.row_start, buf.tuples, known.file))
    return new_at


def _judged(buf: Buffer, same: bool, config: JobConfig, first: str) -> str:
    """A later copy of a buffer found before (``first`` says where): a duplicate when ``same``, else a
    conflict, which fails the run under ``on_conflict: fail``."""
    if same:
        return IntegrityKind.DUPLICATE
    if config.on_conflict == ConflictPolicy.FAIL:
        raise ConflictingDuplicateError(
            f"buffer archived again with different content: {first} and {buf.file} (row {buf.row_start})",
            where=Location(origin=buf.origin, sequence=buf.sequence, chunk=buf.chunk, file=buf.file),
            todo="find out which copy is right and remove the other, or set 'on_conflict: keep_first' "
            "to keep the first copy (the conflict is still reported, and validation's integrity suite blocks "
            "publication beyond 'validation.max_conflicts', 0 unless raised)",
        )
    return IntegrityKind.CONFLICT


def after_skip_notes(discarded: Sequence[_state.Discarded]) -> list[str]:
    """The run summary's note on the buffers discarded as ``after_skip``, if any."""
    late = [c for c in discarded if c.kind == IntegrityKind.AFTER_SKIP]
    if not late:
        return []
    return [
        f"{len(late)} buffer(s) ({sum(c.tuples for c in late)} tuples) of sequences that gap_policy: skip "
        "closed in an earlier run arrived now: not replayed, reported in the integrity table (kind after_skip)"
    ]


def other_copies(discarded: Sequence[_state.Discarded]) -> dict[tuple[int, int, int], frozenset[str]]:
    """Per identity with discarded copies, the files those copies are in."""
    files: dict[tuple[int, int, int], set[str]] = defaultdict(set)
    for c in discarded:
        files[(c.origin, c.sequence, c.chunk)].add(c.file)
    return {identity: frozenset(f) for identity, f in files.items()}


def discard(
    kind: str, copy: Buffer | DuplicateCopy | Conflict, file: str, row_start: int, tuples: int, kept_file: str
) -> _state.Discarded:
    """The record of a copy that was read but not kept (``kind``: duplicate, conflict or after_skip;
    ``kept_file`` is empty for after_skip: no copy of it was kept)."""
    return _state.Discarded(
        kind=str(kind),
        origin=copy.origin,
        sequence=copy.sequence,
        chunk=copy.chunk,
        file=file,
        row_start=row_start,
        tuples=tuples,
        kept_file=kept_file,
    )
