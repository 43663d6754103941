"""DAG integrity: every DAG file parses without errors, cheaply, and without touching connections or Variables."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from tests._airflow import REPO, AirflowHome

DAG_FILES = sorted(p.name for p in (REPO / "dags").glob("*.py"))

# Runs in a fresh interpreter: connections and Variables raise when read, then the DagBag parses the
# folder the way Airflow's DAG processor does, and the modules loaded on the way are reported.
_PARSE = r"""
import json, sys
from airflow.sdk import BaseHook, Variable

def refuse(*args, **kwargs):
    raise RuntimeError(f"read while parsing: {args!r}")

Variable.get = staticmethod(refuse)
BaseHook.get_connection = classmethod(refuse)
from airflow.dag_processing.dagbag import DagBag

bag = DagBag(sys.argv[1])
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"pyspark", "pyarrow", "pandas", "numpy",
                                                         "great_expectations", "matplotlib"})
print(json.dumps({
    "errors": {k: str(v) for k, v in bag.import_errors.items()},
    "dags": {d.dag_id: sorted(d.task_dict) for d in bag.dags.values()},
    "files": sorted({d.fileloc.rsplit("/", 1)[-1] for d in bag.dags.values()}),
    "heavy": heavy,
    "replay_modules": sorted(m for m in sys.modules if m.startswith("replay.")),
    "engines": {d.dag_id: d.params.get_param("engine").schema.get("enum") for d in bag.dags.values()
                if "engine" in d.params},
    "retries": {d.dag_id: sorted({(t.retries, t.retry_delay.total_seconds()) for t in d.tasks})
                for d in bag.dags.values()},
}))
"""


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    home = AirflowHome(home=tmp_path_factory.mktemp("parse-home"), root=tmp_path_factory.mktemp("parse-roots"))
    result = subprocess.run(
        [sys.executable, "-c", _PARSE, str(REPO / "dags")],
        env=home.env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    data: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return data


def test_every_dag_file_parses_without_errors(parsed: dict[str, object]) -> None:
    assert parsed["errors"] == {}
    assert parsed["files"] == DAG_FILES
    assert parsed["dags"] == {
        "replay_backfill": ["plan", "publish", "replay", "report", "validate"],
        "replay_scheduled": ["plan", "publish", "replay", "validate"],
        "replay_quality_report": ["report", "validate"],
        "replay_watermark_gate": ["wait_for_watermark"],
    }


def test_every_dag_that_validates_offers_the_kept_driver(parsed: dict[str, object]) -> None:
    """Where a DAG's Spark work runs is its ``engine`` param; validation has no spark-submit form."""
    from replay_airflow.params import ENGINES

    assert parsed["engines"] == {
        "replay_backfill": list(ENGINES),
        "replay_scheduled": list(ENGINES),
        "replay_quality_report": ["in_task", "kept_driver"],
    }


def test_parsing_imports_nothing_heavy(parsed: dict[str, object]) -> None:
    assert parsed["heavy"] == []
    # Only the configuration model and what it needs (its error type, time parsing and the
    # vocabulary of enums): no engine, outputs or validation modules.
    light = {
        "replay.core",
        "replay.core.config",
        "replay.core.errors",
        "replay.core.timeutil",
        "replay.core.vocabulary",
    }
    assert set(parsed["replay_modules"]) <= light  # type: ignore[arg-type]


@pytest.mark.parametrize("folder", ["dags", "plugins"])
def test_dag_and_plugin_files_ban_heavy_module_level_imports_statically(folder: str) -> None:
    # The same rule as cosmos' TID253 setting: a heavy import at module level fails ruff there.
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "ruff"),
            "check",
            "--no-cache",
            "--stdin-filename",
            f"{folder}/probe.py",
            "-",
        ],
        input='"""Probe."""\n\nimport pyarrow\n\nprint(pyarrow)\n',
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 1 and "TID253" in result.stdout


def test_the_parse_check_catches_a_variable_read_while_parsing(tmp_path: Path) -> None:
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "reads_a_variable.py").write_text(
        "from airflow.sdk import DAG, Variable\n\n"
        "with DAG('probe', schedule=None, tags=[Variable.get('x')]):\n    pass\n"
    )
    home = AirflowHome(home=tmp_path / "home", root=tmp_path / "roots")
    result = subprocess.run(
        [sys.executable, "-c", _PARSE, str(folder)], env=home.env(), capture_output=True, text=True, check=True
    )
    errors = json.loads(result.stdout.strip().splitlines()[-1])["errors"]
    assert any("read while parsing" in e for e in errors.values())


def test_airflow_loads_the_plugin_with_its_ui_page(tmp_path: Path) -> None:
    home = AirflowHome(home=tmp_path / "home", root=tmp_path / "roots")
    home.home.mkdir()
    listed = json.loads(home.run("plugins", "--output", "json").stdout.strip().splitlines()[-1])
    assert [p["name"] for p in listed] == ["replay"]
    plugin = listed[0]
    assert plugin["fastapi_apps"] == [
        {"app": "fastapi.applications.FastAPI", "url_prefix": "/replay", "name": "Replays"}
    ]
    assert plugin["external_views"][0]["href"] == "replay/" and plugin["external_views"][0]["destination"] == "nav"


def test_every_task_retries_operational_failures(parsed: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    """Two retries a minute apart by default (``replay_airflow.defaults``); bad input is never
    retried (``tests/airflow/test_dags_e2e.py`` shows both)."""
    assert parsed["retries"] == {dag: [[2, 60.0]] for dag in parsed["dags"]}  # type: ignore[union-attr]
    from replay_airflow import task_defaults

    monkeypatch.setenv("REPLAY_TASK_RETRIES", "0")
    monkeypatch.setenv("REPLAY_TASK_RETRY_DELAY", "5")
    assert task_defaults() == {"retries": 0, "retry_delay": timedelta(seconds=5)}
