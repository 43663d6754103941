"""A throwaway Airflow installation for tests: its own AIRFLOW_HOME, SQLite metadata database and roots.

Commands run as subprocesses of the real ``airflow`` CLI (``airflow dags test`` executes a DAG run
in one process: tasks in-process, deferred tasks' triggers inline), with this repository's
``dags/`` and ``plugins/`` and every path root under ``root``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
AIRFLOW = Path(sys.executable).parent / "airflow"

#: Spark settings for DAG runs in tests: two cores, small shuffles (the tests' own session uses the same).
SPARK_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}


@dataclass(frozen=True)
class AirflowHome:
    home: Path
    root: Path

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update(
            AIRFLOW_HOME=str(self.home),
            AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
            AIRFLOW__CORE__PLUGINS_FOLDER=str(REPO / "plugins"),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__REPLAY__ROOT=str(self.root),
            PYTHONPATH=str(REPO / "plugins"),
        )
        env.update(extra)
        return env

    def run(
        self, *args: str, check: bool = True, timeout: float = 900, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        # ``timeout`` guards against a hang, it checks no speed: on a loaded 2-core machine the
        # standalone cluster's DAG run, beside the suite's other background work, took over 600 s.
        result = subprocess.run(
            [str(AIRFLOW), *args],
            env=self.env(**(env or {})),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.home,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"airflow {' '.join(args)} exited {result.returncode}\n--- stdout\n{result.stdout[-6000:]}"
                f"\n--- stderr\n{result.stderr[-6000:]}"
            )
        return result

    def dags_test(
        self, dag_id: str, conf: dict[str, Any], *, check: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.run("dags", "test", dag_id, "--conf", json.dumps(conf), check=check, env=env)

    @contextmanager
    def dags_test_meanwhile(self, dag_id: str, conf: dict[str, Any]) -> Iterator[None]:
        """``airflow dags test`` in the background while the block runs (say, the in-process reference
        run the DAG is compared with); it must then succeed."""
        log = self.home / f"dags-test-{dag_id}-{time.monotonic_ns()}.log"
        with open(log, "w") as sink:
            process = subprocess.Popen(
                [str(AIRFLOW), "dags", "test", dag_id, "--conf", json.dumps(conf)],
                env=self.env(),
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=self.home,
            )
        try:
            yield
            code = process.wait(timeout=600)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        if code != 0:
            raise AssertionError(f"airflow dags test {dag_id} exited {code}\n{log.read_text()[-8000:]}")


def make_home(base: Path) -> AirflowHome:
    """Create the home and its metadata database (``airflow db migrate``, about 12 s)."""
    home = AirflowHome(home=base / "airflow", root=base / "roots")
    home.home.mkdir(parents=True)
    home.root.mkdir(parents=True)
    home.run("db", "migrate")
    return home
