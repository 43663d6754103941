"""The "Replays" page of the Airflow UI: every replay under the roots, with its progress.

An Airflow 3 plugin FastAPI app (mounted by the API server at ``/replay``; it also runs on its own
under uvicorn: ``uvicorn replay_airflow.ui:app``). ``GET /`` is the HTML page, ``GET /api/replays``
the same rows as JSON. Each row: the checkpoint, its output, its state (running, interrupted,
finished), the last batch, the stream cut per origin, ``G_k`` per watermark key, the published
version and the newest version's validation verdict. Checkpoints are read without their lock.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import jinja2
from fastapi import FastAPI
from fastapi.responses import HTMLResponse

__all__ = ["app", "list_replays"]

_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=jinja2.select_autoescape(["html", "j2"]),
    undefined=jinja2.StrictUndefined,
)


def list_replays() -> dict[str, Any]:
    """The roots and one row per checkpoint found under the checkpoint and output roots."""
    from replay.errors import ReplayError
    from replay_airflow.hooks import CheckpointHook, find_checkpoints
    from replay_airflow.roots import configured_roots

    roots = configured_roots()
    rows: list[dict[str, Any]] = []
    for path in find_checkpoints(roots.checkpoint, roots.output):
        base = roots.checkpoint if path.startswith(roots.checkpoint.rstrip(os.sep) + os.sep) else roots.output
        row: dict[str, Any] = {"checkpoint": path, "name": os.path.relpath(path, base)}
        hook = CheckpointHook(checkpoint=path)
        if not hook.exists():
            row.update(state="not started", error=None)
            rows.append(row)
            continue
        try:
            status = hook.status()
        except (ReplayError, OSError, ValueError, KeyError) as exc:
            row.update(state="unreadable", error=str(exc))
            rows.append(row)
            continue
        row.update(
            error=None,
            state=status["state"],
            output=status["output"],
            batch=status["batch"],
            run=status["run"],
            finished=status["finished"],
            range=status["range"],
            stream_cut=status["stream_cut"],
            watermarks=[{"key": k["key"], "global": k["global"], "effective": k["effective"]} for k in status["keys"]],
            windows_emitted=status["windows_emitted"],
            open_windows=status["open_windows"],
            late_tuples=status["late_tuples"],
            pending_tuples=status["pending_tuples"],
            versions=status["versions"],
            published=status["published"],
            run_version=status["run_version"],
            validated=status["validated"],
        )
        rows.append(row)
    return {
        "roots": {"archive": roots.archive, "output": roots.output, "checkpoint": roots.checkpoint},
        "replays": rows,
    }


app = FastAPI(title="Replay", description="Replays under the configured roots, with their progress")


@app.get("/api/replays")
async def replays_json() -> dict[str, Any]:
    return await asyncio.to_thread(list_replays)


@app.get("/", response_class=HTMLResponse)
async def replays_page() -> HTMLResponse:
    data = await asyncio.to_thread(list_replays)
    html = _TEMPLATES.get_template("replays.html.j2").render(**data)
    return HTMLResponse(html)
