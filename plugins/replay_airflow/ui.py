"""The "Replays" page of the Airflow UI: every replay under the roots, with its progress.

An Airflow 3 plugin FastAPI app (mounted by the API server at ``/replay``; it also runs on its own
under uvicorn: ``uvicorn replay_airflow.ui:app``). ``GET /`` is the HTML page, ``GET /api/replays``
the same rows as JSON. Both need an Airflow user allowed to read the website, through Airflow's own
FastAPI security dependency (the auth manager's JWT as a Bearer token, or the UI's ``_token`` cookie):
Airflow does not authenticate plugin apps itself. Without a user the JSON answers 401 and the page
redirects to the auth manager's login. Each row: the checkpoint, its output, its state (running, interrupted,
finished), the last batch, the stream cut per origin, ``G_k`` per watermark key, the published
version and the newest version's validation verdict. Checkpoints are read without their lock.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import jinja2
from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
from airflow.api_fastapi.core_api.security import requires_access_view
from fastapi import Depends, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException

__all__ = ["app", "list_replays", "requires_read"]

#: Airflow's dependency for its own UI's pages: an authenticated user the auth manager lets read the
#: website (401 without a user, 403 without the permission). Tests override it to look at the page alone.
requires_read = requires_access_view(AccessView.WEBSITE)

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


@asynccontextmanager
async def _standalone(app: FastAPI) -> AsyncIterator[None]:
    """Run alone under uvicorn, the app initialises Airflow's auth manager itself (mounted in the API
    server, this never runs: the server's own lifespan does it)."""
    from airflow.api_fastapi.app import get_auth_manager, init_auth_manager

    try:
        get_auth_manager()
    except RuntimeError:
        init_auth_manager()
    yield


app = FastAPI(
    title="Replay", description="Replays under the configured roots, with their progress", lifespan=_standalone
)


@app.exception_handler(HTTPException)
async def _login_redirect(request: Request, exc: HTTPException) -> Response:
    """The HTML page sends an unauthenticated browser to the auth manager's login, and back after it."""
    if exc.status_code == 401 and not request.url.path.rstrip("/").endswith("/api/replays"):
        from airflow.api_fastapi.app import get_auth_manager

        return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)), status_code=303)
    return await http_exception_handler(request, exc)


@app.get("/api/replays", dependencies=[Depends(requires_read)])
async def replays_json() -> dict[str, Any]:
    return await asyncio.to_thread(list_replays)


@app.get("/", response_class=HTMLResponse, dependencies=[Depends(requires_read)])
async def replays_page() -> HTMLResponse:
    data = await asyncio.to_thread(list_replays)
    html = _TEMPLATES.get_template("replays.html.j2").render(**data)
    return HTMLResponse(html)
