"""Evaluate an expression tree (:mod:`tessera.cel.syntax`) with cel-go's semantics and its runtime
cost tracking.

An expression is compiled once into nested Python closures ``f(vars, cost) -> value``. Errors
are :class:`~tessera.cel.values.CelError` exceptions; ``&&``, ``||`` and the quantifier macros
absorb them as CEL does (``error && false`` is ``false``). The runtime cost follows
``cel-go/interpreter/runtimecost.go`` with Kubernetes' ``library.CostEstimator.CallCost``
first: 1 per identifier, selection and index, nothing for constants, logical operators and
presence tests (Kubernetes sets ``PresenceTestHasCost(false)``), 10 per list and 30 per map
literal that is not constant, and per call the function's cost (string functions by length,
``in`` by list size, ...). Past the limit evaluation stops with cel-go's
``operation cancelled: actual cost limit exceeded``. Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any

from tessera.api.quantity import Quantity, QuantityError
from tessera.cel.syntax import (
    INT64_MAX,
    INT64_MIN,
    Call,
    Comprehension,
    Const,
    Expr,
    Ident,
    ListLit,
    MapLit,
    Select,
    UInt,
)
from tessera.cel.values import (
    NONE,
    CelError,
    CostLimitExceeded,
    OptionalValue,
    QuantityValue,
    SemverValue,
    TypeValue,
)

Fn = Callable[[dict[str, Any], "CostState"], Any]

STRING_FACTOR = 0.1  # cel-go common.StringTraversalCostFactor
REGEX_FACTOR = 0.25  # cel-go common.RegexStringLengthCostFactor
LIST_CREATE = 10
MAP_CREATE = 30
UINT64_MAX = 2**64 - 1
COST_LIMIT_MESSAGE = "operation cancelled: actual cost limit exceeded"


class CostState:
    """Running cost of one evaluation and its limit (None: unlimited)."""

    __slots__ = ("cost", "limit")

    def __init__(self, limit: int | None) -> None:
        self.cost = 0
        self.limit = limit if limit is not None else UINT64_MAX

    def add(self, n: int) -> None:
        self.cost += n
        if self.cost > self.limit:
            raise CostLimitExceeded(COST_LIMIT_MESSAGE)


class DomainMap(dict[Any, Any]):
    """``device.attributes`` / ``device.capacity``: an unknown domain reads as an empty map
    (upstream's ``newStringInterfaceMapWithDefault``)."""

    def __missing__(self, key: Any) -> Any:
        return {}


# ---------------------------------------------------------------------------------------------
# Types of values.


def type_name(v: Any) -> str:
    """CEL's name for the type of ``v``."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, UInt):
        return "uint"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "double"
    if isinstance(v, str):
        return "string"
    if isinstance(v, bytes):
        return "bytes"
    if v is None:
        return "null_type"
    if isinstance(v, list):
        return "list"
    if isinstance(v, dict):
        return "map"
    if isinstance(v, QuantityValue):
        return "kubernetes.Quantity"
    if isinstance(v, SemverValue):
        return "kubernetes.Semver"
    if isinstance(v, OptionalValue):
        return "optional_type"
    if isinstance(v, TypeValue):
        return "type"
    return type(v).__name__


TYPE_NAMES = {
    "int": "int",
    "uint": "uint",
    "double": "double",
    "bool": "bool",
    "string": "string",
    "bytes": "bytes",
    "list": "list",
    "map": "map",
    "null_type": "null_type",
    "type": "type",
}


def _no_overload(fn: str, *args: Any) -> CelError:
    return CelError(
        f"no matching overload for '{fn}' applied to '({', '.join(type_name(a) for a in args)})'"
    )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and not isinstance(v, UInt)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _check_int(n: int) -> int:
    if not INT64_MIN <= n <= INT64_MAX:
        raise CelError("integer overflow")
    return n


def _check_uint(n: int) -> UInt:
    if not 0 <= n <= UINT64_MAX:
        raise CelError("unsigned integer overflow")
    return UInt(n)


def size_of(v: Any) -> int:
    """cel-go's ``actualSize``: the size of strings (code points), bytes, lists and maps; 1 else."""
    if isinstance(v, str | bytes | list | dict):
        return len(v)
    if isinstance(v, OptionalValue) and v.has:
        return size_of(v.value)
    return 1


# ---------------------------------------------------------------------------------------------
# Equality and ordering (heterogeneous numeric equality, cross-type numeric comparisons).


def _num_cmp(a: Any, b: Any) -> int:
    if isinstance(a, float) or isinstance(b, float):
        if (isinstance(a, float) and math.isnan(a)) or (isinstance(b, float) and math.isnan(b)):
            raise _Unordered
        fa = Fraction(a) if not isinstance(a, float) else Fraction(a) if math.isfinite(a) else a
        fb = Fraction(b) if not isinstance(b, float) else Fraction(b) if math.isfinite(b) else b
        return (fa > fb) - (fa < fb)
    return (a > b) - (a < b)


class _Unordered(Exception):
    pass


def cel_equal(a: Any, b: Any) -> bool:
    """CEL ``==`` (heterogeneous: different types are unequal, numbers compare by value)."""
    if _is_num(a) and _is_num(b):
        try:
            return _num_cmp(a, b) == 0
        except _Unordered:
            return False
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if type(a) is not type(b):
        if (isinstance(a, dict) and isinstance(b, dict)) or (
            isinstance(a, list) and isinstance(b, list)
        ):
            pass
        else:
            return False
    if isinstance(a, list):
        return len(a) == len(b) and all(cel_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        if len(a) != len(b):
            return False
        for k, v in a.items():
            found, w = _map_find(b, k)
            if not found or not cel_equal(v, w):
                return False
        return True
    return bool(a == b)


def _compare(fn: str, a: Any, b: Any) -> int:
    if _is_num(a) and _is_num(b):
        try:
            return _num_cmp(a, b)
        except _Unordered:
            raise _Unordered from None
    if type(a) is type(b) and isinstance(a, str | bytes | bool):
        return (a > b) - (a < b)
    raise _no_overload(fn, a, b)


def _map_find(m: dict[Any, Any], key: Any) -> tuple[bool, Any]:
    """Map lookup with CEL's numeric key equivalence (1 == 1u == 1.0)."""
    if isinstance(key, bool):
        for k, v in m.items():
            if isinstance(k, bool) and k == key:
                return True, v
        return False, None
    if _is_num(key):
        if isinstance(key, float):
            if not key.is_integer():
                return False, None
            key = int(key)
        for k, v in m.items():
            if _is_num(k) and not isinstance(k, bool) and int(k) == key:
                return True, v
        return False, None
    if key in m:
        return True, m[key]
    if isinstance(m, DomainMap) and isinstance(key, str):
        return True, {}
    return False, None


def _key_str(k: Any) -> str:
    return str(k).lower() if isinstance(k, bool) else str(k)


# ---------------------------------------------------------------------------------------------
# Operators.


def _add(a: Any, b: Any) -> Any:
    if _is_int(a) and _is_int(b):
        return _check_int(a + b)
    if isinstance(a, UInt) and isinstance(b, UInt):
        return _check_uint(a + b)
    if isinstance(a, float) and isinstance(b, float):
        return a + b
    if isinstance(a, str) and isinstance(b, str):
        return a + b
    if isinstance(a, bytes) and isinstance(b, bytes):
        return a + b
    if isinstance(a, list) and isinstance(b, list):
        return a + b
    raise _no_overload("_+_", a, b)


def _sub(a: Any, b: Any) -> Any:
    if _is_int(a) and _is_int(b):
        return _check_int(a - b)
    if isinstance(a, UInt) and isinstance(b, UInt):
        return _check_uint(a - b)
    if isinstance(a, float) and isinstance(b, float):
        return a - b
    raise _no_overload("_-_", a, b)


def _mul(a: Any, b: Any) -> Any:
    if _is_int(a) and _is_int(b):
        return _check_int(a * b)
    if isinstance(a, UInt) and isinstance(b, UInt):
        return _check_uint(a * b)
    if isinstance(a, float) and isinstance(b, float):
        return a * b
    raise _no_overload("_*_", a, b)


def _div(a: Any, b: Any) -> Any:
    if (_is_int(a) and _is_int(b)) or (isinstance(a, UInt) and isinstance(b, UInt)):
        if b == 0:
            raise CelError("division by zero")
        q = abs(a) // abs(b)
        q = q if (a >= 0) == (b >= 0) else -q
        return _check_int(q) if _is_int(a) else UInt(q)
    if isinstance(a, float) and isinstance(b, float):
        if b == 0:
            return math.copysign(math.inf, a) * math.copysign(1, b) if a != 0 else math.nan
        return a / b
    raise _no_overload("_/_", a, b)


def _mod(a: Any, b: Any) -> Any:
    if (_is_int(a) and _is_int(b)) or (isinstance(a, UInt) and isinstance(b, UInt)):
        if b == 0:
            raise CelError("modulus by zero")
        r = abs(a) % abs(b)
        r = r if a >= 0 else -r
        return r if _is_int(a) else UInt(r)
    raise _no_overload("_%_", a, b)


def _neg(a: Any) -> Any:
    if _is_int(a):
        return _check_int(-a)
    if isinstance(a, float):
        return -a
    raise _no_overload("-_", a)


def _not(a: Any) -> Any:
    if isinstance(a, bool):
        return not a
    raise _no_overload("!_", a)


def _in(x: Any, c: Any) -> bool:
    if isinstance(c, list):
        return any(cel_equal(x, v) for v in c)
    if isinstance(c, dict):
        return _map_find(c, x)[0] and not (isinstance(c, DomainMap) and x not in c)
    raise _no_overload("@in", x, c)


def _index(c: Any, k: Any) -> Any:
    if isinstance(c, OptionalValue):
        if not c.has:
            return NONE
        return OptionalValue(True, _index(c.value, k))
    if isinstance(c, list):
        if isinstance(k, float):
            if not k.is_integer():
                raise CelError(f"unsupported index value {k}")
            k = int(k)
        if not _is_num(k):
            raise _no_overload("_[_]", c, k)
        i = int(k)
        if not 0 <= i < len(c):
            raise CelError(f"index out of bounds: {i}")
        return c[i]
    if isinstance(c, dict):
        found, v = _map_find(c, k)
        if not found:
            raise CelError(f"no such key: {_key_str(k)}")
        return v
    raise _no_overload("_[_]", c, k)


def _opt_index(c: Any, k: Any) -> OptionalValue:
    if isinstance(c, OptionalValue):
        if not c.has:
            return NONE
        c = c.value
    if isinstance(c, list):
        if not _is_num(k):
            raise _no_overload("_[?_]", c, k)
        i = int(k)
        return OptionalValue(True, c[i]) if 0 <= i < len(c) else NONE
    if isinstance(c, dict):
        found, v = _map_find(c, k)
        return OptionalValue(True, v) if found else NONE
    raise _no_overload("_[?_]", c, k)


def _select(v: Any, field: str) -> Any:
    if isinstance(v, OptionalValue):
        if not v.has:
            return NONE
        return OptionalValue(True, _select(v.value, field))
    if isinstance(v, dict):
        if field in v:
            return v[field]
        if isinstance(v, DomainMap):
            return {}
        raise CelError(f"no such key: {field}")
    raise CelError(f"type '{type_name(v)}' does not support field selection")


def _has(v: Any, field: str) -> bool:
    if isinstance(v, OptionalValue):
        if not v.has:
            return False
        v = v.value
    if isinstance(v, dict):
        return field in v or isinstance(v, DomainMap)
    raise CelError(f"invalid type for field selection: '{type_name(v)}'")


# ---------------------------------------------------------------------------------------------
# Function library: name -> (implementation, runtime cost or None for 1).

CostFn = Callable[[list[Any], Any], int]


def _ceil(x: float) -> int:
    return math.ceil(x)


def _str_scan(i: int) -> CostFn:
    return lambda args, _r: _ceil(size_of(args[i]) * STRING_FACTOR)


def _traversal(v: Any) -> int:
    """Kubernetes ``traversalCost``."""
    if isinstance(v, str | bytes):
        return int(len(v) * STRING_FACTOR)
    if isinstance(v, list):
        return sum(_traversal(x) for x in v)
    if isinstance(v, dict):
        return sum(_traversal(k) + _traversal(x) for k, x in v.items())
    return 1


def _s(v: Any, fn: str) -> str:
    if not isinstance(v, str):
        raise _no_overload(fn, v)
    return v


def _i(v: Any, fn: str) -> int:
    if not _is_int(v):
        raise _no_overload(fn, v)
    return int(v)


def _lst(v: Any, fn: str) -> list[Any]:
    if not isinstance(v, list):
        raise _no_overload(fn, v)
    return v


def _q(v: Any, fn: str) -> Quantity:
    if not isinstance(v, QuantityValue):
        raise _no_overload(fn, v)
    return v.q


# --- standard library ---


def _size(v: Any) -> int:
    if isinstance(v, str | bytes | list | dict):
        return len(v)
    raise _no_overload("size", v)


def _contains(s: Any, sub: Any) -> bool:
    return _s(sub, "contains") in _s(s, "contains")


def _matches(s: Any, pattern: Any) -> bool:
    try:
        rx = _regex(_s(pattern, "matches"))
    except re.error as e:
        raise CelError(f"invalid regular expression: {e}") from None
    return rx.search(_s(s, "matches")) is not None


_RX_CACHE: dict[str, re.Pattern[str]] = {}


def _regex(p: str) -> re.Pattern[str]:
    rx = _RX_CACHE.get(p)
    if rx is None:
        rx = re.compile(p)
        if len(_RX_CACHE) < 256:
            _RX_CACHE[p] = rx
    return rx


def _to_int(v: Any) -> int:
    if isinstance(v, bool):
        raise _no_overload("int", v)
    if isinstance(v, int):
        return _check_int(int(v))
    if isinstance(v, float):
        if math.isnan(v) or not (-(2.0**63) <= v < 2.0**63):
            raise CelError("integer overflow")
        return int(v)
    if isinstance(v, str):
        try:
            return _check_int(int(v, 10))
        except ValueError:
            raise CelError(f"cannot convert '{v}' to int") from None
    raise _no_overload("int", v)


def _to_uint(v: Any) -> UInt:
    if isinstance(v, bool):
        raise _no_overload("uint", v)
    if isinstance(v, int):
        return _check_uint(int(v))
    if isinstance(v, float):
        if math.isnan(v) or not (0 <= v < 2.0**64):
            raise CelError("unsigned integer overflow")
        return UInt(int(v))
    if isinstance(v, str):
        try:
            return _check_uint(int(v, 10))
        except ValueError:
            raise CelError(f"cannot convert '{v}' to uint") from None
    raise _no_overload("uint", v)


def _to_double(v: Any) -> float:
    if isinstance(v, bool):
        raise _no_overload("double", v)
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            raise CelError(f"cannot convert '{v}' to double") from None
    raise _no_overload("double", v)


def _fmt_double(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    r = repr(v)
    if "e" in r:
        mant, exp = r.split("e")
        sign = "-" if exp.startswith("-") else "+"
        exp = exp.lstrip("+-").rjust(2, "0")
        return f"{mant}e{sign}{exp}"
    return r[:-2] if r.endswith(".0") else r


def _to_string(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(int(v))
    if isinstance(v, float):
        return _fmt_double(v)
    if isinstance(v, str):
        return v
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise CelError("invalid UTF-8 in bytes, cannot convert to string") from None
    raise _no_overload("string", v)


def _to_bytes(v: Any) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    raise _no_overload("bytes", v)


def _to_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        if v in ("true", "True", "TRUE", "t", "1"):
            return True
        if v in ("false", "False", "FALSE", "f", "0"):
            return False
        raise CelError(f"type conversion error from 'string' to 'bool': {v}")
    raise _no_overload("bool", v)


# --- strings extension (cel-go ext.Strings v2) ---


def _char_at(s: Any, i: Any) -> str:
    s, i = _s(s, "charAt"), _i(i, "charAt")
    if not 0 <= i <= len(s):
        raise CelError(f"index out of range: {i}")
    return s[i : i + 1]


def _index_of(s: Any, sub: Any, off: Any = 0) -> int:
    if isinstance(s, list):
        return _list_index_of(s, sub)
    s, sub, off = _s(s, "indexOf"), _s(sub, "indexOf"), _i(off, "indexOf")
    if not 0 <= off <= len(s):
        raise CelError(f"index out of range: {off}")
    return s.find(sub, off)


def _last_index_of(s: Any, sub: Any, off: Any = None) -> int:
    if isinstance(s, list):
        return _list_last_index_of(s, sub)
    s, sub = _s(s, "lastIndexOf"), _s(sub, "lastIndexOf")
    if off is None:
        return s.rfind(sub)
    off = _i(off, "lastIndexOf")
    if not 0 <= off < max(len(s), 1):
        raise CelError(f"index out of range: {off}")
    return s.rfind(sub, 0, off + len(sub))


def _lower_ascii(s: Any) -> str:
    return "".join(c.lower() if c.isascii() else c for c in _s(s, "lowerAscii"))


def _upper_ascii(s: Any) -> str:
    return "".join(c.upper() if c.isascii() else c for c in _s(s, "upperAscii"))


def _replace(s: Any, old: Any, new: Any, n: Any = -1) -> str:
    s, old, new, n = _s(s, "replace"), _s(old, "replace"), _s(new, "replace"), _i(n, "replace")
    return s.replace(old, new, n if n >= 0 else -1)


def _split(s: Any, sep: Any, n: Any = -1) -> list[str]:
    s, sep, n = _s(s, "split"), _s(sep, "split"), _i(n, "split")
    if n == 0:
        return []
    if sep == "":
        chars = list(s)
        if n > 0 and len(chars) > n:
            return [*chars[: n - 1], "".join(chars[n - 1 :])]
        return chars
    return s.split(sep, n - 1 if n > 0 else -1)


def _substring(s: Any, start: Any, end: Any = None) -> str:
    s, start = _s(s, "substring"), _i(start, "substring")
    e = len(s) if end is None else _i(end, "substring")
    if not 0 <= start <= len(s):
        raise CelError(f"index out of range: {start}")
    if not start <= e <= len(s):
        raise CelError(f"index out of range: {e}")
    return s[start:e]


_WS = (
    " \t\n\v\f\r\u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


def _trim(s: Any) -> str:
    return _s(s, "trim").strip(_WS)


def _join(lst: Any, sep: Any = "") -> str:
    items = _lst(lst, "join")
    if not all(isinstance(x, str) for x in items):
        raise _no_overload("join", lst)
    return _s(sep, "join").join(items)


def _quote(s: Any) -> str:
    s = _s(s, "strings.quote")
    out = ['"']
    for c in s:
        out.append(
            {
                "\a": "\\a",
                "\b": "\\b",
                "\f": "\\f",
                "\n": "\\n",
                "\r": "\\r",
                "\t": "\\t",
                "\v": "\\v",
                "\\": "\\\\",
                '"': '\\"',
            }.get(c, c)
        )
    out.append('"')
    return "".join(out)


def _format(fmt: Any, args: Any) -> str:
    fmt, args = _s(fmt, "format"), _lst(args, "format")
    out: list[str] = []
    i = ai = 0
    while i < len(fmt):
        c = fmt[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        i += 1
        if i < len(fmt) and fmt[i] == "%":
            out.append("%")
            i += 1
            continue
        m = re.match(r"(\.\d+)?([sdfeboxX])", fmt[i:])
        if not m:
            raise CelError(
                f'could not parse formatting clause: unrecognized formatting clause "{fmt[i : i + 1]}"'
            )
        if ai >= len(args):
            raise CelError(f"index {ai} out of range")
        v = args[ai]
        ai += 1
        prec = int(m.group(1)[1:]) if m.group(1) else None
        verb = m.group(2)
        out.append(_format_one(verb, prec, v))
        i += m.end()
    return "".join(out)


def _format_one(verb: str, prec: int | None, v: Any) -> str:
    if verb == "s":
        if isinstance(v, list):
            return "[" + ", ".join(_format_one("s", None, x) for x in v) + "]"
        if isinstance(v, float):
            return _fmt_double(v)
        if isinstance(v, str):
            return v
        if isinstance(v, bool | int | bytes):
            return _to_string(v)
        if v is None:
            return "null"
        if isinstance(v, TypeValue):
            return v.name
        raise CelError(
            "string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists, types, "
            f"durations, and timestamps, was given {type_name(v)}"
        )
    if verb == "d":
        if isinstance(v, int) and not isinstance(v, bool):
            return str(int(v))
        if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            return _fmt_double(v)
        raise CelError(f"decimal clause can only be used on integers, was given {type_name(v)}")
    if verb in "fe":
        if not _is_num(v):
            raise CelError(
                f"{'fixed-point' if verb == 'f' else 'scientific'} clause can only be used on doubles, was "
                f"given {type_name(v)}"
            )
        p = 6 if prec is None else prec
        fv = float(v)
        if math.isnan(fv) or math.isinf(fv):
            return _fmt_double(fv)
        return f"{fv:.{p}{verb}}"
    if verb in "boxX":
        if isinstance(v, bool):
            v = int(v)
        if isinstance(v, int):
            return format(int(v), {"b": "b", "o": "o", "x": "x", "X": "X"}[verb])
        if verb in "xX" and isinstance(v, str | bytes):
            b = v.encode() if isinstance(v, str) else v
            h = b.hex()
            return h.upper() if verb == "X" else h
        raise CelError(f"{verb} clause can only be used on integers, was given {type_name(v)}")
    raise CelError(f"unrecognized formatting clause {verb}")


# --- lists extension (cel-go ext.Lists v3) and Kubernetes lists library ---


def _slice(lst: Any, start: Any, end: Any) -> list[Any]:
    lst, start, end = _lst(lst, "slice"), _i(start, "slice"), _i(end, "slice")
    if start < 0 or end < 0:
        raise CelError(f"cannot slice({start}, {end}), negative indexes not supported")
    if start > end:
        raise CelError(
            f"cannot slice({start}, {end}), start index must be less than or equal to end index"
        )
    if end > len(lst):
        raise CelError(f"cannot slice({start}, {end}), list is length {len(lst)}")
    return lst[start:end]


def _flatten(lst: Any, depth: Any = 1) -> list[Any]:
    lst, depth = _lst(lst, "flatten"), _i(depth, "flatten")
    if depth < 0:
        raise CelError("level must be non-negative")

    def go(xs: list[Any], d: int) -> list[Any]:
        out: list[Any] = []
        for x in xs:
            if isinstance(x, list) and d > 0:
                out.extend(go(x, d - 1))
            else:
                out.append(x)
        return out

    return go(lst, depth)


def _range(n: Any) -> list[int]:
    return list(range(_i(n, "lists.range")))


def _sort_key_check(lst: list[Any], fn: str) -> None:
    if not lst:
        return
    t = type_name(lst[0])
    if t not in ("int", "uint", "double", "string", "bytes", "bool") or any(
        type_name(x) != t for x in lst
    ):
        raise CelError(f"list elements must have the same type: {fn}")


def _sort(lst: Any) -> list[Any]:
    lst = _lst(lst, "sort")
    _sort_key_check(lst, "sort")
    return sorted(lst)


def _sort_by_keys(lst: Any, keys: Any) -> list[Any]:
    lst, keys = _lst(lst, "sortBy"), _lst(keys, "sortBy")
    _sort_key_check(keys, "sortBy")
    order = sorted(range(len(lst)), key=lambda i: keys[i])
    return [lst[i] for i in order]


def _distinct(lst: Any) -> list[Any]:
    out: list[Any] = []
    for x in _lst(lst, "distinct"):
        if not any(cel_equal(x, y) for y in out):
            out.append(x)
    return out


def _reverse(v: Any) -> Any:
    return list(reversed(_lst(v, "reverse")))


def _is_sorted(lst: Any) -> bool:
    lst = _lst(lst, "isSorted")
    return all(_compare("isSorted", lst[i], lst[i + 1]) <= 0 for i in range(len(lst) - 1))


def _sum(lst: Any) -> Any:
    lst = _lst(lst, "sum")
    if not lst:
        return 0
    total = lst[0]
    for x in lst[1:]:
        total = _add(total, x)
    return total


def _min(lst: Any) -> Any:
    lst = _lst(lst, "min")
    if not lst:
        raise CelError("min(list) called on empty list")
    best = lst[0]
    for x in lst[1:]:
        if _compare("min", x, best) < 0:
            best = x
    return best


def _max(lst: Any) -> Any:
    lst = _lst(lst, "max")
    if not lst:
        raise CelError("max(list) called on empty list")
    best = lst[0]
    for x in lst[1:]:
        if _compare("max", x, best) > 0:
            best = x
    return best


def _list_index_of(lst: list[Any], x: Any) -> int:
    for i, v in enumerate(lst):
        if cel_equal(v, x):
            return i
    return -1


def _list_last_index_of(lst: list[Any], x: Any) -> int:
    for i in range(len(lst) - 1, -1, -1):
        if cel_equal(lst[i], x):
            return i
    return -1


def _includes(container: Any, x: Any) -> bool:
    if isinstance(container, list):
        if len(container) > 48:
            raise CelError("includes() on a list of more than 48 values")
        return any(cel_equal(v, x) for v in container)
    return cel_equal(container, x)


# --- sets extension ---


def _sets_contains(a: Any, b: Any) -> bool:
    a, b = _lst(a, "sets.contains"), _lst(b, "sets.contains")
    return all(any(cel_equal(x, y) for y in a) for x in b)


def _sets_equivalent(a: Any, b: Any) -> bool:
    return _sets_contains(a, b) and _sets_contains(b, a)


def _sets_intersects(a: Any, b: Any) -> bool:
    a, b = _lst(a, "sets.intersects"), _lst(b, "sets.intersects")
    return any(any(cel_equal(x, y) for y in a) for x in b)


# --- Kubernetes regex library ---


def _find(s: Any, pattern: Any) -> str:
    try:
        m = _regex(_s(pattern, "find")).search(_s(s, "find"))
    except re.error as e:
        raise CelError(f"invalid regular expression: {e}") from None
    return m.group(0) if m else ""


def _find_all(s: Any, pattern: Any, n: Any = -1) -> list[str]:
    n = _i(n, "findAll")
    try:
        rx = _regex(_s(pattern, "findAll"))
    except re.error as e:
        raise CelError(f"invalid regular expression: {e}") from None
    out = [m.group(0) for m in rx.finditer(_s(s, "findAll"))]
    return out if n < 0 else out[:n]


# --- Kubernetes quantity and semver libraries ---


def _quantity(s: Any) -> QuantityValue:
    try:
        return QuantityValue(Quantity.parse(_s(s, "quantity")))
    except QuantityError as e:
        raise CelError(str(e)) from None


def _is_quantity(s: Any) -> bool:
    try:
        Quantity.parse(_s(s, "isQuantity"))
        return True
    except QuantityError:
        return False


def _semver(s: Any, normalize: Any = False) -> SemverValue:
    try:
        return SemverValue.parse(_s(s, "semver"), normalize is True)
    except ValueError as e:
        raise CelError(str(e)) from None


def _is_semver(s: Any, normalize: Any = False) -> bool:
    try:
        SemverValue.parse(_s(s, "isSemver"), normalize is True)
        return True
    except ValueError:
        return False


def _cmp(fn: str) -> Callable[[Any, Any], int]:
    def f(a: Any, b: Any) -> int:
        if isinstance(a, QuantityValue) and isinstance(b, QuantityValue):
            return a.q.cmp(b.q)
        if isinstance(a, SemverValue) and isinstance(b, SemverValue):
            return a.cmp(b)
        raise _no_overload(fn, a, b)

    return f


def _to_q(x: Any, fn: str) -> Quantity:
    if isinstance(x, QuantityValue):
        return x.q
    if _is_int(x):
        return Quantity(Fraction(int(x)))
    raise _no_overload(fn, x)


def _as_integer(x: Any) -> int:
    q = _q(x, "asInteger")
    if not q.is_integer() or abs(q.value) >= 2**63:
        raise CelError("cannot convert value to integer")
    return int(q.value)


def _as_float(x: Any) -> float:
    return float(
        Decimal(_q(x, "asApproximateFloat").value.numerator)
        / Decimal(_q(x, "asApproximateFloat").value.denominator)
    )


def _semver_part(part: str) -> Callable[[Any], int]:
    def f(x: Any) -> int:
        if not isinstance(x, SemverValue):
            raise _no_overload(part, x)
        return int(getattr(x, part))

    return f


# --- optional types ---


def _opt_of(v: Any) -> OptionalValue:
    return OptionalValue(True, v)


def _opt_none() -> OptionalValue:
    return NONE


def _is_zero(v: Any) -> bool:
    if v is None or v is False:
        return True
    if isinstance(v, int | float) and not isinstance(v, bool):
        return v == 0
    if isinstance(v, str | bytes | list | dict):
        return len(v) == 0
    return False


def _opt_of_non_zero(v: Any) -> OptionalValue:
    return NONE if _is_zero(v) else OptionalValue(True, v)


def _o(v: Any, fn: str) -> OptionalValue:
    if not isinstance(v, OptionalValue):
        raise _no_overload(fn, v)
    return v


def _has_value(v: Any) -> bool:
    return _o(v, "hasValue").has


def _value(v: Any) -> Any:
    o = _o(v, "value")
    if not o.has:
        raise CelError("optional.none() dereference")
    return o.value


def _or(a: Any, b: Any) -> Any:
    return a if _o(a, "or").has else _o(b, "or")


def _or_value(a: Any, b: Any) -> Any:
    o = _o(a, "orValue")
    return o.value if o.has else b


# --- type values ---


def _type_of(v: Any) -> TypeValue:
    return TypeValue(type_name(v))


def _map_insert(m: Any, k: Any, v: Any = None) -> dict[Any, Any]:
    if not isinstance(m, dict):
        raise _no_overload("cel.@mapInsert", m)
    if v is None and isinstance(k, dict):
        out = dict(m)
        for kk, vv in k.items():
            if _map_find(out, kk)[0]:
                raise CelError(f"insert failed: key {kk} already exists")
            out[kk] = vv
        return out
    if _map_find(m, k)[0]:
        raise CelError(f"insert failed: key {k} already exists")
    out = dict(m)
    out[k] = v
    return out


def _list_self_compare_cost(lst: Any) -> int:
    sz = size_of(lst)
    factor = 2.0
    if sz and isinstance(lst, list) and isinstance(lst[0], str | bytes):
        factor += STRING_FACTOR
    return _ceil(sz * sz * factor) + 1 + LIST_CREATE


def _alloc_list_cost(factor: float, size: int) -> int:
    return _ceil(size * factor) + 1 + LIST_CREATE


def _cmp_cost(args: list[Any], _r: Any) -> int:
    return _ceil(min(size_of(args[0]), size_of(args[1])) * STRING_FACTOR)


def _eq_cost(args: list[Any], r: Any) -> int:
    if isinstance(args[0], QuantityValue | SemverValue):
        return 1
    return _cmp_cost(args, r)


def _str_cmp_cost(args: list[Any], r: Any) -> int:
    if isinstance(args[0], str | bytes) and isinstance(args[1], str | bytes):
        return _cmp_cost(args, r)
    return 1


def _in_cost(args: list[Any], _r: Any) -> int:
    return size_of(args[1]) if isinstance(args[1], list) else 1


def _add_cost(args: list[Any], _r: Any) -> int:
    if isinstance(args[0], str | bytes) and isinstance(args[1], str | bytes):
        return _ceil((size_of(args[0]) + size_of(args[1])) * STRING_FACTOR)
    return 1


def _regex_cost(args: list[Any], _r: Any) -> int:
    return _ceil((1 + size_of(args[0])) * STRING_FACTOR) * _ceil(size_of(args[1]) * REGEX_FACTOR)


def _contains_cost(args: list[Any], _r: Any) -> int:
    return _ceil(size_of(args[0]) * STRING_FACTOR) * _ceil(size_of(args[1]) * STRING_FACTOR)


def _flatten_cost(args: list[Any], _r: Any) -> int:
    depth = int(args[1]) if len(args) == 2 and _is_int(args[1]) else 1
    return _alloc_list_cost(float(depth), size_of(args[0]))


_ONE: CostFn = lambda _a, _r: 1  # noqa: E731


# name -> (implementation, runtime cost). Member functions receive their target first.
FUNCTIONS: dict[str, tuple[Callable[..., Any], CostFn]] = {
    # operators
    "_+_": (_add, _add_cost),
    "_-_": (_sub, _ONE),
    "_*_": (_mul, _ONE),
    "_/_": (_div, _ONE),
    "_%_": (_mod, _ONE),
    "-_": (_neg, _ONE),
    "!_": (_not, _ONE),
    "@in": (_in, _in_cost),
    "cel.@mapInsert": (_map_insert, _ONE),
    "@sortByAssociatedKeys": (_sort_by_keys, lambda a, _r: _list_self_compare_cost(a[1])),
    # standard library
    "size": (_size, _ONE),
    "contains": (_contains, _contains_cost),
    "startsWith": (
        lambda s, p: _s(s, "startsWith").startswith(_s(p, "startsWith")),
        lambda a, _r: _ceil(size_of(a[1]) * STRING_FACTOR),
    ),
    "endsWith": (
        lambda s, p: _s(s, "endsWith").endswith(_s(p, "endsWith")),
        lambda a, _r: _ceil(size_of(a[1]) * STRING_FACTOR),
    ),
    "matches": (_matches, _regex_cost),
    "int": (_to_int, _ONE),
    "uint": (_to_uint, _ONE),
    "double": (_to_double, _ONE),
    "string": (
        _to_string,
        lambda a, _r: _ceil(size_of(a[0]) * STRING_FACTOR) if isinstance(a[0], bytes) else 1,
    ),
    "bytes": (
        _to_bytes,
        lambda a, _r: _ceil(size_of(a[0]) * STRING_FACTOR) if isinstance(a[0], str) else 1,
    ),
    "bool": (_to_bool, _ONE),
    "type": (_type_of, _ONE),
    "dyn": (lambda v: v, _ONE),
    # strings extension v2
    "charAt": (_char_at, _ONE),
    "indexOf": (_index_of, lambda a, _r: _traversal(a[0])),
    "lastIndexOf": (_last_index_of, lambda a, _r: _traversal(a[0])),
    "lowerAscii": (_lower_ascii, _str_scan(0)),
    "upperAscii": (_upper_ascii, _str_scan(0)),
    "replace": (_replace, lambda a, _r: _ceil(size_of(a[0]) * 2 * STRING_FACTOR)),
    "split": (_split, lambda a, _r: _ceil(size_of(a[0]) * 2 * STRING_FACTOR)),
    "substring": (_substring, _str_scan(0)),
    "trim": (_trim, _str_scan(0)),
    "join": (_join, lambda _a, r: _ceil(size_of(r) * 2 * STRING_FACTOR)),
    "strings.quote": (_quote, _str_scan(0)),
    "format": (_format, _str_scan(0)),
    # lists extension v3
    "slice": (_slice, lambda _a, r: _alloc_list_cost(1, size_of(r))),
    "flatten": (_flatten, _flatten_cost),
    "lists.range": (_range, lambda _a, r: _alloc_list_cost(1, size_of(r))),
    "reverse": (_reverse, lambda _a, r: _alloc_list_cost(1, size_of(r))),
    "sort": (_sort, lambda a, _r: _list_self_compare_cost(a[0])),
    "distinct": (_distinct, lambda a, _r: _list_self_compare_cost(a[0])),
    # Kubernetes lists library
    "isSorted": (_is_sorted, lambda a, _r: _traversal(a[0])),
    "sum": (_sum, lambda a, _r: _traversal(a[0])),
    "min": (_min, lambda a, _r: _traversal(a[0])),
    "max": (_max, lambda a, _r: _traversal(a[0])),
    "includes": (_includes, lambda a, _r: _traversal(a[0])),
    # sets extension
    "sets.contains": (_sets_contains, _ONE),
    "sets.equivalent": (_sets_equivalent, _ONE),
    "sets.intersects": (_sets_intersects, _ONE),
    # Kubernetes regex library
    "find": (_find, _regex_cost),
    "findAll": (_find_all, _regex_cost),
    # Kubernetes quantity library
    "quantity": (_quantity, _str_scan(0)),
    "isQuantity": (_is_quantity, _str_scan(0)),
    "compareTo": (_cmp("compareTo"), _ONE),
    "isGreaterThan": (lambda a, b: _cmp("isGreaterThan")(a, b) > 0, _ONE),
    "isLessThan": (lambda a, b: _cmp("isLessThan")(a, b) < 0, _ONE),
    "add": (lambda a, b: QuantityValue(_q(a, "add") + _to_q(b, "add")), _ONE),
    "sub": (lambda a, b: QuantityValue(_q(a, "sub") - _to_q(b, "sub")), _ONE),
    "sign": (lambda a: _q(a, "sign").sign(), _ONE),
    "isInteger": (lambda a: _q(a, "isInteger").is_integer(), _ONE),
    "asInteger": (_as_integer, _ONE),
    "asApproximateFloat": (_as_float, _ONE),
    # Kubernetes semver library
    "semver": (_semver, _str_scan(0)),
    "isSemver": (_is_semver, _str_scan(0)),
    "major": (_semver_part("major"), _ONE),
    "minor": (_semver_part("minor"), _ONE),
    "patch": (_semver_part("patch"), _ONE),
    # optional types
    "optional.of": (_opt_of, _ONE),
    "optional.none": (_opt_none, _ONE),
    "optional.ofNonZeroValue": (_opt_of_non_zero, _ONE),
    "hasValue": (_has_value, _ONE),
    "value": (_value, _ONE),
    "or": (_or, _ONE),
    "orValue": (_or_value, _ONE),
}

# Functions called as members (x.f(...)) and as globals (f(...)); others are global only.
MEMBER = {
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "size",
    "charAt",
    "indexOf",
    "lastIndexOf",
    "lowerAscii",
    "upperAscii",
    "replace",
    "split",
    "substring",
    "trim",
    "join",
    "format",
    "slice",
    "flatten",
    "reverse",
    "sort",
    "distinct",
    "isSorted",
    "sum",
    "min",
    "max",
    "includes",
    "find",
    "findAll",
    "compareTo",
    "isGreaterThan",
    "isLessThan",
    "add",
    "sub",
    "sign",
    "isInteger",
    "asInteger",
    "asApproximateFloat",
    "major",
    "minor",
    "patch",
    "hasValue",
    "value",
    "or",
    "orValue",
    "@sortByAssociatedKeys",
}
GLOBAL = {
    "_+_",
    "_-_",
    "_*_",
    "_/_",
    "_%_",
    "-_",
    "!_",
    "@in",
    "cel.@mapInsert",
    "size",
    "matches",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "bool",
    "type",
    "dyn",
    "strings.quote",
    "lists.range",
    "sets.contains",
    "sets.equivalent",
    "sets.intersects",
    "quantity",
    "isQuantity",
    "semver",
    "isSemver",
    "optional.of",
    "optional.none",
    "optional.ofNonZeroValue",
}


def known_function(name: str, member: bool) -> bool:
    """Whether ``name`` exists as a member function (``x.name(...)``) or a global one."""
    return name in FUNCTIONS and (name in MEMBER if member else name in GLOBAL)


# ---------------------------------------------------------------------------------------------
# Compilation into closures.


def _is_const(e: Expr) -> bool:
    if isinstance(e, Const):
        return True
    if isinstance(e, ListLit):
        return not e.optional and all(_is_const(x) for x in e.elems)
    if isinstance(e, MapLit):
        return all(not o and _is_const(k) and _is_const(v) for k, v, o in e.entries)
    return False


def _const_value(e: Expr) -> Any:
    if isinstance(e, Const):
        return e.value
    if isinstance(e, ListLit):
        return [_const_value(x) for x in e.elems]
    assert isinstance(e, MapLit)
    out: dict[Any, Any] = {}
    for k, v, _ in e.entries:
        kv = _const_value(k)
        if _map_find(out, kv)[0]:
            raise CelError(f"Failed with repeated key: {kv}")
        out[kv] = _const_value(v)
    return out


def compile_expr(e: Expr, types: dict[str, TypeValue] | None = None) -> Fn:
    """Closures for ``e``. Identifiers are looked up in the ``vars`` dict at evaluation time,
    except type names (``int``, ``string`` ...) which are constants."""
    return _Compiler(types or {}).comp(e)


class _Compiler:
    def __init__(self, types: dict[str, TypeValue]) -> None:
        self.types = types

    def comp(self, e: Expr) -> Fn:
        if _is_const(e):
            try:
                v = _const_value(e)
            except CelError as err:
                failure = err

                def fail(a: dict[str, Any], st: CostState) -> Any:
                    raise failure

                return fail
            # Lists and maps are copied so that no evaluation can alias another's value.
            if isinstance(v, list | dict):
                return lambda a, st: v.copy()
            return lambda a, st: v
        if isinstance(e, Ident):
            return self.ident(e)
        if isinstance(e, Select):
            return self.select(e)
        if isinstance(e, Call):
            return self.call(e)
        if isinstance(e, ListLit):
            return self.list_lit(e)
        if isinstance(e, MapLit):
            return self.map_lit(e)
        if isinstance(e, Comprehension):
            return self.comprehension(e)
        raise CelError(f"unsupported expression {type(e).__name__}")

    def ident(self, e: Ident) -> Fn:
        name = e.name
        if name in self.types:
            tv = self.types[name]

            def type_ident(a: dict[str, Any], st: CostState) -> Any:
                st.add(1)
                if name in a:
                    return _read(a[name])
                return tv

            return type_ident

        def ident(a: dict[str, Any], st: CostState) -> Any:
            st.add(1)
            try:
                v = a[name]
            except KeyError:
                raise CelError(f"undeclared reference to '{name}'") from None
            return _read(v)

        return ident

    def select(self, e: Select) -> Fn:
        op = self.comp(e.operand)
        fld = e.field
        if e.test_only:
            return lambda a, st: _has(op(a, st), fld)

        def select(a: dict[str, Any], st: CostState) -> Any:
            v = op(a, st)
            st.add(1)
            return _select(v, fld)

        return select

    def list_lit(self, e: ListLit) -> Fn:
        elems = [self.comp(x) for x in e.elems]
        opt = e.optional

        def list_lit(a: dict[str, Any], st: CostState) -> Any:
            out = []
            for i, f in enumerate(elems):
                v = f(a, st)
                if i in opt:
                    o = _o(v, "optional list element")
                    if o.has:
                        out.append(o.value)
                else:
                    out.append(v)
            st.add(LIST_CREATE)
            return out

        return list_lit

    def map_lit(self, e: MapLit) -> Fn:
        entries = [(self.comp(k), self.comp(v), o) for k, v, o in e.entries]

        def map_lit(a: dict[str, Any], st: CostState) -> Any:
            out: dict[Any, Any] = {}
            for kf, vf, o in entries:
                k = kf(a, st)
                v = vf(a, st)
                if isinstance(k, float | list | dict | OptionalValue) or k is None:
                    raise CelError(f"unsupported key type: {type_name(k)}")
                if o:
                    ov = _o(v, "optional map entry")
                    if not ov.has:
                        continue
                    v = ov.value
                if _map_find(out, k)[0]:
                    raise CelError(f"Failed with repeated key: {_key_str(k)}")
                out[k] = v
            st.add(MAP_CREATE)
            return out

        return map_lit

    def comprehension(self, e: Comprehension) -> Fn:
        rng = self.comp(e.iter_range)
        init = self.comp(e.accu_init)
        cond = self.comp(e.loop_cond)
        step = self.comp(e.loop_step)
        result = self.comp(e.result)
        v1, v2, accu = e.iter_var, e.iter_var2, e.accu_var

        def comprehension(a: dict[str, Any], st: CostState) -> Any:
            r = rng(a, st)
            if isinstance(r, list):
                items: Any = enumerate(r) if v2 is not None else ((None, x) for x in r)
                is_list = True
            elif isinstance(r, dict):
                items = list(r.items())
                is_list = False
            else:
                raise _no_overload("comprehension range", r)
            scope = dict(a)
            scope[accu] = _capture(init, scope, st)
            for k, v in items:
                if v2 is None:
                    scope[v1] = v if is_list else k
                else:
                    scope[v1] = k
                    scope[v2] = v
                c = _capture(cond, scope, st)
                if c is False:
                    break
                if isinstance(c, CelError):
                    raise c
                scope[accu] = _capture(step, scope, st)
            return result(scope, st)

        return comprehension

    def call(self, e: Call) -> Fn:
        fn = e.fn
        if fn == "_&&_" or fn == "_||_":
            return self.logic(e)
        if fn == "_?_:_":
            c, t, f = (self.comp(x) for x in e.args)

            def cond(a: dict[str, Any], st: CostState) -> Any:
                v = c(a, st)
                if v is True:
                    return t(a, st)
                if v is False:
                    return f(a, st)
                raise _no_overload("_?_:_", v)

            return cond
        if fn == "@not_strictly_false":
            inner = self.comp(e.args[0])

            def nsf(a: dict[str, Any], st: CostState) -> Any:
                try:
                    v = inner(a, st)
                except CostLimitExceeded:
                    raise
                except CelError:
                    v = True
                st.add(1)
                return v is not False

            return nsf
        if fn in ("_==_", "_!=_"):
            lf, rf = (self.comp(x) for x in e.args)
            neg = fn == "_!=_"

            def eq(a: dict[str, Any], st: CostState) -> Any:
                x, y = lf(a, st), rf(a, st)
                st.add(_eq_cost([x, y], None))
                return cel_equal(x, y) != neg

            return eq
        if fn in ("_<_", "_<=_", "_>_", "_>=_"):
            lf, rf = (self.comp(x) for x in e.args)
            test = {
                "_<_": lambda c: c < 0,
                "_<=_": lambda c: c <= 0,
                "_>_": lambda c: c > 0,
                "_>=_": lambda c: c >= 0,
            }[fn]

            def rel(a: dict[str, Any], st: CostState) -> Any:
                x, y = lf(a, st), rf(a, st)
                st.add(_str_cmp_cost([x, y], None))
                try:
                    return test(_compare(fn, x, y))
                except _Unordered:
                    return False

            return rel
        if fn == "_[_]":
            cf, kf = (self.comp(x) for x in e.args)

            def index(a: dict[str, Any], st: CostState) -> Any:
                c, k = cf(a, st), kf(a, st)
                st.add(1)
                return _index(c, k)

            return index
        if fn == "_?._":
            of = self.comp(e.args[0])
            fld = e.args[1].value if isinstance(e.args[1], Const) else ""

            def opt_select(a: dict[str, Any], st: CostState) -> Any:
                v = of(a, st)
                st.add(1)
                if isinstance(v, OptionalValue):
                    if not v.has:
                        return NONE
                    v = v.value
                if isinstance(v, dict):
                    found, w = _map_find(v, fld)
                    return OptionalValue(True, w) if found else NONE
                raise CelError(f"type '{type_name(v)}' does not support field selection")

            return opt_select
        if fn == "_[?_]":
            cf, kf = (self.comp(x) for x in e.args)

            def opt_index(a: dict[str, Any], st: CostState) -> Any:
                c, k = cf(a, st), kf(a, st)
                st.add(1)
                return _opt_index(c, k)

            return opt_index
        impl, cost = FUNCTIONS[fn]
        argf = ([self.comp(e.target)] if e.target is not None else []) + [
            self.comp(x) for x in e.args
        ]
        if len(argf) == 1:
            f0 = argf[0]

            def call1(a: dict[str, Any], st: CostState) -> Any:
                x = f0(a, st)
                r = _apply(impl, fn, (x,))
                st.add(cost([x], r))
                return r

            return call1
        if len(argf) == 2:
            f0, f1 = argf

            def call2(a: dict[str, Any], st: CostState) -> Any:
                x, y = f0(a, st), f1(a, st)
                r = _apply(impl, fn, (x, y))
                st.add(cost([x, y], r))
                return r

            return call2

        def calln(a: dict[str, Any], st: CostState) -> Any:
            vals = [f(a, st) for f in argf]
            r = _apply(impl, fn, tuple(vals))
            st.add(cost(vals, r))
            return r

        return calln

    def logic(self, e: Call) -> Fn:
        lf, rf = (self.comp(x) for x in e.args)
        short = e.fn == "_||_"  # the value that decides: true for ||, false for &&

        def logic(a: dict[str, Any], st: CostState) -> Any:
            err: CelError | None = None
            try:
                x = lf(a, st)
            except CostLimitExceeded:
                raise
            except CelError as ex:
                err, x = ex, None
            if x is short:
                return short
            if err is None and not isinstance(x, bool):
                err = _no_overload(e.fn, x)
            try:
                y = rf(a, st)
            except CostLimitExceeded:
                raise
            except CelError:
                if err is not None:
                    raise err from None
                raise
            if y is short:
                return short
            if not isinstance(y, bool):
                raise err if err is not None else _no_overload(e.fn, x, y)
            if err is not None:
                raise err
            return not short

        return logic


def _apply(impl: Callable[..., Any], fn: str, args: tuple[Any, ...]) -> Any:
    try:
        return impl(*args)
    except CelError:
        raise
    except (TypeError, AttributeError):
        raise _no_overload(fn, *args) from None
    except (ValueError, ArithmeticError, OverflowError) as ex:
        raise CelError(str(ex)) from None


def _read(v: Any) -> Any:
    if isinstance(v, CelError):
        raise v
    return v


def _capture(f: Fn, a: dict[str, Any], st: CostState) -> Any:
    """Evaluate, returning an error as a value (for a comprehension's accumulator)."""
    try:
        return f(a, st)
    except CostLimitExceeded:
        raise
    except CelError as e:
        return e
