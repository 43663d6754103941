"""The "Replays" page of the Airflow UI: every replay under the roots, with its progress.

An Airflow 3 plugin FastAPI app (mounted by the API server at ``/replay``; it also runs on its own
under uvicorn: ``uvicorn replay_airflow.ui:app``). ``GET /`` is the HTML page, ``GET /api/replays``
the same rows as JSON. Both need an Airflow user allowed to read the website, through Airflow's own
FastAPI security dependency (the auth manager's JWT as a Bearer token, or the UI's ``_token`` cookie):
Airflow does not authenticate plugin apps itself. Without a user the JSON answers 401 and the page
redirects to the auth manager's login. Each row: the checkpoint, its output, its state (running, interrupted,
finished), the last batch, the stream cut per origin, ``G_k`` per watermark key, the published
version and the newest version's validation verdict, links to the output's HTML report and Data Docs,
the Airflow DAG runs that wrote it (with links into Airflow's UI), and per key the lag of ``G_k``
behind the newest watermark archived. Checkpoints are read without their lock. Above the rows, the
kept driver of the DAGs' engine ``kept_driver`` (the home ``REPLAY_DRIVER`` names): whether it
answers, its master, the runs it served and failed, what it runs now and its memory.

``GET /files/<path>`` serves the reports and Data Docs: files under the output root, inside an
output's ``_report/`` or its Data Docs site (``_validation/gx/uncommitted/data_docs/``), to the same
users as the page; any other path (data, checkpoints, ``..`` or a symbolic link out of the root) is 404.

Where the lag comes from: ``replay`` does not keep the archive's path in a checkpoint, so the
operators record it (``replay_airflow.records``, with the DAG runs). The newest archived watermark of a
key is the maximum of its watermark column (the event-time column for event-time watermarks) in
the Parquet footers' statistics of every file of that archive; the lag is that minus ``G_k``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
from airflow.api_fastapi.core_api.security import requires_access_view
from fastapi import Depends, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException

__all__ = ["DATA_DOCS_INDEX", "REPORT_INDEX", "app", "kept_driver", "list_replays", "requires_read", "servable_file"]

#: Airflow's dependency for its own UI's pages: an authenticated user the auth manager lets read the
#: website (401 without a user, 403 without the permission). Tests override it to look at the page alone.
requires_read = requires_access_view(AccessView.WEBSITE)

#: Under an output: the HTML report (``replay.write_report``'s default) and the Data Docs' index
#: (``replay.quality.validate.DOCS_INDEX``; not imported here: that module loads Great Expectations).
REPORT_INDEX = "_report/index.html"
DATA_DOCS_INDEX = "_validation/gx/uncommitted/data_docs/local_site/index.html"
_DATA_DOCS_SITE = ("_validation", "gx", "uncommitted", "data_docs")

_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=jinja2.select_autoescape(["html", "j2"]),
    undefined=jinja2.StrictUndefined,
)


def _duration(seconds: float | None) -> str:
    """``3.2 s``, ``12 min 5 s``, ``2 h 3 min``, ``4 d 2 h``."""
    if seconds is None:
        return "unknown"
    sign, left = ("-" if seconds < 0 else ""), abs(seconds)
    if left < 60:
        return f"{sign}{left:.1f} s"
    total = int(left)
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{sign}{days} d {hours} h"
    if hours:
        return f"{sign}{hours} h {minutes} min"
    return f"{sign}{minutes} min {secs} s"


_TEMPLATES.filters["duration"] = _duration

_UNIT_MICROS = {"us": (1, 1), "ms": (1_000, 1), "epoch_ms": (1_000, 1), "ns": (1, 1_000)}
_FOOTER_MAX: dict[tuple[str, int, int, str], int | None] = {}
_FOOTER_LOCK = threading.Lock()


def _file_max(path: str, column: str, unit: str) -> int | None:
    """The maximum of ``column`` in ``path``'s row-group statistics, in microseconds (cached per file version)."""
    stat = os.stat(path)
    key = (path, stat.st_mtime_ns, stat.st_size, column)
    with _FOOTER_LOCK:
        if key in _FOOTER_MAX:
            return _FOOTER_MAX[key]
    import pyarrow.parquet as pq

    metadata = pq.ParquetFile(path).metadata
    names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    best: int | None = None
    if column in names:
        index = names.index(column)
        for group in range(metadata.num_row_groups):
            stats = metadata.row_group(group).column(index).statistics
            if stats is None or not stats.has_min_max or not isinstance(stats.max_raw, int):
                continue
            best = stats.max_raw if best is None else max(best, stats.max_raw)
    if best is not None:
        times, divide = _UNIT_MICROS.get(unit, (1, 1))
        best = best * times // divide
    with _FOOTER_LOCK:
        if len(_FOOTER_MAX) > 100_000:
            _FOOTER_MAX.clear()
        _FOOTER_MAX[key] = best
    return best


def _lag(status: dict[str, Any], archive: dict[str, Any] | None, archive_root: str) -> dict[str, Any]:
    """Per key: ``G_k``, the newest archived watermark and the lag between them, and where the newest came from."""
    from replay.core.errors import ReplayError
    from replay.core.timeutil import format_ts, parse_timestamp
    from replay.engine.archive_files import discover_files

    keys = [{"key": k["key"], "global": k["global"], "newest": None, "lag_seconds": None} for k in status["keys"]]
    path = str((archive or {}).get("path") or "")
    columns = dict((archive or {}).get("keys") or {})
    if not path or not columns:
        return {"source": None, "archive": None, "files": None, "keys": keys}
    if "://" in path or "://" in archive_root:
        return {"source": "not read: the archive is not on a local path", "archive": path, "files": None, "keys": keys}
    root = Path(archive_root).resolve()
    resolved = Path(path).resolve()
    if resolved != root and root not in resolved.parents:  # a record naming a path outside the root: not read
        return {"source": "not read: outside the archive root", "archive": path, "files": None, "keys": keys}
    try:
        files = discover_files(str(resolved))
        for row in keys:
            spec = columns.get(row["key"]) or {}
            if not spec.get("column"):
                continue
            maxima = [_file_max(f, str(spec["column"]), str(spec.get("unit") or "us")) for f in files]
            known = [m for m in maxima if m is not None]
            if not known:
                continue
            newest = max(known)
            row["newest"] = format_ts(newest)
            row["column"] = spec["column"]
            if row["global"] is not None:
                row["lag_seconds"] = max(0, newest - parse_timestamp(row["global"])) / 1e6
    except (ReplayError, OSError, ValueError) as exc:
        return {"source": f"not read: {exc}", "archive": path, "files": None, "keys": keys}
    return {
        "source": "the maximum of each key's watermark column in the Parquet footer statistics of the archive's files",
        "archive": path,
        "files": len(files),
        "keys": keys,
    }


def _dag_run_url(dag_id: str, run_id: str) -> str:
    """The DAG run's page in Airflow's UI (``airflow.utils.helpers.build_airflow_dagrun_url``, with quoting)."""
    from airflow.configuration import conf

    base = conf.get("api", "base_url", fallback="") or ""
    return f"{base.rstrip('/')}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def _dag_runs(record: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The recorded task entries grouped per DAG run, the newest run first."""
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    for entry in (record or {}).get("runs", []):
        key = (str(entry.get("dag_id")), str(entry.get("run_id")))
        run = runs.pop(key, None) or {
            "dag_id": key[0],
            "run_id": key[1],
            "run_type": entry.get("run_type"),
            "url": _dag_run_url(*key),
            "tasks": [],
        }
        run["tasks"].append(
            {k: entry.get(k) for k in ("task_id", "action", "version", "at", "batches", "success", "source")}
        )
        run["at"] = entry.get("at")
        runs[key] = run  # re-inserted: ordered by each run's newest entry
    return list(reversed(runs.values()))


def _file_link(output: str, relative: str, output_root: str, base: str) -> dict[str, str] | None:
    """The ``/files/`` link to ``output/relative`` when that file exists under the output root."""
    path = os.path.join(output, relative)
    if "://" in output_root or not os.path.isfile(path):
        return None
    root = os.path.realpath(output_root)
    real = os.path.realpath(path)
    if not real.startswith(root.rstrip(os.sep) + os.sep):
        return None
    return {"path": path, "url": f"{base}/files/{quote(os.path.relpath(real, root))}"}


def servable_file(relative: str) -> Path | None:
    """The file ``GET /files/<relative>`` may serve: under the output root, in a report or a Data Docs site."""
    from replay_airflow.roots import configured_roots

    output_root = configured_roots().output
    if "://" in output_root or "\x00" in relative:
        return None
    root = Path(output_root).resolve()
    target = (root / relative).resolve()
    if root not in target.parents or not target.is_file():
        return None
    parts = target.relative_to(root).parts[:-1]
    in_report = "_report" in parts
    in_docs = any(parts[i : i + len(_DATA_DOCS_SITE)] == _DATA_DOCS_SITE for i in range(len(parts)))
    return target if in_report or in_docs else None


def list_replays(mount: str = "") -> dict[str, Any]:
    """The roots and one row per checkpoint found under the checkpoint and output roots.

    ``mount``: the path the app is mounted at (links to ``/files/`` start with it).
    """
    from replay.core.errors import ReplayError
    from replay_airflow.hooks import CheckpointHook, find_checkpoints
    from replay_airflow.records import read_record
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
            output_watermarks=status["output_watermarks"],
            late_tuples=status["late_tuples"],
            pending_tuples=status["pending_tuples"],
            versions=status["versions"],
            published=status["published"],
            run_version=status["run_version"],
            validated=status["validated"],
        )
        record = read_record(roots.output, status["output"])
        row.update(
            report=_file_link(status["output"], REPORT_INDEX, roots.output, mount),
            data_docs=_file_link(status["output"], DATA_DOCS_INDEX, roots.output, mount),
            dag_runs=_dag_runs(record),
            lag=_lag(status, (record or {}).get("archive"), roots.archive),
        )
        rows.append(row)
    return {
        "roots": {"archive": roots.archive, "output": roots.output, "checkpoint": roots.checkpoint},
        "driver": kept_driver(),
        "replays": rows,
    }


def kept_driver() -> dict[str, Any] | None:
    """The kept driver whose home ``REPLAY_DRIVER`` names: its status (``replay driver status``), a
    ``state`` (idle, busy, stopping), and ``same_code``, whether it runs this deployment's Replay (it
    refuses runs otherwise: ``driver.version``); or ``not answering`` and why; ``None`` where no home
    is set."""
    home = os.environ.get("REPLAY_DRIVER")
    if not home:
        return None
    from replay.core.errors import ReplayError
    from replay.driver.client import driver_status
    from replay.driver.home import DriverHome
    from replay.driver.wire import code_identity

    try:
        status = driver_status(DriverHome(Path(home)), timeout=5)
    except ReplayError as exc:
        return {"home": home, "state": "not answering", "error": exc.message}
    state = "stopping" if status["stopping"] else "busy" if status["running"] else "idle"
    return {"home": home, "state": state, "error": None, "same_code": status.get("code") == code_identity(), **status}


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


def _base(request: Request) -> str:
    """Where the app is mounted (``/replay`` in the API server, nothing under uvicorn alone)."""
    return str(request.scope.get("root_path") or "").rstrip("/")


@app.get("/api/replays", dependencies=[Depends(requires_read)])
async def replays_json(request: Request) -> dict[str, Any]:
    return await asyncio.to_thread(list_replays, _base(request))


@app.get("/files/{relative:path}", dependencies=[Depends(requires_read)])
async def report_file(relative: str) -> FileResponse:
    """A report or Data Docs file under the output root; anything else is 404."""
    path = await asyncio.to_thread(servable_file, relative)
    if path is None:
        raise HTTPException(404, "no report or Data Docs file there")
    return FileResponse(path)


@app.get("/", response_class=HTMLResponse, dependencies=[Depends(requires_read)])
async def replays_page(request: Request) -> HTMLResponse:
    data = await asyncio.to_thread(list_replays, _base(request))
    html = _TEMPLATES.get_template("replays.html.j2").render(**data)
    return HTMLResponse(html)
