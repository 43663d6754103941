"""The plugin's own record of the Airflow runs that wrote each replay's output (the library keeps none).

``replay`` records batches, versions and verdicts, not which Airflow DAG run caused them. The
operators add that here, from the context Airflow passes them: one small JSON file per output
directory, ``<output root>/.replay-airflow/<hash of the output path>.json``, holding the output, the
archive the replay read (with the columns its watermarks come from, for the page's lag) and the
newest ``KEEP`` task entries (DAG id, run id, run type, task id, what it did, the version, when).

Only tasks that change something are recorded: a replay that committed batches, a validation
that wrote a verdict, a publication that changed. A re-run that finds nothing new leaves the
record as it was. Outputs under URI roots are not recorded (the page lists local checkpoints only).
Writers take a file lock beside the record and replace it atomically; a failure to record is
logged and never fails the task.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["KEEP", "read_record", "record_path", "record_task"]

#: Task entries kept per output (older ones are dropped).
KEEP = 30
_DIR = ".replay-airflow"


def record_path(output_root: str, output: str) -> Path | None:
    """The record of ``output`` under ``output_root`` (``None``: a URI root or output)."""
    if "://" in output_root or "://" in output:
        return None
    digest = hashlib.sha256(os.path.abspath(output).encode()).hexdigest()[:20]
    return Path(output_root) / _DIR / f"{digest}.json"


def read_record(output_root: str, output: str) -> dict[str, Any] | None:
    """The record of ``output``, or ``None`` (none yet, unreadable, or for another output)."""
    path = record_path(output_root, output)
    if path is None:
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("output") != os.path.abspath(output):
        return None
    return record


def _context_run(context: Any) -> dict[str, Any] | None:
    dag_run = context.get("dag_run") if hasattr(context, "get") else None
    if dag_run is None:
        return None
    from replay_airflow._compat import run_type

    ti = context.get("ti") or context.get("task_instance")
    return {
        "dag_id": str(dag_run.dag_id),
        "run_id": str(dag_run.run_id),
        "run_type": run_type(context),
        "task_id": str(getattr(ti, "task_id", "") or ""),
        "try_number": getattr(ti, "try_number", None),
    }


def record_task(
    context: Any, output: str, action: str, *, version: int | None, archive: dict[str, Any] | None = None, **facts: Any
) -> None:
    """Add what the task of ``context`` did to ``output`` (``action``: replayed, validated, published).

    ``archive``: the archive the replay read, ``{"path", "keys": {key: {"column", "unit"}}}``.
    Does nothing outside a DAG run (an operator executed directly) and for URI outputs.
    """
    import logging

    log = logging.getLogger(__name__)
    entry = _context_run(context)
    if entry is None:
        return
    try:
        from replay_airflow.roots import configured_roots

        path = record_path(configured_roots().output, output)
        if path is None:
            return
        from filelock import FileLock

        path.parent.mkdir(parents=True, exist_ok=True)
        entry.update(action=action, version=version, at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **facts)
        with FileLock(str(path) + ".lock", timeout=60):
            record = read_record(configured_roots().output, output) or {"output": os.path.abspath(output), "runs": []}
            if archive is not None:
                record["archive"] = archive
            record["runs"] = [*record["runs"], entry][-KEEP:]
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w") as sink:
                json.dump(record, sink, indent=1, sort_keys=True)
            os.replace(tmp, path)
    except Exception as exc:  # the record is a convenience for the page: never fail the task over it
        log.warning("could not record this run in the Replays page's record of %s: %s", output, exc)
