"""Airflow as teams run it: ``./dev.sh airflow`` (Postgres metadata database, api-server, scheduler with the
LocalExecutor, dag-processor, triggerer), started once per session beside the other tests.

On that stack: the "Replays" page and its JSON answer only an Airflow user (a JWT from the auth manager's
``POST /auth/token``, as a Bearer token or the UI's cookie), and the real scheduler runs a run of
``airflow backfill create`` whose published windows equal ``replay run`` over the same event-time range.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from replay import digest, generate_archive, parse_config, run
from replay.generate import DEFAULT_START
from replay.outputs import current_version, latest_run_version, read_validation
from tests import _background
from tests._airflow_stack import Response, airflow_stack
from tests.test_dags_e2e import BACKFILL_ARCHIVE, JOB, WINDOWS

pytestmark = [pytest.mark.slow, pytest.mark.spark]

DAY = 86_400_000_000
#: Four seconds before midnight: the archive's event times run into 2026-01-02, so the backfill's day cuts it.
ARCHIVE = dataclasses.replace(BACKFILL_ARCHIVE, start=DEFAULT_START + DAY - 4_000_000)
DAY_START = DEFAULT_START  # 2026-01-01T00:00:00Z, the backfill's one day
CONF = {"archive": "archives/bf", "output": "outputs/bf", **JOB}


@dataclass
class StackRun:
    work: Path
    root: Path
    started_in: float
    health: dict[str, Any]
    database: str
    anonymous_json: Response
    anonymous_page: Response
    wrong_password: Response
    forged_token: Response
    token: Response
    json_with_bearer: Response
    page_with_cookie: Response
    backfill_state: str
    backfill_seconds: float
    backfill_tasks: dict[str, str]
    listing_after: Response
    anonymous_after: Response
    exit_code: int | None
    api_closed: bool
    postgres_closed: bool
    stopped_in: float


def _closed(url: str) -> bool:
    parts = urlsplit(url)
    with socket.socket() as s:
        return s.connect_ex((parts.hostname or "127.0.0.1", parts.port or 80)) != 0


@_background.register("airflow-stack")
def run_on_the_stack() -> StackRun:
    """Start ``./dev.sh airflow``, write the archive meanwhile, check the page's authentication, run a backfill."""
    work = Path(tempfile.mkdtemp(prefix="replay-airflow-stack-"))
    root = work / "roots"
    with airflow_stack(work, root) as stack:
        generate_archive(root / "archives" / "bf", ARCHIVE)
        stack.wait_until_up()
        health = stack.request("/api/v2/monitor/health").json()
        database = stack.env()["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        anonymous_json = stack.request("/replay/api/replays")
        anonymous_page = stack.request("/replay/")
        wrong_password = stack.token("not the password")
        forged_token = stack.request("/replay/api/replays", token="e30.e30.not-signed")
        token = stack.token()
        jwt = token.json()["access_token"]
        json_with_bearer = stack.request("/replay/api/replays", token=jwt)
        page_with_cookie = stack.request("/replay/", cookie=jwt)

        # The backfill: once the dag-processor has stored the DAG, the CLI creates the run and the
        # scheduler executes it (LocalExecutor, tasks through the api-server's execution API).
        deadline = time.monotonic() + 180
        while stack.request("/api/v2/dags/replay_backfill", token=jwt).status != 200:
            assert time.monotonic() < deadline, "the dag-processor did not store replay_backfill in 180 s"
            time.sleep(1)
        # New DAGs start paused, and the scheduler starts no run of a paused DAG, a backfill's included.
        stack.airflow("dags", "unpause", "replay_backfill")
        begin = time.monotonic()
        stack.airflow(
            "backfill",
            "create",
            "--dag-id",
            "replay_backfill",
            "--from-date",
            "2026-01-01",
            "--to-date",
            "2026-01-01",
            "--dag-run-conf",
            json.dumps(CONF),
        )
        state, runs = "none", []
        while time.monotonic() - begin < 600:
            runs = stack.request("/api/v2/dags/replay_backfill/dagRuns?run_type=backfill", token=jwt).json()["dag_runs"]
            state = runs[0]["state"] if runs else "none"
            if state in ("success", "failed"):
                break
            time.sleep(2)
        backfill_seconds = time.monotonic() - begin
        tasks: dict[str, str] = {}
        if runs:
            instances = stack.request(
                f"/api/v2/dags/replay_backfill/dagRuns/{runs[0]['dag_run_id']}/taskInstances", token=jwt
            ).json()["task_instances"]
            tasks = {t["task_id"]: str(t["state"]) for t in instances}
        listing_after = stack.request("/replay/api/replays", token=jwt)
        anonymous_after = stack.request("/replay/api/replays")
        stop = time.monotonic()
    stopped_in = time.monotonic() - stop
    pg = urlsplit(database.replace("postgresql+psycopg", "http"))
    return StackRun(
        work=work,
        root=root,
        started_in=stack.started_in,
        health=health,
        database=database,
        anonymous_json=anonymous_json,
        anonymous_page=anonymous_page,
        wrong_password=wrong_password,
        forged_token=forged_token,
        token=token,
        json_with_bearer=json_with_bearer,
        page_with_cookie=page_with_cookie,
        backfill_state=state,
        backfill_seconds=backfill_seconds,
        backfill_tasks=tasks,
        listing_after=listing_after,
        anonymous_after=anonymous_after,
        exit_code=stack.process.returncode,
        api_closed=_closed(stack.url),
        postgres_closed=_closed(f"http://127.0.0.1:{pg.port}"),
        stopped_in=stopped_in,
    )


@pytest.fixture(scope="module")
def done() -> StackRun:
    result: StackRun = _background.result("airflow-stack")
    return result


@pytest.mark.background("airflow-stack")
def test_dev_sh_airflow_runs_every_service_on_postgres_and_stops_them_on_sigterm(done: StackRun) -> None:
    assert done.database.startswith("postgresql+psycopg://airflow:") and "@127.0.0.1:" in done.database
    assert {p: done.health[p]["status"] for p in ("metadatabase", "scheduler", "triggerer", "dag_processor")} == {
        "metadatabase": "healthy",
        "scheduler": "healthy",
        "triggerer": "healthy",
        "dag_processor": "healthy",
    }
    print(f"stack up in {done.started_in:.0f} s, stopped in {done.stopped_in:.0f} s")
    # SIGTERM (Ctrl-C's sibling): every service stopped, then Postgres, then the script exited 128 + 15.
    assert done.exit_code == 143 and done.api_closed and done.postgres_closed


@pytest.mark.background("airflow-stack")
def test_the_replays_page_answers_only_an_airflow_user(done: StackRun) -> None:
    # Without a user: 401 and nothing listed; the page sends a browser to the auth manager's login.
    assert done.anonymous_json.status == 401 and "replays" not in done.anonymous_json.body
    assert done.anonymous_after.status == 401 and "replays" not in done.anonymous_after.body
    assert done.anonymous_page.status == 303 and "<h1>" not in done.anonymous_page.body
    location = done.anonymous_page.headers["location"]
    assert location.startswith("/auth/login?next=") and "replay" in location
    assert done.wrong_password.status == 401
    assert done.forged_token.status in (401, 403) and "replays" not in done.forged_token.body
    # With the auth manager's JWT: as a Bearer token (the API's way) or the UI's cookie (the browser's).
    assert done.token.status == 201
    assert done.json_with_bearer.status == 200 and done.json_with_bearer.json()["roots"]["checkpoint"] == str(done.root)
    assert done.page_with_cookie.status == 200 and "<h1>Replays</h1>" in done.page_with_cookie.body
    # After the backfill, its checkpoint is listed, finished.
    assert done.listing_after.status == 200
    rows = done.listing_after.json()["replays"]
    assert len(rows) == 1 and rows[0]["state"] == "finished", rows
    assert rows[0]["name"].startswith("_checkpoints/outputs/bf/range_"), rows


@pytest.mark.background("airflow-stack")
def test_a_backfill_run_by_the_scheduler_publishes_what_replay_run_computes_over_its_day(
    done: StackRun, spark: Any, tmp_path: Path
) -> None:
    try:
        assert done.backfill_state == "success", (done.backfill_state, done.backfill_tasks)
        assert done.backfill_tasks == dict.fromkeys(("plan", "replay", "validate", "publish", "report"), "success")
        print(f"backfill run done in {done.backfill_seconds:.0f} s")
        archive = done.root / "archives" / "bf"
        reference = tmp_path / "reference"
        config = parse_config(
            {
                "archive": str(archive),
                "output": str(reference),
                "checkpoint": str(tmp_path / "reference-ckpt"),
                "windows": WINDOWS,
                "micro_batch": JOB["micro_batch"],
            }
        )
        run(config, start=DAY_START, end=DAY_START + DAY, spark=spark)  # replay run --start/--end
        everything = digest(_full_run(spark, archive, tmp_path / "full"))["windows"]
        out = done.root / "outputs" / "bf"
        run_version = latest_run_version(out)
        assert run_version is not None and digest(out, run_version) == digest(reference)
        assert (read_validation(out, run_version) or {}).get("success") is True
        assert current_version(out) is not None and digest(out)["windows"] == digest(reference)["windows"]
        assert digest(reference)["windows"] != everything  # the day cut the archive: the range mattered
    finally:
        shutil.rmtree(done.work, ignore_errors=True)


def _full_run(spark: Any, archive: Path, out: Path) -> Path:
    run(
        parse_config(
            {
                "archive": str(archive),
                "output": str(out),
                "checkpoint": str(out.parent / "full-ckpt"),
                "windows": WINDOWS,
                "micro_batch": JOB["micro_batch"],
            }
        ),
        spark=spark,
    )
    return out
