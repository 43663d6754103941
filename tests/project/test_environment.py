"""The environment holds exactly one PySpark, the locked one.

``apache-airflow-providers-apache-spark`` (the DAGs' spark_submit engine) requires ``pyspark-client``,
which ships the same ``pyspark`` package files at another version: installed beside ``pyspark``,
whichever was installed last wins file by file. pyproject.toml's ``override-dependencies`` keeps it
out; this checks that it stayed out and that nothing else brought a second copy.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pyspark

ROOT = Path(__file__).resolve().parents[2]


def _pinned_pyspark() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [re.fullmatch(r"pyspark==([\w.]+)", d) for d in project["dependencies"]]
    versions = [m.group(1) for m in pins if m]
    assert len(versions) == 1, project["dependencies"]
    return versions[0]


def test_exactly_one_distribution_owns_the_pyspark_package_and_it_is_the_pinned_one() -> None:
    owners = sorted(
        (dist.metadata["Name"], dist.version)
        for dist in importlib.metadata.distributions()
        if any(str(f).startswith("pyspark/") for f in dist.files or ())
    )
    assert owners == [("pyspark", _pinned_pyspark())]
    assert pyspark.__version__ == _pinned_pyspark()
    installed = {dist.metadata["Name"].lower() for dist in importlib.metadata.distributions()}
    assert "pyspark-client" not in installed and "pyspark-connect" not in installed
    # The Spark provider (SparkSubmitHook) is there, without its pyspark-client.
    assert "apache-airflow-providers-apache-spark" in installed
