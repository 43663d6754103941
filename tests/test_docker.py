"""docker/ is checked statically: no engine runs here. Every image must be buildable from files in the repo."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def test_dockerfile_uses_the_supported_stack_and_the_lock_file() -> None:
    steps = instructions(ROOT / "docker" / "Dockerfile")
    assert steps[0][0] == "FROM" and steps[0][1].startswith("python:3.11")
    runs = " ".join(arg for op, arg in steps if op == "RUN")
    assert "openjdk-17-jre-headless" in runs
    assert "./dev.sh setup" in runs  # the same set-up as without Docker
    for op, arg in steps:
        if op == "COPY":
            for source in arg.split()[:-1]:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
    assert ("ENTRYPOINT", '["replay"]') in steps


def test_the_image_holds_every_package_the_project_builds_before_setting_it_up() -> None:
    import tomllib

    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"][
        "packages"
    ]
    steps = instructions(ROOT / "docker" / "Dockerfile")
    setup = next(i for i, (op, arg) in enumerate(steps) if op == "RUN" and "./dev.sh setup" in arg)
    copied = {source.rstrip("/") for op, arg in steps[:setup] if op == "COPY" for source in arg.split()[:-1]}
    for package in packages:
        assert any(package == c or package.startswith(c + "/") for c in copied), package


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    return data


def test_compose_builds_every_service_from_the_replay_image() -> None:
    services = compose()["services"]
    assert set(services) == {"spark", "airflow"}
    for name, service in services.items():
        build = service["build"]
        assert (ROOT / "docker" / build["context"] / build["dockerfile"]).resolve() == ROOT / "docker" / "Dockerfile"
        assert service["volumes"] == ["replay-data:/data"], name  # the same paths for the task and the executors
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name}: {port} is published beyond the host"
    assert "replay-data" in compose()["volumes"]


def test_compose_starts_what_starts_without_docker(tmp_path: Path) -> None:
    """Each service's command is one a machine without Docker runs: ``./dev.sh cluster``, ``airflow standalone``."""
    services = compose()["services"]
    dev = (ROOT / "dev.sh").read_text()
    spark = services["spark"]
    assert spark["entrypoint"] == ["./dev.sh", "cluster"] and "\n    cluster)\n" in dev
    for variable in spark["environment"]:
        assert variable in dev, f"{variable}: not a setting ./dev.sh cluster documents"
    master = f"spark://{spark['environment']['SPARK_MASTER_HOST']}:{spark['environment']['SPARK_MASTER_PORT']}"
    assert spark["hostname"] == spark["environment"]["SPARK_MASTER_HOST"]
    assert master in (ROOT / "docs" / "airflow.md").read_text()  # the spark_master the docs tell users to set

    airflow = services["airflow"]
    assert airflow["entrypoint"] == ["airflow", "standalone"]
    env = airflow["environment"]
    workdir = next(arg for op, arg in instructions(ROOT / "docker" / "Dockerfile") if op == "WORKDIR")
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == f"{workdir}/dags"
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == f"{workdir}/plugins"
    assert env["AIRFLOW__REPLAY__ROOT"] == "/data" and env["AIRFLOW_HOME"].startswith("/data/")
    assert airflow["depends_on"]["spark"]["condition"] == "service_healthy"
    # `airflow standalone` is a command of the locked Airflow.
    result = subprocess.run(
        [str(Path(sys.executable).with_name("airflow")), "standalone", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, AIRFLOW_HOME=str(tmp_path)),
    )
    assert result.returncode == 0 and "standalone" in result.stdout, result.stderr[-2000:]
