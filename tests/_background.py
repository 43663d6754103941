"""Work that runs beside the test session, for tests whose cost is mostly another process.

The suite is CPU-bound on two cores but not saturated: Spark tests wait on py4j and job scheduling.
A test marked ``background`` names a function here by the same key; the function starts when
collection finishes (``pytest_collection_finish`` in ``conftest.py``), the test is moved to the end
of the run, and it asserts on what the function returned (or re-raises what it raised). Run alone,
the test starts the function itself and waits: the same work, the same checks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["finish", "register", "result", "start"]

_WORK: dict[str, Callable[[], Any]] = {}
_STARTED: dict[str, _Job] = {}


class _Job:
    def __init__(self, key: str, work: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(work,), name=f"background-{key}", daemon=True)
        self.thread.start()

    def _run(self, work: Callable[[], Any]) -> None:
        try:
            self.value = work()
        except BaseException as error:  # re-raised in the test
            self.error = error


def register(key: str) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    def decorate(work: Callable[[], Any]) -> Callable[[], Any]:
        _WORK[key] = work
        return work

    return decorate


def start(key: str) -> None:
    if key not in _STARTED:
        _STARTED[key] = _Job(key, _WORK[key])


def result(key: str, timeout: float = 900) -> Any:
    """What the work of ``key`` returned, starting it now if nothing did."""
    start(key)
    job = _STARTED[key]
    job.thread.join(timeout)
    assert not job.thread.is_alive(), f"background work {key!r} still running after {timeout:.0f} s"
    if job.error is not None:
        raise job.error
    return job.value


def finish(timeout: float = 900) -> None:
    """Wait for whatever is still running (a session stopped early): its own clean-up stops its processes."""
    for job in _STARTED.values():
        job.thread.join(timeout)
