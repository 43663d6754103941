"""Archive, output and checkpoint locations are URIs or plain paths: the local path of one, if any."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

__all__ = ["check_directory", "local_path"]


def local_path(uri: str) -> str | None:
    """The local filesystem path of ``uri`` (plain path or ``file:``), else ``None``."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return unquote(parsed.path) if parsed.scheme else uri
    if len(parsed.scheme) == 1:  # a Windows drive letter, not a scheme
        return uri
    return None


def check_directory(setting: str, uri: str) -> None:
    """Refuse a local location for ``setting`` (``output``, ``checkpoint``) that is a file, or lies
    under one, before any work: a missing directory is created when it is first written.

    Raises:
        ConfigError: ``config.not_a_directory``, naming the file in the way.
    """
    from replay.core.errors import ConfigError, Location

    local = local_path(uri)
    if local is None:
        return
    for path in (Path(local), *Path(local).absolute().parents):
        if path.is_dir():
            return
        if path.exists():
            what = "is a file" if path == Path(local) else f"is under {path}, which is a file"
            raise ConfigError(
                f"the {setting} location {local} {what}, not a directory",
                where=Location(file=str(path), field=setting),
                todo=f"point '{setting}' (or --{setting}) at a directory; a missing one is created",
                code="config.not_a_directory",
            )
