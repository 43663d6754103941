"""The ledger (docs/outputs.md#ledger): every tuple read is accounted for, checked at every commit.

``tuples read = tuples in windows (open or emitted) + late + pending + duplicates (+ tuples
without an event time or outside a backfill range)``, and the XOR of the buffer copies read equals
the XOR of those processed, pending and discarded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from replay.core.buffer import Buffer
from replay.core.config import JobConfig
from replay.core.errors import LedgerError, Location
from replay.engine.passes import Reads, WorkResult, buffer_copy_id

__all__ = ["Ledger", "account", "check_ledger", "ledger_row"]


@dataclass(slots=True, kw_only=True)
class Ledger:
    """Cumulative counts the ledger identity is checked on (docs/outputs.md#ledger)."""

    tuples_read: int = 0
    read_xor: int = 0
    processed_xor: int = 0
    discarded_xor: int = 0
    discarded_tuples: int = 0
    discarded_copies: int = 0
    outside_skipped: int = 0  # tuples of buffers a backfill range did not need to read
    late: list[int] = field(default_factory=list)
    no_event: list[int] = field(default_factory=list)
    outside: list[int] = field(default_factory=list)
    unwindowed: dict[str, int] = field(default_factory=dict)
    windowed: dict[str, int] = field(default_factory=dict)
    emitted_owned: dict[str, int] = field(default_factory=dict)
    open_owned: dict[str, int] = field(default_factory=dict)
    emitted_windows: dict[str, int] = field(default_factory=dict)
    open_windows: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Ledger:
        return cls(**dict(data))


def check_ledger(
    ledger: Ledger,
    pending: Mapping[tuple[int, int, int], Buffer],
    config: JobConfig,
    key_index: Mapping[str, int],
    batch: int,
) -> None:
    pending_tuples = sum(b.tuples for b in pending.values())
    pending_xor = 0
    for buf in pending.values():
        pending_xor ^= buffer_copy_id(buf)
    accounted = ledger.processed_xor ^ pending_xor ^ ledger.discarded_xor
    if accounted != ledger.read_xor:
        raise LedgerError(
            "the XOR of the buffer copies read differs from the XOR of those accounted for "
            "(processed, pending, discarded): a buffer was lost or counted twice",
            where=Location(extra={"batch": batch}),
            todo="nothing was committed for this batch; report this with the archive and the checkpoint",
        )
    for spec in config.windows:
        i = key_index[spec.wm_key]
        windowed = ledger.emitted_owned.get(spec.name, 0) + ledger.open_owned.get(spec.name, 0)
        if windowed != ledger.windowed.get(spec.name, 0):
            raise LedgerError(
                f"window aggregation {spec.name!r} owns {windowed} tuples but {ledger.windowed.get(spec.name, 0)} "
                "on-time tuples entered it",
                where=Location(extra={"batch": batch, "window": spec.name}),
                todo="nothing was committed for this batch; report this with the archive and the checkpoint",
            )
        total = (
            windowed
            + ledger.unwindowed.get(spec.name, 0)
            + ledger.late[i]
            + ledger.no_event[i]
            + ledger.outside[i]
            + ledger.outside_skipped
            + pending_tuples
            + ledger.discarded_tuples
        )
        if total != ledger.tuples_read:
            raise LedgerError(
                f"tuples read ({ledger.tuples_read}) differ from tuples accounted for ({total}: windows, late, "
                f"pending, duplicates) for window aggregation {spec.name!r}",
                where=Location(extra={"batch": batch, "window": spec.name}),
                todo="nothing was committed for this batch; report this with the archive and the checkpoint",
            )


def ledger_row(
    ledger: Ledger,
    pending: Mapping[tuple[int, int, int], Buffer],
    config: JobConfig,
    key_index: Mapping[str, int],
) -> dict[str, Any]:
    """The ledger's terms after a batch, kept per batch so that validation can check the identity again.

    Every term is stored, not the verdict: the reconciliation suite adds them up itself.
    """
    pending_xor = 0
    for buf in pending.values():
        pending_xor ^= buffer_copy_id(buf)
    return {
        "tuples_read": ledger.tuples_read,
        "read_xor": ledger.read_xor,
        "processed_xor": ledger.processed_xor,
        "pending_xor": pending_xor,
        "discarded_xor": ledger.discarded_xor,
        "pending": sum(b.tuples for b in pending.values()),
        "discarded": ledger.discarded_tuples,
        "outside_skipped": ledger.outside_skipped,
        "windows": {
            spec.name: {
                "emitted": ledger.emitted_owned.get(spec.name, 0),
                "open": ledger.open_owned.get(spec.name, 0),
                "entered": ledger.windowed.get(spec.name, 0),
                "unwindowed": ledger.unwindowed.get(spec.name, 0),
                "late": ledger.late[key_index[spec.wm_key]],
                "no_event_time": ledger.no_event[key_index[spec.wm_key]],
                "outside_range": ledger.outside[key_index[spec.wm_key]],
                "emitted_windows": ledger.emitted_windows.get(spec.name, 0),
            }
            for spec in config.windows
        },
    }


def account(
    ledger: Ledger,
    reads: Reads,
    result: WorkResult,
    config: JobConfig,
    key_index: Mapping[str, int],
    nkeys: int,
    batch: int,
) -> None:
    """Check what Spark saw against the metadata scan, then add the batch to the ledger."""
    ids: list[int] = reads.copy_ids.tolist()
    counts = result.counts
    # The checksum's width is the pass's (rows and tuples do not depend on it).
    expected_rows, expected_tuples, expected_checksum = reads.checksums(bits=counts.checksum_bits if counts else 1)
    if reads and (
        counts is None
        or (counts.rows, counts.tuples, counts.checksum) != (expected_rows, expected_tuples, expected_checksum)
    ):
        seen = (counts.rows, counts.tuples) if counts else (0, 0)
        raise LedgerError(
            f"Spark read {seen[0]} rows ({seen[1]} tuples) of the batch's {len(reads)} buffer copies, whose "
            f"scan counted {expected_rows} rows ({expected_tuples} tuples), or read other copies than those",
            where=Location(file=reads.buffers[0].file, extra={"batch": batch}),
            todo="a file changed while the run read it: let the archiver finish writing and run again",
        )
    if counts is not None and result.late_rows != sum(counts.late):
        raise LedgerError(
            f"the batch wrote {result.late_rows} rows to the late table but counted {sum(counts.late)} late tuples",
            where=Location(file=reads.buffers[0].file, extra={"batch": batch}),
            todo="nothing was committed for this batch; report this with the archive and the checkpoint",
        )
    for cid in ids:
        ledger.processed_xor ^= cid
    if counts is not None:
        for i in range(nkeys):
            ledger.late[i] += counts.late[i]
            ledger.outside[i] += counts.outside[i]
            ledger.no_event[i] += counts.tuples - counts.late[i] - counts.on_time[i] - counts.outside[i]
    for name, c in result.specs.items():
        i = key_index[next(spec.wm_key for spec in config.windows if spec.name == name)]
        on_time = counts.on_time[i] if counts is not None else 0
        ledger.windowed[name] = ledger.windowed.get(name, 0) + c.windowed
        ledger.unwindowed[name] = ledger.unwindowed.get(name, 0) + on_time - c.windowed
        ledger.emitted_owned[name] = ledger.emitted_owned.get(name, 0) + c.emitted_owned
        ledger.emitted_windows[name] = ledger.emitted_windows.get(name, 0) + c.emitted
        # A batch inside a pass has no open-window files of its own: what its open windows own
        # follows from what entered and left them (the pass's last batch checks it on the files).
        derived = ledger.open_owned.get(name, 0) + c.windowed - c.emitted_owned
        ledger.open_owned[name] = derived if c.open_owned is None else c.open_owned
        ledger.open_windows[name] = c.open
