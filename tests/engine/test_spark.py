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
