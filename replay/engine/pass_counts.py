"""The ledger's counts of a pass: what Spark sums over the rows, and each batch's counts from it.

Every batch's ledger (``replay.runner.ledger``) checks counts of the rows Spark read: rows,
tuples, a checksum of the copy ids, late, on-time and outside-range tuples per key and, per window
aggregation, the on-time tuples its windows own. ``count_terms`` gives them as per-row values to
sum; ``packed`` puts the 0-or-1 ones two to a long and ``unpacked`` takes them apart. A pass of one
batch observes their sums; a pass of several either counts each batch in a branch of its own or,
where they follow (``derives``), derives each batch's counts from the pass's totals and the batch's
rows outside every window (``derived``). ``results`` turns what the pass wrote and observed into
each batch's ``WorkResult``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from replay.core.config import WindowSpec
from replay.core.errors import LedgerError, Location
from replay.engine.passes import Counts, PassWork, SpecCounts, WorkResult
from replay.engine.sink import Written
from replay.engine.windows import WindowColumns, owner_start, owns_its_members, window_end

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = ["PASS", "count_terms", "derived", "derives", "filled", "packed", "results", "unpacked"]


def count_terms(
    specs: Sequence[WindowSpec],
    spec_cols: Mapping[int, WindowColumns],
    key_index: Mapping[str, int],
    nkeys: int,
    *,
    bounded: bool,
) -> tuple[list[tuple[str, Column]], dict[str, str | None]]:
    """What the ledger checks of each batch, as per-row values to sum over its rows: rows, tuples,
    the copy checksum (a long per row, ``PassWork.checksum_bits``), late, on-time and outside-range
    tuples per key and, per window aggregation, the on-time tuples a window of it owns (``owner_start``).

    A count that is the same as another on every row is not summed twice: it is in the second
    result, by name, with the count it equals (``None``: 0), for ``filled``. Without a backfill
    range (``bounded`` false) no tuple is outside it; a window aggregation whose windows own each
    tuple they hold (tumbling, no range start) owns every on-time tuple of its key. Each count
    summed is one more aggregate per window group of the first window aggregation, where a pass's
    counts ride."""
    from pyspark.sql import functions as F

    def one(condition: Column) -> Column:
        return F.when(condition, F.lit(1)).otherwise(F.lit(0))

    terms = [
        ("rows", F.lit(1)),
        ("tuples", one(F.col("_tuple"))),
        ("checksum", F.col("d_weight")),
    ]
    same: dict[str, str | None] = {}
    for k in range(nkeys):
        terms += [(f"late{k}", one(F.col(f"_late{k}"))), (f"on{k}", one(F.col(f"_on{k}")))]
        if bounded:
            terms.append((f"out{k}", one(F.col(f"_out{k}"))))
        else:
            same[f"out{k}"] = None
    for s, spec in enumerate(specs):
        i, cols = key_index[spec.wm_key], spec_cols[s]
        t = F.col(f"_ev{i}")
        if owns_its_members(spec, cols) and cols.range_start is None:
            same[f"win{s}"] = f"on{i}"  # every on-time tuple has its owner window
            continue
        owner = owner_start(t, spec, cols)
        kept = F.col(f"_on{i}") & (window_end(owner, spec) > t)
        if cols.range_start is not None:
            kept = kept & (owner >= F.lit(cols.range_start))
        terms.append((f"win{s}", one(kept)))
    return terms, same


def filled(counts: Mapping[str, Any], same: Mapping[str, str | None]) -> dict[str, Any]:
    """``counts`` (``<name>_<batch>``) with the counts ``count_terms`` did not sum: each batch's
    is the one it equals, or 0."""
    out = dict(counts)
    batches = {key.rpartition("_")[2] for key in counts}
    for name, source in same.items():
        for batch in batches:
            out[f"{name}_{batch}"] = 0 if source is None else counts.get(f"{source}_{batch}", 0)
    return out


def derives(specs: Sequence[WindowSpec], spec_cols: Mapping[int, WindowColumns], nkeys: int) -> bool:
    """Whether each batch's counts follow from the pass's totals and the batch's rows outside every
    window (``derived``): one watermark key, and window aggregations whose windows own every
    on-time tuple they hold (tumbling, no backfill range). A row inside a window of the first one
    is then an on-time tuple and entered a window of each; nothing else about it is counted."""
    tumbling = all(
        owns_its_members(spec, spec_cols[s]) and spec_cols[s].range_start is None for s, spec in enumerate(specs)
    )
    return nkeys == 1 and bool(specs) and tumbling


#: The suffix of a pass's observed totals (``derived``), where a batch's counts have its number.
PASS = "pass"


def derived(
    work: PassWork,
    specs: Sequence[WindowSpec],
    written: Sequence[Written],
    totals: Mapping[str, Any],
    outside: Mapping[str, Any],
) -> dict[str, int]:
    """Each batch's counts (``<name>_<batch>``) in a pass of several batches (``derives``), from
    what the pass observed over all its rows (``totals``: ``<name>_pass``), each batch's sums over
    its rows outside every window (``outside``; a count absent there is 0: where the pass took its
    counts from the groups, the rows outside every window hold no late and no on-time tuple, and
    only their number is there) and its rows written to the ``late`` table.

    A batch's other rows are inside a window: on-time tuples that entered a window of every
    aggregation. Their number is the batch's rows (the scan's count of its copies) less the
    others; its rows, tuples and copy checksum are the scan's. The batches' counts must add up to
    the pass's totals, term by term, or the pass raises ``LedgerError`` before any batch commits:
    the totals are what Spark read, so the rows, tuples and copy checksum are checked for the pass
    (as for a pass of one batch), and the late, on-time, outside and windowed counts for each batch.
    """
    late_written: dict[int, int] = {}
    for w in written:
        kind, _, batch = w.part.partition(":")
        if kind == "late":
            late_written[int(batch)] = late_written.get(int(batch), 0) + w.rows
    out: dict[str, int] = {}
    for step in work.steps:
        b = step.batch
        rows, tuples, checksum = work.reads.checksums(b, bits=work.checksum_bits)

        def rest(name: str, batch: int = b) -> int:
            return int(outside.get(f"{name}_{batch}") or 0)

        late = late_written.get(b, 0)
        inside = rows - rest("rows") - late
        out |= {
            f"rows_{b}": rows,
            f"tuples_{b}": tuples,
            f"checksum_{b}": checksum,
            f"late0_{b}": late + rest("late0"),
            f"on0_{b}": inside + rest("on0"),
            f"out0_{b}": rest("out0"),
        }
        out |= {f"win{s}_{b}": inside + rest(f"win{s}") for s in range(len(specs))}
    names = ["rows", "tuples", "checksum", "late0", "on0", "out0", *[f"win{s}" for s in range(len(specs))]]
    for name in names:
        seen = int(totals.get(f"{name}_{PASS}") or 0)
        summed = sum(out[f"{name}_{step.batch}"] for step in work.steps)
        if seen != summed:
            first, last = work.steps[0].batch, work.steps[-1].batch
            read = name in ("rows", "tuples", "checksum")
            raise LedgerError(
                f"Spark counted {seen} for {name!r} over the rows of batches {first} to {last}, and the batches' "
                f"counts add up to {summed}" + (": it read other rows than the scan counted" if read else ""),
                where=Location(file=work.reads.buffers[0].file if len(work.reads) else None, extra={"batch": first}),
                todo=(
                    "a file changed while the run read it: let the archiver finish writing and run again"
                    if read
                    else "nothing was committed for these batches; report this with the archive and the checkpoint"
                ),
            )
    return out


#: The ledger's count that is not 0 or 1 per row (the copy checksum).
_CHECKSUMS = ("checksum",)
_PACKED_ROWS = 2**31  # a pass with fewer rows packs its 0-or-1 counts two to a long


def packed(terms: Sequence[tuple[str, Column]], rows: int) -> list[tuple[str, Column]]:
    """``terms`` with the counts that are 0 or 1 per row two to a long (``a|b``: ``a + (b << 32)``)
    when the pass reads fewer than 2**31 rows: a sum of either is then at most the pass's rows, so
    ``a`` stays in the low 32 bits and ``b << 32`` below 2**63. Each count is one more aggregate per
    window group of the first window aggregation, where a one-batch pass's counts ride: half as
    many aggregates (docs/performance-record.md). ``unpacked`` takes them apart."""
    from pyspark.sql import functions as F

    if rows >= _PACKED_ROWS:
        return list(terms)
    flags = [(name, value) for name, value in terms if name not in _CHECKSUMS]
    out = [(name, value) for name, value in terms if name in _CHECKSUMS]
    for j in range(0, len(flags) - 1, 2):
        (a, low), (b, high) = flags[j], flags[j + 1]
        out.append((f"{a}|{b}", low.cast("long") + F.shiftleft(high.cast("long"), 32)))
    if len(flags) % 2:
        out.append(flags[-1])
    return out


def unpacked(counts: Mapping[str, Any]) -> dict[str, Any]:
    """Counts by ``<name>_<batch>``, the packed ones (``packed``) taken apart."""
    out: dict[str, Any] = {}
    for key, value in counts.items():
        name, _, batch = key.rpartition("_")
        if "|" not in name:
            out[key] = value
            continue
        low, high = name.split("|")
        out[f"{low}_{batch}"] = int(value) & 0xFFFFFFFF
        out[f"{high}_{batch}"] = int(value) >> 32
    return out


def results(
    work: PassWork,
    specs: Sequence[WindowSpec],
    nkeys: int,
    written: Sequence[Written],
    metrics: Mapping[str, Any],
) -> dict[int, WorkResult]:
    """Each batch's result from what the pass wrote and observed: its counts, its emitted and open windows."""

    totals: dict[str, tuple[int, int]] = {}
    # Per window aggregation: (first batch with a tuple in the window, the batch it was due at, or
    # None: still open) -> windows.
    spans: dict[int, dict[tuple[int, int | None], int]] = {s: {} for s in range(len(specs))}
    for w in written:
        rows, owned = totals.get(w.part, (0, 0))
        totals[w.part] = (rows + w.rows, owned + w.owned)
        kind, _, rest = w.part.partition(":")
        if kind in ("windows", "open"):
            number, _, due = rest.partition(":")
            span = spans[int(number)]
            for first, n in w.firsts.items():
                key = (first, int(due) if due else None)
                span[key] = span.get(key, 0) + n

    last = work.steps[-1].batch
    results: dict[int, WorkResult] = {}
    for step in work.steps:
        b = step.batch
        seen = metrics.get(f"rows_{b}", 0) > 0
        counts = (
            Counts(
                rows=int(metrics[f"rows_{b}"]),
                tuples=int(metrics[f"tuples_{b}"]),
                checksum=int(metrics[f"checksum_{b}"]),
                checksum_bits=work.checksum_bits,
                late=tuple(int(metrics[f"late{k}_{b}"]) for k in range(nkeys)),
                on_time=tuple(int(metrics[f"on{k}_{b}"]) for k in range(nkeys)),
                outside=tuple(int(metrics[f"out{k}_{b}"]) for k in range(nkeys)),
            )
            if seen
            else None
        )
        spec_counts: dict[str, SpecCounts] = {}
        for s, spec in enumerate(specs):
            emitted, emitted_owned = totals.get(f"windows:{s}:{b}", (0, 0))
            still_open = sum(n for (first, due), n in spans[s].items() if first <= b and (due is None or due > b))
            open_rows, open_owned = totals.get(f"open:{s}", (0, 0))
            spec_counts[spec.name] = SpecCounts(
                windowed=int(metrics[f"win{s}_{b}"]) if seen else 0,
                emitted=emitted,
                emitted_owned=emitted_owned,
                open=still_open,
                open_owned=open_owned if b == last else None,
                open_dir=work.state_dirs[spec.name] if b == last and open_rows else None,
            )
        late_rows = totals.get(f"late:{b}", (0, 0))[0]
        results[b] = WorkResult(
            counts=counts,
            specs=spec_counts,
            windows_written=any(totals.get(f"windows:{s}:{b}", (0, 0))[0] for s in range(len(specs))),
            late_written=late_rows > 0,
            late_rows=late_rows,
        )
    return results
