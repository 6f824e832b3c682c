"""Exact Kubernetes ``resource.Quantity`` (``k8s.io/apimachinery/pkg/api/resource``).

A quantity is held as an exact :class:`fractions.Fraction`, never a float. Parsing accepts
every form the API server accepts: binary SI suffixes (``Ki`` .. ``Ei``), decimal SI suffixes
(``n``, ``u``, ``m``, none, ``k``, ``M``, ``G``, ``T``, ``P``, ``E``) and decimal exponents
(``1e3``, ``5E-2``). As upstream, values finer than a nano unit are rounded up to the next
nano unit. :meth:`Quantity.canonical` renders the same canonical string the API server
writes back (``1024Mi`` -> ``1Gi``, ``1500m`` -> ``1500m``, ``0.5Gi`` -> ``512Mi``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Literal

from tessera.api.errors import TesseraError

Format = Literal["BinarySI", "DecimalSI", "DecimalExponent"]

_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DEC_SUFFIX_BY_EXP = {v: k for k, v in _DECIMAL.items()}
_BIN_SUFFIX_BY_EXP = {v: k for k, v in _BINARY.items()}

# <sign><digits>[.<digits>]<suffix>, suffix one of the SI forms or e/E<signed int>.
_QUANTITY_RE = re.compile(
    r"^(?P<sign>[+-])?(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_NANO = Fraction(1, 10**9)
# Upstream keeps int64 scaled values; anything past this is rejected as out of range.
_MAX = Fraction(2**63 - 1)
_MAX_EXPONENT = 2**31 - 1
# 2^63 < 10^19: a number with more integer digits than this is out of range before any suffix.
_MAX_INT_DIGITS = 20
# Decimal quantities past 2^63-1 (``beyond_int64``): upstream keeps them exactly (inf.Dec, no
# bound); Tessera computes with at most this many integer digits, so that a hostile exponent
# cannot make it build a huge integer.
_WIDE_INT_DIGITS = 64
# Fraction digits kept below the nano unit before rounding up (2^60 < 10^19, so a binary suffix
# cannot lift a digit past this position above 1n).
_GUARD_DIGITS = 9 + 19 + 2


def _shown(text: str) -> str:
    """``text`` for a message: quoted, cut to 40 characters."""
    return repr(text) if len(text) <= 40 else repr(text[:40]) + f"... ({len(text)} characters)"


def _exact_value(
    num: str, exp10: int, exp2: int, max_digits: int = _MAX_INT_DIGITS
) -> Fraction | None:
    """``num`` (digits with an optional '.') x 10^exp10 x 2^exp2, rounded up in magnitude to
    nano precision as upstream does; None when it has more than ``max_digits`` integer digits
    (certainly above 2^63-1 with the default). Works on the digit
    strings first, so neither a thousand-digit number nor an exponent of 10^9 costs more than a
    few 60-digit integers."""
    whole, _, frac = num.partition(".")
    digits = (whole + frac).lstrip("0")
    if not digits.strip("0"):
        return Fraction(0)
    # value = int(digits) x 10^scale, digits without leading zeros
    scale = exp10 - len(frac)
    top = len(digits) + scale  # decimal digits before the point
    if top > max_digits:
        return None
    keep = top + (_GUARD_DIGITS if exp2 else 9)
    sticky = False
    if keep < len(digits):
        rest = digits[max(keep, 0) :]
        digits = digits[: max(keep, 0)]
        sticky = rest.strip("0") != ""
        scale = -(_GUARD_DIGITS if exp2 else 9)
        if not digits:
            digits = "0"
    value = Fraction(int(digits)) * (Fraction(10) ** scale) * (2**exp2)
    if sticky:
        value += Fraction(1, 10 ** (_GUARD_DIGITS + 1))
    if (value / _NANO).denominator != 1:
        value = Fraction(math.ceil(value / _NANO)) * _NANO
    return value


class QuantityError(TesseraError, ValueError):
    """A string is not a valid Kubernetes quantity. The message says what was wrong."""


@dataclass(frozen=True, slots=True)
class Quantity:
    """An exact quantity: ``value`` in base units (bytes, cores, ...), ``format`` for output.

    Comparison and arithmetic use the exact value only; the format is kept so that
    :meth:`canonical` renders like upstream ``Quantity.String()``.
    """

    value: Fraction
    format: Format = "DecimalSI"

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str | int | Quantity, *, beyond_int64: bool = False) -> Quantity:
        """Parse ``text`` as upstream ``resource.ParseQuantity`` does.

        Accepts an int (taken as a plain decimal count) or an existing Quantity.
        Raises :class:`QuantityError` naming the text and the accepted forms.

        ``|value| <= 2^63-1`` unless ``beyond_int64``: then a decimal value (no suffix, a
        decimal SI suffix or an exponent) may be larger, as ``ParseQuantity`` keeps such values
        exactly and the API server stores them in DRA objects (ResourceSlice capacities and
        counters, capacity requests: the values of kubernetes PRs #140518 and #140702), up to
        10^64 here. A BinarySI value past 2^63-1 stays out of range (upstream caps it).
        """
        if isinstance(text, Quantity):
            return text
        if beyond_int64:
            if isinstance(text, int) and not isinstance(text, bool) and abs(text) > _MAX:
                return cls.parse(str(text), beyond_int64=True)
            if isinstance(text, str):
                return _parse_wide(text) if len(text) <= 64 else cls._parse_text(text, True)
        if isinstance(text, bool):
            raise QuantityError(f"{text!r} is not a quantity (a boolean)")
        if isinstance(text, int):
            if abs(text) > _MAX:
                raise QuantityError(
                    f"{_shown(str(text))} is out of range for a Kubernetes quantity (max 2^63-1)"
                )
            return cls(Fraction(text), "DecimalSI")
        if isinstance(text, float):
            # A JSON/YAML number: the API server parses its decimal text (1.5 -> 1500m).
            if not math.isfinite(text):
                raise QuantityError(
                    f"{text!r} is not a quantity: write a number such as '1.5' or '1500m'"
                )
            return cls.parse(repr(text).replace("e+", "e"), beyond_int64=beyond_int64)
        if not isinstance(text, str):
            raise QuantityError(
                f"{_shown(repr(text))} is not a quantity (expected a string such as '8Gi')"
            )
        if len(text) <= 64:  # the same few quantities come back thousands of times in a manifest
            return _parse_text(text)
        return cls._parse_text(text)

    @classmethod
    def _parse_text(cls, text: str, beyond_int64: bool = False) -> Quantity:
        s = text.strip()
        m = _QUANTITY_RE.match(s)
        if not m or s in ("", "+", "-"):
            raise QuantityError(
                f"{_shown(text)} is not a valid quantity: expected a number with an optional suffix "
                "(Ki, Mi, Gi, Ti, Pi, Ei, n, u, m, k, M, G, T, P, E) or exponent (e3), e.g. '8Gi'"
            )
        suffix = m.group("suffix") or ""
        fmt: Format
        exp10 = 0
        exp2 = 0
        if suffix in _BINARY:
            exp2, fmt = _BINARY[suffix], "BinarySI"
        elif suffix in _DECIMAL:
            exp10, fmt = _DECIMAL[suffix], "DecimalSI"
        else:
            # Upstream parses the exponent as a 32-bit integer ("unable to parse quantity's suffix").
            digits = suffix[1:].lstrip("+-").lstrip("0")
            if len(digits) > 10 or abs(int(suffix[1:])) > _MAX_EXPONENT:
                raise QuantityError(
                    f"{_shown(text)} has an exponent out of range (at most 2^31-1 in magnitude, "
                    "as Kubernetes parses it): write the value with a suffix such as 'Gi' or 'k'"
                )
            exp10, fmt = int(suffix[1:]), "DecimalExponent"
        wide = beyond_int64 and fmt != "BinarySI"
        value = _exact_value(
            m.group("num"), exp10, exp2, _WIDE_INT_DIGITS if wide else _MAX_INT_DIGITS
        )
        if value is None and wide:
            raise QuantityError(
                f"{_shown(text)} is out of range: Tessera computes with at most "
                f"{_WIDE_INT_DIGITS} digits before the decimal point"
            )
        if value is None:
            raise QuantityError(
                f"{_shown(text)} is out of range for a Kubernetes quantity (max 2^63-1)"
            )
        if m.group("sign") == "-":
            value = -value
        if abs(value) > _MAX and not wide:
            raise QuantityError(
                f"{_shown(text)} is out of range for a Kubernetes quantity (max 2^63-1)"
            )
        return cls(value, fmt)

    @classmethod
    def from_int(cls, n: int, fmt: Format = "DecimalSI") -> Quantity:
        """An integral quantity in base units, e.g. ``Quantity.from_int(2**30, "BinarySI")``."""
        return cls(Fraction(n), fmt)

    # ---- numeric views --------------------------------------------------------------------
    def value_int(self) -> int:
        """Upstream ``Value()``: the value rounded up to an integer (ceil)."""
        return math.ceil(self.value)

    def milli_value(self) -> int:
        """Upstream ``MilliValue()``: value x 1000, rounded up."""
        return math.ceil(self.value * 1000)

    def is_integer(self) -> bool:
        return self.value.denominator == 1

    def sign(self) -> int:
        return (self.value > 0) - (self.value < 0)

    # ---- arithmetic and ordering --------------------------------------------------------------
    def __add__(self, other: Quantity) -> Quantity:
        return Quantity(self.value + other.value, self.format)

    def __sub__(self, other: Quantity) -> Quantity:
        return Quantity(self.value - other.value, self.format)

    def __lt__(self, other: Quantity) -> bool:
        return self.value < other.value

    def __le__(self, other: Quantity) -> bool:
        return self.value <= other.value

    def __gt__(self, other: Quantity) -> bool:
        return self.value > other.value

    def __ge__(self, other: Quantity) -> bool:
        return self.value >= other.value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def cmp(self, other: Quantity) -> int:
        """Upstream ``Cmp``: -1, 0 or 1."""
        return (self.value > other.value) - (self.value < other.value)

    # ---- output ---------------------------------------------------------------------------------
    def canonical(self) -> str:
        """The canonical string upstream ``Quantity.String()`` gives for this value and format."""
        v = self.value
        fmt = self.format
        if fmt == "BinarySI" and (-1024 < v < 1024 or v.denominator != 1):
            fmt = "DecimalSI"
        if fmt == "BinarySI":
            n = int(v)
            exp = 0
            while exp < 60 and n != 0 and n % 1024 == 0:
                n //= 1024
                exp += 10
            return f"{n}{_BIN_SUFFIX_BY_EXP.get(exp, '')}"
        # Decimal forms: express as integer mantissa x 10^exp with exp a multiple of 3.
        if v == 0:
            return "0"
        exp = -9
        mant = v * 10**9
        assert mant.denominator == 1, "values are kept at nano precision"
        m = int(mant)
        while exp < 18 and m % 1000 == 0:
            m //= 1000
            exp += 3
        if fmt == "DecimalExponent":
            return f"{m}" if exp == 0 else f"{m}e{exp}"
        return f"{m}{_DEC_SUFFIX_BY_EXP[exp]}"

    def __str__(self) -> str:
        return self.canonical()

    def __repr__(self) -> str:
        return f"Quantity({self.canonical()!r})"


@lru_cache(maxsize=4096)
def _parse_text(text: str) -> Quantity:
    """:meth:`Quantity._parse_text`, remembered (a Quantity is immutable; errors are not cached)."""
    return Quantity._parse_text(text)


@lru_cache(maxsize=1024)
def _parse_wide(text: str) -> Quantity:
    """:meth:`Quantity._parse_text` with ``beyond_int64``, remembered."""
    return Quantity._parse_text(text, True)


def parse_quantity(text: str | int | Quantity) -> Quantity:
    """Shorthand for :meth:`Quantity.parse`."""
    return Quantity.parse(text)


ZERO = Quantity(Fraction(0))
