"""Great Expectations 1.x suites for Replay's outputs (docs/validation.md#suites).

Each suite is a module with ``NAME``, ``frame(inputs)`` (the Spark DataFrame it validates:
a table of the output version, with the columns its expectations compare) and
``expectations(inputs)`` (the expectations, built from the job configuration: window sizes,
keys, aggregations, thresholds). ``replay validate`` runs them through GX Checkpoints.

- ``windows``: schema, non-null, sizes, counts, uniqueness, closure, ``min <= mean <= max``;
- ``progress``: ``G_k``, local watermarks, prefixes and stream cuts never go back;
- ``reconciliation``: the windows equal an independent recomputation; the ledger identity;
- ``integrity``: the job's thresholds on gaps, conflicts, late fraction and the rest.
"""

from __future__ import annotations

from types import ModuleType

from expectations import integrity, progress, reconciliation, windows
from expectations._inputs import SuiteInputs

__all__ = ["SUITES", "SuiteInputs", "suite_module"]

#: The suites in the order they run.
SUITES: tuple[str, ...] = (windows.NAME, progress.NAME, integrity.NAME, reconciliation.NAME)

_MODULES: dict[str, ModuleType] = {m.NAME: m for m in (windows, progress, integrity, reconciliation)}


def suite_module(name: str) -> ModuleType:
    """The module of suite ``name`` (``KeyError`` for an unknown one)."""
    return _MODULES[name]
