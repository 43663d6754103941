"""Archive, output and checkpoint locations are URIs or plain paths: the local path of one, if any."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

__all__ = ["check_directory", "default_checkpoint", "local_path", "range_checkpoint"]


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


def default_checkpoint(output: str, start: int | None, end: int | None) -> str:
    """Where a run keeps its checkpoint when the job names none: under the output."""
    if start is None and end is None:
        return str(Path(output) / "_checkpoints" / "full")
    return str(Path(output) / "_checkpoints" / _range_name(start, end))


def range_checkpoint(checkpoint: str, start: int | None, end: int | None) -> str:
    """The checkpoint of a backfill of ``[start, end)`` whose job names ``checkpoint`` for its
    replay of the whole archive: beside it, named after the range (``ckpt.range_<start>_<end>``),
    so that a backfill never meets the scheduled replay's checkpoint, and the same range meets
    its own again (and changes nothing)."""
    return f"{checkpoint.rstrip('/')}.{_range_name(start, end)}"


def _range_name(start: int | None, end: int | None) -> str:
    from replay.core.timeutil import format_ts

    lo = "inf" if start is None else format_ts(start)
    hi = "inf" if end is None else format_ts(end)
    return f"range_{lo}_{hi}".replace(":", "")
