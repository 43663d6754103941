"""Examples are tests: the README's command-line snippet runs as written, and importing replay stays light."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from replay.cli import app

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[list[str]]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    lines = [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith(".venv/bin/replay ")]


def test_readme_opens_with_the_two_commands() -> None:
    first = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    assert first is not None
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines()]
    assert commands == ["./dev.sh demo", "./dev.sh test"]
    assert "./dev.sh test" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.spark
def test_readme_snippet_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark: Any) -> None:
    commands = readme_commands()
    assert [c[0] for c in commands] == [
        "generate",
        "inspect",
        "inspect",
        "run",
        "run",
        "status",
        "validate",
        "publish",
        "report",
        "digest",
        "show",
    ]
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for command in commands:
        result = runner.invoke(app, command)
        assert result.exit_code == 0, (command, result.output)
        if command[0] == "run":
            assert "windows:" in result.output and "late tuples:" in result.output
        if command[0] == "digest":
            assert [line.split()[0] for line in result.output.splitlines()] == [
                "windows",
                "late",
                "progress",
                "integrity",
                "corrections",
            ]


def test_importing_replay_starts_nothing_heavy() -> None:
    code = (
        "import sys, replay; print(sorted({m.split('.')[0] for m in sys.modules} & {'pyspark', 'airflow', "
        "'great_expectations', 'pandas'}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
