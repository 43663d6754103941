"""The driver JVM's class-data archive (``replay.engine.jvm_archive``): made once by ``replay
jvm-archive``, mapped by later JVMs, and never used unless whole (a JVM given a truncated archive
crashes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from replay.cli import app
from replay.core.errors import ConfigError
from replay.engine import jvm_archive
from replay.engine.jvm_archive import ENV, archive_path, java_options, usable
from replay.engine.spark import driver_java_options, with_job_conf
from tests import _background

JAVA = "spark.driver.extraJavaOptions"


def _recorded(path: Path, content: bytes) -> Path:
    """A file with the record ``create`` writes beside an archive."""
    path.write_bytes(content)
    stat = path.stat()
    path.with_name(path.name + ".json").write_text(json.dumps({"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}))
    return path


def test_an_archive_is_used_only_while_its_record_matches_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "spark.jsa"
    monkeypatch.setenv(ENV, str(path))
    assert archive_path() == path
    path.write_bytes(b"x" * 1000)
    assert not usable(path) and java_options() == ""  # no record: a file still being written, or not ours
    _recorded(path, b"x" * 1000)
    assert usable(path)
    assert java_options() == f"-XX:SharedArchiveFile={path} -Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"
    assert java_options() in driver_java_options() and driver_java_options().startswith("-Dlog4j2.configurationFile=")

    with path.open("r+b") as file:  # truncated in place, as a full disk or a killed copy leaves it
        file.truncate(500)
    assert not usable(path) and java_options() == ""
    _recorded(path, b"x" * 1000)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # rewritten, same size
    assert not usable(path) and java_options() == ""
    path.with_name(path.name + ".json").write_text("{not json")
    assert not usable(path)

    monkeypatch.setenv(ENV, "off")
    assert archive_path() is None and java_options() == ""
    assert driver_java_options().startswith("-Dlog4j2.configurationFile=") and "Shared" not in driver_java_options()


def test_the_default_place_is_in_the_environment_and_follows_the_java_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    first = archive_path()
    assert first is not None and first.parent == Path(sys.prefix) / "share" / "replay"
    assert first.name.startswith("spark-") and first.suffix == ".jsa"
    assert archive_path() == first  # the same runtime and Spark: the same file
    other = tmp_path / "jdk" / "bin" / "java"
    other.parent.mkdir(parents=True)
    other.write_text("#!/bin/sh\n")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    second = archive_path()
    assert second is not None and second != first and second.parent == first.parent


def test_the_job_s_driver_options_come_after_replay_s() -> None:
    ours = {JAVA: "-Dours=1", "spark.sql.session.timeZone": "UTC"}
    assert with_job_conf(ours, {JAVA: "-Dtheirs=2", "spark.sql.session.timeZone": "Europe/Paris"}) == {
        JAVA: "-Dours=1 -Dtheirs=2",
        "spark.sql.session.timeZone": "Europe/Paris",
    }
    assert with_job_conf(ours, {"x": "1"}) == ours | {"x": "1"}
    assert with_job_conf({}, {JAVA: "-Dtheirs=2"}) == {JAVA: "-Dtheirs=2"}


@dataclass(frozen=True)
class Made:
    path: Path
    work: Path
    made: subprocess.CompletedProcess[str] | None  # None: the environment's archive was there
    used: subprocess.CompletedProcess[str]
    classes: list[str]  # the class-load log of a JVM started with the archive


_SESSION = """
import sys
from replay.core.config import SparkSettings
from replay.engine.spark import get_session
log = "-Xlog:class+load=info:file=" + sys.argv[1]
session = get_session(SparkSettings(conf={"spark.driver.extraJavaOptions": log}))
assert session.range(10).selectExpr("sum(id)").first()[0] == 45
session.stop()
"""


@_background.register("jvm-archive")
def _make_and_use() -> Made:
    """The archive ``./dev.sh setup`` made for this environment, else one ``replay jvm-archive`` makes
    into a file of its own; then a JVM started by ``get_session`` with it, logging where each class
    came from."""
    work = Path(tempfile.mkdtemp(prefix="replay-jvm-archive-test-"))
    made: subprocess.CompletedProcess[str] | None = None
    path = archive_path()
    if path is None or not usable(path):
        path = work / "spark.jsa"
        made = subprocess.run(
            [sys.executable, "-m", "replay", "jvm-archive", "--path", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
    log = work / "classes.log"
    used = subprocess.run(
        [sys.executable, "-c", _SESSION, str(log)],
        env=os.environ | {ENV: str(path)},
        capture_output=True,
        text=True,
        check=False,
    )
    return Made(path, work, made, used, log.read_text().splitlines() if log.exists() else [])


@pytest.mark.background("jvm-archive")
def test_a_jvm_started_with_the_archive_maps_spark_s_classes_from_it() -> None:
    done: Made = _background.result("jvm-archive")
    try:
        if done.made is not None:
            assert done.made.returncode == 0, done.made.stderr[-3000:]
            assert done.made.stdout.strip() == str(done.path)
            assert not list(done.path.parent.glob(".*.tmp"))  # written under a temporary name, then moved
        assert usable(done.path)
        assert done.used.returncode == 0, done.used.stderr[-3000:]
        # The dynamic archive is the top layer of the JVM's shared classes (the JDK's own is the base).
        mapped = [line for line in done.classes if "source: shared objects file (top)" in line]
        spark_classes = [line for line in mapped if " org.apache.spark." in line]
        assert len(spark_classes) > 1000, (len(mapped), done.classes[:20])
        assert any(" org.apache.spark.sql.SparkSession " in line for line in spark_classes)
    finally:
        shutil.rmtree(done.work, ignore_errors=True)  # an archive made here is large (about 180 MiB)


def test_a_recording_writes_the_archive_whole_with_its_record(tmp_path: Path) -> None:
    target = tmp_path / "jvm" / "spark.jsa"
    writes = "import sys; open(sys.argv[1], 'wb').write(b'x' * 4096)"
    created = jvm_archive.create(target, [sys.executable, "-c", writes])
    assert created.path == target and created.size == 4096 and created.seconds > 0
    assert sorted(p.name for p in target.parent.iterdir()) == ["spark.jsa", "spark.jsa.json"]
    assert usable(target)


def test_the_command_keeps_a_usable_archive_and_removes_it_with_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _recorded(tmp_path / "spark.jsa", b"x" * 100)
    monkeypatch.setenv(ENV, str(path))
    before = path.stat().st_mtime_ns
    kept = CliRunner().invoke(app, ["jvm-archive", "--if-missing"])
    assert kept.exit_code == 0 and kept.stdout.strip() == str(path)
    assert path.stat().st_mtime_ns == before and usable(path)  # nothing was made again
    removed = CliRunner().invoke(app, ["jvm-archive", "--remove"])
    assert removed.exit_code == 0 and removed.stdout.strip() == str(path)
    assert sorted(tmp_path.iterdir()) == []


def test_making_an_archive_when_it_is_switched_off_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "off")
    result = CliRunner().invoke(app, ["jvm-archive"])
    assert result.exit_code == 2
    assert "REPLAY_JVM_ARCHIVE is 'off'" in result.stderr
    with pytest.raises(Exception, match="is 'off'"):
        jvm_archive.create(None, [sys.executable, "-c", "raise SystemExit(1)"])


def test_a_recording_that_fails_leaves_no_archive_and_says_why(tmp_path: Path) -> None:
    """A recorder that wrote part of its file and failed: the error carries its output, and neither the
    part nor an archive stays where a JVM would map it."""
    target = tmp_path / "spark.jsa"
    half = "import sys; open(sys.argv[1], 'wb').write(b'x' * 100); print('no Java here'); raise SystemExit(1)"
    with pytest.raises(ConfigError, match="wrote no class-data archive") as caught:
        jvm_archive.create(target, [sys.executable, "-c", half])
    assert caught.value.code == "env.jvm_archive" and "no Java here" in str(caught.value.to_dict())
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert not usable(target)
