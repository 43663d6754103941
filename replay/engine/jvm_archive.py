"""A class-data sharing archive for the driver's JVM: Spark's classes mapped from one file at start-up
instead of read, verified and linked one by one (docs/performance-record.md#the-jvms-start-up).

Every ``replay`` command that runs Spark, and every Airflow task that calls the library, starts a JVM
that loads some 15,000 of Spark's classes before its first query ends. Java 17 records the classes a
JVM loaded into a file when it exits (``-XX:ArchiveClassesAtExit``) and maps them from that file in
later JVMs (``-XX:SharedArchiveFile``): ``replay jvm-archive`` makes the file once, from a small
replay of its own (``create``); ``replay.engine.spark.get_session`` starts the driver with it from
then on (``java_options``). On the machine that measured it, a cold ``replay run`` of 10M tuples took
40 s instead of 48 s, of which the session's start-up 7 s instead of 11 s.

The file belongs to one Java runtime and one Spark installation (the JVM checks the class path's
jars, by path, size and time, and ignores an archive that does not match them): its default place
is in the Python environment that holds that Spark, named after both. A JVM given a truncated archive crashes, so the
file is written under a temporary name, moved into place once complete, and used only while a
record beside it (``.json``: its size and modification time) matches it. ``REPLAY_JVM_ARCHIVE``
names another file, or is ``off``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from replay.core.errors import ConfigError, Location

__all__ = [
    "ENV",
    "Created",
    "archive_path",
    "create",
    "java_options",
    "recording_options",
    "remove",
    "usable",
    "wait_for_exit",
]

ENV = "REPLAY_JVM_ARCHIVE"  # a path, or "off"
_OFF = "off"
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # an archive the JVM cannot use is ignored, silently


def _java() -> str | None:
    """The ``java`` Spark's launcher starts: ``$JAVA_HOME/bin/java``, else the one on the PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return os.path.realpath(os.path.join(home, "bin", "java"))
    found = shutil.which("java")
    return os.path.realpath(found) if found else None


def _spark_home() -> str:
    from pyspark.find_spark_home import _find_spark_home

    return os.path.realpath(_find_spark_home())


def _key() -> str:
    """What the archive is valid for: the Java runtime (its binary) and the Spark installation (its jars)."""
    java = _java()
    jars = Path(_spark_home()) / "jars"
    parts = [java or "", str(jars)]
    if java:
        stat = os.stat(java)
        parts.append(f"{stat.st_size}:{stat.st_mtime_ns}")
    if jars.is_dir():
        parts += sorted(p.name for p in jars.iterdir())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def archive_path() -> Path | None:
    """Where the archive is (or goes): ``REPLAY_JVM_ARCHIVE``, else ``share/replay/spark-<key>.jsa``
    in this Python environment (``sys.prefix``), beside the Spark it was made for and gone with it;
    ``None`` when the variable says ``off``."""
    given = os.environ.get(ENV, "").strip()
    if given.lower() == _OFF:
        return None
    if given:
        return Path(given).expanduser()
    return Path(sys.prefix) / "share" / "replay" / f"spark-{_key()}.jsa"


def _record(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def usable(path: Path) -> bool:
    """Whether ``path`` is a complete archive: its record beside it gives its size and modification
    time as they are (a truncated or rewritten file is not used: the JVM would crash on the first)."""
    try:
        record = json.loads(_record(path).read_text())
        stat = path.stat()
    except (OSError, ValueError):
        return False
    if not isinstance(record, dict):
        return False
    return record.get("size") == stat.st_size and record.get("mtime_ns") == stat.st_mtime_ns


def remove(path: Path) -> None:
    """Delete the archive ``path`` and its record (record first: a file without one is never used)."""
    _record(path).unlink(missing_ok=True)
    path.unlink(missing_ok=True)


def java_options() -> str:
    """The driver JVM's options that map the archive, or ``""`` when there is none to use."""
    try:
        path = archive_path()
    except (OSError, RuntimeError):  # the Java binary or Spark's jars could not be read: start without it
        return ""
    if path is None or not usable(path):
        return ""
    return f"-XX:SharedArchiveFile={path} -Xshare:auto {_QUIET}"


@dataclass(frozen=True)
class Created:
    """An archive ``create`` wrote: where, its size in bytes, and the seconds it took."""

    path: Path
    size: int
    seconds: float


def recording_options(destination: Path | str) -> str:
    """The driver JVM options of the process ``create`` starts: write ``destination`` at exit."""
    return f"-XX:ArchiveClassesAtExit={destination} {_QUIET}"


def wait_for_exit() -> None:
    """Stop the session and wait for its JVM to end (it writes the archive as it exits): PySpark
    leaves the JVM to end by itself after the Python process, which would not wait for the file."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    process = getattr(SparkContext._gateway, "proc", None)
    if session is not None:
        session.stop()
    if process is not None:
        process.stdin.close()  # the JVM ends when its stdin does
        process.wait()


def create(path: Path | None, recorder: Sequence[str]) -> Created:
    """Write the archive: ``recorder`` plus a temporary path is a process that runs a small replay
    with ``recording_options`` of that path and ``wait_for_exit`` (``replay jvm-archive`` does,
    with ``--record-into``); its JVM records the classes it loaded when it exits.

    Raises:
        ConfigError: ``REPLAY_JVM_ARCHIVE`` is ``off`` and no ``path`` was given, or the JVM wrote
            no archive (its output is in the message).
    """
    target = path if path is not None else archive_path()
    if target is None:
        raise ConfigError(
            f"{ENV} is 'off': no JVM archive is used or made",
            where=Location(extra={ENV: os.environ.get(ENV, "")}),
            todo=f"unset {ENV}, or give the archive's path",
            code="env.jvm_archive_off",
        )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot make the JVM archive's directory: {exc}",
            where=Location(file=str(target)),
            todo=f"set {ENV} to a file in a directory you can write",
            code="env.jvm_archive",
        ) from exc
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="replay-jvm-archive-") as work:
        partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        env = os.environ | {ENV: _OFF}  # Java 17 records no archive on top of another
        child = subprocess.run(
            [*recorder, str(partial)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if child.returncode != 0 or not partial.is_file():
            partial.unlink(missing_ok=True)
            raise ConfigError(
                "the JVM wrote no class-data archive",
                where=Location(file=str(target), extra={"output": (child.stderr or child.stdout)[-2000:]}),
                todo="check that Java 17 or later runs Spark here ('replay run' on a small archive); "
                f"runs work without the archive, only their JVM starts slower (set {ENV}=off to stop looking for it)",
                code="env.jvm_archive",
            )
        os.replace(partial, target)
    stat = target.stat()
    _record(target).write_text(json.dumps({"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}))
    return Created(path=target, size=stat.st_size, seconds=time.perf_counter() - began)
