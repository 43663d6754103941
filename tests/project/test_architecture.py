"""The folders of ``replay/`` are its architecture, and their imports keep it.

Layers, bottom up: ``core`` (the contract in pure Python) < ``store`` (checkpoints, outputs) <
``engine`` (the Spark data plane) < ``runner`` (the run loop) and ``quality`` (validation, report) <
the top layer: the top-level modules (the public API), ``cli/`` (the command line) and ``driver/``
(the kept driver, a server and its commands over the run loop and validation). A layer imports its
own folder and the layers below it, never above. ``reference`` (the naive model) imports ``core``
alone, and no code but the tests imports it: the model the engine is checked against must not share
it. Every import counts, also inside functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("core", "reference", "store", "engine", "runner", "quality")
MAY_IMPORT = {
    "core": {"core"},
    "reference": {"core", "reference"},
    "store": {"core", "store"},
    "engine": {"core", "store", "engine"},
    "runner": {"core", "store", "engine", "runner"},
    "quality": {"core", "store", "engine", "quality"},
}


def _folder(module: str) -> str:
    """``replay.engine.scan`` -> ``engine``; ``replay.cli`` or ``replay`` -> ``top``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FOLDERS else "top"


def _replay_imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "replay":
                found += [(node.lineno, f"replay.{a.name}") for a in node.names]
            elif node.module.startswith("replay."):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("replay.")]
    return found


def _modules(folder: str) -> list[Path]:
    return sorted((ROOT / "replay" / folder).rglob("*.py"))


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_folder_imports_only_its_own_and_the_layers_below(folder: str) -> None:
    assert _modules(folder), f"replay/{folder}/ holds no module"
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for path in _modules(folder)
        for line, target in _replay_imports(path)
        if _folder(target) not in MAY_IMPORT[folder]
    ]
    assert wrong == []


def test_only_the_tests_import_the_reference_model() -> None:
    code = [p for d in ("replay", "plugins", "dags", "expectations", "benchmarks") for p in (ROOT / d).rglob("*.py")]
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for path in code
        if "reference" not in path.relative_to(ROOT).parts
        for line, target in _replay_imports(path)
        if _folder(target) == "reference"
    ]
    assert wrong == []
    # And the tests do use it: it is what the engine is checked against.
    assert any(_folder(t) == "reference" for p in (ROOT / "tests").rglob("test_*.py") for _, t in _replay_imports(p))


def test_no_flat_module_is_left_beside_the_folders() -> None:
    top = sorted(p.name for p in (ROOT / "replay").glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "console.py", "generate.py", "generate_options.py"]


#: A module of the library past this many lines holds more than one concept: split it, along one.
LIBRARY_LINES = 450
#: The DAGs, the plugin and the expectations: the same rule, with some room for their templates.
SHELL_LINES = 500


def test_modules_stay_small_enough_to_hold_one_concept() -> None:
    sizes = {
        path.relative_to(ROOT): len(path.read_text().splitlines())
        for folder in ("replay", "plugins", "dags", "expectations")
        for path in (ROOT / folder).rglob("*.py")
    }
    over = {
        str(path): lines
        for path, lines in sizes.items()
        if lines > (LIBRARY_LINES if path.parts[0] == "replay" else SHELL_LINES)
    }
    assert over == {}, f"split these modules along their concepts: {over}"
