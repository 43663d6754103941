"""Airflow as teams run it: ``./dev.sh airflow`` (Postgres metadata database, api-server, scheduler with the
LocalExecutor, dag-processor, triggerer), started once per session beside the other tests.

On that stack: the "Replays" page and its JSON answer only an Airflow user (a JWT from the auth manager's
``POST /auth/token``, as a Bearer token or the UI's cookie), and the real scheduler runs a run of
``airflow backfill create`` whose published windows equal ``replay run`` over the same event-time range.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from replay import GenerateOptions, digest, generate_archive, parse_config, run
from replay.generate_options import DEFAULT_START
from replay.store.outputs import current_version, latest_run_version, read_validation
from tests import _background
from tests.airflow._stack import CHROMIUM, Response, Stack, airflow_stack, chromium_page
from tests.airflow.test_dags_e2e import BACKFILL_ARCHIVE, JOB, WINDOWS

pytestmark = [pytest.mark.slow, pytest.mark.spark]

DAY = 86_400_000_000
#: Four seconds before midnight: the archive's event times run into 2026-01-02, so the backfill's day cuts it.
ARCHIVE = dataclasses.replace(BACKFILL_ARCHIVE, start=DEFAULT_START + DAY - 4_000_000)
DAY_START = DEFAULT_START  # 2026-01-01T00:00:00Z, the backfill's one day
CONF = {"archive": "archives/bf", "output": "outputs/bf", **JOB}


#: Two files: after the first, G_k is known (both origins have a watermark); the second moves it on.
LIVE_ARCHIVE = GenerateOptions(origins=2, tuples=800, buffer_tuples=20, keys=3, seed=9, files=2)


@dataclass
class Scheduled:
    """What the scheduler did with ``replay_scheduled`` (default params: ``live/archive`` into ``live/out``,
    checkpoint ``live``), ``replay_quality_report`` and ``replay_watermark_gate``."""

    first_run: dict[str, Any]
    first_global: int
    gate_target: int
    gate_states: list[str]
    gate_state: str
    queued: list[str]
    max_running: int
    runs: list[dict[str, Any]]
    tasks: dict[str, dict[str, tuple[str, int]]]
    quality_runs: list[dict[str, Any]]
    quality_events: dict[str, list[dict[str, Any]]]
    published_events: list[dict[str, Any]]
    locked_in_logs: list[str]
    #: ``replay driver status`` of the stack's kept driver, after the run sent to it (``engine: kept_driver``).
    driver: dict[str, Any]
    sent_to_driver: list[str]
    listing: Response
    report_file: Response
    report_file_anonymous: Response
    outside_file: Response
    dom: str
    screenshot: Path
    seconds: float


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
    backfill_durations: dict[str, float | None]
    #: When the backfill did not succeed: its task logs and the services' warnings, for the failure's message.
    backfill_logs: str
    listing_after: Response
    anonymous_after: Response
    scheduled: Scheduled | None
    scheduled_error: BaseException | None
    exit_code: int | None
    api_closed: bool
    postgres_closed: bool
    driver_log: str
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
        generate_archive(work / "live-source", LIVE_ARCHIVE)
        live_files = sorted((work / "live-source").glob("*.parquet"))
        (root / "live" / "archive").mkdir(parents=True)
        shutil.copy(live_files[0], root / "live" / "archive")
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
        for dag_id in ("replay_scheduled", "replay_quality_report", "replay_watermark_gate"):
            while stack.request(f"/api/v2/dags/{dag_id}", token=jwt).status != 200:
                assert time.monotonic() < deadline, f"the dag-processor did not store {dag_id} in 180 s"
                time.sleep(1)
        # New DAGs start paused, and the scheduler starts no run of a paused DAG, a backfill's included.
        stack.airflow("dags", "unpause", "replay_backfill")
        # Unpaused, the hourly replay_scheduled gets its latest hour's run at once (catchup=False): its
        # schedule fires, beside the backfill, on the first archive file.
        stack.airflow("dags", "unpause", "replay_quality_report")
        stack.airflow("dags", "unpause", "replay_scheduled")
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
        # A guard against a hang, not a speed check: on a loaded 2-core machine, with the rest of the
        # suite and replay_scheduled's first run beside it, the five tasks have taken over 600 s.
        state, runs = "none", []
        while time.monotonic() - begin < 1200:
            runs = stack.request("/api/v2/dags/replay_backfill/dagRuns?run_type=backfill", token=jwt).json()["dag_runs"]
            state = runs[0]["state"] if runs else "none"
            if state in ("success", "failed"):
                break
            time.sleep(2)
        backfill_seconds = time.monotonic() - begin
        tasks: dict[str, str] = {}
        durations: dict[str, float | None] = {}
        if runs:
            instances = stack.request(
                f"/api/v2/dags/replay_backfill/dagRuns/{runs[0]['dag_run_id']}/taskInstances", token=jwt
            ).json()["task_instances"]
            tasks = {t["task_id"]: str(t["state"]) for t in instances}
            durations = {t["task_id"]: t.get("duration") for t in instances}
        backfill_logs = "" if state == "success" else _logs_of(stack, "replay_backfill", "backfill__")
        listing_after = stack.request("/replay/api/replays", token=jwt)
        anonymous_after = stack.request("/replay/api/replays")
        scheduled, scheduled_error = None, None
        try:
            scheduled = _scheduled_runs(stack, jwt, root, work, live_files[1:])
        except Exception as error:  # reported by the tests of the scheduled DAGs; the others still check theirs
            for dag_id in ("replay_quality_report", "replay_watermark_gate"):
                error.add_note(_logs_of(stack, dag_id, "", tail=15, services=()))
            error.add_note(_logs_of(stack, "replay_scheduled", "", tail=15))
            scheduled_error = error
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
        backfill_durations=durations,
        backfill_logs=backfill_logs,
        listing_after=listing_after,
        anonymous_after=anonymous_after,
        scheduled=scheduled,
        scheduled_error=scheduled_error,
        exit_code=stack.process.returncode,
        api_closed=_closed(stack.url),
        postgres_closed=_closed(f"http://127.0.0.1:{pg.port}"),
        driver_log=(work / "stack" / "logs" / "replay-driver.log").read_text(errors="replace"),
        stopped_in=stopped_in,
    )


TERMINAL = ("success", "failed")


def _logs_of(
    stack: Stack, dag_id: str, run_prefix: str, tail: int = 40, services: tuple[str, ...] = ("scheduler", "api-server")
) -> str:
    """The last lines of each task log of the DAG's runs whose id starts with ``run_prefix``, and the
    warnings and errors the scheduler and api-server logged: what a failed run's assertion shows."""
    parts: list[str] = []
    logs = stack.directory / "home" / "logs" / f"dag_id={dag_id}"
    for path in sorted(logs.glob(f"run_id={run_prefix}*/task_id=*/attempt=*.log")):
        lines = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                lines.append(line)
                continue
            errors = " <- ".join(f"{e['exc_type']}: {e['exc_value']}" for e in record.get("error_detail") or [])
            lines.append(f"{record.get('timestamp', '')} {record.get('level', '')} {record.get('event', '')} {errors}")
        parts.append(f"== {path.relative_to(logs)}\n" + "\n".join(lines[-tail:]))
    for service in services:
        path = stack.directory / "logs" / f"{service}.log"
        if path.exists():
            noted = [x for x in path.read_text(errors="replace").splitlines() if re.search(r"warn|error|fail", x, re.I)]
            parts.append(f"== {service}.log, warnings and errors\n" + "\n".join(x[:400] for x in noted[-tail:]))
    return "\n".join(parts)


def _runs(stack: Stack, jwt: str, dag_id: str) -> list[dict[str, Any]]:
    answer = stack.request(f"/api/v2/dags/{dag_id}/dagRuns?order_by=run_after&limit=100", token=jwt)
    assert answer.status == 200, answer.body
    return list(answer.json()["dag_runs"])


def _wait(what: str, check: Any, timeout: float, every: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not in {timeout:.0f} s"
        time.sleep(every)


def _trigger(stack: Stack, jwt: str, dag_id: str, conf: dict[str, Any]) -> str:
    answer = stack.request(f"/api/v2/dags/{dag_id}/dagRuns", token=jwt, data={"logical_date": None, "conf": conf})
    assert answer.status == 200, answer.body
    return str(answer.json()["dag_run_id"])


def _scheduled_runs(stack: Stack, jwt: str, root: Path, work: Path, new_files: list[Path]) -> Scheduled:
    """Through the scheduler: replay_scheduled's first run (its schedule fired when it was unpaused), the
    quality report it triggers, the watermark gate deferred to the triggerer, two runs queued at once after
    new files arrived, then the Replays page in Chromium."""
    from replay.core.timeutil import format_ts
    from replay.driver.client import driver_status
    from replay.driver.home import DriverHome
    from replay_airflow.hooks import CheckpointHook

    begin = time.monotonic()
    sched, quality, gate_dag = "replay_scheduled", "replay_quality_report", "replay_watermark_gate"

    def settled(dag_id: str, at_least: int) -> list[dict[str, Any]] | None:
        runs = _runs(stack, jwt, dag_id)
        return runs if len(runs) >= at_least and all(r["state"] in TERMINAL for r in runs) else None

    first = _wait("replay_scheduled's scheduled run", lambda: settled(sched, 1), 900)[0]
    first_global = CheckpointHook(checkpoint=str(root / "live")).global_watermark()
    assert first_global is not None, first

    # The gate waits for one microsecond past G_k: only a replay of new files moves G_k there.
    stack.airflow("dags", "unpause", gate_dag)
    target = first_global + 1
    gate_run = _trigger(stack, jwt, gate_dag, {"checkpoint": "live", "target": format_ts(target), "poll_interval": 1})
    gate_url = f"/api/v2/dags/{gate_dag}/dagRuns/{gate_run}/taskInstances/wait_for_watermark"
    gate_states: list[str] = []

    def gate_state() -> str:
        answer = stack.request(gate_url, token=jwt)
        state = str(answer.json().get("state")) if answer.status == 200 else "none"
        if not gate_states or gate_states[-1] != state:
            gate_states.append(state)
        return state

    _wait("the watermark gate deferred", lambda: gate_state() in ("deferred", "success", "failed"), 180, 0.5)
    time.sleep(3)
    gate_state()  # still deferred: G_k has not moved

    # New files, then two runs queued at once: one at a time (max_active_runs=1), never the lock. The first,
    # which replays the new files, sends its run to the stack's kept driver.
    for f in new_files:
        shutil.copy(f, root / "live" / "archive")
    queued = [_trigger(stack, jwt, sched, {"engine": "kept_driver"}), _trigger(stack, jwt, sched, {})]
    max_running = 0
    deadline = time.monotonic() + 900
    while True:
        runs = _runs(stack, jwt, sched)
        max_running = max(max_running, sum(r["state"] == "running" for r in runs))
        mine = [r for r in runs if r["dag_run_id"] in queued]
        if len(mine) == 2 and all(r["state"] in TERMINAL for r in mine) and gate_state() in TERMINAL:
            break
        assert time.monotonic() < deadline, f"the queued runs did not finish in 900 s: {runs}"
        time.sleep(0.5)
    # The hourly schedule may fire meanwhile (the suite crossed an hour boundary here once): that run finds
    # nothing new and publishes nothing, but the checks below read every run's tasks, so all must settle.
    runs = _wait("every replay_scheduled run settled", lambda: settled(sched, 3), 900)
    quality_runs = _wait("the quality report of the second publication", lambda: settled(quality, 2), 600)

    tasks: dict[str, dict[str, tuple[str, int]]] = {}
    for r in runs:
        listing = stack.request(f"/api/v2/dags/{sched}/dagRuns/{r['dag_run_id']}/taskInstances", token=jwt).json()
        tasks[r["dag_run_id"]] = {
            t["task_id"]: (str(t["state"]), int(t["try_number"])) for t in listing["task_instances"]
        }
    quality_events = {
        q["dag_run_id"]: stack.request(
            f"/api/v2/dags/{quality}/dagRuns/{q['dag_run_id']}/upstreamAssetEvents", token=jwt
        ).json()["asset_events"]
        for q in quality_runs
    }
    published = stack.request(f"/api/v2/assets/events?source_dag_id={sched}&limit=100", token=jwt).json()
    logs = [p for p in (stack.directory / "home" / "logs").rglob("*") if p.is_file()]
    locked = [str(p.relative_to(stack.directory)) for p in logs if "checkpoint.locked" in p.read_text(errors="replace")]
    sent = [
        str(p.relative_to(stack.directory)) for p in logs if "to the kept driver of" in p.read_text(errors="replace")
    ]
    driver = driver_status(DriverHome(Path(stack.env()["REPLAY_DRIVER"])))

    listing = stack.request("/replay/api/replays", token=jwt)
    live: dict[str, Any] = next((r for r in listing.json()["replays"] if r["name"] == "live"), {})
    report_url = str((live.get("report") or {}).get("url") or "/replay/files/live/out/_report/index.html")
    shot = work / "replays.png"
    dom = chromium_page(stack.url + "/replay/", cookie=("_token", jwt), screenshot=shot) if CHROMIUM.exists() else ""
    return Scheduled(
        first_run=first,
        first_global=first_global,
        gate_target=target,
        gate_states=gate_states,
        gate_state=gate_states[-1],
        queued=queued,
        max_running=max_running,
        runs=runs,
        tasks=tasks,
        quality_runs=quality_runs,
        quality_events=quality_events,
        published_events=list(published["asset_events"]),
        locked_in_logs=locked,
        driver=driver,
        sent_to_driver=sent,
        listing=listing,
        report_file=stack.request(report_url, token=jwt),
        report_file_anonymous=stack.request(report_url),
        outside_file=stack.request("/replay/files/live/archive/" + new_files[0].name, token=jwt),
        dom=dom,
        screenshot=shot,
        seconds=time.monotonic() - begin,
    )


@pytest.fixture(scope="module")
def done() -> Iterator[StackRun]:
    # Its DAG runs take minutes each on two cores shared with the rest of the suite.
    result: StackRun = _background.result("airflow-stack", timeout=2400)
    try:
        yield result
    finally:
        shutil.rmtree(result.work, ignore_errors=True)


@pytest.fixture(scope="module")
def scheduled(done: StackRun) -> Scheduled:
    if done.scheduled_error is not None:
        raise done.scheduled_error
    assert done.scheduled is not None
    return done.scheduled


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
    assert "driver stopped" in done.driver_log, done.driver_log[-3000:]  # the kept driver too


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
    rows = [r for r in done.listing_after.json()["replays"] if r["name"] != "live"]  # live: replay_scheduled's
    assert len(rows) == 1 and rows[0]["state"] == "finished", (rows, "backfill run:", done.backfill_state)
    assert rows[0]["name"].startswith("_checkpoints/outputs/bf/range_"), rows


@pytest.mark.background("airflow-stack")
def test_a_backfill_run_by_the_scheduler_publishes_what_replay_run_computes_over_its_day(
    done: StackRun, spark: Any, tmp_path: Path
) -> None:
    seen = (done.backfill_state, f"{done.backfill_seconds:.0f} s", done.backfill_tasks, done.backfill_durations)
    assert done.backfill_state == "success", f"{seen}\n{done.backfill_logs}"
    assert done.backfill_tasks == dict.fromkeys(("plan", "replay", "validate", "publish", "report"), "success")
    print(f"backfill run done in {done.backfill_seconds:.0f} s, task seconds {done.backfill_durations}")
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


@pytest.mark.background("airflow-stack")
def test_each_publication_of_the_scheduled_replay_triggers_the_quality_report_through_its_asset(
    done: StackRun, scheduled: Scheduled
) -> None:
    print(f"scheduled part done in {scheduled.seconds:.0f} s")
    # The first run is the schedule's own (the DAG was unpaused with catchup=False), on the first file.
    assert scheduled.first_run["run_type"] == "scheduled" and scheduled.first_run["state"] == "success"
    assert all(r["state"] == "success" for r in scheduled.runs), scheduled.runs
    publishing = [run for run, tasks in scheduled.tasks.items() if tasks.get("publish", ("", 0))[0] == "success"]
    assert scheduled.first_run["dag_run_id"] in publishing and scheduled.queued[0] in publishing
    # The second queued run found nothing new: its publish ended skipped, and recorded no Asset event.
    assert scheduled.tasks[scheduled.queued[1]]["publish"][0] == "skipped"
    events = [e for e in scheduled.published_events if e["source_task_id"] == "publish"]
    assert sorted(e["source_run_id"] for e in events) == sorted(publishing)
    assert all(e["extra"]["output"] == str(done.root / "live" / "out") for e in events)
    # One asset-triggered quality report per publication, each consuming that publication's event.
    assert len(scheduled.quality_runs) == len(publishing)
    assert all(q["run_type"] == "asset_triggered" and q["state"] == "success" for q in scheduled.quality_runs)
    consumed = sorted(
        e["source_run_id"] for q in scheduled.quality_runs for e in scheduled.quality_events[q["dag_run_id"]]
    )
    assert consumed == sorted(publishing)
    # The last quality report validated the current publication and wrote the report of it.
    out = done.root / "live" / "out"
    published = current_version(out)
    assert published is not None and (read_validation(out, published) or {}).get("success") is True
    assert f"version {published}" in (out / "_report" / "index.html").read_text()


@pytest.mark.background("airflow-stack")
def test_two_runs_queued_at_once_run_one_at_a_time_without_meeting_the_checkpoint_lock(scheduled: Scheduled) -> None:
    assert scheduled.max_running == 1
    spans = sorted((r["start_date"], r["end_date"]) for r in scheduled.runs)
    assert all(earlier[1] <= later[0] for earlier, later in itertools.pairwise(spans)), spans
    # No task failed or was retried, and no task log mentions the single-writer lock.
    assert all(
        state in ("success", "skipped") and tries == 1 for t in scheduled.tasks.values() for state, tries in t.values()
    ), scheduled.tasks
    assert scheduled.locked_in_logs == []


@pytest.mark.background("airflow-stack")
def test_a_run_with_engine_kept_driver_runs_on_the_stack_s_kept_driver(done: StackRun, scheduled: Scheduled) -> None:
    """The first queued run (``engine: kept_driver``) replayed the new files and validated them on the driver
    ``./dev.sh airflow`` started, through the ``REPLAY_DRIVER`` its services have; it published (above)."""
    tasks = scheduled.tasks[scheduled.queued[0]]
    assert tasks["replay"] == ("success", 1) and tasks["validate"] == ("success", 1), tasks
    assert tasks["publish"][0] == "success", tasks
    sent = sorted(p.split("task_id=")[1].split("/")[0] for p in scheduled.sent_to_driver)
    assert sent == ["replay", "validate"], scheduled.sent_to_driver
    assert all(scheduled.queued[0] in p for p in scheduled.sent_to_driver), scheduled.sent_to_driver
    assert (scheduled.driver["runs"], scheduled.driver["failed"]) == (2, 0), scheduled.driver
    assert scheduled.driver["master"].startswith("local")
    # The Replays page shows it, idle after its two.
    shown = scheduled.listing.json()["driver"]
    assert (shown["state"], shown["runs"], shown["failed"]) == ("idle", 2, 0), shown
    log = done.driver_log
    assert log.count(": done in ") == 2 and "validation of " in log and "run into " in log, log[-3000:]


@pytest.mark.background("airflow-stack")
def test_the_watermark_gate_defers_to_the_triggerer_and_resumes_when_a_replay_moves_g_k(
    done: StackRun, scheduled: Scheduled
) -> None:
    from replay_airflow.hooks import CheckpointHook

    assert "deferred" in scheduled.gate_states, scheduled.gate_states
    after = scheduled.gate_states[scheduled.gate_states.index("deferred") :]
    assert after[-1] == "success" and "failed" not in after, scheduled.gate_states
    final = CheckpointHook(checkpoint=str(done.root / "live")).global_watermark()
    assert final is not None and final >= scheduled.gate_target > scheduled.first_global


@pytest.mark.background("airflow-stack")
def test_the_replays_page_on_the_api_server_shows_the_replays_with_reports_runs_and_lag(
    done: StackRun, scheduled: Scheduled, tmp_path: Path
) -> None:
    assert scheduled.listing.status == 200
    rows = {r["name"]: r for r in scheduled.listing.json()["replays"]}
    live = rows["live"]
    out = done.root / "live" / "out"
    assert live["state"] == "finished" and live["output"] == str(out) and live["published"] == current_version(out)
    assert live["report"]["url"] == "/replay/files/live/out/_report/index.html"
    assert live["data_docs"]["url"].startswith("/replay/files/live/out/_validation/gx/uncommitted/data_docs/")
    # The DAG runs that wrote it, as Airflow knows them, with links into Airflow's UI.
    wrote = [r for r in scheduled.runs if scheduled.tasks[r["dag_run_id"]].get("publish", ("", 0))[0] == "success"]
    recorded = {(d["dag_id"], d["run_id"]) for d in live["dag_runs"]}
    assert {("replay_scheduled", r["dag_run_id"]) for r in wrote} <= recorded
    assert {("replay_quality_report", q["dag_run_id"]) for q in scheduled.quality_runs} <= recorded
    assert all(d["url"].startswith("http://127.0.0.1:") for d in live["dag_runs"])
    assert "/dags/replay_scheduled/runs/" in " ".join(d["url"] for d in live["dag_runs"])
    # Fully replayed: the newest archived watermark is known, and G_k lags behind it by the origins' spread.
    assert live["lag"]["files"] == 2 and "footer statistics" in live["lag"]["source"]
    assert all(k["newest"] and k["lag_seconds"] is not None and k["lag_seconds"] >= 0 for k in live["lag"]["keys"])
    # The report is served to an Airflow user only, and only reports and Data Docs are.
    assert scheduled.report_file.status == 200 and f"version {live['published']}" in scheduled.report_file.body
    assert scheduled.report_file_anonymous.status == 303  # a browser without a user goes to the login
    assert scheduled.outside_file.status == 404

    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium package is not installed")
    shot = tmp_path / "replays.png"
    shutil.copy(scheduled.screenshot, shot)
    dom = scheduled.dom
    assert "<h1>Replays</h1>" in dom and "<strong>live</strong>" in dom and "state-finished" in dom
    gk = live["lag"]["keys"][0]
    assert f"<code>{gk['key']}</code>: {gk['global']}" in dom and 'class="lag">lag ' in dom
    assert 'href="/replay/files/live/out/_report/index.html"' in dom and 'class="data-docs"' in dom
    assert scheduled.queued[0] in dom and "replay_quality_report / " in dom
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    assert image.size == (1400, 900)
    colours = sorted(image.getcolors(maxcolors=1 << 20) or [], reverse=True)
    assert len(colours) > 20 and colours[0][0] < 0.95 * 1400 * 900
