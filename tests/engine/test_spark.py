"""The per-core settings ``replay.engine.spark`` chooses (``follow_cores``).

A session started on a cluster asks for its cores before the executors register: the split count
and shuffle partitions it chose then follow the cores Spark has when a pass runs, unless the job or
anyone else set them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from replay.engine.spark import _CHOSEN, _MIN_SPLITS, _SHUFFLE, follow_cores

pytestmark = pytest.mark.spark


@contextmanager
def _kept(spark: Any, *keys: str) -> Iterator[None]:
    before = {key: spark.conf.get(key, None) for key in keys}
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def test_a_chosen_setting_follows_the_cores_and_a_given_one_stands(spark: Any) -> None:
    cores = spark.sparkContext.defaultParallelism
    keys = (_SHUFFLE, _MIN_SPLITS, _CHOSEN + _SHUFFLE, _CHOSEN + _MIN_SPLITS)
    with _kept(spark, *keys):
        # Chosen when the session started, before the executors registered: one core then.
        for key, value in ((_SHUFFLE, "1"), (_MIN_SPLITS, "2")):
            spark.conf.set(key, value)
            spark.conf.set(_CHOSEN + key, value)
        follow_cores(spark)
        assert spark.conf.get(_SHUFFLE) == str(cores)
        assert spark.conf.get(_MIN_SPLITS) == str(2 * cores)
        assert spark.conf.get(_CHOSEN + _SHUFFLE) == str(cores)
        # Set by someone since (a notebook, a test): it stands, and so does a key never chosen.
        spark.conf.set(_SHUFFLE, "7")
        spark.conf.set(_CHOSEN + _MIN_SPLITS, "1")
        spark.conf.unset(_CHOSEN + _SHUFFLE)
        follow_cores(spark)
        assert spark.conf.get(_SHUFFLE) == "7"
        spark.conf.set(_CHOSEN + _SHUFFLE, "3")
        follow_cores(spark)
        assert spark.conf.get(_SHUFFLE) == "7"
        assert spark.conf.get(_MIN_SPLITS) == str(2 * cores)  # not the one chosen: left alone


def test_the_driver_jvm_compiles_with_the_optimizing_compiler_later(spark: Any) -> None:
    """The test session's JVM, started with ``driver_java_options`` as every Replay driver is, runs
    with the JIT's tier-4 thresholds Replay gives it (``compiler_options``): the JVM took them."""
    from replay.engine.spark import compiler_options, driver_java_options

    assert compiler_options() in driver_java_options()
    jvm = spark.sparkContext._jvm
    taken = set(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    wanted = compiler_options().split()
    assert wanted and set(wanted) <= taken
    flags = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    assert flags.getVMOption("Tier4InvocationThreshold").getValue() == "50000"


def test_pyspark_s_converters_are_imported_ahead_in_a_thread_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before a JVM starts, ``get_session`` imports what PySpark imports once the JVM is up
    (``pyspark.testing.utils``, pandas with it) in another thread; nothing when it is loaded."""
    import importlib
    import sys
    import threading

    from replay.engine import spark as module

    calls: list[tuple[str, str]] = []
    done = threading.Event()

    def recorded(name: str) -> object:
        calls.append((name, threading.current_thread().name))
        done.set()
        return None

    monkeypatch.setattr(importlib, "import_module", recorded)
    monkeypatch.setitem(sys.modules, "pyspark.testing.utils", sys.modules.get("pyspark.testing.utils"))
    module._import_ahead()  # loaded: nothing to do
    assert not calls
    monkeypatch.delitem(sys.modules, "pyspark.testing.utils")
    module._import_ahead()
    assert done.wait(10)
    assert calls == [("pyspark.testing.utils", "replay-import-ahead")]
    assert threading.current_thread().name != "replay-import-ahead"


@pytest.mark.parametrize("submitted", [False, True])
def test_get_session_starts_the_import_ahead_just_before_the_jvm(
    monkeypatch: pytest.MonkeyPatch, submitted: bool
) -> None:
    """A session of its own starts the import thread, then the JVM; under spark-submit the JVM is up already."""
    import os
    import sys

    from pyspark.sql import SparkSession

    from replay.engine import spark as module

    order: list[str] = []

    class Started(Exception):
        pass

    def get_or_create(self: Any) -> None:
        order.append("jvm")
        raise Started

    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))  # not the test session's
    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", get_or_create)
    monkeypatch.setattr(module, "check_java", lambda: None)
    monkeypatch.setattr(module, "_import_ahead", lambda: order.append("import ahead"))
    for name in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP"):  # set by get_session if unset: put back after
        monkeypatch.setenv(name, os.environ.get(name, sys.executable if name == "PYSPARK_PYTHON" else "127.0.0.1"))
    if submitted:
        monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")
    else:
        monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    with pytest.raises(Started):
        module.get_session()
    assert order == (["jvm"] if submitted else ["import ahead", "jvm"])
