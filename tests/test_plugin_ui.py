"""The "Replays" UI page: the plugin's FastAPI app under uvicorn, opened in headless Chromium.

The app is served with Airflow's authentication dependency overridden (``tests/_ui_without_auth.py``):
these tests look at what the page shows. That it answers only an Airflow user is tested against the
real api-server in ``test_airflow_stack.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replay import checkpoint_status
from tests._airflow import REPO, AirflowHome

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.spark  # through the session's validated output


@pytest.fixture(scope="module")
def replays(tmp_path_factory: pytest.TempPathFactory, validated_run: Any) -> tuple[Path, dict[str, Any]]:
    """Two replays under a checkpoint root: the session's validated output's, finished, and a copy of it
    whose last batch did not finish its run (as after a kill)."""
    config, _ = validated_run
    root = tmp_path_factory.mktemp("ui-ckpts")
    shutil.copytree(config.checkpoint, root / "daily")
    shutil.copytree(config.checkpoint, root / "partial")
    commits = sorted((root / "partial" / "commits").glob("*.json"))
    record = json.loads(commits[-1].read_text())
    record["batches"][-1]["finish"] = False
    commits[-1].write_text(json.dumps(record))
    return root, {"config": config}


@pytest.fixture(scope="module")
def server(replays: tuple[Path, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root, _ = replays
    home = AirflowHome(home=tmp_path_factory.mktemp("ui-home"), root=tmp_path_factory.mktemp("ui-outputs"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path_factory.mktemp("ui-log") / "uvicorn.log"
    with open(log, "w") as sink:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "uvicorn", "tests._ui_without_auth:app", "--factory"),
                *("--host", "127.0.0.1", "--port", str(port)),
            ],
            env=home.env(
                AIRFLOW__REPLAY__CHECKPOINT_ROOT=str(root), PYTHONPATH=f"{REPO / 'plugins'}{os.pathsep}{REPO}"
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
    assert daily["output"] == facts["config"].output
    assert daily["published"] is None and daily["run_version"] == 1 and daily["validated"] is True
    assert daily["watermarks"] == [
        {"key": k["key"], "global": k["global"], "effective": k["effective"]} for k in expected["keys"]
    ]
    assert daily["stream_cut"] == {str(o): c for o, c in expected["stream_cut"].items()}
    assert daily["batch"] == expected["batch"] == 2


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
