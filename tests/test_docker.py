"""docker/ is checked statically: no engine runs here. Every image must be buildable from files in the repo."""

from __future__ import annotations

import re
from pathlib import Path

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
