"""The "Replays" UI page: the plugin's FastAPI app under uvicorn, opened in headless Chromium.

The app is served with Airflow's authentication dependency overridden (``tests/airflow/_ui_without_auth.py``):
these tests look at what the page shows. That it answers only an Airflow user is tested against the
real api-server in ``test_stack.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from replay import checkpoint_status
from tests._airflow import REPO, AirflowHome

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.spark  # through the session's validated output


RUN_ID = "manual__2026-01-02T03:04:05+00:00"


@pytest.fixture(scope="module")
def replays(tmp_path_factory: pytest.TempPathFactory, validated_run: Any) -> tuple[Path, dict[str, Any]]:
    """Two replays under a checkpoint root: "daily", a copy of the session's validated replay whose output
    (copied too, with a report) is under the output root and whose DAG run the plugin recorded, finished;
    and "partial", a copy whose last batch did not finish its run (as after a kill)."""
    from replay.engine.archive import inspect_schema
    from replay.store.checkpoint import CheckpointStore
    from replay.store.durable import write_record
    from replay_airflow.records import record_task

    config, _ = validated_run
    root = tmp_path_factory.mktemp("ui-ckpts")
    outputs = tmp_path_factory.mktemp("ui-outputs")
    out = outputs / "daily"
    shutil.copytree(config.output, out)
    (out / "_report").mkdir()
    (out / "_report" / "index.html").write_text("<!doctype html><title>report</title><h1>The report</h1>")
    (outputs / "secret.txt").write_text("not a report")
    shutil.copytree(config.checkpoint, root / "daily")
    identity = CheckpointStore(root / "daily").identity()
    assert identity is not None
    write_record(root / "daily" / "checkpoint.json", {**identity, "output": str(out)})
    shutil.copytree(config.checkpoint, root / "partial")
    partial = CheckpointStore(root / "partial")
    last = partial.latest()
    assert last is not None
    partial.commit(dataclasses.replace(last, finish=False))

    # What the operators record in a DAG run (here with a context of our own).
    layout = inspect_schema(config)
    columns = {
        k.name: {"column": k.watermark or k.event_time, "unit": layout.time_columns[k.watermark or k.event_time]}
        for k in layout.keys
    }
    context = {
        "dag_run": SimpleNamespace(dag_id="replay_scheduled", run_id=RUN_ID, run_type="manual"),
        "ti": SimpleNamespace(task_id="replay", try_number=1),
    }
    with mock.patch.dict(os.environ, {"AIRFLOW__REPLAY__OUTPUT_ROOT": str(outputs)}):
        record_task(
            context, str(out), "replayed", version=1, batches=2, archive={"path": config.archive, "keys": columns}
        )
        context["ti"] = SimpleNamespace(task_id="validate", try_number=1)
        record_task(context, str(out), "validated", version=1, success=True)
    return root, {"config": config, "outputs": outputs, "out": out, "columns": columns}


@pytest.fixture(scope="module")
def server(replays: tuple[Path, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root, facts = replays
    home = AirflowHome(home=tmp_path_factory.mktemp("ui-home"), root=facts["outputs"])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path_factory.mktemp("ui-log") / "uvicorn.log"
    with open(log, "w") as sink:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "uvicorn", "tests.airflow._ui_without_auth:app", "--factory"),
                *("--host", "127.0.0.1", "--port", str(port)),
            ],
            env=home.env(
                AIRFLOW__REPLAY__CHECKPOINT_ROOT=str(root),
                AIRFLOW__REPLAY__ARCHIVE_ROOT=str(Path(facts["config"].archive).parent),
                PYTHONPATH=f"{REPO / 'plugins'}{os.pathsep}{REPO}",
            ),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/api/replays", timeout=5).read()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.3)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_json_lists_every_replay_with_its_progress(server: str, replays: tuple[Path, dict[str, Any]]) -> None:
    root, facts = replays
    data = json.loads(urllib.request.urlopen(server + "/api/replays", timeout=30).read())
    assert data["roots"]["checkpoint"] == str(root.resolve())
    rows = {r["name"]: r for r in data["replays"]}
    assert set(rows) == {"daily", "partial"}
    daily = rows["daily"]
    assert daily["state"] == "finished" and rows["partial"]["state"] == "interrupted"
    expected = checkpoint_status(facts["config"].checkpoint)
    assert daily["output"] == str(facts["out"])
    assert daily["published"] is None and daily["run_version"] == 1 and daily["validated"] is True
    assert daily["watermarks"] == [
        {"key": k["key"], "global": k["global"], "effective": k["effective"]} for k in expected["keys"]
    ]
    assert daily["stream_cut"] == {str(o): c for o, c in expected["stream_cut"].items()}
    assert daily["batch"] == expected["batch"] == 2
    assert (
        daily["output_watermarks"] == expected["output_watermarks"]
        and None not in expected["output_watermarks"].values()
    )


def test_each_replay_links_its_report_data_docs_and_the_dag_runs_that_wrote_it(
    server: str, replays: tuple[Path, dict[str, Any]]
) -> None:
    from replay.quality.validate import DOCS_INDEX
    from replay_airflow.ui import DATA_DOCS_INDEX

    _, facts = replays
    rows = {
        r["name"]: r for r in json.loads(urllib.request.urlopen(server + "/api/replays", timeout=30).read())["replays"]
    }
    daily, partial = rows["daily"], rows["partial"]
    assert DATA_DOCS_INDEX == DOCS_INDEX
    assert daily["report"] == {
        "path": str(facts["out"] / "_report" / "index.html"),
        "url": "/files/daily/_report/index.html",
    }
    assert daily["data_docs"] == {"path": str(facts["out"] / DOCS_INDEX), "url": f"/files/daily/{DOCS_INDEX}"}
    # The copy's output is the session's, outside the output root: no links, no recorded runs.
    assert partial["report"] is None and partial["data_docs"] is None and partial["dag_runs"] == []
    assert [(r["dag_id"], r["run_id"], r["run_type"]) for r in daily["dag_runs"]] == [
        ("replay_scheduled", RUN_ID, "manual")
    ]
    assert daily["dag_runs"][0]["url"] == "/dags/replay_scheduled/runs/manual__2026-01-02T03%3A04%3A05%2B00%3A00"
    assert [(t["task_id"], t["action"], t["version"]) for t in daily["dag_runs"][0]["tasks"]] == [
        ("replay", "replayed", 1),
        ("validate", "validated", 1),
    ]

    # The files the links name are served; nothing else under (or outside) the output root is.
    assert b"The report" in urllib.request.urlopen(server + daily["report"]["url"], timeout=30).read()
    docs = urllib.request.urlopen(server + daily["data_docs"]["url"], timeout=30)
    assert docs.status == 200 and docs.headers["content-type"].startswith("text/html")
    (facts["out"] / "_report" / "escape.txt").symlink_to(facts["outputs"] / "secret.txt")
    for refused in (
        "/files/secret.txt",
        "/files/daily/_report/escape.txt",  # a symbolic link out of the report
        "/files/daily/_report/../../secret.txt",
        "/files/daily/_report/%2E%2E/%2E%2E/secret.txt",
        "/files/daily/current",
        "/files/daily/_validation/gx/great_expectations.yml",
        "/files//etc/passwd",
        "/files/daily/_report",
    ):
        status = _status(server + refused)
        assert status == 404, (refused, status)


def test_the_lag_of_g_k_behind_the_newest_archived_watermark(server: str, replays: tuple[Path, dict[str, Any]]) -> None:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from replay.core.timeutil import format_ts, parse_timestamp
    from replay.engine.archive_files import discover_files

    _, facts = replays
    rows = {
        r["name"]: r for r in json.loads(urllib.request.urlopen(server + "/api/replays", timeout=30).read())["replays"]
    }
    lag = rows["daily"]["lag"]
    files = discover_files(facts["config"].archive)
    assert lag["archive"] == facts["config"].archive and lag["files"] == len(files)
    assert "Parquet footer statistics" in lag["source"]
    expected = checkpoint_status(facts["config"].checkpoint)
    assert [k["key"] for k in lag["keys"]] == [k["key"] for k in expected["keys"]]
    for row in lag["keys"]:
        column = facts["columns"][row["key"]]["column"]
        newest = max(pc.max(pq.read_table(f, columns=[column])[column]).as_py() for f in files)  # the data itself
        micros = parse_timestamp(newest if newest.tzinfo else newest.replace(tzinfo=UTC))
        assert row["newest"] == format_ts(micros) and row["column"] == column
        assert row["global"] is not None and row["lag_seconds"] == (micros - parse_timestamp(row["global"])) / 1e6
    # Without a recorded archive the lag is unknown, and the page says why.
    assert rows["partial"]["lag"]["source"] is None and all(k["newest"] is None for k in rows["partial"]["lag"]["keys"])


def _status(url: str) -> int:
    try:
        return int(urllib.request.urlopen(url, timeout=30).status)
    except urllib.error.HTTPError as error:
        return int(error.code)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium package is not installed")
def test_the_page_renders_in_headless_chromium(server: str, tmp_path: Path) -> None:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run(
        [str(CHROMIUM), *flags, "--dump-dom", server + "/"], capture_output=True, text=True, timeout=180
    ).stdout
    assert "<h1>Replays</h1>" in dom
    assert dom.count('class="replay"') == 2
    assert "<strong>daily</strong>" in dom and "<strong>partial</strong>" in dom
    assert "state-finished" in dom and "state-interrupted" in dom
    assert "not published" in dom and "run version 1: passed validation" in dom
    assert 'class="gk"' in dom and "1: " in dom  # G_k per key, the stream cut per origin
    assert " open, output wm 20" in dom  # each window aggregation's output watermark (a timestamp)
    assert '<a class="report" href="/files/daily/_report/index.html">HTML report</a>' in dom
    assert 'class="data-docs"' in dom and "no report yet" in dom  # the partial copy has none
    assert f">replay_scheduled / {RUN_ID}</a>" in dom and "manual: replayed v1, validated v1" in dom
    assert "newest archived" in dom and 'class="lag">lag ' in dom and "Parquet footer statistics" in dom
    assert "no Airflow run of this plugin recorded the archive" in dom

    shot = tmp_path / "replays.png"
    subprocess.run(
        [str(CHROMIUM), *flags, f"--screenshot={shot}", "--window-size=1280,800", server + "/"],
        capture_output=True,
        timeout=180,
    )
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 800)
    colours = sorted(image.getcolors(maxcolors=1 << 20) or [], reverse=True)
    assert len(colours) > 20 and colours[0][0] < 0.95 * 1280 * 800  # text and table, not a blank page


def test_the_page_shows_the_kept_driver(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above the replays: the kept driver ``REPLAY_DRIVER`` names, answering or not; nothing without one."""
    import threading

    from replay.driver.home import DriverHome
    from replay.driver.server import DriverServer
    from replay_airflow.ui import _TEMPLATES, kept_driver

    def page(driver: dict[str, Any] | None) -> str:
        roots = {"archive": "/a", "output": "/o", "checkpoint": "/c"}
        return _TEMPLATES.get_template("replays.html.j2").render(roots=roots, driver=driver, replays=[])

    monkeypatch.delenv("REPLAY_DRIVER", raising=False)
    assert kept_driver() is None and 'id="kept-driver"' not in page(None)
    monkeypatch.setenv("REPLAY_DRIVER", str(tmp_path / "none"))
    gone = kept_driver()
    assert gone is not None and gone["state"] == "not answering" and "replay driver serve" in gone["error"]
    assert "state-not-answering" in page(gone)

    server = DriverServer(DriverHome(tmp_path / "home"), spark)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("REPLAY_DRIVER", str(tmp_path / "home"))
        up = kept_driver()
        assert up is not None and (up["state"], up["runs"], up["failed"], up["error"]) == ("idle", 0, 0, None)
        assert up["master"] == str(spark.sparkContext.master) and up["home"] == str(tmp_path / "home")
        html = page(up)
        assert 'id="kept-driver"' in html and "state-idle" in html and "0 served, 0 failed" in html
        assert f"<code>{up['master']}</code>" in html and "JVM heap" in html
        busy = page(up | {"state": "busy", "running": {"op": "run", "output": "/o/daily", "since": 0}})
        assert "now: run of <code>/o/daily</code>" in busy
        assert up["same_code"] and f"Replay <code>{up['code']}</code>" in html and "driver-other-code" not in html
        monkeypatch.setattr(server, "code", "0.0.9+0123456789ab")  # as after an upgrade of this deployment
        other = kept_driver()
        assert other is not None and not other["same_code"] and 'id="driver-other-code"' in page(other)
    finally:
        server.stop()
        thread.join(30)
