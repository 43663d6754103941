"""``replay driver serve|status|stop`` and ``replay run --driver`` as users run them: each command a
process of its own, the driver with its own JVM (in the background: ``tests/_background.py``); and
a driver killed with SIGKILL in the middle of a run's commit, whose run then resumes in process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from replay.generate import generate_archive
from replay.generate_options import GenerateOptions
from replay.store.digest import digest
from tests import _background

pytestmark = pytest.mark.spark

REPLAY = [sys.executable, "-m", "replay"]


@dataclass
class Session:
    work: Path
    runs: list[subprocess.CompletedProcess[str]]
    second_serve: subprocess.CompletedProcess[str]
    status: subprocess.CompletedProcess[str]
    stop: subprocess.CompletedProcess[str]
    serve_code: int | None
    serve_log: str
    record_left: bool
    lost: subprocess.CompletedProcess[str]
    killed_code: int | None
    resumed: subprocess.CompletedProcess[str]


def _command(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """One ``replay`` command; a hang fails here, long before the background job's own limit."""
    return subprocess.run([*REPLAY, *args], capture_output=True, text=True, check=False, cwd=cwd, env=env, timeout=600)


@_background.register("kept-driver")
def _session() -> Session:
    work = Path(tempfile.mkdtemp(prefix="replay-driver-test-"))
    generate_archive(work / "archive", GenerateOptions(origins=2, tuples=400, buffer_tuples=50, seed=5, files=2))
    windows = [{"name": "w", "size": "200ms", "aggregations": [{"fn": "count"}, {"fn": "sum", "column": "value"}]}]
    job = {"archive": "archive", "output": "out1", "windows": windows, "micro_batch": {"max_buffers": 3}}
    (work / "job.yaml").write_text(yaml.safe_dump(job))
    home = work / "home"
    log = (work / "serve.log").open("w")
    elsewhere = work / "driver-cwd"  # the driver's working directory is not the client's
    elsewhere.mkdir()
    serve = subprocess.Popen(
        [*REPLAY, "driver", "serve", "--dir", str(home), "--master", "local[1]"], stderr=log, stdout=log, cwd=elsewhere
    )
    try:
        _wait_for_record(home, serve)
        first = _command("run", "-c", "job.yaml", "--driver", str(home), cwd=work)
        second = _command(
            "run", "-c", "job.yaml", "--output", "out2", cwd=work, env=os.environ | {"REPLAY_DRIVER": str(home)}
        )
        second_serve = _command("driver", "serve", "--dir", str(home))
        status = _command("driver", "status", "--dir", str(home), "--json")
        stop = _command("driver", "stop", "--dir", str(home))
        code = _ended(serve)
    finally:
        if serve.poll() is None:
            serve.kill()
        log.close()
    lost, killed_code, resumed = _killed_in_a_commit(work)
    return Session(
        work,
        [first, second],
        second_serve,
        status,
        stop,
        code,
        (work / "serve.log").read_text(),
        (home / "driver.json").exists() or (home / "key").exists(),
        lost,
        killed_code,
        resumed,
    )


def _ended(process: subprocess.Popen[str]) -> int | None:
    try:
        return process.wait(120)
    except subprocess.TimeoutExpired:
        return None


def _wait_for_record(home: Path, serve: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 300
    while not (home / "driver.json").exists() and serve.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)


def _killed_in_a_commit(
    work: Path,
) -> tuple[subprocess.CompletedProcess[str], int | None, subprocess.CompletedProcess[str]]:
    """A kept driver killed with SIGKILL in the commit of a run's second batch (the crash tests'
    ``REPLAY_FAULT`` hook, set in the driver's environment), then the same run in process."""
    home = work / "home-killed"
    env = {k: v for k, v in os.environ.items() if k != "REPLAY_DRIVER"}
    with (work / "serve-killed.log").open("w") as log:
        serve = subprocess.Popen(
            [*REPLAY, "driver", "serve", "--dir", str(home), "--master", "local[1]"],
            stderr=log,
            stdout=log,
            env=env | {"REPLAY_FAULT": "during_commit:2"},
        )
        try:
            _wait_for_record(home, serve)
            lost = _command("run", "-c", "job.yaml", "--output", "out3", "--driver", str(home), cwd=work, env=env)
            code = _ended(serve)
        finally:
            if serve.poll() is None:
                serve.kill()
    resumed = _command("run", "-c", "job.yaml", "--output", "out3", cwd=work, env=env)
    return lost, code, resumed


@pytest.mark.background("kept-driver")
def test_runs_sent_to_a_driver_started_from_the_command_line_and_one_killed_in_a_commit() -> None:
    done: Session = _background.result("kept-driver")
    try:
        for result in done.runs:
            assert result.returncode == 0, (result.stderr[-3000:], done.serve_log[-3000:])
            assert "replayed 8 buffers" in result.stdout and "micro-batch" in result.stdout
        assert (done.work / "out1" / "data").is_dir()  # the client's relative paths, not the driver's
        assert not (done.work / "driver-cwd" / "out1").exists()
        assert digest(done.work / "out1") == digest(done.work / "out2")
        assert done.second_serve.returncode == 2 and "[driver.running]" in done.second_serve.stderr
        assert done.status.returncode == 0, done.status.stderr
        status = json.loads(done.status.stdout)
        assert (status["runs"], status["failed"], status["master"]) == (2, 0, "local[1]")
        spark_log = Path(status["spark_log"])  # the driver's own, where the serve command's environment says
        assert spark_log.parent == Path(os.environ["REPLAY_LOG_DIR"]) and f"-{status['pid']}." in spark_log.name
        assert done.stop.returncode == 0, done.stop.stderr
        assert done.serve_code == 0, done.serve_log[-3000:]
        assert not done.record_left
        assert done.serve_log.count(": done in ") == 2
        # A driver killed in a run's commit: the client says so, and the run in process resumes.
        assert done.killed_code == -signal.SIGKILL, (work_log := (done.work / "serve-killed.log").read_text())
        assert done.lost.returncode == 1 and "[driver.lost]" in done.lost.stderr, (done.lost.stderr, work_log)
        assert done.resumed.returncode == 0, done.resumed.stderr[-3000:]
        assert "replayed 5 buffers" in done.resumed.stdout and "(resumed)" in done.resumed.stdout  # batch 1 kept
        assert digest(done.work / "out3") == digest(done.work / "out1")
    finally:
        shutil.rmtree(done.work, ignore_errors=True)
