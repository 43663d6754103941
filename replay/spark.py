"""The one place a SparkSession is built.

``local[*]`` embedded by default; any ``spark://`` (or other) master URL from the
job's ``spark.master`` setting. Settings that Replay relies on are forced here:
UTC session time zone (timestamps are instants) and Parquet metadata columns.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

from replay.errors import ConfigError, Location

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from replay.config import SparkSettings

__all__ = ["check_java", "get_session"]

_DEFAULTS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # Replay's shuffles are over buffer metadata or per-batch partial aggregates,
    # both small: a few partitions per core beat Spark's default of 200.
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
}


def check_java() -> None:
    """Fail early, with install instructions, when no Java runtime is on the machine.

    Raises:
        ConfigError: neither ``JAVA_HOME`` nor ``java`` on the PATH.
    """
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.path.exists(os.path.join(java_home, "bin", "java")):
        return
    if shutil.which("java"):
        return
    raise ConfigError(
        "no Java runtime found: PySpark needs Java 17",
        where=Location(extra={"JAVA_HOME": java_home or "(unset)"}),
        todo=(
            "install Java 17 (Debian/Ubuntu: 'apt-get install openjdk-17-jre-headless'; "
            "macOS: 'brew install openjdk@17') or set JAVA_HOME to a Java 17 installation"
        ),
        code="env.no_java",
    )


def get_session(settings: SparkSettings | None = None, *, app_name: str = "replay") -> SparkSession:
    """Return the active SparkSession, or build one from ``settings``.

    An already active session (a test session, a notebook, spark-submit) is reused
    as it is: its master and configuration belong to whoever started it.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    check_java()
    master = settings.master if settings is not None else "local[*]"
    if master.startswith("local"):
        # An embedded driver talks to itself only: bind to loopback instead of guessing an interface.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    builder = builder.master(master)
    conf = dict(_DEFAULTS)
    if settings is not None:
        conf.update(settings.conf)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
