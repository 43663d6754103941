"""Where the archive's files are, and reading one footer or a Spark task's failure to read a file
(docs/archive.md#columns): local directories, single files and ``fsspec`` URIs."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa

from replay.core.errors import ArchiveReadError, EmptyArchiveError, Location
from replay.core.paths import local_path

__all__ = ["discover_files", "read_failure", "read_schema"]

_PARQUET_SUFFIXES = (".parquet", ".parq")


def _is_data_file(name: str) -> bool:
    base = posixpath.basename(name)
    return not base.startswith(("_", ".")) and base.endswith(_PARQUET_SUFFIXES)


def discover_files(archive: str) -> list[str]:
    """Every Parquet file under ``archive`` (a directory, a file, or a URI), sorted by path.

    Files whose names start with ``_`` or ``.`` (``_SUCCESS``, ``.crc``) are skipped.
    Local paths come back as plain paths; other URIs keep their scheme.

    Raises:
        ArchiveReadError: the location does not exist or cannot be listed.
        EmptyArchiveError: it holds no Parquet file.
    """
    local = local_path(archive)
    if local is not None:
        root = Path(local).absolute()  # Spark resolves relative paths against its own working directory
        if not root.exists():
            raise ArchiveReadError(
                "the archive does not exist",
                where=Location(file=archive),
                todo="check the 'archive' setting or --archive; it must be a directory or file of Parquet files",
                code="archive.not_found",
            )
        if root.is_file():
            files = [str(root)]
        else:
            files = sorted(str(p) for p in root.rglob("*") if p.is_file() and _is_data_file(p.name))
    else:
        files = _discover_remote(archive)
    if not files:
        raise EmptyArchiveError(
            "the archive holds no Parquet file",
            where=Location(file=archive),
            todo="point 'archive' at the directory the archiver writes to, or generate one with 'replay generate'",
        )
    return files


def _discover_remote(archive: str) -> list[str]:
    import fsspec

    scheme = urlparse(archive).scheme
    protocol = {"s3a": "s3", "s3n": "s3"}.get(scheme, scheme)
    try:
        fs, root = fsspec.core.url_to_fs(archive.replace(f"{scheme}://", f"{protocol}://", 1))
        found = [p for p in fs.find(root) if _is_data_file(p)]
    except (ImportError, ValueError) as exc:
        raise ArchiveReadError(
            f"cannot list {scheme}:// archives from the driver: {exc}",
            where=Location(file=archive),
            todo=f"install the fsspec implementation for '{protocol}' (e.g. s3fs, or pyarrow's HDFS support)",
            code="archive.unsupported_scheme",
        ) from exc
    except OSError as exc:
        raise ArchiveReadError(
            f"cannot list the archive: {exc}",
            where=Location(file=archive),
            todo="check the URI and the credentials the driver uses",
            code="archive.not_found",
        ) from exc
    return sorted(f"{scheme}://{p.lstrip('/')}" if not p.startswith(scheme) else p for p in found)


def read_schema(path: str) -> pa.Schema:
    """The Arrow schema in ``path``'s Parquet footer (local, or through ``fsspec``); a file that cannot
    be opened, is truncated or is not Parquet is ``archive.unreadable``, naming it."""
    import pyarrow.parquet as pq

    try:
        local = local_path(path)
        if local is not None:
            return pq.read_schema(local)
        import fsspec

        with fsspec.open(path, "rb") as handle:
            return pq.read_schema(handle)
    except (OSError, pa.ArrowException) as exc:
        raise ArchiveReadError(
            f"cannot read the Parquet footer (unreadable, truncated or not Parquet): {exc}",
            where=Location(file=path),
            todo="restore the file from the archiver, or move it out of the archive directory; nothing was committed",
        ) from exc


# How Spark reports a file it could not read in a task (its footer read, its pages did not), and
# the causes under it: ``[FAILED_READ_FILE.NO_HINT] Encountered error while reading file <uri>.``
_READ_FAILED = re.compile(r"\[FAILED_READ_FILE[.\w]*\] Encountered error while reading file (\S+?)\.?\s")
_CAUSE = re.compile(r"(?m)^Caused by: (?:[\w.$]+\.)?([^\n]+?)\s*$")


def read_failure(error: BaseException, files: Mapping[str, str]) -> ArchiveReadError | None:
    """The archive file a Spark task could not read (damaged pages behind an intact footer), as
    ``archive.unreadable`` naming it, with the deepest cause Spark gives; ``None`` when ``error`` is
    another failure. ``files`` maps the paths Spark reports back to the archive's."""
    text = str(error)
    found = _READ_FAILED.search(text)
    if found is None:
        return None
    reported = found.group(1)
    causes = _CAUSE.findall(text)
    return ArchiveReadError(
        "cannot read the file's rows: its footer reads but its data does not (damaged or truncated pages)"
        + (f": {causes[-1]}" if causes else ""),
        where=Location(file=files.get(reported, reported.removeprefix("file://"))),
        todo="restore the file from the archiver, or move it out of the archive directory; nothing of the "
        "batch in progress was committed, and the next run resumes from the checkpoint",
    )
