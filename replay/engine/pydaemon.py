"""Spark's Python daemon for a local master, started from the installed PySpark's compiled modules.

Spark starts its Python workers from a daemon (``python -m pyspark.daemon``) whose ``PYTHONPATH``
starts with the copies of PySpark and py4j bundled in the Spark distribution as zip files. A
pip-installed PySpark bundles them too (``pyspark/python/lib/pyspark.zip``), and zip files hold
only sources, so every daemon compiled each PySpark module it imported again: about 1 s of CPU
before a new JVM's first Python task (docs/performance.md). ``replay.engine.spark`` names this
module as ``spark.python.daemon.module`` for a local master whose workers run the driver's own
interpreter. It drops from the path only those zips of the installed PySpark the workers would
import anyway, with its compiled modules, then runs ``pyspark.daemon`` as Spark would. A Spark
distribution of its own (``SPARK_HOME`` elsewhere) keeps its zips, and so its modules.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

__all__ = ["without_bundled_zips"]


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


def _main() -> None:
    import runpy

    try:
        trimmed = without_bundled_zips(sys.path)
    except Exception:  # a path it cannot read: start the daemon as Spark would
        trimmed = sys.path
    for dropped in set(sys.path) - set(trimmed):
        sys.path_importer_cache.pop(dropped, None)  # no zip importer for the workers to refresh
    sys.path[:] = trimmed
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _main()
