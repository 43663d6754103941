"""Where a row of a pass's union goes, and the value columns its destinations share.

A pass (``replay.engine.aggregate``, its query built by ``replay.engine.pass_query``) writes
every destination (each batch's due windows, the open windows, each batch's late tuples, the
counts) from one union of branches, in one Spark action. Each row names its destination in
``_part``: ``due_part`` picks the batch a window is due at, ``batch_part`` the part of a batch;
``Shared`` lays every destination's values into columns that the destinations share by type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from replay.engine.passes import Step

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import DataType, StructType

__all__ = ["Shared", "Value", "batch_part", "due_part", "fields_of"]

#: One value of a destination's row: its name there, the expression, and the expression's type.
Value = tuple[str, "Column", "DataType"]


def fields_of(struct: StructType, prefix: str = "") -> list[Value]:
    """Values that are the fields of ``struct`` as they are, each the column ``prefix`` + its name."""
    from pyspark.sql import functions as F

    return [(f.name, F.col(f"{prefix}{f.name}"), f.dataType) for f in struct.fields]


def due_part(end: Column, steps: Sequence[Step], i: int, part: Mapping[int, int]) -> Column:
    """The part of the first batch of the pass whose ``E_k`` (key ``i``) reaches ``end`` (``part``:
    by batch), or null: the window stays open."""
    from pyspark.sql import functions as F

    due: Column | None = None
    reached: int | None = None
    for step in steps:
        if reached is not None and step.effective[i] <= reached:
            continue  # E_k did not move: no window can first be due here
        reached = step.effective[i]
        condition = end <= F.lit(reached)
        value = F.lit(part[step.batch])
        due = F.when(condition, value) if due is None else due.when(condition, value)
    return F.lit(None).cast("int") if due is None else due


def batch_part(batch: Column, part: Mapping[int, int]) -> Column:
    """The part of the batch in column ``batch`` (``part``: by batch)."""
    from pyspark.sql import functions as F

    chosen: Column | None = None
    for b, number in part.items():
        condition, value = batch == F.lit(b), F.lit(number)
        chosen = F.when(condition, value) if chosen is None else chosen.when(condition, value)
    assert chosen is not None  # a pass has a batch
    return chosen


class Shared:
    """The union's value columns, shared between destinations by type: the ``j``-th value of type
    ``T`` of every destination is in column ``_v<T>_<j>``. A row goes to one destination, and every
    column of the union crosses to the writer on every row, null or not (Arrow keeps 8 bytes for a
    null long): a column per value of every destination carried twice as much (docs/performance-record.md)."""

    def __init__(self) -> None:
        self._types: dict[str, int] = {}

    def columns(self, types: Sequence[DataType]) -> list[str]:
        """The columns that values of ``types`` (one destination's, in order) are in."""
        taken: dict[int, int] = {}
        names = []
        for data_type in types:
            kind = self._types.setdefault(data_type.simpleString(), len(self._types))
            j = taken.get(kind, 0)
            taken[kind] = j + 1
            names.append(f"_v{kind}_{j}")
        return names

    def select(
        self, kinds: Sequence[tuple[Column | None, Sequence[Value]]]
    ) -> tuple[list[Column], list[tuple[tuple[str, str], ...]]]:
        """The shared columns of rows each of which is of one of ``kinds``: ``(condition, its values)``,
        the first whose condition holds (``None``: always); and per kind, the ``Part.columns`` its
        values are in. The values' types are declared (``Value``), not found by analysing a
        projection of the frame: an analysis of the whole plan, 10 to 20 ms a pass."""
        from pyspark.sql import functions as F

        options: dict[str, list[tuple[Column | None, Column]]] = {}
        placed: list[tuple[tuple[str, str], ...]] = []
        for condition, values in kinds:
            names = self.columns([data_type for _, _, data_type in values])
            placed.append(tuple((column, name) for column, (name, _, _) in zip(names, values, strict=True)))
            for column, (_, value, _) in zip(names, values, strict=True):
                options.setdefault(column, []).append((condition, value))
        selected: list[Column] = []
        for column, choices in options.items():
            expr: Column | None = None
            for condition, value in choices:
                if condition is None:
                    expr = value if expr is None else expr.otherwise(value)
                    break
                expr = F.when(condition, value) if expr is None else expr.when(condition, value)
            assert expr is not None
            selected.append(expr.alias(column))
        return selected, placed
