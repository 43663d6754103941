"""The files of a table directory a batch committed: ``_files.json``, written by the driver.

A pass's Spark tasks write its tables' files themselves, each attempt to files of its own, and
the driver keeps the files its successful attempts returned (``replay.engine.sink.keep_only``).
It then lists them in the directory's ``_files.json`` (atomically: temporary file, fsync, rename,
fsync of the directory), before the batch's commit. Readers read the listed files only: a file a
late attempt wrote after that (an attempt Spark had given up on but that still ran, on an
executor it took for lost, or of a job it had cancelled) is never read. A directory without a
listing (written by an earlier Replay) is read whole.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from replay.store.durable import FORMAT_VERSION, corrupt, damaged_output, write_json_atomic

__all__ = ["LISTING", "listed", "write_listing"]

LISTING = "_files.json"


def write_listing(directory: Path, names: Sequence[str]) -> None:
    """List ``names`` (files of ``directory``) as the directory's files."""
    write_json_atomic(directory / LISTING, {"format_version": FORMAT_VERSION, "files": sorted(names)})


def listed(directory: Path, *, checkpoint: bool = False) -> list[Path] | None:
    """The files ``directory``'s listing names, in order; ``None`` without a listing.

    Raises:
        CheckpointCorruptError: (``checkpoint``: a checkpoint's directory) the listing does not read.
        DataError: ``output.corrupt``: (an output's directory) the listing does not read.
    """
    path = directory / LISTING
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        document = str(exc)
    files = document.get("files") if isinstance(document, dict) else None
    if isinstance(files, list) and all(isinstance(f, str) for f in files):
        return [directory / f for f in files]
    what = f"does not list the directory's files ({document})" if isinstance(document, str) else "does not list files"
    if checkpoint:
        raise corrupt(path, what)
    raise damaged_output(f"{path.name} of {directory} {what}", path)
