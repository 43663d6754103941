"""Spark's Python workers on a local master import the installed PySpark's compiled modules, not the
sources of the zip bundled with it (``replay.engine.pydaemon``)."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyspark
import pytest

from replay.engine.pydaemon import quiet_worker, without_bundled_zips
from replay.engine.spark import python_worker_conf

PACKAGE = Path(pyspark.__file__).resolve().parent
BUNDLED = [str(PACKAGE / "python" / "lib" / "pyspark.zip"), str(PACKAGE / "python" / "lib" / "py4j-src.zip")]


def test_only_the_installed_pysparks_own_zips_are_dropped(tmp_path: Path) -> None:
    site = str(PACKAGE.parent)
    elsewhere = [str(tmp_path / "spark" / "python" / "lib" / "pyspark.zip"), str(tmp_path / "deps.zip")]
    path = [*BUNDLED, *elsewhere, site, str(tmp_path)]
    assert without_bundled_zips(path) == [*elsewhere, site, str(tmp_path)]
    # Without the package on the path's other entries, its zips are what the workers import: kept.
    assert without_bundled_zips([*BUNDLED, str(tmp_path)]) == [*BUNDLED, str(tmp_path)]


def test_the_daemon_is_named_only_for_workers_that_run_this_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    assert python_worker_conf() == {"spark.python.daemon.module": "replay.engine.pydaemon"}
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/other/python3")
    assert python_worker_conf() == {}


@pytest.mark.spark
def test_the_workers_import_pyspark_from_its_package(spark: Any) -> None:
    """The test session names the daemon as ``get_session`` does; its workers' PySpark is the package's."""
    assert spark.conf.get("spark.python.daemon.module") == "replay.engine.pydaemon"

    def where(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import sys

        import pyspark

        daemon = sys.modules.get("pyspark.daemon")  # the daemon this worker was forked from
        runs = getattr(getattr(daemon, "worker", None), "__qualname__", "")
        for _ in batches:
            zips = [p for p in sys.path if p.endswith(".zip") and "pyspark" in p]
            yield pa.record_batch({"file": [pyspark.__file__], "zips": [len(zips)], "worker": [runs]})

    rows = spark.range(2, numPartitions=2).mapInArrow(where, "file string, zips long, worker string").collect()
    assert len(rows) == 2
    for row in rows:
        assert Path(row["file"]).resolve().parent == PACKAGE, row["file"]
        assert row["zips"] == 0
        assert row["worker"] == "quiet_worker.<worker>"  # the daemon runs its tasks through quiet_worker


def test_a_worker_whose_socket_the_jvm_closed_ends_without_a_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    """PySpark's worker flushes its output last; when the JVM has closed the socket (a stopping Spark),
    the flush raises ``BrokenPipeError`` and the daemon printed its traceback. Now the worker ends
    with code 1 (not reused), and prints nothing; other errors still raise."""
    ours, jvm = socket.socketpair()
    jvm.close()

    def worker(sock: socket.socket, authenticated: bool) -> int:
        with open(sock.fileno(), "wb", closefd=False) as out:  # as pyspark.daemon.worker does, on a dup
            out.write(b"x" * 65536)
            out.flush()
        return 0

    with pytest.raises(BrokenPipeError):  # PySpark's own worker function, as the daemon calls it
        worker(ours, True)
    assert quiet_worker(worker)(ours, True) == 1
    assert capfd.readouterr() == ("", "")

    def failing(sock: socket.socket, authenticated: bool) -> int:
        raise ValueError("not the JVM's closed socket")

    with pytest.raises(ValueError, match="closed socket"):
        quiet_worker(failing)(ours, True)
    ours.close()
