"""The task defaults every Replay DAG gives its tasks (``default_args``): retries.

What fails a task on Replay's input or configuration (bad input, a path outside the roots, an
incompatible checkpoint) raises ``AirflowFailException`` (``replay_airflow.operators.task_errors``)
and is never retried: the same run would fail the same way. Everything else is operational and
worth another try: a kept driver not up yet or lost (``driver.*``), a Spark executor or master lost,
storage (``storage.io``), another writer holding the checkpoint. Those are retried ``retries`` times,
``retry_delay`` apart; a retried run resumes from its checkpoint, so nothing is done twice.

A deployment changes them with ``REPLAY_TASK_RETRIES`` (default 2) and ``REPLAY_TASK_RETRY_DELAY``
(seconds, default 60) in the environment of the processes that parse the DAGs.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

__all__ = ["task_defaults"]


def task_defaults() -> dict[str, Any]:
    """``default_args`` for a Replay DAG: ``retries`` and ``retry_delay`` (see the module docstring)."""
    return {
        "retries": int(os.environ.get("REPLAY_TASK_RETRIES", "2")),
        "retry_delay": timedelta(seconds=float(os.environ.get("REPLAY_TASK_RETRY_DELAY", "60"))),
    }
