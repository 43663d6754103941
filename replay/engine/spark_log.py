"""Where a command's Spark log goes.

The driver's JVM logs Spark's warnings and errors twice (``log4j2.properties`` beside this module):
on stderr one line each, an exception as its message only, and in this process's log file whole,
with their stack traces. A failure Replay understands (a damaged file, say) is then one clear error
after a few lines of Spark's, not some 130 lines of traces; the traces are in the file, which the
command names when it fails.

The file is ``spark-<UTC time>-<pid>.log`` in ``REPLAY_LOG_DIR``, else in ``$XDG_STATE_HOME/replay/logs``
(``~/.local/state/replay/logs``), else, where that cannot be made, in the system's temporary directory.
Spark creates it only when it has something to write. Files older than a week go when a later
command picks its own, unless their process still runs.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import time
from pathlib import Path

__all__ = ["LOG_DIR_ENV", "chosen_spark_log", "log_option", "spark_log", "written_spark_log"]

LOG_DIR_ENV = "REPLAY_LOG_DIR"
#: The JVM system property ``log4j2.properties`` reads the file's path from.
PROPERTY = "replay.spark.log"
_KEPT_SECONDS = 7 * 24 * 3600


def _directory() -> Path:
    given = os.environ.get(LOG_DIR_ENV, "").strip()
    if given:
        return Path(given).expanduser()
    state = os.environ.get("XDG_STATE_HOME", "").strip()
    return (Path(state) if state else Path.home() / ".local" / "state") / "replay" / "logs"


@functools.cache
def spark_log() -> Path:
    """This process's Spark log file (not created here: the JVM makes it on its first line)."""
    name = f"spark-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}.log"
    try:
        directory = _directory()
        directory.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError):  # not writable, or no home directory (a container's nameless user)
        directory = Path(tempfile.gettempdir()) / f"replay-logs-{os.getuid()}"
        directory.mkdir(parents=True, exist_ok=True)
    _prune(directory)
    return directory / name


def _prune(directory: Path) -> None:
    """Remove the logs older than a week, but for a process that still runs (a kept driver idle for
    a week writes to its log still)."""
    cutoff = time.time() - _KEPT_SECONDS
    for old in directory.glob("spark-*.log"):
        with contextlib.suppress(OSError):  # another command's prune got there first
            if old.stat().st_mtime < cutoff and not _running(old):
                old.unlink()


def _running(log: Path) -> bool:
    """Whether the process a log is named after (``spark-<time>-<pid>.log``) still runs here."""
    pid = log.stem.rsplit("-", 1)[-1]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: it runs
        return True
    return True


def log_option() -> str:
    """The driver JVM's option naming the file; ``""`` when no directory for it can be made (the
    JVM then logs to stderr only)."""
    try:
        path = spark_log()
    except OSError:
        return ""
    text = str(path)
    if any(c.isspace() or c in "'\"" for c in text):  # Spark splits the options on blanks
        return ""
    return f"-D{PROPERTY}={text}"


def chosen_spark_log() -> Path | None:
    """This process's Spark log once its driver JVM was given it (``log_option``), else ``None``."""
    return spark_log() if spark_log.cache_info().currsize else None


def written_spark_log() -> Path | None:
    """This process's Spark log when Spark wrote something to it, else ``None``."""
    path = chosen_spark_log()
    try:
        return path if path is not None and path.stat().st_size > 0 else None
    except OSError:
        return None
