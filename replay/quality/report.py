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

import os
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replay.core.errors import storage_errors
from replay.core.rules import mixed_rules, rules_name
from replay.core.timeutil import format_ts
from replay.quality.charts import REASON_COLOURS
from replay.quality.report_tables import (
    corrections_section,
    event_column,
    integrity_section,
    lateness_section,
    number_list,
    plain_text,
    time_text,
    timeline_section,
)
from replay.store.outputs import (
    Manifest,
    current_version,
    list_versions,
    read_manifest,
    read_table,
    read_validation,
    resolve_version,
)
from replay.store.status import checkpoint_status

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["write_report"]


@storage_errors("the report may be incomplete: write it again")
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
    config: Mapping[str, Any] = manifest.config or {}
    integrity = read_table(root, "integrity", number)
    progress = read_table(root, "progress", number)
    context = {
        "header": _header(root, number, manifest),
        "summary": _summary(manifest, progress, integrity),
        "timelines": timeline_section(progress),
        "lateness": lateness_section(read_table(root, "late", number), manifest, config),
        "integrity": integrity_section(integrity),
        "validation": _validation(root, number, manifest, target),
        "corrections": corrections_section(read_table(root, "corrections", number)),
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


# --------------------------------------------------------------------------- sections
# (the sections drawn from the tables, and the display text of values: replay.quality.report_tables)


def _header(root: Path, number: int, manifest: Manifest) -> dict[str, Any]:
    current = current_version(root)
    if current == number:
        published = "published (current)"
    elif current is None:
        published = "not published (nothing is published yet)"
    else:
        published = f"not published (the current publication is version {current})"
    config = manifest.config or {}
    return {
        "output": str(root),
        "version": number,
        "versions": number_list(list_versions(root), "versions"),
        "published": current == number,
        "published_text": published,
        "archive": config.get("archive", "—"),
        "lateness": manifest.lateness if manifest.lateness is not None else config.get("lateness", "—"),
        "created": manifest.created or "—",
        "kind": _kind(manifest),
        "checkpoint_id": manifest.checkpoint_id if manifest.checkpoint_id is not None else "—",
        "run": manifest.run,
        "batch": manifest.batch,
        "range": _range(manifest.range or (None, None)),
        "rules": _rules(manifest),
    }


def _rules(manifest: Manifest) -> str:
    """The rules version(s) the version's rows were computed by (docs/outputs.md#rules-version)."""
    if manifest.merged_rules:
        return mixed_rules(manifest.merged_rules, manifest.rules)
    return rules_name(manifest.rules)


def _kind(manifest: Manifest) -> str:
    if manifest.kind != "publication":
        return manifest.kind
    previous = manifest.previous
    return f"publication of version {manifest.source}" + (
        f", after publication {previous}" if previous is not None else ", the first"
    )


def _range(bounds: tuple[int | None, int | None]) -> str:
    if bounds[0] is None and bounds[1] is None:
        return "the whole archive"
    return f"[{format_ts(bounds[0]) or 'open'}, {format_ts(bounds[1]) or 'open'})"


def _summary(manifest: Manifest, progress: pa.Table, integrity: pa.Table) -> dict[str, Any]:
    counts: Mapping[str, Any] = manifest.counts or {}
    keys: list[Mapping[str, Any]] = list(manifest.watermarks or ())
    config = manifest.config or {}
    read = int(counts.get("tuples_read", 0))
    late = [int(n) for n in counts.get("late", [])]
    ledger = manifest.ledger_batches or ()
    pending_buffers = {int(o["origin"]): int(o["pending_buffers"]) for o in manifest.origins or ()}
    kinds = Counter(integrity.column("kind").to_pylist()) if "kind" in integrity.column_names else Counter()
    batches = len(set(progress.column("batch").to_pylist())) if "batch" in progress.column_names else len(ledger)
    cards = [
        ("Tuples read", plain_text(read), f"in {batches:,} micro-batch(es)"),
        ("Windows emitted", plain_text(sum(counts.get("emitted_windows", {}).values())), "final"),
        ("Windows open", plain_text(sum(counts.get("open_windows", {}).values())), "carried in the checkpoint"),
        (
            "Late tuples",
            plain_text(sum(late)),
            f"{100 * sum(late) / read:.2f} % of tuples read" if read and len(late) == 1 else "summed over keys",
        ),
        (
            "Pending tuples",
            plain_text(ledger[-1].get("pending")) if ledger else "—",
            f"{sum(pending_buffers.values()):,} buffer(s) beyond a complete prefix",
        ),
        (
            "Duplicates",
            plain_text(counts.get("discarded_copies", 0)),
            f"copies discarded ({int(counts.get('discarded_tuples', 0)):,} tuples)",
        ),
        ("Gaps", plain_text(kinds.get("gap", 0)), f"{kinds.get('incomplete', 0):,} incomplete sequence(s)"),
        ("Conflicts", plain_text(kinds.get("conflict", 0)), f"{kinds.get('regression', 0):,} regression(s)"),
    ]
    declared = config.get("watermarks") or {}
    key_rows = []
    for i, key in enumerate(keys):
        spec = declared.get(key["key"], {})
        window = key.get("time_window") or [None, None]
        key_rows.append(
            {
                "key": key["key"],
                "event_time": event_column(config, key["key"]),
                "allowed_lateness": spec.get("allowed_lateness", "0s"),
                "global": time_text(key.get("global")),
                "effective": time_text(key.get("effective")),
                "lower": time_text(window[0]),
                "upper": time_text(window[1]),
                "origins": number_list(key.get("participants", []), "origins"),
                "late": plain_text(late[i]) if i < len(late) else "—",
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
                "emitted": plain_text(counts.get("emitted_windows", {}).get(name)),
                "open": plain_text(counts.get("open_windows", {}).get(name)),
                "entered": plain_text(counts.get("windowed", {}).get(name)),
            }
        )
    return {"cards": cards, "keys": key_rows, "windows": window_rows}


def _validation(root: Path, number: int, manifest: Manifest, target: Path) -> dict[str, Any] | None:
    """The version's validation record; a publication's is its source version's (publish requires it)."""
    validated = number
    record = read_validation(root, number)
    if record is None and manifest.kind == "publication" and manifest.source is not None:
        validated = manifest.source
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
                "error": plain_text(e["error"]) if e.get("error") else "",
                "column": ", ".join(map(str, e["column"]))
                if isinstance(e.get("column"), list)
                else e.get("column") or "—",
                "success": bool(e.get("success")),
                "unexpected": plain_text(e.get("unexpected_count")),
                "observed": plain_text(e.get("observed_value")),
                "examples": "" if e.get("success") else plain_text(e.get("unexpected_examples") or None),
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
                "origins": number_list(k["participants"], "origins"),
                "late": plain_text(status["late_tuples"].get(k["key"])),
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
