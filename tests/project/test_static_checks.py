"""The project's own checks, run by the README's test command: ruff (lint and format) and strict mypy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import _background

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def check(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / command[0]), *command[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600)


@_background.register("mypy")
def mypy() -> subprocess.CompletedProcess[str]:
    """Strict mypy takes half a minute of one core: it runs beside the Spark tests."""
    return check(["mypy"])


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "replay", "tests", "benchmarks", "dags", "plugins"],
        ["ruff", "format", "--check", "replay", "tests", "benchmarks", "dags", "plugins"],
        pytest.param(["mypy"], marks=pytest.mark.background("mypy")),
    ],
    ids=["ruff-check", "ruff-format", "mypy-strict"],
)
def test_static_checks(command: list[str]) -> None:
    result = _background.result("mypy") if command == ["mypy"] else check(command)
    assert result.returncode == 0, result.stdout + result.stderr
