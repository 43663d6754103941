"""The README's commands on a machine that lacks Java or Python 3.11: they stop and say how to install it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def bin_dir(tmp_path: Path, tools: list[str]) -> Path:
    """A PATH holding only the named tools (and this interpreter as python3.11 when asked)."""
    path = tmp_path / "bin"
    path.mkdir()
    for tool in tools:
        if tool == "python3.11":
            (path / tool).symlink_to(sys.executable)
        else:
            found = shutil.which(tool)
            assert found, tool
            (path / tool).symlink_to(found)
    return path


def run(tmp_path: Path, tools: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYTHON")}
    env["PATH"] = str(bin_dir(tmp_path, tools))
    return subprocess.run(
        [shutil.which("bash") or "bash", str(ROOT / "dev.sh"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


BASICS = ["dirname", "sed", "head", "grep"]


def test_without_java_it_says_how_to_install_it(tmp_path: Path) -> None:
    result = run(tmp_path, [*BASICS, "python3.11"], "test")
    assert result.returncode == 1
    assert "Java 17 is needed" in result.stderr and "openjdk-17-jre-headless" in result.stderr


def test_without_python_311_it_says_how_to_install_it(tmp_path: Path) -> None:
    result = run(tmp_path, BASICS, "demo")
    assert result.returncode == 1
    assert "Python 3.11 is needed" in result.stderr


def test_unknown_command_prints_usage(tmp_path: Path) -> None:
    result = run(tmp_path, BASICS, "nonsense")
    assert result.returncode == 2 and "./dev.sh test" in result.stdout
