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

**Per window** (``total``): the double nearest to the exact sum of the limbs (ties to even),
computed from the four limb sums only, so it does not depend on the order of the values: the sums
are normalised in integer arithmetic to a signed integer part ``W`` and three digits in ``[0,
2^32)``; the whole number times 2^96 (or, where ``|W| >= 2^30``, times 2^64 or 2^32, the digits
below standing as a sticky bit: round to odd, keeping at least 94 significant bits) is one exact
decimal(38,0), whose conversion to a double is the one rounding (to nearest; round to odd at 55 or
more bits, then to nearest at 53, is exact rounding); the rest is a scaling by a power of two. A
single value of magnitude 2^-44 or more comes back exactly (its truncation is itself).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replay.core.errors import DataError, Location

if TYPE_CHECKING:
    from collections.abc import Iterable

    from pyspark.sql import Column

__all__ = ["LIMBS", "LIMIT", "failure", "limbs", "marker", "total", "unsummable"]

#: The number of limbs: the integer part and three 32-bit fraction limbs (2^-96 resolution).
LIMBS = 4
#: Values summed must be finite and below this in magnitude (their integer part is a long).
LIMIT = 2.0**63
_BITS = 32
_MASK = (1 << _BITS) - 1
_SCALE = float(1 << _BITS)
_DECIMAL = "decimal(38,0)"


def marker(column: str) -> str:
    """The text of the Spark error a value of ``column`` that cannot be summed raises."""
    return f"replay-unsummable[{column}]"


def unsummable(column: str) -> DataError:
    """``archive.unsummable``: a NaN, an infinity or a value beyond 2^63 in a summed column."""
    return DataError(
        f"column '{column}' holds a NaN, an infinity or a value of magnitude 2^63 or more among the "
        "values of a window's sum or mean, which are exact sums of finite values below 2^63",
        where=Location(column=column),
        todo=f"replace those values in the archive (or drop the sum and mean of '{column}' from the job); "
        "nothing of the batch in progress was committed, and the next run resumes from the checkpoint",
        code="archive.unsummable",
    )


def failure(error: BaseException, columns: Iterable[str]) -> DataError | None:
    """``archive.unsummable`` for the first of ``columns`` whose marker ``error`` carries, else ``None``."""
    text = str(error)
    for column in columns:
        if marker(column) in text:
            return unsummable(column)
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


def _normalised(sums: list[Column]) -> tuple[Column, list[Column]]:
    """``sums`` (limbs' sums, most significant first) as a signed integer part and three digits in
    ``[0, 2^32)``, the same number: carries moved up with floor shifts."""
    from pyspark.sql import functions as F

    carry: Column | None = None
    digits: list[Column] = []
    for s in reversed(sums[1:]):
        t = s if carry is None else s + carry
        digits.insert(0, t.bitwiseAND(F.lit(_MASK)))
        carry = F.shiftright(t, _BITS)
    assert carry is not None
    return sums[0] + carry, digits


def _integer(digits: list[Column]) -> Column:
    """``digits`` (a signed long, then longs in ``[0, 2^32)``) as one exact decimal(38,0) integer."""
    from pyspark.sql import functions as F

    out = digits[0].cast(_DECIMAL)
    for digit in digits[1:]:
        out = (out * F.lit(1 << _BITS).cast(_DECIMAL) + digit.cast(_DECIMAL)).cast(_DECIMAL)
    return out


def total(sums: list[Column]) -> Column:
    """The double nearest to ``sums[0] + sums[1] 2^-32 + sums[2] 2^-64 + sums[3] 2^-96`` (exact
    integers, the limbs' sums), ties to even; 0.0 (never -0.0) for zero.

    The sum times 2^96 is an integer of up to 159 bits; a decimal(38,0) holds 126. Where it does
    not fit, the lowest digits are dropped and stand as a sticky bit (round to odd), keeping at
    least 94 significant bits: the conversion of the decimal to a double is then the one rounding
    (to nearest), and the scaling by a power of two after it is exact."""
    from pyspark.sql import functions as F

    whole, (d1, d2, d3) = _normalised(sums)

    def odd(digit: Column, *below: Column) -> Column:
        nonzero = below[0] != 0
        for b in below[1:]:
            nonzero = nonzero | (b != 0)
        return F.when(nonzero, digit.bitwiseOR(F.lit(1))).otherwise(digit)

    def within(bits: int) -> Column:
        return (whole >= F.lit(-(1 << bits))) & (whole < F.lit(1 << bits))

    exact = _integer([whole, d1, d2, d3]).cast("double") * F.lit(2.0**-96)
    odd64 = _integer([whole, d1, odd(d2, d3)]).cast("double") * F.lit(2.0**-64)
    odd32 = _integer([whole, odd(d1, d2, d3)]).cast("double") * F.lit(2.0**-32)
    # Without decimals where the sum is a double already: no limb below 2^-32 and an integer part
    # below 2^20, so ``a0 2^32 + a1`` is a long below 2^53 in magnitude, exact as a double, and the
    # scaling exact too (sums of values whose fractions end by 2^-32, as sixty-fourths do). Spark's
    # decimal arithmetic costs microseconds a window: on 1.1M windows, seconds.
    a0, a1, a2, a3 = sums
    fits = (a2 == 0) & (a3 == 0) & (a0 > F.lit(-(1 << 20))) & (a0 < F.lit(1 << 20))
    fits = fits & (a1 > F.lit(-(1 << 52))) & (a1 < F.lit(1 << 52))
    fast = (a0 * F.lit(1 << 32) + a1).cast("double") * F.lit(2.0**-32)
    return F.when(fits, fast).when(within(30), exact).when(within(62), odd64).otherwise(odd32)
