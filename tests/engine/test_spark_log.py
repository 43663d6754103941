"""Where a command's Spark log goes (``replay.engine.spark_log``): the directory it is kept in, the
option that names it to the JVM, and the week after which old logs go."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from replay.engine import spark_log
from replay.engine.spark import driver_java_options


@pytest.fixture
def fresh() -> Iterator[None]:
    """Each test picks this process's log anew (the choice is made once per process)."""
    spark_log.spark_log.cache_clear()
    yield
    spark_log.spark_log.cache_clear()


def test_the_log_lives_in_replay_log_dir_and_is_named_to_the_jvm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh: None
) -> None:
    monkeypatch.setenv("REPLAY_LOG_DIR", str(tmp_path / "logs"))
    path = spark_log.spark_log()
    assert path.parent == tmp_path / "logs" and path.name.endswith(f"-{os.getpid()}.log")
    assert not path.exists()  # the JVM makes it on its first line
    assert f"-Dreplay.spark.log={path}" in driver_java_options().split()
    assert spark_log.written_spark_log() is None
    path.write_text("")
    assert spark_log.written_spark_log() is None  # nothing written: nothing to name
    path.write_text("26/11/29 05:23:29 ERROR Executor: ...\n")
    assert spark_log.written_spark_log() == path


def test_without_replay_log_dir_it_is_the_user_s_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh: None
) -> None:
    monkeypatch.delenv("REPLAY_LOG_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert spark_log.spark_log().parent == tmp_path / "state" / "replay" / "logs"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    spark_log.spark_log.cache_clear()
    assert spark_log.spark_log().parent == tmp_path / "home" / ".local" / "state" / "replay" / "logs"


def test_a_directory_that_cannot_be_made_falls_back_to_the_temporary_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh: None
) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("REPLAY_LOG_DIR", str(tmp_path / "a-file" / "logs"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    assert spark_log.spark_log().parent == tmp_path / "tmp" / f"replay-logs-{os.getuid()}"
    # A user with no home directory (an arbitrary uid in a container, no HOME): the same.
    spark_log.spark_log.cache_clear()
    monkeypatch.delenv("REPLAY_LOG_DIR")
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert spark_log.spark_log().parent == tmp_path / "tmp" / f"replay-logs-{os.getuid()}"


def test_a_path_spark_would_split_is_not_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh: None) -> None:
    monkeypatch.setenv("REPLAY_LOG_DIR", str(tmp_path / "my logs"))
    assert spark_log.log_option() == ""
    assert "replay.spark.log" not in driver_java_options()


def test_logs_older_than_a_week_go_when_a_command_picks_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh: None
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    old = logs / f"spark-20261101T000000Z-{int(ended.stdout)}.log"  # its process has ended
    running = logs / f"spark-20261101T000000Z-{os.getpid()}.log"  # a kept driver idle for a week
    recent, other = logs / "spark-20261123T000000Z-1.log", logs / "notes.txt"
    for path in (old, running, recent, other):
        path.write_text("x")
    eight_days_ago = time.time() - 8 * 24 * 3600
    for path in (old, running, other):
        os.utime(path, (eight_days_ago, eight_days_ago))
    os.utime(recent, (time.time() - 6 * 24 * 3600,) * 2)
    monkeypatch.setenv("REPLAY_LOG_DIR", str(logs))
    spark_log.spark_log()
    assert not old.exists() and running.exists() and recent.exists() and other.exists()
