"""``replay jvm-archive``: the class-data archive later commands start their JVM from, and the small
replay whose JVM records it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from replay.console import failure
from replay.core.errors import ReplayError

__all__ = ["jvm_archive"]


def jvm_archive(
    path: Annotated[
        Path | None,
        typer.Option(
            help="Where to write it (default: the place runs look, REPLAY_JVM_ARCHIVE if set, else "
            "share/replay/spark-<key>.jsa in this Python environment, e.g. .venv/share/replay/)."
        ),
    ] = None,
    if_missing: Annotated[
        bool, typer.Option("--if-missing", help="Do nothing when a usable archive is there.")
    ] = False,
    remove: Annotated[bool, typer.Option("--remove", help="Delete the archive instead.")] = False,
    record_into: Annotated[Path | None, typer.Option(hidden=True)] = None,
) -> None:
    """Record the classes Spark's JVM loads into a class-data archive: later runs start their JVM from it
    (seconds less per command; REPLAY_JVM_ARCHIVE names another file, or 'off'). Prints its path."""
    from replay.engine import jvm_archive as archives

    if record_into is not None:  # the process ``create`` starts (its working directory is a scratch one)
        _record_classes(record_into)
        return
    target = path if path is not None else archives.archive_path()
    try:
        if target is not None and (remove or (if_missing and archives.usable(target))):
            if remove:
                archives.remove(target)
            typer.echo(str(target))
            return
        created = archives.create(target, [sys.executable, "-m", "replay", "jvm-archive", "--record-into"])
    except ReplayError as error:
        raise failure(error) from error
    typer.echo(str(created.path))
    typer.echo(f"{created.size / 2**20:.0f} MiB, made in {created.seconds:.0f} s", err=True)


def _record_classes(destination: Path) -> None:
    """A small replay (two origins, 4,000 tuples, a window of four aggregations) in the current
    directory, by a JVM that writes the class-data archive ``destination`` when it exits."""
    from replay.core.config import parse_config
    from replay.engine.jvm_archive import recording_options, wait_for_exit
    from replay.generate import generate_archive
    from replay.generate_options import GenerateOptions
    from replay.runner.loop import run

    options = GenerateOptions(
        origins=2,
        tuples=4_000,
        buffer_tuples=100,
        keys=10,
        files=2,
        seed=1,
        gaps=0,
        duplicates=1,
        late_fraction=0.01,
        multi_chunk_fraction=0.2,
    )
    work = Path.cwd()
    generate_archive(work / "archive", options)
    aggregations = [{"fn": "count"}, *({"fn": fn, "column": "value"} for fn in ("sum", "min", "max"))]
    job = {
        "archive": str(work / "archive"),
        "output": str(work / "out"),
        "checkpoint": str(work / "checkpoint"),
        "windows": [{"name": "per_minute", "size": "60s", "aggregations": aggregations}],
        "micro_batch": {"max_buffers": 10},
        # After Replay's own options (``get_session``).
        "spark": {"conf": {"spark.driver.extraJavaOptions": recording_options(destination)}},
    }
    run(parse_config(job, source="replay jvm-archive"))
    wait_for_exit()
