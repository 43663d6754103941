"""``replay report``: one self-contained HTML page about an output version (docs/validation.md#report).

The page shows the run's summary numbers, the watermark timeline per key (local
watermark per origin, global watermark, reader time window, per batch), the
lateness histogram per origin and key, the integrity findings (gaps, incomplete
and skipped sequences, regressions, duplicates, conflicts), the validation
verdict with a link to the Data Docs, the corrections against the previous
publication, and, when a checkpoint is given, its stream cut and watermarks.

Everything is read from the output location (and the checkpoint): no Spark. The
page embeds its charts as PNG data URIs and its CSS inline, so it opens offline
and can be mailed or attached to an Airflow task as one file. matplotlib, Jinja2
and ``pyarrow.compute`` are imported inside the functions that need them:
importing ``replay`` stays light.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replay.core.timeutil import MICROS_PER_SECOND, NEG_INF, format_ts
from replay.core.vocabulary import IntegrityKind
from replay.quality.charts import REASON_COLOURS, histogram_chart, timeline_chart
from replay.store.outputs import (
    current_version,
    list_versions,
    read_manifest,
    read_table,
    read_validation,
    resolve_version,
)
from replay.store.status import checkpoint_status

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

__all__ = ["write_report"]

#: Integrity kinds in reading order (an unknown kind is listed after them).
INTEGRITY_KINDS: dict[str, str] = {
    IntegrityKind.GAP: "Gaps (missing sequences)",
    IntegrityKind.INCOMPLETE: "Incomplete sequences (missing chunks)",
    IntegrityKind.SKIPPED: "Skipped sequences (closed by gap_policy: skip)",
    IntegrityKind.REGRESSION: "Watermark regressions",
    IntegrityKind.DUPLICATE: "Duplicates (identical copies discarded)",
    IntegrityKind.CONFLICT: "Conflicts (copies with different content)",
}
_INTEGRITY_ROWS = 200  # rows shown per integrity kind
_CORRECTION_ROWS = 100
_HISTOGRAM_ORIGINS = 48  # lateness histograms drawn per key; the table below them lists every origin


def write_report(
    output: str | Path, checkpoint: str | Path | None, to: str | Path, *, version: int | None = None
) -> Path:
    """Write the HTML report of an output version to ``to/index.html`` and return that path.

    ``version=None`` reports the published version, or the newest one when none is
    published. ``checkpoint`` adds its stream cut, watermarks and last batch; ``None``
    leaves that section out. ``to`` is created if needed; an earlier ``index.html``
    there is replaced atomically.

    Raises:
        ConfigError: the output holds no version (or not ``version``), or no committed
            checkpoint is at ``checkpoint``.
    """
    root = Path(output)
    number = resolve_version(root, version)
    manifest = read_manifest(root, number)
    target = Path(to)
    status = checkpoint_status(checkpoint) if checkpoint is not None else None
    config: dict[str, Any] = manifest.get("config") or {}
    integrity = read_table(root, "integrity", number)
    progress = read_table(root, "progress", number)
    context = {
        "header": _header(root, number, manifest),
        "summary": _summary(manifest, progress, integrity),
        "timelines": _timelines(progress),
        "lateness": _lateness(read_table(root, "late", number), manifest, config),
        "integrity": _integrity(integrity),
        "validation": _validation(root, number, manifest, target),
        "corrections": _corrections(read_table(root, "corrections", number)),
        "checkpoint": _checkpoint(status, root) if status is not None else None,
        "reason_colours": REASON_COLOURS,
        "text_columns": ("wm_key", "file", "other_file", "detail"),
        "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    html = _render(context)
    target.mkdir(parents=True, exist_ok=True)
    path = target / "index.html"
    tmp = target / f".index.html.{os.getpid()}.tmp"
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------- values


def _ts(micros: int | None) -> str:
    text = format_ts(micros)
    return "no watermark yet" if text in (None, "-inf") else str(text)


def _plain(value: Any) -> str:
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


def _micros(array: pa.ChunkedArray | pa.Array, *, int_unit: int = 1) -> np.ndarray:
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


def _numbers(values: list[int], noun: str) -> str:
    """A short list in full, a long one as its count and range."""
    if len(values) <= 10:
        return ", ".join(map(str, values)) or "—"
    return f"{len(values)} {noun} ({min(values)} to {max(values)})"


def _rows(table: pa.Table, limit: int | None = None) -> tuple[list[str], list[list[str]]]:
    """Column names and rows as display text (timestamps ISO 8601 UTC), the first ``limit`` rows."""
    import pyarrow as pa

    part = table if limit is None else table.slice(0, limit)
    columns: list[list[str]] = []
    for name in part.column_names:
        column = part.column(name)
        if pa.types.is_timestamp(column.type):
            columns.append(["—" if v == NEG_INF else _ts(int(v)) for v in _micros(column)])
        else:
            columns.append([_plain(v) for v in column.to_pylist()])
    return list(part.column_names), [list(row) for row in zip(*columns, strict=True)] if columns else []


# --------------------------------------------------------------------------- sections


def _header(root: Path, number: int, manifest: Mapping[str, Any]) -> dict[str, Any]:
    current = current_version(root)
    if current == number:
        published = "published (current)"
    elif current is None:
        published = "not published (nothing is published yet)"
    else:
        published = f"not published (the current publication is version {current})"
    config = manifest.get("config") or {}
    return {
        "output": str(root),
        "version": number,
        "versions": _numbers(list_versions(root), "versions"),
        "published": current == number,
        "published_text": published,
        "archive": config.get("archive", "—"),
        "lateness": manifest.get("lateness", config.get("lateness", "—")),
        "created": manifest.get("created", "—"),
        "kind": _kind(manifest),
        "checkpoint_id": manifest.get("checkpoint_id", "—"),
        "run": manifest.get("run"),
        "batch": manifest.get("batch"),
        "range": _range(manifest.get("range") or [None, None]),
    }


def _kind(manifest: Mapping[str, Any]) -> str:
    if manifest.get("kind") != "publication":
        return str(manifest.get("kind", "run"))
    previous = manifest.get("previous")
    return f"publication of version {manifest.get('source')}" + (
        f", after publication {previous}" if previous is not None else ", the first"
    )


def _range(bounds: list[int | None]) -> str:
    if bounds[0] is None and bounds[1] is None:
        return "the whole archive"
    return f"[{format_ts(bounds[0]) or 'open'}, {format_ts(bounds[1]) or 'open'})"


def _summary(manifest: Mapping[str, Any], progress: pa.Table, integrity: pa.Table) -> dict[str, Any]:
    counts: dict[str, Any] = manifest.get("counts") or {}
    keys: list[dict[str, Any]] = list(manifest.get("watermarks") or [])
    config = manifest.get("config") or {}
    read = int(counts.get("tuples_read", 0))
    late = [int(n) for n in counts.get("late", [])]
    ledger = manifest.get("ledger_batches") or []
    pending_buffers = {int(o["origin"]): int(o["pending_buffers"]) for o in manifest.get("origins") or []}
    kinds = Counter(integrity.column("kind").to_pylist()) if "kind" in integrity.column_names else Counter()
    batches = len(set(progress.column("batch").to_pylist())) if "batch" in progress.column_names else len(ledger)
    cards = [
        ("Tuples read", _plain(read), f"in {batches:,} micro-batch(es)"),
        ("Windows emitted", _plain(sum(counts.get("emitted_windows", {}).values())), "final"),
        ("Windows open", _plain(sum(counts.get("open_windows", {}).values())), "carried in the checkpoint"),
        (
            "Late tuples",
            _plain(sum(late)),
            f"{100 * sum(late) / read:.2f} % of tuples read" if read and len(late) == 1 else "summed over keys",
        ),
        (
            "Pending tuples",
            _plain(ledger[-1].get("pending")) if ledger else "—",
            f"{sum(pending_buffers.values()):,} buffer(s) beyond a complete prefix",
        ),
        (
            "Duplicates",
            _plain(counts.get("discarded_copies", 0)),
            f"copies discarded ({int(counts.get('discarded_tuples', 0)):,} tuples)",
        ),
        ("Gaps", _plain(kinds.get("gap", 0)), f"{kinds.get('incomplete', 0):,} incomplete sequence(s)"),
        ("Conflicts", _plain(kinds.get("conflict", 0)), f"{kinds.get('regression', 0):,} regression(s)"),
    ]
    declared = config.get("watermarks") or {}
    key_rows = []
    for i, key in enumerate(keys):
        spec = declared.get(key["key"], {})
        window = key.get("time_window") or [None, None]
        key_rows.append(
            {
                "key": key["key"],
                "event_time": _event_column(config, key["key"]),
                "allowed_lateness": spec.get("allowed_lateness", "0s"),
                "global": _ts(key.get("global")),
                "effective": _ts(key.get("effective")),
                "lower": _ts(window[0]),
                "upper": _ts(window[1]),
                "origins": _numbers(key.get("participants", []), "origins"),
                "late": _plain(late[i]) if i < len(late) else "—",
            }
        )
    window_rows = []
    for spec in config.get("windows") or []:
        name = spec["name"]
        shape = spec["size"] if spec["kind"] == "tumbling" else f"{spec['size']} every {spec['slide']}"
        window_rows.append(
            {
                "name": name,
                "key": spec["wm_key"],
                "shape": f"{spec['kind']} {shape}" + (f" + {spec['offset']}" if spec.get("offset") != "0s" else ""),
                "aggregations": ", ".join(
                    a["fn"] if a["column"] is None else f"{a['fn']}({a['column']})" for a in spec["aggregations"]
                ),
                "emitted": _plain(counts.get("emitted_windows", {}).get(name)),
                "open": _plain(counts.get("open_windows", {}).get(name)),
                "entered": _plain(counts.get("windowed", {}).get(name)),
            }
        )
    return {"cards": cards, "keys": key_rows, "windows": window_rows}


def _event_column(config: Mapping[str, Any], key: str) -> str:
    """The physical event-time column of a watermark key (a role name goes through ``columns``)."""
    declared = config.get("watermarks")
    name = str(declared[key]["event_time"]) if declared and key in declared else "event_time"
    return str((config.get("columns") or {}).get(name, name))


def _timelines(progress: pa.Table) -> list[dict[str, Any]]:
    import numpy as np

    if progress.num_rows == 0:
        return []
    batch = np.asarray(progress.column("batch").to_numpy(), dtype=np.int64)
    keys = progress.column("wm_key").to_pylist()
    origins = np.asarray(progress.column("origin_id").to_numpy(), dtype=np.int64)
    marks = {
        name: _micros(progress.column(name))
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


def _lateness(late: pa.Table, manifest: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    import numpy as np
    import pyarrow.compute as pc

    keys = [k["key"] for k in manifest.get("watermarks") or []]
    int_unit = 1000 if config.get("time_unit") == "ms" else 1
    sections = []
    for key in keys or sorted(set(late.column("wm_key").to_pylist()) if late.num_rows else []):
        rows = late.filter(pc.equal(late.column("wm_key"), key)) if late.num_rows else late
        column = _event_column(config, key)
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
            _micros(rows.column("violated_watermark")) - _micros(rows.column(column), int_unit=int_unit)
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
                "count": _plain(int(mine.sum())),
                "reasons": ", ".join(f"{r} {n:,}" for r, n in sorted(Counter(reason[mine]).items())),
                "median": f"{float(np.median(values)):.3f}",
                "max": f"{float(values.max()):.3f}",
                "image": None,
            }
            if i < _HISTOGRAM_ORIGINS:
                entry["image"] = histogram_chart(key, int(o), values, reason[mine], edges)
            section["origins"].append(entry)
        section["origins"].sort(key=lambda e: e["origin"])
        section["not_drawn"] = max(0, len(ranked) - _HISTOGRAM_ORIGINS)
    return {"keys": sections, "total": late.num_rows}


def _integrity(table: pa.Table) -> dict[str, Any]:
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
        columns, shown = _rows(rows, _INTEGRITY_ROWS)
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


def _validation(root: Path, number: int, manifest: Mapping[str, Any], target: Path) -> dict[str, Any] | None:
    """The version's validation record; a publication's is its source version's (publish requires it)."""
    validated = number
    record = read_validation(root, number)
    if record is None and manifest.get("kind") == "publication" and manifest.get("source") is not None:
        validated = int(manifest["source"])
        record = read_validation(root, validated)
    if record is None:
        return None
    docs = record.get("data_docs")
    link = exists = None
    if docs:
        docs_path = (root / docs).resolve()
        exists = docs_path.exists()
        try:
            link = Path(os.path.relpath(docs_path, target.resolve())).as_posix()
        except ValueError:  # another drive on Windows: no relative path exists
            link = docs_path.as_uri()
    suites = []
    for suite in record.get("suites") or []:
        expectations = [
            {
                "type": e.get("type", "—"),
                "description": e.get("description") or "",
                "error": _plain(e["error"]) if e.get("error") else "",
                "column": ", ".join(map(str, e["column"]))
                if isinstance(e.get("column"), list)
                else e.get("column") or "—",
                "success": bool(e.get("success")),
                "unexpected": _plain(e.get("unexpected_count")),
                "observed": _plain(e.get("observed_value")),
                "examples": "" if e.get("success") else _plain(e.get("unexpected_examples") or None),
            }
            for e in suite.get("expectations") or []
        ]
        expectations.sort(key=lambda e: e["success"])  # failures first
        suites.append(
            {
                "name": suite.get("name", "—"),
                "success": bool(suite.get("success")),
                "evaluated": suite.get("evaluated", len(expectations)),
                "failed": suite.get("failed", sum(not e["success"] for e in expectations)),
                "expectations": expectations,
            }
        )
    return {
        "version": validated,
        "success": bool(record.get("success")),
        "validated_at": record.get("validated_at", "—"),
        "data_docs": link,
        "data_docs_exists": exists,
        "suites": suites,
    }


def _corrections(table: pa.Table) -> dict[str, Any] | None:
    if table.num_rows == 0 or "change" not in table.column_names:
        return None
    counts = Counter(table.column("change").to_pylist())
    order = [n for n in ("change", "window", "wm_key", "window_start", "key") if n in table.column_names]
    columns, rows = _rows(table.sort_by([(n, "ascending") for n in order]), _CORRECTION_ROWS)
    return {
        "counts": [(kind, counts.get(kind, 0)) for kind in ("added", "changed", "retracted")],
        "columns": columns,
        "rows": rows,
        "more": table.num_rows - len(rows),
        "total": table.num_rows,
    }


def _checkpoint(status: Mapping[str, Any], root: Path) -> dict[str, Any]:
    def show(value: str | None) -> str:
        return "no watermark yet" if value is None else value

    writes_here = Path(status["output"]).resolve() == root.resolve()
    return {
        "path": status["checkpoint"],
        "output": status["output"],
        "writes_here": writes_here,
        "batch": status["batch"],
        "run": status["run"],
        "finished": status["finished"],
        "commits": ", ".join(str(c) for c in status["commits"]),
        "lateness": status["lateness"],
        "stream_cut": [(o, c[0], c[1]) for o, c in status["stream_cut"].items()],
        "keys": [
            {
                "key": k["key"],
                "global": show(k["global"]),
                "effective": show(k["effective"]),
                "lower": show(k["time_window_lower"]),
                "upper": show(k["time_window_upper"]),
                "origins": _numbers(k["participants"], "origins"),
                "late": _plain(status["late_tuples"].get(k["key"])),
            }
            for k in status["keys"]
        ],
        "open_windows": ", ".join(f"{n}: {c:,}" for n, c in status["open_windows"].items()) or "—",
        "pending": f"{status['pending_buffers']:,} buffer(s), {status['pending_tuples']:,} tuple(s)",
        "gaps": ", ".join(f"origin {o} sequence {s}" for o, s in status["gaps"][:20])
        + (f" … {len(status['gaps']) - 20} more" if len(status["gaps"]) > 20 else ""),
    }


def _render(context: Mapping[str, Any]) -> str:
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("replay.quality", "templates"),
        autoescape=True,  # the template ends in .j2, which select_autoescape would not recognise
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return environment.get_template("report.html.j2").render(**context)
