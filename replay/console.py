"""What the ``replay`` command shows while it works and after: progress of long steps (a rich bar on a
terminal, plain log lines on stderr elsewhere) and ``replay inspect``'s tables. rich is imported
only when something is shown."""

from __future__ import annotations

import logging
import sys
from typing import Any

__all__ = ["Steps", "print_inspection"]

log = logging.getLogger("replay")


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
