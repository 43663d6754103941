"""The report's sections built from an output version's tables: the watermark timelines, the
lateness histograms, the integrity findings and the corrections, and the display text of
times, numbers and table rows that every section uses (``replay.quality.report`` puts them on
the page). pyarrow, numpy and matplotlib are imported inside the functions that need them."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from replay.core.timeutil import MICROS_PER_SECOND, NEG_INF, format_ts
from replay.core.vocabulary import IntegrityKind
from replay.quality.charts import histogram_chart, timeline_chart
from replay.store.manifest import Manifest

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

__all__ = [
    "INTEGRITY_KINDS",
    "corrections_section",
    "event_column",
    "integrity_section",
    "lateness_section",
    "micros_of",
    "number_list",
    "plain_text",
    "table_rows",
    "time_text",
    "timeline_section",
]

#: Integrity kinds in reading order (an unknown kind is listed after them).
INTEGRITY_KINDS: dict[str, str] = {
    IntegrityKind.GAP: "Gaps (missing sequences)",
    IntegrityKind.INCOMPLETE: "Incomplete sequences (missing chunks)",
    IntegrityKind.SKIPPED: "Skipped sequences (closed by gap_policy: skip)",
    IntegrityKind.REGRESSION: "Watermark regressions",
    IntegrityKind.DUPLICATE: "Duplicates (identical copies discarded)",
    IntegrityKind.CONFLICT: "Conflicts (copies with different content)",
    IntegrityKind.AFTER_SKIP: "Arrived after skip (buffers of sequences closed by gap_policy: skip in an earlier run)",
}
INTEGRITY_ROWS = 200  # rows shown per integrity kind
CORRECTION_ROWS = 100
HISTOGRAM_ORIGINS = 48  # lateness histograms drawn per key; the table below them lists every origin


def time_text(micros: int | None) -> str:
    text = format_ts(micros)
    return "no watermark yet" if text in (None, "-inf") else str(text)


def plain_text(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.10g}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, Mapping | list):
        text = json.dumps(value, default=str, sort_keys=True)
        return text if len(text) <= 160 else text[:157] + "…"
    return str(value)


def micros_of(array: pa.ChunkedArray | pa.Array, *, int_unit: int = 1) -> np.ndarray:
    """A time column as int64 microseconds, nulls as ``NEG_INF`` (numpy's NaT).

    Integer columns are epoch values in units of ``int_unit`` microseconds (1000 for ``time_unit: ms``).
    """
    import numpy as np
    import pyarrow as pa

    if pa.types.is_timestamp(array.type):
        raw = array.cast(pa.int64()).fill_null(NEG_INF).to_numpy()
        # Exact integer scaling (numpy's floor division truncates toward minus infinity); Arrow's
        # unsafe cast would truncate nanoseconds toward zero, one microsecond off below the epoch.
        if array.type.unit == "ns":
            values = np.where(raw == NEG_INF, NEG_INF, np.floor_divide(raw, 1000))
        else:
            scale = {"s": 1_000_000, "ms": 1_000, "us": 1}[array.type.unit]
            values = np.where(raw == NEG_INF, NEG_INF, raw * scale)
    else:
        values = array.cast(pa.int64()).fill_null(NEG_INF).to_numpy()
        values = np.where(values == NEG_INF, NEG_INF, values * int_unit)
    return np.asarray(values, dtype=np.int64)


def number_list(values: list[int], noun: str) -> str:
    """A short list in full, a long one as its count and range."""
    if len(values) <= 10:
        return ", ".join(map(str, values)) or "—"
    return f"{len(values)} {noun} ({min(values)} to {max(values)})"


def table_rows(table: pa.Table, limit: int | None = None) -> tuple[list[str], list[list[str]]]:
    """Column names and rows as display text (timestamps ISO 8601 UTC), the first ``limit`` rows."""
    import pyarrow as pa

    part = table if limit is None else table.slice(0, limit)
    columns: list[list[str]] = []
    for name in part.column_names:
        column = part.column(name)
        if pa.types.is_timestamp(column.type):
            columns.append(["—" if v == NEG_INF else time_text(int(v)) for v in micros_of(column)])
        else:
            columns.append([plain_text(v) for v in column.to_pylist()])
    return list(part.column_names), [list(row) for row in zip(*columns, strict=True)] if columns else []


def event_column(config: Mapping[str, Any], key: str) -> str:
    """The physical event-time column of a watermark key (a role name goes through ``columns``)."""
    declared = config.get("watermarks")
    name = str(declared[key]["event_time"]) if declared and key in declared else "event_time"
    return str((config.get("columns") or {}).get(name, name))


def timeline_section(progress: pa.Table) -> list[dict[str, Any]]:
    import numpy as np

    if progress.num_rows == 0:
        return []
    batch = np.asarray(progress.column("batch").to_numpy(), dtype=np.int64)
    keys = progress.column("wm_key").to_pylist()
    origins = np.asarray(progress.column("origin_id").to_numpy(), dtype=np.int64)
    marks = {
        name: micros_of(progress.column(name))
        for name in ("local_watermark", "global_watermark", "time_window_lower", "time_window_upper")
    }
    result = []
    for key in sorted(set(keys)):
        rows = np.array([k == key for k in keys])
        batches = np.unique(batch[rows])
        per_origin: dict[int, np.ndarray] = {}
        for origin in np.unique(origins[rows]):
            values = np.full(len(batches), NEG_INF, dtype=np.int64)
            mine = rows & (origins == origin)
            values[np.searchsorted(batches, batch[mine])] = marks["local_watermark"][mine]
            per_origin[int(origin)] = values
        first = np.unique(batch[rows], return_index=True)[1]
        index = np.flatnonzero(rows)[first]  # one row per batch: the key's global values repeat per origin
        lines = {name: marks[name][index] for name in ("global_watermark", "time_window_lower", "time_window_upper")}
        image = timeline_chart(key, batches, per_origin, lines)
        result.append({"key": key, "image": image, "batches": len(batches), "origins": len(per_origin)})
    return result


def lateness_section(late: pa.Table, manifest: Manifest, config: Mapping[str, Any]) -> dict[str, Any]:
    import numpy as np
    import pyarrow.compute as pc

    keys = [k["key"] for k in manifest.watermarks or ()]
    int_unit = 1000 if config.get("time_unit") == "ms" else 1
    sections = []
    for key in keys or sorted(set(late.column("wm_key").to_pylist()) if late.num_rows else []):
        rows = late.filter(pc.equal(late.column("wm_key"), key)) if late.num_rows else late
        column = event_column(config, key)
        section: dict[str, Any] = {
            "key": key,
            "event_time": column,
            "total": rows.num_rows,
            "origins": [],
            "note": None,
            "not_drawn": 0,
        }
        sections.append(section)
        if rows.num_rows == 0:
            continue
        if column not in rows.column_names:
            section["note"] = f"the late table has no column {column!r}: lateness cannot be computed"
            continue
        # Exact integer differences first; the division to float seconds only shapes the histogram.
        seconds = (
            micros_of(rows.column("violated_watermark")) - micros_of(rows.column(column), int_unit=int_unit)
        ) / MICROS_PER_SECOND
        origin = np.asarray(rows.column("origin_id").to_numpy(), dtype=np.int64)
        reason = np.array(rows.column("reason").to_pylist(), dtype=object)
        ranked = sorted(np.unique(origin), key=lambda o: (-int((origin == o).sum()), int(o)))
        # Shared bins so that origins compare; Rice's rule on a typical origin's count.
        typical = float(np.median([(origin == o).sum() for o in ranked]))
        edges = np.histogram_bin_edges(seconds, bins=min(40, max(5, round(2 * typical ** (1 / 3)))))
        for i, o in enumerate(ranked):
            mine = origin == o
            values = seconds[mine]
            entry: dict[str, Any] = {
                "origin": int(o),
                "count": plain_text(int(mine.sum())),
                "reasons": ", ".join(f"{r} {n:,}" for r, n in sorted(Counter(reason[mine]).items())),
                "median": f"{float(np.median(values)):.3f}",
                "max": f"{float(values.max()):.3f}",
                "image": None,
            }
            if i < HISTOGRAM_ORIGINS:
                entry["image"] = histogram_chart(key, int(o), values, reason[mine], edges)
            section["origins"].append(entry)
        section["origins"].sort(key=lambda e: e["origin"])
        section["not_drawn"] = max(0, len(ranked) - HISTOGRAM_ORIGINS)
    return {"keys": sections, "total": late.num_rows}


def integrity_section(table: pa.Table) -> dict[str, Any]:
    import pyarrow.compute as pc

    present = Counter(table.column("kind").to_pylist()) if table.num_rows else Counter()
    kinds = [*INTEGRITY_KINDS, *sorted(k for k in present if k not in INTEGRITY_KINDS)]
    sections = []
    for kind in kinds:
        if not present.get(kind):
            continue
        rows = table.filter(pc.equal(table.column("kind"), kind)).drop_columns(["kind"])
        # Columns a kind never fills (a gap has no file) are left out of its table.
        rows = rows.select([n for n in rows.column_names if rows.column(n).null_count < rows.num_rows])
        sort = [(n, "ascending") for n in ("origin_id", "sequence_number", "chunk_number") if n in rows.column_names]
        rows = rows.sort_by(sort) if sort else rows
        columns, shown = table_rows(rows, INTEGRITY_ROWS)
        sections.append(
            {
                "kind": kind,
                "title": INTEGRITY_KINDS.get(kind, kind),
                "columns": columns,
                "rows": shown,
                "more": rows.num_rows - len(shown),
            }
        )
    return {"counts": [(k, INTEGRITY_KINDS.get(k, k), present.get(k, 0)) for k in kinds], "kinds": sections}


def corrections_section(table: pa.Table) -> dict[str, Any] | None:
    if table.num_rows == 0 or "change" not in table.column_names:
        return None
    counts = Counter(table.column("change").to_pylist())
    order = [n for n in ("change", "window", "wm_key", "window_start", "key") if n in table.column_names]
    columns, rows = table_rows(table.sort_by([(n, "ascending") for n in order]), CORRECTION_ROWS)
    return {
        "counts": [(kind, counts.get(kind, 0)) for kind in ("added", "changed", "retracted")],
        "columns": columns,
        "rows": rows,
        "more": table.num_rows - len(rows),
        "total": table.num_rows,
    }
