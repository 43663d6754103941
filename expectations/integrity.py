"""The ``integrity`` suite (docs/validation.md#suites): the job's thresholds on gaps, incomplete and skipped
sequences, conflicts, regressions and the late fraction (``validation:`` in the job file).

The frame has one row per watermark key: the count of each integrity kind (kinds that
belong to no key, such as gaps, count for every key), the late tuples of the key, the
tuples read and ``late_fraction``. A threshold set to null is not checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from expectations._inputs import SuiteInputs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["KINDS", "NAME", "expectations", "frame"]

NAME = "integrity"
#: integrity kind -> the frame's column counting it
KINDS = {
    "gap": "gaps",
    "incomplete": "incomplete",
    "skipped": "skipped",
    "regression": "regressions",
    "duplicate": "duplicates",
    "conflict": "conflicts",
    "after_skip": "after_skip",
}


def frame(inputs: SuiteInputs) -> DataFrame:
    counts: dict[tuple[str, str | None], int] = {}
    for found in inputs.tables["integrity"].groupBy("kind", "wm_key").count().collect():
        counts[(found["kind"], found["wm_key"])] = int(found["count"])
    late = inputs.late_per_key
    read = int((inputs.manifest.counts or {}).get("tuples_read", 0))
    rows = []
    for key in inputs.effective:
        row: dict[str, Any] = {"wm_key": key}
        for kind, column in KINDS.items():
            row[column] = sum(n for (k, wm_key), n in counts.items() if k == kind and wm_key in (None, key))
        row["unknown_kinds"] = sum(n for (k, _), n in counts.items() if k not in KINDS)
        row["late"] = late.get(key, 0)
        row["tuples_read"] = read
        # A ratio compared with a threshold, not a time: a double is what it is.
        row["late_fraction"] = late.get(key, 0) / read if read else 0.0
        rows.append(row)
    schema = "wm_key string, " + ", ".join(f"{c} long" for c in KINDS.values())
    schema += ", unknown_kinds long, late long, tuples_read long, late_fraction double"
    return inputs.spark.createDataFrame(rows, schema)


def expectations(inputs: SuiteInputs) -> list[Any]:
    import great_expectations.expectations as gxe

    settings = inputs.config.validation
    out: list[Any] = [
        gxe.ExpectColumnValuesToBeBetween(
            column="unknown_kinds", max_value=0, description="the integrity table holds only known kinds"
        ),
    ]
    limits = {
        "gaps": "max_gaps",
        "incomplete": "max_incomplete",
        "skipped": "max_skipped",
        "conflicts": "max_conflicts",
        "regressions": "max_regressions",
    }
    for column, setting in limits.items():
        limit = getattr(settings, setting)
        if limit is not None:
            out.append(
                gxe.ExpectColumnValuesToBeBetween(
                    column=column,
                    min_value=0,
                    max_value=limit,
                    description=f"at most {limit} {column} (validation.{setting})",
                )
            )
    if settings.max_late_fraction is not None:
        out.append(
            gxe.ExpectColumnValuesToBeBetween(
                column="late_fraction",
                min_value=0,
                max_value=settings.max_late_fraction,
                description=f"late tuples are at most {settings.max_late_fraction:g} of the tuples read, per key",
            )
        )
    return out
