"""Archive, output and checkpoint locations are URIs or plain paths: the local path of one, if any."""

from __future__ import annotations

from urllib.parse import unquote, urlparse

__all__ = ["local_path"]


def local_path(uri: str) -> str | None:
    """The local filesystem path of ``uri`` (plain path or ``file:``), else ``None``."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return unquote(parsed.path) if parsed.scheme else uri
    if len(parsed.scheme) == 1:  # a Windows drive letter, not a scheme
        return uri
    return None
