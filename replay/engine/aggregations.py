"""The aggregation registry: one object per function, holding all it means to the Spark engine.

Each ``AggregateFunction`` says which partial columns it adds for one micro-batch's tuples
(``partial``), how partials of several batches merge (``merge``), how merged partials become the
value in the ``windows`` table (``final``) and that value's type (``output_type``). ``windows``
drives them through ``FUNCTIONS``; adding a function is one class here (and its name in the job
model's ``Aggregation.fn``). ``count`` without a column is the window's row count, which every
window carries anyway (``_rows``), so it needs no partial of its own.

Every partial is exactly mergeable and independent of the order of the tuples: counts and integer
sums are 64-bit integers, a floating-point column's sum is carried as two 64-bit integer sums (of
the values' integer parts, and of their fractional parts in units of 1e-9), ``mean`` is such a sum
and a count, ``min``/``max`` keep the column's type, and ``approx_count_distinct`` carries the set
of distinct values (so it is exact). The reference model (``replay.reference.model``) and the
reconciliation suite compute the same functions by their own code, in the same vocabulary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import DataType

__all__ = ["FLOAT_SUM_TYPE", "FUNCTIONS", "AggregateFunction", "is_float", "sum_kind"]

FLOAT_SUM_TYPE = "fixed"
FRACTION_SCALE = 1_000_000_000  # a float's fractional part is added in units of 1e-9


def sum_kind(data_type: DataType) -> str:
    """How a column of ``data_type`` is summed: ``long``, ``decimal(38,s)``, or ``FLOAT_SUM_TYPE``."""
    from pyspark.sql.types import ByteType, DecimalType, IntegerType, LongType, ShortType

    if isinstance(data_type, ByteType | ShortType | IntegerType | LongType):
        return "long"
    if isinstance(data_type, DecimalType):
        return f"decimal(38,{data_type.scale})"
    return FLOAT_SUM_TYPE


def is_float(data_type: DataType) -> bool:
    return sum_kind(data_type) == FLOAT_SUM_TYPE


class AggregateFunction:
    """One aggregation function over a column. Partial columns of the ``i``-th aggregation of a
    window spec are named ``p<i>_<part>``; merged partials keep the names."""

    name: ClassVar[str]

    def partial(self, i: int, value: Column, data_type: DataType) -> list[Column]:
        """Aggregate expressions over the batch's rows; ``value`` is the column, null off-window."""
        raise NotImplementedError

    def merge(self, i: int, data_type: DataType) -> list[Column]:
        """Aggregate expressions that merge partial rows of one window."""
        raise NotImplementedError

    def final(self, i: int, data_type: DataType) -> Column:
        """The window's value from its merged partial row."""
        raise NotImplementedError

    def output_type(self, data_type: DataType) -> DataType:
        """The Spark type of the value in the ``windows`` table."""
        raise NotImplementedError


class _Count(AggregateFunction):
    name = "count"

    def partial(self, i: int, value: Column, data_type: DataType) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.count(value).alias(f"p{i}_n")]

    def merge(self, i: int, data_type: DataType) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.sum(f"p{i}_n").cast("long").alias(f"p{i}_n")]

    def final(self, i: int, data_type: DataType) -> Column:
        from pyspark.sql import functions as F

        return F.col(f"p{i}_n")

    def output_type(self, data_type: DataType) -> DataType:
        from pyspark.sql.types import LongType

        return LongType()


class _Sum(_Count):
    """A count of non-null values (SQL's sum of nothing is null) and the exact sum."""

    name = "sum"

    def partial(self, i: int, value: Column, data_type: DataType) -> list[Column]:
        from pyspark.sql import functions as F

        kind = sum_kind(data_type)
        if kind != FLOAT_SUM_TYPE:
            return [*super().partial(i, value, data_type), F.sum(value.cast(kind)).cast(kind).alias(f"p{i}_s")]
        # Exact and order-independent, in 64-bit integer arithmetic: the integer parts, and the
        # fractional parts rounded to 1e-9. The values are the payload's own floats (never times).
        # ``rint`` (to nearest, ties to even) is one floating-point instruction; Spark's ``round``
        # goes through a BigDecimal per row (about 1 s per 10M values here). Either is a function
        # of the value alone, which is all that order independence needs.
        whole = F.floor(value)
        fraction = F.rint((value - whole) * F.lit(float(FRACTION_SCALE))).cast("long")
        return [
            *super().partial(i, value, data_type),
            F.sum(whole.cast("long")).alias(f"p{i}_s"),
            F.sum(fraction).alias(f"p{i}_f"),
        ]

    def merge(self, i: int, data_type: DataType) -> list[Column]:
        from pyspark.sql import functions as F

        kind = sum_kind(data_type)
        if kind != FLOAT_SUM_TYPE:
            return [*super().merge(i, data_type), F.sum(f"p{i}_s").cast(kind).alias(f"p{i}_s")]
        return [
            *super().merge(i, data_type),
            F.sum(f"p{i}_s").cast("long").alias(f"p{i}_s"),
            F.sum(f"p{i}_f").cast("long").alias(f"p{i}_f"),
        ]

    def total(self, i: int, data_type: DataType) -> Column:
        """The exact sum; for floats the two integer sums combined as a double (a function of the
        two integers only, so still independent of the order of the tuples)."""
        from pyspark.sql import functions as F

        if not is_float(data_type):
            return F.col(f"p{i}_s")
        fraction = F.col(f"p{i}_f").cast("double") / F.lit(float(FRACTION_SCALE))
        return F.col(f"p{i}_s").cast("double") + fraction

    def final(self, i: int, data_type: DataType) -> Column:
        from pyspark.sql import functions as F

        total = self.total(i, data_type)
        if is_float(data_type):
            total = total.cast("double")
        return F.when(F.col(f"p{i}_n") > 0, total)

    def output_type(self, data_type: DataType) -> DataType:
        from pyspark.sql.types import DecimalType, DoubleType, LongType

        if isinstance(data_type, DecimalType):
            return DecimalType(38, data_type.scale)
        return DoubleType() if is_float(data_type) else LongType()


class _Mean(_Sum):
    name = "mean"

    def final(self, i: int, data_type: DataType) -> Column:
        from pyspark.sql import functions as F

        # A mean is a double by definition (SQL's avg); both operands are exact order-free totals.
        total = self.total(i, data_type).cast("double")
        return F.when(F.col(f"p{i}_n") > 0, total / F.col(f"p{i}_n").cast("double"))

    def output_type(self, data_type: DataType) -> DataType:
        from pyspark.sql.types import DoubleType

        return DoubleType()


class _Extreme(AggregateFunction):
    """``min`` or ``max``: the column's own type, merged with itself."""

    def _fn(self, column: Column | str) -> Column:
        from pyspark.sql import functions as F

        return F.min(column) if self.name == "min" else F.max(column)

    def partial(self, i: int, value: Column, data_type: DataType) -> list[Column]:
        return [self._fn(value).alias(f"p{i}_{self.name}")]

    def merge(self, i: int, data_type: DataType) -> list[Column]:
        return [self._fn(f"p{i}_{self.name}").alias(f"p{i}_{self.name}")]

    def final(self, i: int, data_type: DataType) -> Column:
        from pyspark.sql import functions as F

        return F.col(f"p{i}_{self.name}")

    def output_type(self, data_type: DataType) -> DataType:
        return data_type


class _Min(_Extreme):
    name = "min"


class _Max(_Extreme):
    name = "max"


class _ApproxCountDistinct(AggregateFunction):
    """Exact: the set of distinct non-null values travels with the window."""

    name = "approx_count_distinct"

    def partial(self, i: int, value: Column, data_type: DataType) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.collect_set(value).alias(f"p{i}_set")]

    def merge(self, i: int, data_type: DataType) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.array_distinct(F.flatten(F.collect_list(f"p{i}_set"))).alias(f"p{i}_set")]

    def final(self, i: int, data_type: DataType) -> Column:
        from pyspark.sql import functions as F

        return F.size(f"p{i}_set").cast("long")

    def output_type(self, data_type: DataType) -> DataType:
        from pyspark.sql.types import LongType

        return LongType()


#: Every aggregation function by its name in the job file.
FUNCTIONS: dict[str, AggregateFunction] = {
    f.name: f for f in (_Count(), _Sum(), _Mean(), _Min(), _Max(), _ApproxCountDistinct())
}
