"""Path roots: every path a DAG run's params name resolves under its root, or is refused naming both."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from replay.core.errors import ConfigError
from replay_airflow.roots import PathOutsideRootError, Roots


@pytest.fixture
def roots(tmp_path: Path) -> Roots:
    for name in ("archives", "outputs", "checkpoints"):
        (tmp_path / name).mkdir()
    return Roots(
        archive=str(tmp_path / "archives"), output=str(tmp_path / "outputs"), checkpoint=str(tmp_path / "checkpoints")
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("a", "a"),
        ("a/b/../c", "a/c"),
        ("./a", "a"),
        (".", ""),
        ("{root}/a", "a"),  # an absolute path inside the root
    ],
)
def test_paths_inside_the_root_resolve_under_it(roots: Roots, value: str, expected: str) -> None:
    resolved = roots.resolve("archive", value.format(root=roots.archive), param="archive")
    assert resolved == os.path.join(roots.archive, expected).rstrip("/")


@pytest.mark.parametrize("value", ["..", "../outputs/x", "a/../../x", "/etc", "{other}", "{root}-sibling/a"])
def test_paths_outside_the_root_are_refused_naming_param_value_and_root(roots: Roots, value: str) -> None:
    value = value.format(root=roots.archive, other=roots.output)
    with pytest.raises(PathOutsideRootError) as raised:
        roots.resolve("archive", value, param="archive")
    message = raised.value.message
    assert raised.value.code == "airflow.path_outside_root"
    assert f"param 'archive' = {value!r}" in message and f"outside the archive root {roots.archive}" in message
    assert "What to do" in message and "[replay] archive_root" in message


def test_a_symbolic_link_out_of_the_root_is_refused(roots: Roots, tmp_path: Path) -> None:
    (tmp_path / "secret").mkdir()
    Path(roots.archive, "link").symlink_to(tmp_path / "secret")
    with pytest.raises(PathOutsideRootError):
        roots.resolve("archive", "link/data", param="archive")


def test_uri_roots_take_uris_under_them_and_refuse_others() -> None:
    roots = Roots(archive="s3://bucket/archives", output="/srv/out", checkpoint="/srv/ckpt")
    assert roots.resolve("archive", "day=1", param="archive") == "s3://bucket/archives/day=1"
    assert roots.resolve("archive", "s3://bucket/archives/x/", param="archive") == "s3://bucket/archives/x"
    for bad in (
        "s3://bucket/other",
        "s3://bucket/archives/../other",
        "gs://bucket/archives/x",
        "s3://bucket/archives2",
    ):
        with pytest.raises(PathOutsideRootError):
            roots.resolve("archive", bad, param="archive")
    with pytest.raises(PathOutsideRootError):
        roots.resolve("output", "s3://bucket/archives/x", param="output")


def test_an_empty_path_or_a_relative_root_is_a_configuration_error(roots: Roots) -> None:
    with pytest.raises(ConfigError, match="param 'output' is empty"):
        roots.resolve("output", " ", param="output")
    with pytest.raises(ConfigError, match="not an absolute path"):
        Roots(archive="relative", output="/o", checkpoint="/c")


def test_configured_roots_come_from_the_replay_section(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from replay_airflow.roots import configured_roots

    monkeypatch.setenv("AIRFLOW__REPLAY__ROOT", str(tmp_path / "common"))
    monkeypatch.setenv("AIRFLOW__REPLAY__ARCHIVE_ROOT", str(tmp_path / "arch"))
    roots = configured_roots()
    assert roots.archive == str((tmp_path / "arch").resolve())
    assert roots.output == roots.checkpoint == str((tmp_path / "common").resolve())
