"""What the ``replay`` command shows while it works and after: progress of long steps (a rich bar on a
terminal, plain log lines on stderr elsewhere) and each command's result as text and tables
(``generate``'s summary, ``inspect``'s and ``status``' tables, ``run``'s summary, ``validate``'s
suites and failures, ``publish``'s outcome). ``replay.cli`` parses the command, calls the library
and chooses the exit code; the ``--json`` forms it prints itself. rich is imported only when
something is shown."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

import typer

from replay.core.rules import publication_note

if TYPE_CHECKING:
    from replay.core.errors import ReplayError
    from replay.generate_options import GenerateSummary
    from replay.quality.validate import ValidationOutcome
    from replay.runner.summary import RunSummary
    from replay.store.publish import PublishOutcome

__all__ = [
    "Steps",
    "failure",
    "print_generated",
    "print_inspection",
    "print_publication",
    "print_run",
    "print_status",
    "print_validation",
]

log = logging.getLogger("replay")


def failure(error: ReplayError) -> typer.Exit:
    """Print a Replay error's message on stderr and give the exit that ends the command with its code."""
    typer.echo(f"replay: error: {error.message}", err=True)
    return typer.Exit(error.exit_code)


class Steps:
    """A rich progress bar on a terminal, plain log lines elsewhere."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self.tty = sys.stderr.isatty()
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}
        self._logged: dict[str, int] = {}

    def __enter__(self) -> Steps:
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def __call__(self, step: str, done: int, total: int) -> None:
        label = self.labels.get(step, step)
        if self._progress is not None:
            if step not in self._tasks:
                self._tasks[step] = self._progress.add_task(label, total=total)
            self._progress.update(self._tasks[step], completed=done, total=total)
            return
        # Plain lines: at the start, every 10 %, and at the end of each step.
        tenth = (10 * done) // max(total, 1)
        if done in (0, total) or tenth != self._logged.get(step, -1):
            if done == 0 and step in self._logged:
                return
            self._logged[step] = tenth
            log.info("%s: %d/%d", label, done, total)


def print_inspection(data: dict[str, Any]) -> None:
    """``replay inspect``'s tables on stdout: progress per origin and key, per key, integrity counts."""
    from rich.console import Console
    from rich.table import Table

    # On a terminal rich fits the terminal; piped output gets room for full timestamps.
    console = Console() if sys.stdout.isatty() else Console(width=200)
    console.print(
        f"[bold]{data['archive']}[/bold]: {data['files']} file(s), {data['buffers']} buffers, "
        f"{data['tuples_read']} tuples, lateness mode [bold]{data['lateness']}[/bold]"
    )
    table = Table(title="Progress per origin and key")
    columns = {
        "origin_id": "origin",
        "wm_key": "key",
        "complete_prefix": "prefix",
        "local_watermark": "local wm",
        "pending_buffers": "pending",
        "gaps": "gaps",
        "duplicates": "dups",
        "conflicts": "conflicts",
        "regressions": "regressions",
        "idle": "idle",
    }
    for name, title in columns.items():
        table.add_column(
            title,
            justify="left" if name in ("wm_key", "local_watermark") else "right",
            no_wrap=name == "local_watermark",
        )
    for row in data["origins"]:
        table.add_row(*[str(row[c]) for c in columns])
    console.print(table)
    keys = Table(title="Per key")
    key_columns = {
        "wm_key": "key",
        "watermark": "watermark column",
        "allowed_lateness": "lateness",
        "global_watermark": "global wm",
        "time_window_lower": "window lower",
        "time_window_upper": "window upper",
    }
    for name, title in key_columns.items():
        keys.add_column(title, no_wrap=name not in ("wm_key", "watermark"))
    for row in data["keys"]:
        keys.add_row(*[str(row[c]) for c in key_columns])
    console.print(keys)
    integrity = data["integrity"]
    console.print("integrity: " + ", ".join(f"{name} {len(items)}" for name, items in integrity.items()))


def print_generated(summary: GenerateSummary) -> None:
    """``replay generate``'s one line: what was written where."""
    typer.echo(
        f"wrote {summary.tuples} tuples in {summary.buffers} buffers to {summary.files} file(s) under {summary.path} "
        f"(gaps {len(summary.gaps)}, duplicates {len(summary.duplicates)}, conflicts {len(summary.conflicts)}, "
        f"late tuples {summary.late_tuples}, idle origins {len(summary.idle_origins)})"
    )


def print_run(summary: RunSummary, data: dict[str, Any]) -> None:
    """``replay run``'s summary (``data`` is ``summary.to_dict()``): notes on stderr, the result on stdout."""
    if summary.stale_lock is not None:
        typer.echo(
            f"note: broke the lock left by process {summary.stale_lock.pid} on {summary.stale_lock.host}, "
            "which is no longer running",
            err=True,
        )
    for note in summary.notes:
        typer.echo(f"note: {note}", err=True)
    if summary.batches == 0 and not summary.new_version:
        typer.echo(f"nothing new in the archive since the last run; output version {summary.version} is current")
    else:
        typer.echo(
            f"replayed {summary.buffers} buffers ({summary.tuples_read} tuples) in {summary.batches} micro-batch(es)"
            + (" (resumed)" if summary.resumed else "")
            + f" in {summary.seconds:.1f} s"
        )
    typer.echo(f"output:      {summary.output} (version {summary.version})")
    typer.echo(f"checkpoint:  {summary.checkpoint}")
    typer.echo(
        f"windows:     {summary.windows_emitted} emitted, {summary.open_windows} still open (carried in the checkpoint)"
    )
    typer.echo("late tuples: " + ", ".join(f"{k} {n}" for k, n in summary.late_tuples.items()))
    typer.echo(f"pending:     {summary.pending_tuples} tuples; duplicate copies discarded: {summary.duplicate_copies}")
    for key, marks in data["watermarks"].items():
        typer.echo(f"watermark:   {key}: global {marks['global']}, effective {marks['effective']}")
    for name, mark in data["output_watermarks"].items():
        typer.echo(f"output wm:   {name}: {mark}")


def print_status(data: dict[str, Any]) -> None:
    """``replay status``'s tables on stdout: the checkpoint, per key, the stream cut, open windows."""
    from rich.console import Console
    from rich.table import Table

    console = Console() if sys.stdout.isatty() else Console(width=200)
    console.print(
        f"[bold]{data['checkpoint']}[/bold]: batch {data['batch']} of run {data['run']} "
        f"({'finished' if data['finished'] else 'interrupted'}), commits kept {data['commits']}, "
        f"lateness {data['lateness']}, output {data['output']} (versions {data['versions']}), "
        f"rules {'unversioned' if data['rules'] is None else data['rules']}"
    )
    keys = Table(title="Per key")
    for title in ("key", "global wm", "effective wm", "window lower", "window upper"):
        keys.add_column(title, no_wrap=True)
    for k in data["keys"]:
        keys.add_row(
            k["key"], str(k["global"]), str(k["effective"]), str(k["time_window_lower"]), str(k["time_window_upper"])
        )
    console.print(keys)
    cut = Table(title="Stream cut per origin")
    for title in ("origin", "sequence", "chunk"):
        cut.add_column(title, justify="right")
    for origin, (seq, chunk) in data["stream_cut"].items():
        cut.add_row(str(origin), str(seq), str(chunk))
    console.print(cut)
    console.print(
        "open windows: "
        + ", ".join(f"{n} {c}" for n, c in data["open_windows"].items())
        + f"; pending: {data['pending_buffers']} buffers ({data['pending_tuples']} tuples)"
    )
    console.print(
        "output watermarks (min(E_k, oldest open window's end - 1 ms)): "
        + ", ".join(f"{n} {mark}" for n, mark in data["output_watermarks"].items())
    )
    for line in data["corrupt"]:
        console.print(f"[yellow]checkpoint.corrupt[/yellow]: {line} (the next run sets it aside and redoes it)")


def print_validation(output: str, outcome: ValidationOutcome) -> None:
    """``replay validate``'s table of suites on stdout and, when one failed, its failed expectations
    and the suites not run yet on stderr."""
    from rich.console import Console
    from rich.table import Table

    console = Console() if sys.stdout.isatty() else Console(width=200)
    table = Table(title=f"{output} version {outcome.version}")
    for title in ("suite", "result", "expectations", "failed"):
        table.add_column(title)
    for s in outcome.record["suites"]:
        table.add_row(s["name"], "passed" if s["success"] else "FAILED", str(s["evaluated"]), str(s["failed"]))
    console.print(table)
    console.print(f"Data Docs: {outcome.data_docs}")
    if not outcome.success:
        for suite_name, e in outcome.failures:
            examples = "; ".join(map(str, e["unexpected_examples"][:3]))
            typer.echo(
                f"replay: failed: {suite_name}: {e['type']}({e['column']}): {e['description']}"
                + (f" ({e['unexpected_count']} unexpected: {examples})" if e["unexpected_count"] else "")
                + (f" [{e['error']}]" if e.get("error") else ""),
                err=True,
            )
        missing = {"windows", "progress", "integrity", "reconciliation"} - {s["name"] for s in outcome.record["suites"]}
        if missing:
            typer.echo(f"replay: not validated yet: {', '.join(sorted(missing))}", err=True)


def print_publication(outcome: PublishOutcome) -> None:
    """``replay publish``'s one line: what was published, with the corrections."""
    typer.echo(outcome.describe())
    if not outcome.changed:
        return
    if outcome.merged_rules:
        typer.echo(f"note: {publication_note(outcome.merged_rules, outcome.rules)}", err=True)
