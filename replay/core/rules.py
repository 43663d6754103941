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

__all__ = ["CHANGES", "RULES_VERSION", "changes_since", "mixed_rules", "publication_note", "rules_name"]

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


def rules_name(version: int | None) -> str:
    """A rules version as the outputs and messages name it (``None``: from before rules were versioned)."""
    return "rules from before they were versioned" if version is None else f"rules {version}"


def mixed_rules(versions: tuple[int | None, ...], merged: int | None) -> str:
    """The rules ``versions`` of a publication's rows, where a range computed by rules ``merged`` was
    merged into a publication made by other rules (docs/outputs.md#rules-version)."""
    names = ", ".join(rules_name(v) for v in versions)
    return f"{names}: the merged range's rows by {rules_name(merged)}, the others as the previous publication's"


def publication_note(versions: tuple[int | None, ...], merged: int | None) -> str:
    """``replay publish``'s note (and the Airflow publish task's warning) on such a publication."""
    return (
        f"the publication's rows were computed by {mixed_rules(versions, merged)}; to publish rows of one rules "
        "version, replay the whole archive into a new --checkpoint and publish that version"
    )
