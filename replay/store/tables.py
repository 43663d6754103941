"""The output tables a run writes besides Spark's (docs/outputs.md#tables): ``progress`` per
batch, ``integrity`` and the manifest of a finished run's version, and the progress record a
commit carries. (The schemas of ``windows`` and ``late`` are the engine's: ``replay.engine.schemas``.)"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from replay.core.config import JobConfig
from replay.core.errors import CheckpointCorruptError
from replay.core.paths import local_path
from replay.core.progress import ProgressSnapshot
from replay.core.rules import RULES_VERSION
from replay.core.timeutil import NEG_INF, format_ts
from replay.core.vocabulary import IntegrityKind
from replay.store import state as _state
from replay.store.checkpoint import CheckpointStore
from replay.store.durable import write_parquet_atomic
from replay.store.outputs import Manifest, encode_schema, list_versions, read_manifest, write_manifest
from replay.store.records import Commit

__all__ = [
    "INTEGRITY_SCHEMA",
    "integrity_from_json",
    "integrity_table",
    "progress_table",
    "snapshot_json",
    "write_run_version",
]


def _ts(value: int) -> int | None:
    return None if value == NEG_INF else value


def progress_table(batch: int, snapshot: ProgressSnapshot) -> pa.Table:
    keys = {k.key: k for k in snapshot.keys}
    rows: dict[str, list[Any]] = {
        name: []
        for name in (
            "batch",
            "wm_key",
            "origin_id",
            "complete_prefix",
            "local_watermark",
            "pending_buffers",
            "global_watermark",
            "time_window_lower",
            "time_window_upper",
            "cut_sequence",
            "cut_chunk",
        )
    }
    for o in snapshot.origins:
        cut = snapshot.stream_cut.get(o.origin)
        key = keys[o.key]
        rows["batch"].append(batch)
        rows["wm_key"].append(o.key)
        rows["origin_id"].append(o.origin)
        rows["complete_prefix"].append(o.complete_prefix)
        rows["local_watermark"].append(_ts(o.local_watermark))
        rows["pending_buffers"].append(o.pending_buffers)
        rows["global_watermark"].append(_ts(key.global_watermark))
        rows["time_window_lower"].append(_ts(key.time_window[0]) if key.time_window else None)
        rows["time_window_upper"].append(_ts(key.time_window[1]) if key.time_window else None)
        rows["cut_sequence"].append(cut[0] if cut else None)
        rows["cut_chunk"].append(cut[1] if cut else None)
    ts = pa.timestamp("us", tz="UTC")
    return pa.table(
        rows,
        schema=pa.schema(
            [
                ("batch", pa.int64()),
                ("wm_key", pa.string()),
                ("origin_id", pa.int64()),
                ("complete_prefix", pa.int64()),
                ("local_watermark", ts),
                ("pending_buffers", pa.int64()),
                ("global_watermark", ts),
                ("time_window_lower", ts),
                ("time_window_upper", ts),
                ("cut_sequence", pa.int64()),
                ("cut_chunk", pa.int64()),
            ]
        ),
    )


INTEGRITY_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("origin_id", pa.int64()),
        ("sequence_number", pa.int64()),
        ("chunk_number", pa.int64()),
        ("wm_key", pa.string()),
        ("tuples", pa.int64()),
        ("file", pa.string()),
        ("other_file", pa.string()),
        ("detail", pa.string()),
    ]
)


_AFTER_SKIP = "its sequence was closed by gap_policy: skip in an earlier run; not replayed"


def integrity_table(snapshot: ProgressSnapshot, discarded: Sequence[_state.Discarded], root: str) -> pa.Table:
    def rel(path: str) -> str:
        local, base = local_path(path), local_path(root)
        if local is not None and base is not None:
            try:
                return str(Path(local).resolve().relative_to(Path(base).resolve()))  # the archive may be relative
            except ValueError:
                return local
        return path

    rows: list[dict[str, Any]] = []
    for origin, seq in snapshot.gaps:
        rows.append({"kind": IntegrityKind.GAP.value, "origin_id": origin, "sequence_number": seq})
    for origin, seq in snapshot.incomplete:
        rows.append({"kind": IntegrityKind.INCOMPLETE.value, "origin_id": origin, "sequence_number": seq})
    for s in snapshot.skipped:
        rows.append(
            {
                "kind": IntegrityKind.SKIPPED.value,
                "origin_id": s.origin,
                "sequence_number": s.sequence,
                "detail": "missing" if s.missing else "chunks " + ",".join(map(str, s.chunks)),
            }
        )
    for r in snapshot.regressions:
        rows.append(
            {
                "kind": IntegrityKind.REGRESSION.value,
                "origin_id": r.origin,
                "sequence_number": r.sequence,
                "wm_key": r.key,
                "detail": f"{r.action}: {format_ts(r.watermark)} after {format_ts(r.previous)}",
            }
        )
    for d in discarded:
        rows.append(
            {
                "kind": d.kind,
                "origin_id": d.origin,
                "sequence_number": d.sequence,
                "chunk_number": d.chunk,
                "tuples": d.tuples,
                "file": rel(d.file),
                "other_file": rel(d.kept_file) if d.kept_file else None,
                "detail": _AFTER_SKIP if d.kind == IntegrityKind.AFTER_SKIP else None,
            }
        )
    return pa.Table.from_pylist(rows, schema=INTEGRITY_SCHEMA)


def snapshot_json(snapshot: ProgressSnapshot) -> dict[str, Any]:
    """The progress state a commit records (for ``replay status`` and the integrity table)."""
    return {
        "keys": [
            {
                "key": k.key,
                "global": k.global_watermark,
                "effective": k.effective_watermark,
                "time_window": list(k.time_window) if k.time_window else None,
                "participants": list(k.participants),
            }
            for k in snapshot.keys
        ],
        "origins": [
            {
                "origin": o.origin,
                "key": o.key,
                "complete_prefix": o.complete_prefix,
                "local_watermark": o.local_watermark,
                "pending_buffers": o.pending_buffers,
                "idle": o.idle,
                "counted": o.counted,
            }
            for o in snapshot.origins
        ],
        "stream_cut": {str(o): list(c) for o, c in snapshot.stream_cut.items()},
        "gaps": [list(g) for g in snapshot.gaps],
        "incomplete": [list(g) for g in snapshot.incomplete],
        "skipped": [{"origin": s.origin, "sequence": s.sequence, "chunks": list(s.chunks)} for s in snapshot.skipped],
        "regressions": [
            {
                "origin": r.origin,
                "sequence": r.sequence,
                "key": r.key,
                "watermark": r.watermark,
                "previous": r.previous,
                "action": r.action,
            }
            for r in snapshot.regressions
        ],
    }


def integrity_from_json(progress: Mapping[str, Any], discarded: Sequence[_state.Discarded], root: str) -> pa.Table:
    from replay.core.progress import Regression, Skipped

    snapshot = ProgressSnapshot(
        mode="",
        origins=(),
        keys=(),
        stream_cut={},
        gaps=tuple((g[0], g[1]) for g in progress["gaps"]),
        incomplete=tuple((g[0], g[1]) for g in progress["incomplete"]),
        skipped=tuple(
            Skipped(origin=s["origin"], sequence=s["sequence"], chunks=tuple(s["chunks"])) for s in progress["skipped"]
        ),
        regressions=tuple(Regression(**r) for r in progress["regressions"]),
    )
    return integrity_table(snapshot, discarded, root)


def write_run_version(
    output: Path, store: CheckpointStore, cid: str, config: JobConfig, commit: Commit, progress: Mapping[str, Any]
) -> tuple[int | None, int | None]:
    """The output version of the run ``commit`` ended: (the one already written, the version).

    Writes it (the ``integrity`` table and the manifest, which lists every batch's output files
    from the batch log) when the commit ends its run and no version names this checkpoint and
    batch yet; ``(None, None)`` for a commit in the middle of a run. ``progress``: the progress
    report of the commit's engine snapshot.
    """
    existing = None
    base: Manifest | None = None  # the checkpoint's newest earlier run version
    for v in reversed(list_versions(output)):
        manifest = read_manifest(output, v)
        if manifest.kind != "run" or manifest.checkpoint_id != cid:
            continue  # a publication names its source's checkpoint and batch too
        if manifest.batch == commit.batch:
            existing = v
            break
        if (manifest.batch or 0) < commit.batch and manifest.log is not None:
            base = manifest
            break
    if existing is not None or not commit.finish:
        return existing, existing
    # The batches since the base version, read from the log after its pointer; all of them when
    # there is no base (or it does not point into this log: a checkpoint repaired since).
    before: dict[str, list[Any]] = {"windows": [], "late": [], "progress": [], "ledger_batches": []}
    entries = None
    if base is not None and base.log is not None and base.ledger_batches is not None:
        try:
            entries = store.read_log(commit.log, since=base.log)
            before = {t: list(base.tables[t]) for t in ("windows", "late", "progress")}
            before["ledger_batches"] = list(base.ledger_batches)
        except (CheckpointCorruptError, KeyError):
            entries = None
    if entries is None:
        entries = store.read_log(commit.log)
    discarded = _state.read_discarded(store.root / commit.discarded) if commit.discarded else []
    consumed = _state.read_consumed(store.root / commit.consumed) if commit.consumed else {}
    integrity = integrity_from_json(progress, discarded, config.archive)
    integrity_rel = f"data/integrity/{cid}-b{commit.batch:08d}-{commit.token}.parquet"
    write_parquet_atomic(integrity, output / integrity_rel)
    tables = {t: before[t] + [p for e in entries if (p := e.outputs.get(t))] for t in ("windows", "late", "progress")}
    written = write_manifest(
        output,
        Manifest(
            checkpoint=str(store.root),
            checkpoint_id=cid,
            batch=commit.batch,
            run=commit.run,
            range=commit.range,
            lateness=commit.lateness,
            tables={t: tuple(paths) for t, paths in tables.items()} | {"integrity": (integrity_rel,)},
            schemas=dict(commit.schemas) | {"integrity": encode_schema(INTEGRITY_SCHEMA)},
            watermarks=progress["keys"],
            counts=dict(commit.ledger),
            # What validation needs without the checkpoint (whose commits are pruned):
            kind="run",
            config=config.model_dump(mode="json"),
            files=tuple(sorted(consumed)),
            origins=progress["origins"],
            ledger_batches=(*before["ledger_batches"], *({"batch": e.batch, **e.ledger} for e in entries)),
            # How far the batch log reached: the next version reads only the batches after it.
            log=commit.log,
            rules=RULES_VERSION,
        ),
    )
    return None, written.version
