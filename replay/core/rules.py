"""The version of the rules Replay computes results by (docs/outputs.md#rules-version).

A checkpoint's committed batches, open windows and engine snapshot were computed by the rules of
the Replay that wrote them: how copies are compared, how times are cut to microseconds, how sums
are taken. A Replay whose rules differ would continue them into outputs that neither version
computes on its own, so a checkpoint records ``RULES_VERSION`` in its identity and a run under
other rules is refused (``checkpoint.incompatible``), unless the checkpoint holds no commit yet.
Raise the version with every change of a rule that can change a committed result, and say what
changed in ``CHANGES``.
"""

from __future__ import annotations

__all__ = ["CHANGES", "RULES_VERSION", "changes_since"]

#: The rules this Replay computes by.
RULES_VERSION = 1

#: What each version changed, against the one before (version 1: against a checkpoint that
#: records no version, written before rules were versioned).
CHANGES: dict[int, str] = {
    1: "float sums exact (an integer part and three 32-bit fraction limbs), decimal means kept within "
    "[min, max], every Parquet timestamp column (payload ones too) at microsecond precision with "
    "nanoseconds truncated toward minus infinity, watermark_ts always buffer metadata, copies compared "
    "by content hash recipe 3",
}


def changes_since(version: int | None) -> list[str]:
    """What changed after rules ``version`` (``None``: a checkpoint that records none), oldest first."""
    after = 0 if version is None else version
    return [f"rules {v}: {text}" for v, text in sorted(CHANGES.items()) if v > after]
