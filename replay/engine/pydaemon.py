"""Spark's Python daemon for a local master, started from the installed PySpark's compiled modules.

Spark starts its Python workers from a daemon (``python -m pyspark.daemon``) whose ``PYTHONPATH``
starts with the copies of PySpark and py4j bundled in the Spark distribution as zip files. A
pip-installed PySpark bundles them too (``pyspark/python/lib/pyspark.zip``), and zip files hold
only sources, so every daemon compiled each PySpark module it imported again: about 1 s of CPU
before a new JVM's first Python task (docs/performance-record.md). ``replay.engine.spark`` names this
module as ``spark.python.daemon.module`` for a local master whose workers run the driver's own
interpreter. It drops from the path only those zips of the installed PySpark the workers would
import anyway, with its compiled modules, then runs ``pyspark.daemon`` as Spark would. A Spark
distribution of its own (``SPARK_HOME`` elsewhere) keeps its zips, and so its modules.

It also keeps a worker quiet when the JVM has closed its socket before the worker's last flush (a
stopping Spark, a task whose output is no longer wanted). PySpark's daemon then printed the
``BrokenPipeError``'s traceback on stderr, in 7 of 20 small runs measured, after or (cut
short by the JVM's exit) within the command's output. The worker ends as it did, without it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["quiet_worker", "without_bundled_zips"]

Worker = Callable[[Any, bool], int]


def without_bundled_zips(path: Sequence[str]) -> list[str]:
    """``path`` without the zip files inside the PySpark package found on ``path``'s other entries
    (its bundled ``pyspark.zip`` and py4j), so that the package's own modules are imported instead;
    ``path`` unchanged when no such package is found."""
    from importlib.machinery import PathFinder

    kept = [entry for entry in path if not entry.endswith(".zip")]
    spec = PathFinder.find_spec("pyspark", kept)
    if spec is None or not spec.submodule_search_locations:
        return list(path)
    bundled = os.path.join(os.path.realpath(next(iter(spec.submodule_search_locations))), "python", "lib") + os.sep
    return [entry for entry in path if not (entry.endswith(".zip") and os.path.realpath(entry).startswith(bundled))]


def quiet_worker(worker: Worker) -> Worker:
    """``worker`` (``pyspark.daemon.worker``, which runs one task on a socket from the JVM), ending
    with code 1 instead of raising when the JVM has closed the socket: the daemon ends such a worker
    (``PYTHON_DAEMON_KILL_WORKER_ON_FLUSH_FAILURE``) after printing the error's traceback."""

    def run(sock: Any, authenticated: bool) -> int:
        try:
            return worker(sock, authenticated)
        except (BrokenPipeError, ConnectionResetError):
            return 1  # not reused: the daemon's loop lets the socket close, and the process exits

    run.__qualname__ = f"quiet_worker.<{worker.__qualname__}>"
    return run


def _main() -> None:
    try:
        trimmed = without_bundled_zips(sys.path)
    except Exception:  # a path it cannot read: start the daemon as Spark would
        trimmed = sys.path
    for dropped in set(sys.path) - set(trimmed):
        sys.path_importer_cache.pop(dropped, None)  # no zip importer for the workers to refresh
    sys.path[:] = trimmed
    import pyspark.daemon as daemon  # after the path is trimmed: its compiled modules

    daemon.worker = quiet_worker(daemon.worker)  # type: ignore[assignment]  # what ``manager`` calls per worker
    daemon.manager()


if __name__ == "__main__":
    _main()
