"""docker/ is checked statically: no engine runs here. Every image must be buildable from files in the repo.

docker/compose.yaml is the deployment: Postgres, airflow-init, Airflow 3's api-server, scheduler, dag-processor
and triggerer, a Spark master and workers. Each service runs the command ``./dev.sh airflow`` or
``./dev.sh cluster`` runs without Docker, with the same Airflow settings; these tests read dev.sh to check it.
The health checks' Python snippets and airflow-init's script are also run, against stand-ins.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import stat
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

AIRFLOW_SERVICES = ("api-server", "scheduler", "dag-processor", "triggerer")
SPARK_SERVICES = ("spark-master", "spark-worker")
SERVICES = {"postgres", "airflow-init", *AIRFLOW_SERVICES, "replay-driver", *SPARK_SERVICES}
DATA_MOUNTS = {
    "replay-archive": "/data/archive",
    "replay-outputs": "/data/outputs",
    "replay-checkpoints": "/data/checkpoints",
}
JOB_TYPES = {"scheduler": "SchedulerJob", "dag-processor": "DagProcessorJob", "triggerer": "TriggererJob"}
SECRETS = ("REPLAY_POSTGRES_PASSWORD", "REPLAY_JWT_SECRET", "REPLAY_API_SECRET_KEY")


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def workdir() -> str:
    return next(arg for op, arg in instructions(ROOT / "docker" / "Dockerfile") if op == "WORKDIR")


def version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    return data


def services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose()["services"]
    return found


_INTERPOLATION = re.compile(r"\$\$|\$\{(\w+)(?::-([^}]*))?\}")


def interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """Compose's interpolation: ``${NAME:-default}`` from ``env`` (unset or empty: the default), ``$$`` is ``$``."""
    env = env or {}

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1)) or (match.group(2) or "")

    return _INTERPOLATION.sub(one, value)


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


# ---------------------------------------------------------------------------------------------- dev.sh


def dev_section(name: str) -> str:
    """The body of one ``./dev.sh`` subcommand, continuation lines joined."""
    text = (ROOT / "dev.sh").read_text()
    start = text.index(f"\n    {name})\n")
    body = text[start : text.index("\n        ;;\n", start)]
    return re.sub(r"\\\n\s*", " ", body)


def dev_airflow_env() -> dict[str, str]:
    """What ``./dev.sh airflow`` exports for the services, as written in the script; a value that is one
    variable of the script (``"$db"``) is replaced by that variable's assignment."""
    lines = dev_section("airflow").splitlines()
    line = next(line for line in lines if line.strip().startswith("export AIRFLOW_HOME="))
    words = shlex.split(line)
    assert words[0] == "export"
    assigned = dict(re.findall(r"^\s*(\w+)=(\S+)$", "\n".join(lines), flags=re.M))
    env: dict[str, str] = {}
    for key, value in (word.split("=", 1) for word in words[1:]):
        name = value[1:] if re.fullmatch(r"\$\w+", value) else None
        env[key] = shlex.split(assigned[name])[0] if name in assigned else value
    return env


def expand(text: str, variables: dict[str, str]) -> str:
    """Shell expansion of ``$name``, ``${name}`` and ``${NAME:-default}`` (nested once) from ``variables``."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        if match.group(2) is not None:
            return variables.get(name) or expand(match.group(2), variables)
        return variables[name]

    return re.sub(r"\$\{(\w+)(?::-((?:[^{}]|\$\{[^}]*\})*))?\}|\$(\w+)", one, text)


def dev_cluster_commands(master_host: str) -> dict[str, list[str]]:
    """``./dev.sh cluster``'s two spark-class command lines, as they run in the image's working directory with
    ``SPARK_MASTER_HOST=master_host`` and every other setting at its default."""
    variables = {"PWD": workdir(), "SPARK_MASTER_HOST": master_host}
    commands: dict[str, list[str]] = {}
    for line in dev_section("cluster").splitlines():
        line = line.strip()
        assignment = re.fullmatch(r"(?:export )?(\w+)=([^$(].*|\$\{.*\})", line)
        if assignment and not line.startswith("spark_home="):
            variables[assignment.group(1)] = expand(assignment.group(2), variables)
        elif "/bin/spark-class" in line:
            words = shlex.split(line.removesuffix("&"))
            assert words[0] == "$spark_home/bin/spark-class", words
            commands[words[1].rsplit(".", 1)[1]] = [expand(word, variables) for word in words[1:]]
    assert set(commands) == {"Master", "Worker"}
    return commands


def test_expand_follows_the_shell() -> None:
    variables = {"PWD": "/w", "SET": "x"}
    assert expand("${SET:-a}/${UNSET:-$PWD/d}/$PWD", variables) == "x//w/d//w"


# ----------------------------------------------------------------------------------------- Dockerfile


def test_dockerfile_uses_the_supported_stack_and_the_lock_file() -> None:
    steps = instructions(ROOT / "docker" / "Dockerfile")
    assert steps[0][0] == "FROM" and steps[0][1].startswith("python:3.11")
    # A full release, not a moving tag: every build of this version starts from the same Python.
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", steps[0][1]), steps[0][1]
    runs = " ".join(arg for op, arg in steps if op == "RUN")
    assert "openjdk-17-jre-headless" in runs
    assert "./dev.sh setup" in runs  # the same set-up as without Docker: uv sync --frozen --all-extras
    for op, arg in steps:
        if op == "COPY":
            for source in arg.split()[:-1]:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
    assert ("ENTRYPOINT", '["replay"]') in steps


def test_the_image_holds_the_jvm_archive_its_containers_start_from() -> None:
    """``./dev.sh setup`` makes the JVM's class-data archive (``replay jvm-archive``) in the environment it
    sets up (``.venv``, in the image), unless the image switched it off or moved it elsewhere."""
    assert "replay jvm-archive --if-missing" in (ROOT / "dev.sh").read_text()
    steps = instructions(ROOT / "docker" / "Dockerfile")
    assert not [arg for op, arg in steps if op == "ENV" and "REPLAY_JVM_ARCHIVE" in arg]


def test_the_image_holds_every_package_the_project_builds_before_setting_it_up() -> None:
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"][
        "packages"
    ]
    steps = instructions(ROOT / "docker" / "Dockerfile")
    setup = next(i for i, (op, arg) in enumerate(steps) if op == "RUN" and "./dev.sh setup" in arg)
    copied = {source.rstrip("/") for op, arg in steps[:setup] if op == "COPY" for source in arg.split()[:-1]}
    for package in packages:
        assert any(package == c or package.startswith(c + "/") for c in copied), package


def test_the_image_has_airflow_and_the_postgres_driver_from_the_lock_file() -> None:
    """``./dev.sh setup`` installs every extra: the airflow one holds Airflow and psycopg (the services' driver)."""
    assert "--all-extras" in (ROOT / "dev.sh").read_text() and "--frozen" in (ROOT / "dev.sh").read_text()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["airflow"]
    assert any(e.startswith("apache-airflow==") for e in extras) and any(e.startswith("psycopg[") for e in extras)
    lock = (ROOT / "uv.lock").read_text()
    for package in ("apache-airflow", "psycopg", "psycopg-binary"):
        assert f'\nname = "{package}"\n' in lock, package


def test_the_build_context_sends_only_what_the_dockerfile_copies() -> None:
    lines = [
        line.strip()
        for line in (ROOT / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    included = {line[1:] for line in lines if line.startswith("!")}
    for op, arg in instructions(ROOT / "docker" / "Dockerfile"):
        if op == "COPY":
            for source in arg.split()[:-1]:
                assert source.rstrip("/") in included, f"COPY {source}: excluded from the build context"


# ------------------------------------------------------------------------------------ compose: shape


def test_compose_has_the_deployments_services() -> None:
    assert set(services()) == SERVICES


def test_every_image_is_pinned() -> None:
    for name, service in services().items():
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{name}: {image} has no tag"
        assert tag != "latest" and re.match(r"\d+\.\d+(\.\d+)?([-.][\w.]+)?$", tag), f"{name}: {image} is not pinned"
        if "build" in service:
            # Built here: the Replay image of this version, from docker/Dockerfile.
            assert image == f"replay:{version()}", name
            build = service["build"]
            dockerfile = (ROOT / "docker" / build["context"] / build["dockerfile"]).resolve()
            assert dockerfile == ROOT / "docker" / "Dockerfile", name
    assert services()["postgres"]["image"].startswith("postgres:")
    assert {name for name, s in services().items() if "build" not in s} == {"postgres"}


def test_every_long_running_service_has_a_health_check_and_restarts() -> None:
    for name, service in services().items():
        if name == "airflow-init":
            assert "healthcheck" not in service and service["restart"] == "no"
            continue
        check = service["healthcheck"]
        assert check["test"][0] in ("CMD", "CMD-SHELL") and len(check["test"]) > 1, name
        for key in ("interval", "timeout", "retries", "start_period"):
            assert key in check, f"{name}: healthcheck has no {key}"
        assert service["restart"] == "unless-stopped", name


def test_services_start_in_order() -> None:
    every = services()
    healthy, done = "service_healthy", "service_completed_successfully"
    assert every["airflow-init"]["depends_on"] == {"postgres": {"condition": healthy}}
    for name in AIRFLOW_SERVICES:
        depends = every[name]["depends_on"]
        assert depends["postgres"] == {"condition": healthy}, name
        assert depends["airflow-init"] == {"condition": done}, name
    # The scheduler's task processes report to the api-server's execution API.
    assert every["scheduler"]["depends_on"]["api-server"] == {"condition": healthy}
    assert every["spark-worker"]["depends_on"] == {"spark-master": {"condition": healthy}}
    for name, service in every.items():
        for target, rule in service.get("depends_on", {}).items():
            assert target in every and target != name, f"{name} -> {target}"
            assert rule["condition"] in (healthy, done), f"{name} -> {target}"
            # Healthy needs a health check; completed needs a service that ends.
            assert ("healthcheck" in every[target]) == (rule["condition"] == healthy), f"{name} -> {target}"


def test_ports_are_published_on_the_host_only() -> None:
    for name, service in services().items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name}: {port} is published beyond the host"


def test_the_data_volumes_are_the_same_paths_for_the_tasks_and_the_executors() -> None:
    """Archive, outputs and checkpoints: a named volume each, mounted where the [replay] roots say, at the same
    paths in every Airflow service (the tasks run in the scheduler) and every Spark worker (the executors)."""
    every = services()
    declared = compose()["volumes"]
    expected = [f"{volume}:{path}" for volume, path in DATA_MOUNTS.items()]
    for name in (*AIRFLOW_SERVICES, "airflow-init", "replay-driver", "spark-worker"):
        mounts = every[name]["volumes"]
        assert [m for m in mounts if m.split(":")[0] in DATA_MOUNTS] == expected, name
    env = every["scheduler"]["environment"]
    assert env["AIRFLOW__REPLAY__ARCHIVE_ROOT"] == DATA_MOUNTS["replay-archive"]
    assert env["AIRFLOW__REPLAY__OUTPUT_ROOT"] == DATA_MOUNTS["replay-outputs"]
    assert env["AIRFLOW__REPLAY__CHECKPOINT_ROOT"] == DATA_MOUNTS["replay-checkpoints"]
    for root in ("ARCHIVE", "OUTPUT", "CHECKPOINT"):
        assert env[f"AIRFLOW__REPLAY__{root}_ROOT"].startswith(env["AIRFLOW__REPLAY__ROOT"] + "/")
    used = {m.split(":")[0] for s in every.values() for m in s.get("volumes", []) if not m.startswith((".", "/"))}
    assert used == set(declared), "every named volume is declared and used"
    # Airflow's home and passwords: one volume for the Airflow services, as dev.sh's stack directory.
    home = every["scheduler"]["environment"]["AIRFLOW_HOME"]
    (airflow_mount,) = [
        m for m in every["scheduler"]["volumes"] if m.split(":")[0] not in {*DATA_MOUNTS, "replay-driver"}
    ]
    mount_path = airflow_mount.split(":")[1]
    assert home.startswith(mount_path + "/")
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"].startswith(mount_path + "/")
    assert every["postgres"]["volumes"] == ["postgres-data:/var/lib/postgresql/data"]


# ------------------------------------------------------------------ compose: the same as without Docker


# Where a container's Airflow setting differs from ./dev.sh airflow's, and why: (dev.sh's text, compose's text).
# Every other variable is the same text in both.
TRANSLATED = {
    "AIRFLOW_HOME": ("$stack_dir/home", "/opt/airflow/home"),  # in the airflow volume, as in the stack directory
    "AIRFLOW__CORE__DAGS_FOLDER": ("$PWD/dags", "{workdir}/dags"),
    "AIRFLOW__CORE__PLUGINS_FOLDER": ("$PWD/plugins", "{workdir}/plugins"),
    "PYTHONPATH": ("$PWD/plugins${PYTHONPATH:+:$PYTHONPATH}", "{workdir}/plugins"),
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": ("$stack_dir/passwords.json", "/opt/airflow/passwords.json"),
    # The services reach each other by service name; the api-server listens beyond its container's loopback.
    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": (
        "http://127.0.0.1:$port/execution/",
        "http://api-server:8088/execution/",
    ),
    "AIRFLOW__API__HOST": ("127.0.0.1", "0.0.0.0"),
    "AIRFLOW__API__PORT": ("${AIRFLOW__API__PORT:-8088}", "8088"),
    "AIRFLOW__API__BASE_URL": ("http://127.0.0.1:$port", "${REPLAY_BASE_URL:-http://127.0.0.1:8088}"),
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": (
        "postgresql+psycopg://airflow:$pg_password@127.0.0.1:$pg_port/airflow",
        "postgresql+psycopg://airflow:${REPLAY_POSTGRES_PASSWORD:-insecure-change-me}@postgres:5432/airflow",
    ),
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": (
        "postgresql+psycopg://airflow:$pg_password@127.0.0.1:$pg_port/airflow",
        "postgresql+psycopg://airflow:${REPLAY_POSTGRES_PASSWORD:-insecure-change-me}@postgres:5432/airflow",
    ),
    # Made up at each start by dev.sh; set once in docker/.env for a deployment.
    "AIRFLOW__API__SECRET_KEY": ("$(secret 48)", "${REPLAY_API_SECRET_KEY:-insecure-change-me-api-secret-key}"),
    "AIRFLOW__API_AUTH__JWT_SECRET": ("$(secret 48)", "${REPLAY_JWT_SECRET:-insecure-change-me-jwt-secret}"),
    # dev.sh picks free ports (stacks side by side on one machine); a container has its own, Airflow's defaults.
    "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": ("$(free_port)", "8793"),
    "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": ("$(free_port)", "8794"),
    "AIRFLOW__REPLAY__ROOT": ("${AIRFLOW__REPLAY__ROOT:-$PWD/data}", "/data"),
    # The kept driver's home: in the stack directory; the replay-driver volume.
    "REPLAY_DRIVER": ("$stack_dir/driver", "/opt/replay-driver"),
    # Spark's logs in full, which failed tasks name: in the stack directory; on the airflow volume.
    "REPLAY_LOG_DIR": ("$stack_dir/logs/replay", "/opt/airflow/logs/replay"),
    # The spark_submit engine's cluster: ./dev.sh cluster's default address; the spark-master service.
    "AIRFLOW_CONN_SPARK_MASTER": ("${AIRFLOW_CONN_SPARK_MASTER:-spark://127.0.0.1:7077}", "spark://spark-master:7077"),
}
# Only in compose: one root per data volume.
COMPOSE_ONLY = {"AIRFLOW__REPLAY__ARCHIVE_ROOT", "AIRFLOW__REPLAY__OUTPUT_ROOT", "AIRFLOW__REPLAY__CHECKPOINT_ROOT"}


def test_every_airflow_service_has_the_same_environment() -> None:
    every = services()
    env = every["api-server"]["environment"]
    for name in AIRFLOW_SERVICES:
        assert every[name]["environment"] == env, name
    # airflow-init too, plus the admin's password it may set.
    init = every["airflow-init"]["environment"]
    assert {k: v for k, v in init.items() if k != "REPLAY_ADMIN_PASSWORD"} == env
    assert init["REPLAY_ADMIN_PASSWORD"] == "${REPLAY_ADMIN_PASSWORD:-}"


def test_airflow_runs_with_the_settings_of_dev_sh_airflow() -> None:
    dev = dev_airflow_env()
    env = services()["api-server"]["environment"]
    assert set(env) == set(dev) | COMPOSE_ONLY, "a variable ./dev.sh airflow exports is missing here, or the reverse"
    assert set(TRANSLATED) <= set(dev)
    for key, value in dev.items():
        if key in TRANSLATED:
            in_dev, in_compose = TRANSLATED[key]
            assert value == in_dev, f"{key}: ./dev.sh airflow changed; change docker/compose.yaml to match"
            assert env[key] == in_compose.replace("{workdir}", workdir()), key
        else:
            assert env[key] == value, f"{key}: {env[key]!r} here, {value!r} in ./dev.sh airflow"
    # Spot checks of what is the same text: the executor, the auth manager and its users, overridable sizes.
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin"
    assert env["AIRFLOW__CORE__PARALLELISM"] == "${AIRFLOW__CORE__PARALLELISM:-4}"
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == f"{workdir()}/dags"
    port = re.search(r"\bport=\$\{AIRFLOW__API__PORT:-(\d+)\}", dev_section("airflow"))
    assert port and env["AIRFLOW__API__PORT"] == port.group(1), "the api-server's port is dev.sh's default"


def test_each_airflow_service_runs_the_command_dev_sh_airflow_runs() -> None:
    section = dev_section("airflow")
    loop = re.search(r"for service in ([\w -]+); do\s+\.venv/bin/airflow \"\$service\"", section)
    assert loop, "./dev.sh airflow starts its services in a loop"
    assert tuple(loop.group(1).split()) == AIRFLOW_SERVICES
    every = services()
    for name in AIRFLOW_SERVICES:
        assert every[name]["entrypoint"] == ["airflow", name], name
        assert every[name]["hostname"] == name  # the host Airflow records, reachable by that name
    # airflow-init runs what dev.sh runs before the services: the migration, then the passwords file.
    assert ".venv/bin/airflow db migrate" in section
    entrypoint = every["airflow-init"]["entrypoint"]
    assert entrypoint[:2] == ["bash", "-c"]
    assert "\nairflow db migrate\n" in entrypoint[2]


def test_spark_runs_the_commands_of_dev_sh_cluster() -> None:
    """The master and the worker are ./dev.sh cluster's spark-class lines with SPARK_MASTER_HOST=spark-master, run
    in the image; the worker leaves out --host so that each replica advertises its own address."""
    every = services()
    master, worker = every["spark-master"], every["spark-worker"]
    dev = dev_cluster_commands(master["hostname"])
    assert master["entrypoint"][0] == worker["entrypoint"][0] == "spark-class"
    assert (BIN / "spark-class").exists()  # the pyspark distribution's launcher, on the image's PATH
    assert master["entrypoint"][1:] == dev["Master"], f"./dev.sh cluster runs {dev['Master']}"
    expected = list(dev["Worker"])
    del expected[expected.index("--host") : expected.index("--host") + 2]
    assert worker["entrypoint"][1:] == expected, f"./dev.sh cluster runs {dev['Worker']}"
    assert "hostname" not in worker
    # The worker registers with the master's URL; Spark's own variables size it, as dev.sh documents.
    master_url = f"spark://{option(master['entrypoint'], '--host')}:{option(master['entrypoint'], '--port')}"
    assert worker["entrypoint"][2] == master_url
    for variable, value in worker["environment"].items():
        assert variable in dev_section("cluster"), f"{variable}: not a setting ./dev.sh cluster documents"
        assert re.fullmatch(rf"\$\{{{variable}:-\w+\}}", value), f"{variable}: overridable, with a default"
    for page in (ROOT / "docs" / "airflow.md", ROOT / "docker" / "README.md"):
        assert master_url in page.read_text(), f"{page.name}: the spark_master to set"


def test_the_kept_driver_runs_the_command_dev_sh_airflow_runs(tmp_path: Path) -> None:
    """``replay driver serve`` on the home the Airflow services' ``REPLAY_DRIVER`` names, a volume they share,
    with dev.sh's master setting; in a container it listens beyond loopback and publishes its service's name."""
    every = services()
    driver = every["replay-driver"]
    line = next(x for x in dev_section("airflow").splitlines() if "/bin/replay driver serve" in x)
    words = shlex.split(line.strip().split(">", 1)[0])
    assert words[0] == ".venv/bin/replay"
    home = every["scheduler"]["environment"]["REPLAY_DRIVER"]
    in_dev = [home if w == "$REPLAY_DRIVER" else w for w in ["replay", *words[1:]]]
    entrypoint = driver["entrypoint"]
    assert entrypoint[: len(in_dev)] == in_dev, f"./dev.sh airflow runs {words}"
    assert entrypoint[len(in_dev) :] == ["--host", "0.0.0.0", "--port", "7078"]
    assert option(entrypoint, "--master") == "${REPLAY_DRIVER_MASTER:-local[*]}"
    assert driver["hostname"] == "replay-driver"  # the address it publishes when it listens on 0.0.0.0
    for name in (*AIRFLOW_SERVICES, "replay-driver"):
        assert f"replay-driver:{home}" in every[name]["volumes"], name
    assert driver["healthcheck"]["test"] == ["CMD", "replay", "driver", "status", "--dir", home]
    # Spark's default memory; its Spark log on the volume the Airflow services mount too (dev.sh's driver
    # shares the stack's REPLAY_LOG_DIR, on the one machine).
    assert driver["environment"] == {
        "SPARK_DRIVER_MEMORY": "${SPARK_DRIVER_MEMORY:-1g}",
        "REPLAY_LOG_DIR": f"{home}/logs",
    }
    # Its health check fails where no driver answers.
    result = subprocess.run(
        [str(BIN / "replay"), "driver", "status", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1 and "[driver.unreachable]" in result.stderr, result.stderr


# ------------------------------------------------------------------------- compose: health and secrets


def test_health_checks_look_where_the_services_listen() -> None:
    every = services()
    env = every["api-server"]["environment"]
    port = env["AIRFLOW__API__PORT"]
    dev_health = re.search(r'health="http://127\.0\.0\.1:\$port(/[\w/]+)"', dev_section("airflow"))
    assert dev_health, "./dev.sh airflow waits on the api-server's health endpoint"
    assert f"http://127.0.0.1:{port}{dev_health.group(1)}" in every["api-server"]["healthcheck"]["test"][-1]
    assert every["api-server"]["ports"] == [f"127.0.0.1:{port}:{port}"]
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == f"http://api-server:{port}/execution/"

    for name, job in JOB_TYPES.items():
        assert every[name]["healthcheck"]["test"] == ["CMD", "airflow", "jobs", "check", "--job-type", job, "--local"]

    master, worker = every["spark-master"]["entrypoint"], every["spark-worker"]["entrypoint"]
    ui = option(master, "--webui-port")
    assert f"http://127.0.0.1:{ui}/json/" in every["spark-master"]["healthcheck"]["test"][-1]
    assert every["spark-master"]["ports"] == [f"127.0.0.1:{ui}:{ui}"]
    worker_ui = option(worker, "--webui-port")
    assert f"http://127.0.0.1:{worker_ui}/json/" in every["spark-worker"]["healthcheck"]["test"][-1]

    postgres = every["postgres"]
    check = postgres["healthcheck"]["test"]
    assert check[:2] == ["CMD", "pg_isready"]
    user, database = postgres["environment"]["POSTGRES_USER"], postgres["environment"]["POSTGRES_DB"]
    assert option(check, "--username") == user and option(check, "--dbname") == database
    password = postgres["environment"]["POSTGRES_PASSWORD"]
    for key in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"):
        assert env[key] == f"postgresql+psycopg://{user}:{password}@postgres:5432/{database}", key


def test_the_job_types_checked_are_the_locked_airflows(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(BIN / "airflow"), "jobs", "check", "--help"],
        capture_output=True,
        text=True,
        timeout=180,
        env=dict(os.environ, AIRFLOW_HOME=str(tmp_path)),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    choices = re.search(r"--job-type \{([\w,]+)\}", result.stdout)
    assert choices and set(JOB_TYPES.values()) <= set(choices.group(1).split(",")), result.stdout
    assert "--local" in result.stdout


class _Canned(http.server.BaseHTTPRequestHandler):
    answers: ClassVar[dict[str, Any]] = {}

    def do_GET(self) -> None:
        if self.path not in self.answers:
            self.send_error(404)
            return
        body = json.dumps(self.answers[self.path]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def canned_server(answers: dict[str, Any]) -> Iterator[int]:
    handler = type("Handler", (_Canned,), {"answers": answers})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


MONITOR, EXECUTION = "/api/v2/monitor/health", "/execution/health"


@pytest.mark.parametrize(
    ("service", "healthy", "unhealthy"),
    [
        (
            "api-server",
            {MONITOR: {"metadatabase": {"status": "healthy"}}, EXECUTION: {"status": "healthy"}},
            [
                {MONITOR: {"metadatabase": {"status": "unhealthy"}}, EXECUTION: {"status": "healthy"}},
                {MONITOR: {"metadatabase": {"status": "healthy"}}},  # the execution API does not answer
            ],
        ),
        ("spark-master", {"/json/": {"status": "ALIVE", "aliveworkers": 0}}, [{"/json/": {"status": "STANDBY"}}]),
        ("spark-worker", {"/json/": {"masterurl": "spark://spark-master:7077"}}, [{"/json/": {"masterurl": ""}}]),
    ],
)
def test_the_python_health_checks_tell_up_from_down(
    service: str, healthy: dict[str, Any], unhealthy: list[dict[str, Any]]
) -> None:
    """Each Python health check, pointed at a stand-in serving what the service answers when up, and when not."""
    test = services()[service]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    urls = re.findall(r"'(http://127\.0\.0\.1:\d+(/[^']*))'", test[3])
    assert sorted(path for _, path in urls) == sorted(healthy)
    for answers, code in [(healthy, 0)] + [(answer, 1) for answer in unhealthy]:
        with canned_server(answers) as port:
            script = test[3]
            for url, path in urls:
                script = script.replace(url, f"http://127.0.0.1:{port}{path}")
            result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert result.returncode == code, (answers, result.stderr)


def test_secrets_come_from_the_environment_with_marked_defaults() -> None:
    text = (ROOT / "docker" / "compose.yaml").read_text()
    for name in SECRETS:
        defaults = set(re.findall(rf"\$\{{{name}:-([^}}]*)\}}", text))
        assert len(defaults) == 1, f"{name}: one default"
        assert "insecure-change-me" in defaults.pop(), f"{name}: its default says it is one"
    assert re.search(r"^\s*#.*INSECURE", text, flags=re.M)
    # Each variable the file reads is documented, and docker/.env (where they go) is never committed.
    docs = (ROOT / "docs" / "airflow.md").read_text()
    deploying = docs[docs.index("\n## Deploying") :]
    for name in set(re.findall(r"(?<!\$)\$\{(\w+)", text)):
        assert name in deploying, f"{name}: not in docs/airflow.md#deploying"
    assert "docker/.env" in (ROOT / ".gitignore").read_text().splitlines()


def test_airflow_init_migrates_and_prepares_the_admin(tmp_path: Path) -> None:
    """airflow-init's script, run with a stand-in ``airflow``: it migrates, then writes the SimpleAuthManager's
    passwords file (600) with a made-up password kept across runs, or REPLAY_ADMIN_PASSWORD's."""
    service = services()["airflow-init"]
    script = interpolate(service["entrypoint"][2])
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls"
    (fake / "airflow").write_text(f'#!/bin/sh\necho "$*" >> {shlex.quote(str(calls))}\n')
    (fake / "airflow").chmod(0o755)
    (fake / "python").symlink_to(sys.executable)
    passwords = tmp_path / "volume" / "passwords.json"
    passwords.parent.mkdir()
    env = {key: interpolate(value) for key, value in service["environment"].items()}
    env.update(
        PATH=f"{fake}:{os.environ['PATH']}",
        AIRFLOW_HOME=str(tmp_path / "volume" / "home"),
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(passwords),
    )

    def run(**extra: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["bash", "-c", script], env={**env, **extra}, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr
        return result

    first = run()
    assert calls.read_text() == "db migrate\n"
    assert (tmp_path / "volume" / "home").is_dir()
    made_up = json.loads(passwords.read_text())["admin"]
    assert len(made_up) >= 32 and f"user admin, password {made_up}" in first.stdout
    assert stat.S_IMODE(passwords.stat().st_mode) == 0o600
    # The defaults are called out, each by name.
    for key in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__API__SECRET_KEY", "AIRFLOW__API_AUTH__JWT_SECRET"):
        assert f"WARNING: {key} uses" in first.stderr, key

    second = run(
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="postgresql+psycopg://airflow:s3cret@postgres:5432/airflow",
        AIRFLOW__API__SECRET_KEY="k" * 32,
        AIRFLOW__API_AUTH__JWT_SECRET="j" * 32,
    )
    assert json.loads(passwords.read_text()) == {"admin": made_up}, "kept across runs"
    assert made_up not in second.stdout and "password unchanged" in second.stdout
    assert "WARNING" not in second.stderr

    run(REPLAY_ADMIN_PASSWORD="chosen-one")
    assert json.loads(passwords.read_text()) == {"admin": "chosen-one"}
    assert calls.read_text() == "db migrate\n" * 3
