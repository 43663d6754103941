"""The aggregation registry: one object per function, holding all it means to the Spark engine.

Each ``AggregateFunction`` says which partial columns it adds for one micro-batch's tuples
(``partial``), how partials of several batches merge (``merge``), how merged partials become the
value in the ``windows`` table (``final``) and that value's type (``output_type``). ``windows``
drives them through ``FUNCTIONS``; adding a function is one class here (and its name in the job
model's ``Aggregation.fn``). ``count`` without a column is the window's row count, which every
window carries anyway (``_rows``), so it needs no partial of its own.

Every partial is exactly mergeable and independent of the order of the tuples: counts and integer
sums are 64-bit integers, a floating-point column's sum is carried as four 64-bit integer sums (the
limbs of ``replay.engine.float_sum``: the values' integer parts and three 32-bit fraction digits),
``mean`` is such a sum and a count (and, for a floating-point column, its min and max, into which
the mean is clamped: rounding alone could put it outside), ``min``/``max`` keep the column's type,
and ``approx_count_distinct`` carries the set of distinct values (so it is exact). The reference
model (``replay.reference.model``) and the reconciliation suite compute the same functions by their
own code, in the same vocabulary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from replay.engine import float_sum

if TYPE_CHECKING:
    from collections.abc import Iterable

    from pyspark.sql import Column
    from pyspark.sql.types import DataType

    from replay.core.config import Aggregation

__all__ = ["FLOAT_SUM_TYPE", "FUNCTIONS", "AggregateFunction", "is_float", "sum_kind", "summed_columns"]

FLOAT_SUM_TYPE = "limbs"


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
    #: Whether it sums its column (``sum``, ``mean``): a value such a sum cannot take is bad input.
    sums: ClassVar[bool] = False

    def columns(self, i: int, data_type: DataType) -> list[str]:
        """The names of the partial columns (as ``partial`` and ``merge`` name them)."""
        raise NotImplementedError

    def partial(self, i: int, value: Column, data_type: DataType, column: str) -> list[Column]:
        """Aggregate expressions over the batch's rows; ``value`` is the column ``column``, null
        off-window."""
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

    def columns(self, i: int, data_type: DataType) -> list[str]:
        return [f"p{i}_n"]

    def partial(self, i: int, value: Column, data_type: DataType, column: str) -> list[Column]:
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


def _clamped(data_type: DataType) -> bool:
    """Whether a mean of ``data_type`` is clamped into its values' [min, max] (``_Mean``)."""
    return sum_kind(data_type) != "long"


def _limb_names(i: int) -> list[str]:
    return [f"p{i}_l{k}" for k in range(float_sum.LIMBS)]


class _Sum(_Count):
    """A count of non-null values (SQL's sum of nothing is null) and the exact sum."""

    name = "sum"
    sums = True

    def columns(self, i: int, data_type: DataType) -> list[str]:
        return [*super().columns(i, data_type), *(_limb_names(i) if is_float(data_type) else [f"p{i}_s"])]

    def partial(self, i: int, value: Column, data_type: DataType, column: str) -> list[Column]:
        from pyspark.sql import functions as F

        kind = sum_kind(data_type)
        counted = super().partial(i, value, data_type, column)
        if kind != FLOAT_SUM_TYPE:
            return [*counted, F.sum(value.cast(kind)).cast(kind).alias(f"p{i}_s")]
        # Exact and order-independent, in 64-bit integer arithmetic: each value's limbs
        # (``replay.engine.float_sum``), a few floating-point instructions per value.
        limbs = float_sum.limbs(value, column)
        return [*counted, *[F.sum(limb).alias(name) for limb, name in zip(limbs, _limb_names(i), strict=True)]]

    def merge(self, i: int, data_type: DataType) -> list[Column]:
        from pyspark.sql import functions as F

        kind = sum_kind(data_type)
        if kind != FLOAT_SUM_TYPE:
            return [*super().merge(i, data_type), F.sum(f"p{i}_s").cast(kind).alias(f"p{i}_s")]
        return [*super().merge(i, data_type), *[F.sum(name).cast("long").alias(name) for name in _limb_names(i)]]

    def total(self, i: int, data_type: DataType) -> Column:
        """The exact sum; for floats the double nearest to the limbs' exact sum (a function of the
        limbs' sums only, so still independent of the order of the tuples)."""
        from pyspark.sql import functions as F

        if not is_float(data_type):
            return F.col(f"p{i}_s")
        return float_sum.total([F.col(name) for name in _limb_names(i)])

    def final(self, i: int, data_type: DataType) -> Column:
        from pyspark.sql import functions as F

        return F.when(F.col(f"p{i}_n") > 0, self.total(i, data_type))

    def output_type(self, data_type: DataType) -> DataType:
        from pyspark.sql.types import DecimalType, DoubleType, LongType

        if isinstance(data_type, DecimalType):
            return DecimalType(38, data_type.scale)
        return DoubleType() if is_float(data_type) else LongType()


class _Mean(_Sum):
    """The sum over the count; of a floating-point or decimal column, clamped into the values'
    [min, max] as doubles (``p<i>_lo``, ``p<i>_hi``, partials of their own): the exact mean lies
    there, so the clamp only takes back what the rounding of the sum (a float's, or a decimal's to a
    double) and of the division put outside. An integer mean needs none: below 2^53 its sum is a
    double exactly, and a quotient is rounded once."""

    name = "mean"

    def columns(self, i: int, data_type: DataType) -> list[str]:
        return [*super().columns(i, data_type), *([f"p{i}_lo", f"p{i}_hi"] if _clamped(data_type) else [])]

    def partial(self, i: int, value: Column, data_type: DataType, column: str) -> list[Column]:
        from pyspark.sql import functions as F

        extremes = [F.min(value).alias(f"p{i}_lo"), F.max(value).alias(f"p{i}_hi")] if _clamped(data_type) else []
        return [*super().partial(i, value, data_type, column), *extremes]

    def merge(self, i: int, data_type: DataType) -> list[Column]:
        from pyspark.sql import functions as F

        extremes = [F.min(f"p{i}_lo").alias(f"p{i}_lo"), F.max(f"p{i}_hi").alias(f"p{i}_hi")]
        return [*super().merge(i, data_type), *(extremes if _clamped(data_type) else [])]

    def final(self, i: int, data_type: DataType) -> Column:
        from pyspark.sql import functions as F

        # A mean is a double by definition (SQL's avg); both operands are exact order-free totals.
        mean = self.total(i, data_type).cast("double") / F.col(f"p{i}_n").cast("double")
        if _clamped(data_type):
            low, high = F.col(f"p{i}_lo").cast("double"), F.col(f"p{i}_hi").cast("double")
            mean = F.when(mean < low, low).when(mean > high, high).otherwise(mean)
        return F.when(F.col(f"p{i}_n") > 0, mean)

    def output_type(self, data_type: DataType) -> DataType:
        from pyspark.sql.types import DoubleType

        return DoubleType()


class _Extreme(AggregateFunction):
    """``min`` or ``max``: the column's own type, merged with itself."""

    def _fn(self, column: Column | str) -> Column:
        from pyspark.sql import functions as F

        return F.min(column) if self.name == "min" else F.max(column)

    def columns(self, i: int, data_type: DataType) -> list[str]:
        return [f"p{i}_{self.name}"]

    def partial(self, i: int, value: Column, data_type: DataType, column: str) -> list[Column]:
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

    def columns(self, i: int, data_type: DataType) -> list[str]:
        return [f"p{i}_set"]

    def partial(self, i: int, value: Column, data_type: DataType, column: str) -> list[Column]:
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


def summed_columns(aggregations: Iterable[Aggregation]) -> tuple[str, ...]:
    """The columns these aggregations sum, each once, in order."""
    return tuple(dict.fromkeys(a.column for a in aggregations if FUNCTIONS[a.fn].sums and a.column))
