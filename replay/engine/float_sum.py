"""Exact, order-independent sums of floating-point columns in Spark (docs/semantics.md#aggregates).

**Per value** (``limbs``): a value ``v`` (finite, ``|v| < 2^63``) is cut into four 64-bit integers,
each with the sign of ``v``: ``a0 = trunc(v)`` and, for ``k = 1, 2, 3``, ``a_k = trunc(r_{k-1} *
2^32)``, where ``r_0 = v - a0`` and ``r_k = r_{k-1} * 2^32 - a_k``. Every step is exact in IEEE
arithmetic (a subtraction of a value's own integer part, a scaling by a power of two), so
``a0 + a1 2^-32 + a2 2^-64 + a3 2^-96`` is ``v`` truncated toward zero to a multiple of ``2^-96``:
``v`` itself when ``|v| >= 2^-44`` or when ``v`` has no bits below ``2^-96``. Each limb is summed in a
long; ``|a_k| < 2^32`` for ``k >= 1``, so those sums cannot overflow below 2^31 values. A value that
is NaN, infinite or beyond ``2^63`` in magnitude stops the job (``unsummable``): the query raises an
error carrying ``marker(column)``, which ``failure`` turns into ``archive.unsummable``.

**Per window** (``total``): ``a0 + (a1 + (a2 + a3 2^-32) 2^-32) 2^-32`` over the limbs' sums, in
double arithmetic and in that order: a function of the four sums only, so it does not depend on
the order of the values. A single value of magnitude 2^-44 or more comes back exactly; a sum of
several is within a few units in the last place of the exact sum of the truncated values.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, TypeVar

from replay.core.errors import DataError, Location

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from pyspark.sql import Column

    from replay.engine.unsummable import Found, Locator

__all__ = ["LIMBS", "LIMIT", "failure", "limbs", "marker", "total", "unsummable"]

T = TypeVar("T")

#: The number of limbs: the integer part and three 32-bit fraction limbs (2^-96 resolution).
LIMBS = 4
#: Values summed must be finite and below this in magnitude (their integer part is a long).
LIMIT = 2.0**63
_BITS = 32
_SCALE = float(1 << _BITS)


def marker(column: str) -> str:
    """The text of the Spark error a value of ``column`` that cannot be summed raises."""
    return f"replay-unsummable[{column}]"


def unsummable(column: str, found: Found | None = None) -> DataError:
    """``archive.unsummable``: a NaN, an infinity or a value beyond 2^63 in a summed column; with
    ``found`` (``replay.engine.unsummable.Locator.first``), the first such value's buffer and how
    many there are."""
    what = (
        f"column '{column}' holds a NaN, an infinity or a value of magnitude 2^63 or more among the "
        "values of a window's sum or mean, which are exact sums of finite values below 2^63"
    )
    where = Location(column=column)
    if found is not None:
        what += (
            f": {found.count} such value{'s' if found.count != 1 else ''} among the on-time tuples of the "
            "batches in progress, the first (by origin, sequence and chunk) in the buffer this error names"
        )
        where = Location(
            file=found.file,
            origin=found.origin,
            sequence=found.sequence,
            chunk=found.chunk,
            column=column,
            extra=dict(found.extra()),
        )
    return DataError(
        what,
        where=where,
        todo=f"replace those values in the archive (or drop the sum and mean of '{column}' from the job); "
        "nothing of the batch in progress was committed, and the next run resumes from the checkpoint",
        code="archive.unsummable",
    )


#: Spark's errors (ANSI mode) for a sum beyond its type: a long's 2^63, a decimal's 38 digits.
OVERFLOW = ("[ARITHMETIC_OVERFLOW]", "[NUMERIC_VALUE_OUT_OF_RANGE")


def failure(error: BaseException, columns: Iterable[str], locator: Locator | None = None) -> DataError | None:
    """``archive.unsummable`` for the first of ``columns`` whose marker ``error`` carries, or for a
    sum that overflowed its exact type; else ``None``. With ``locator`` (the failed pass's, asked
    only here, on the error path), the first value that cannot be summed is located in its buffer,
    and the sums that overflow are named; a question that fails, or finds nothing, leaves the
    column (or every summed column) named as Spark's error allows."""
    text = str(error)
    summed = list(dict.fromkeys(columns))
    for column in summed:
        if marker(column) in text:
            return unsummable(column, _asked(partial(locator.first, column)) if locator else None)
    if summed and any(tag in text for tag in OVERFLOW):
        pairs = (_asked(locator.overflowing) if locator else None) or []
        named = list(dict.fromkeys(c for _, c in pairs)) or summed
        names = ", ".join(f"'{c}'" for c in named)
        sums = ", ".join(f"'{c}' in window aggregation '{w}'" for w, c in pairs)
        if not pairs:
            what = f"a window's sum over {names} does not fit its exact type"
        elif len(pairs) == 1:
            what = f"the sum of {sums} over a window does not fit its exact type"
        else:
            what = f"the sums of {sums} over a window do not fit their exact types"
        return DataError(
            what + ": integers (and a float's integer parts) are summed as 64-bit integers, below 2^63 in "
            "magnitude, decimals as decimal(38, s)",
            where=Location(
                column=named[0] if len(named) == 1 else None,
                extra={"window": pairs[0][0]} if len({w for w, _ in pairs}) == 1 else {},
            ),
            todo="use smaller windows or scale the column down in the archive (or drop its sum and mean from "
            "the job); nothing of the batch in progress was committed, and the next run resumes from the checkpoint",
            code="archive.unsummable",
        )
    return None


def _asked(question: Callable[[], T]) -> T | None:
    """``question()``, or ``None`` when it fails: the error being reported matters more than where
    it is."""
    try:
        return question()
    except Exception:
        return None


def limbs(value: Column, column: str) -> list[Column]:
    """The four limbs of ``value`` (null stays null), as longs; a value that cannot be summed
    raises ``marker(column)``. ``F.abs(NaN) < LIMIT`` is false: Spark orders NaN above everything."""
    from pyspark.sql import functions as F

    v = value.cast("double")
    checked = F.when(v.isNull() | (F.abs(v) < F.lit(LIMIT)), v).otherwise(F.raise_error(F.lit(marker(column))))
    out = [checked.cast("long")]
    rest = checked - out[0].cast("double")  # the fraction, exactly
    for k in range(1, LIMBS):
        scaled = rest * F.lit(_SCALE)
        out.append(scaled.cast("long"))
        if k < LIMBS - 1:
            rest = scaled - out[k].cast("double")
    return out


def total(sums: list[Column]) -> Column:
    """The window's sum, a double, from the limbs' sums (exact longs) only, so it does not depend
    on the order of the values: ``a0 + (a1 + (a2 + a3 2^-32) 2^-32) 2^-32`` in double arithmetic,
    in that order. A single value comes back exactly (each partial sum is a tail of its
    significand's bits); a sum of several is within a few units in the last place of the exact sum
    of the truncated values. The reference model computes the same expression
    (``replay.reference.windows``).

    Not the correctly rounded sum: that needs Spark's decimal arithmetic here, whose generated code
    made a warm replay of the 10M-tuple benchmark archive 60 % slower even for windows that never
    took it (docs/performance-record.md)."""
    from pyspark.sql import functions as F

    a0, a1, a2, a3 = (s.cast("double") for s in sums)
    step = F.lit(1.0 / _SCALE)
    return a0 + (a1 + (a2 + a3 * step) * step) * step
