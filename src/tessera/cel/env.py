"""Compile and evaluate device selectors. See the package docstring for the environment."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import celpy
import lark
from celpy import celtypes
from celpy.evaluation import CELEvalError

from tessera.api.quantity import Quantity, QuantityError


class CelCompileError(ValueError):
    """The expression does not compile. ``str()`` gives the parser's reason on one line."""


class CelRuntimeError(ValueError):
    """Evaluation failed on a device (e.g. ``no such key``). Upstream aborts allocation on it."""


# ---------------------------------------------------------------------------------------------
# Value types: Quantity and semver, as opaque CEL objects with member functions.


class QuantityValue:
    """CEL ``kubernetes.Quantity``: equality and member functions only, no ``<`` operators."""

    __slots__ = ("q",)

    def __init__(self, q: Quantity) -> None:
        self.q = q

    def __eq__(self, other: object) -> bool:
        if isinstance(other, QuantityValue):
            return self.q.value == other.q.value
        raise TypeError("no such overload: Quantity == non-Quantity")

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(self.q.value)

    def _no_order(self, other: object) -> bool:
        raise TypeError(
            "no such overload: Quantity values compare with compareTo/isGreaterThan/isLessThan, not < or >"
        )

    __lt__ = __le__ = __gt__ = __ge__ = _no_order

    def __repr__(self) -> str:
        return f"quantity({self.q.canonical()!r})"


_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


class SemverValue:
    """CEL ``kubernetes.Semver`` (semver 2.0.0). Build metadata is ignored in comparisons."""

    __slots__ = ("major", "minor", "patch", "pre", "text")

    def __init__(self, major: int, minor: int, patch: int, pre: tuple[str, ...], text: str) -> None:
        self.major, self.minor, self.patch, self.pre, self.text = major, minor, patch, pre, text

    @classmethod
    def parse(cls, s: str, normalize: bool = False) -> SemverValue:
        """Strict semver; ``normalize`` accepts a ``v`` prefix, missing minor/patch, leading zeros."""
        t = s
        if normalize:
            t = t[1:] if t.startswith("v") else t
            m0 = re.search(r"[-+]", t)
            core, sep, rest = (t[: m0.start()], m0.group(0), t[m0.end() :]) if m0 else (t, "", "")
            nums = core.split(".")
            while len(nums) < 3:
                nums.append("0")
            if all(n.isdigit() for n in nums):
                core = ".".join(str(int(n)) for n in nums)
            t = core + sep + rest
        m = _SEMVER.match(t)
        if not m:
            raise ValueError(f"{s!r} is not a semantic version (semver 2.0.0, e.g. 1.2.3)")
        pre = tuple(m.group(4).split(".")) if m.group(4) else ()
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3)), pre, t)

    def _key(self) -> tuple[Any, ...]:
        # Pre-release sorts before release; numeric identifiers before alphanumeric.
        pre: tuple[Any, ...] = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.pre)
        return (self.major, self.minor, self.patch, 0 if self.pre else 1, pre)

    def cmp(self, other: SemverValue) -> int:
        a, b = self._key(), other._key()
        return (a > b) - (a < b)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SemverValue):
            return self.cmp(other) == 0
        raise TypeError("no such overload: Semver == non-Semver")

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(self._key())

    def _no_order(self, other: object) -> bool:
        raise TypeError("no such overload: semver values compare with compareTo/isGreaterThan/isLessThan")

    __lt__ = __le__ = __gt__ = __ge__ = _no_order

    def __repr__(self) -> str:
        return f"semver({self.text!r})"


# ---------------------------------------------------------------------------------------------
# Functions of the Kubernetes base environment that device selectors use.


def _str(x: Any, fn: str) -> str:
    if not isinstance(x, str):
        raise TypeError(f"no such overload: {fn}({type(x).__name__})")
    return str(x)


def _quantity(s: Any) -> QuantityValue:
    try:
        return QuantityValue(Quantity.parse(_str(s, "quantity")))
    except QuantityError as e:
        raise ValueError(str(e)) from None


def _is_quantity(s: Any) -> celtypes.BoolType:
    try:
        Quantity.parse(_str(s, "isQuantity"))
        return celtypes.BoolType(True)
    except QuantityError:
        return celtypes.BoolType(False)


def _semver(s: Any, normalize: Any = False) -> SemverValue:
    return SemverValue.parse(_str(s, "semver"), bool(normalize))


def _is_semver(s: Any, normalize: Any = False) -> celtypes.BoolType:
    try:
        SemverValue.parse(_str(s, "isSemver"), bool(normalize))
        return celtypes.BoolType(True)
    except ValueError:
        return celtypes.BoolType(False)


def _cmp(a: Any, b: Any) -> int:
    if isinstance(a, QuantityValue) and isinstance(b, QuantityValue):
        return a.q.cmp(b.q)
    if isinstance(a, SemverValue) and isinstance(b, SemverValue):
        return a.cmp(b)
    raise TypeError(f"no such overload: compareTo({type(a).__name__}, {type(b).__name__})")


def _to_q(x: Any) -> Quantity:
    if isinstance(x, QuantityValue):
        return x.q
    if isinstance(x, int) and not isinstance(x, bool):
        return Quantity(Fraction(int(x)))
    raise TypeError(f"no such overload for quantity arithmetic with {type(x).__name__}")


def _q_only(x: Any, fn: str) -> Quantity:
    if not isinstance(x, QuantityValue):
        raise TypeError(f"no such overload: {fn} on {type(x).__name__}")
    return x.q


def _as_integer(x: Any) -> celtypes.IntType:
    q = _q_only(x, "asInteger")
    if not q.is_integer() or abs(q.value) >= 2**63:
        raise ValueError("cannot convert value to integer")
    return celtypes.IntType(int(q.value))


def _semver_part(part: str) -> Any:
    def f(x: Any) -> celtypes.IntType:
        if not isinstance(x, SemverValue):
            raise TypeError(f"no such overload: {part}() on {type(x).__name__}")
        return celtypes.IntType(getattr(x, part))

    return f


def _includes(container: Any, x: Any) -> celtypes.BoolType:
    if isinstance(container, list):
        if len(container) > 48:
            raise ValueError("includes() on a list of more than 48 values")
        return celtypes.BoolType(any(_eq(v, x) for v in container))
    return celtypes.BoolType(_eq(container, x))


def _eq(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except TypeError:
        return False


def _split(s: Any, sep: Any, n: Any = -1) -> celtypes.ListType:
    parts = _str(s, "split").split(_str(sep, "split"), int(n) - 1 if int(n) > 0 else -1)
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


FUNCTIONS: dict[str, Any] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": _semver,
    "isSemver": _is_semver,
    "compareTo": lambda a, b: celtypes.IntType(_cmp(a, b)),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_cmp(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_cmp(a, b) < 0),
    "add": lambda a, b: QuantityValue(_q_only(a, "add") + _to_q(b)),
    "sub": lambda a, b: QuantityValue(_q_only(a, "sub") - _to_q(b)),
    "sign": lambda a: celtypes.IntType(_q_only(a, "sign").sign()),
    "isInteger": lambda a: celtypes.BoolType(_q_only(a, "isInteger").is_integer()),
    "asInteger": _as_integer,
    "asApproximateFloat": lambda a: celtypes.DoubleType(float(_q_only(a, "asApproximateFloat").value)),
    "major": _semver_part("major"),
    "minor": _semver_part("minor"),
    "patch": _semver_part("patch"),
    "includes": _includes,
    # strings extension (cel-go ext.Strings) members used in selectors.
    "lowerAscii": lambda s: celtypes.StringType(_str(s, "lowerAscii").lower()),
    "upperAscii": lambda s: celtypes.StringType(_str(s, "upperAscii").upper()),
    "trim": lambda s: celtypes.StringType(_str(s, "trim").strip()),
    "replace": lambda s, a, b: celtypes.StringType(_str(s, "replace").replace(_str(a, "replace"), _str(b, "replace"))),
    "indexOf": lambda s, sub: celtypes.IntType(_str(s, "indexOf").find(_str(sub, "indexOf"))),
    "lastIndexOf": lambda s, sub: celtypes.IntType(_str(s, "lastIndexOf").rfind(_str(sub, "lastIndexOf"))),
    "split": _split,
    "join": lambda lst, sep="": celtypes.StringType(_str(sep, "join").join(str(x) for x in lst)),
}

_UNSUPPORTED = [
    (re.compile(r"\.\?"), "optional field selection '.?' is not supported here: guard with has(...)"),
    (re.compile(r"\borValue\s*\("), "orValue() is not supported here: guard with has(...)"),
    (re.compile(r"\bcel\.bind\s*\("), "cel.bind() is not supported here: repeat the sub-expression"),
]


# ---------------------------------------------------------------------------------------------
# The device variable.


class _DomainMap(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: unknown domains read as an empty map."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            if isinstance(key, str):
                return celtypes.MapType()
            raise


@dataclass(frozen=True)
class DeviceView:
    """What a selector sees of a device: driver, attributes and capacity by qualified name.

    ``attributes`` maps a qualified name (``domain/id``, unqualified names already expanded with
    the driver as domain) to int/bool/str, a :class:`SemverValue`, or a list of those.
    ``capacity`` maps qualified names to the published :class:`Quantity` (not what is left).
    """

    driver: str
    attributes: Mapping[str, Any]
    capacity: Mapping[str, Quantity]
    allow_multiple_allocations: bool = False


def _cel_value(v: Any) -> Any:
    if isinstance(v, bool):
        return celtypes.BoolType(v)
    if isinstance(v, int):
        return celtypes.IntType(v)
    if isinstance(v, str):
        return celtypes.StringType(v)
    if isinstance(v, SemverValue | QuantityValue):
        return v
    if isinstance(v, Quantity):
        return QuantityValue(v)
    if isinstance(v, list | tuple):
        return celtypes.ListType([_cel_value(x) for x in v])
    raise ValueError(f"unsupported attribute value {v!r}")


def _by_domain(values: Mapping[str, Any]) -> _DomainMap:
    grouped: dict[str, dict[str, Any]] = {}
    for key, v in values.items():
        domain, _, ident = key.rpartition("/")
        grouped.setdefault(domain, {})[ident] = _cel_value(v)
    return _DomainMap(
        {celtypes.StringType(d): celtypes.MapType({celtypes.StringType(k): v for k, v in m.items()}) for d, m in grouped.items()}
    )


def device_activation(dev: DeviceView) -> dict[str, Any]:
    """The CEL activation (``{"device": ...}``) for one device."""
    return {
        "device": celtypes.MapType(
            {
                celtypes.StringType("driver"): celtypes.StringType(dev.driver),
                celtypes.StringType("attributes"): _by_domain(dev.attributes),
                celtypes.StringType("capacity"): _by_domain(dev.capacity),
                celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(dev.allow_multiple_allocations),
            }
        )
    }


_ENV = celpy.Environment()


@dataclass(frozen=True)
class CompiledSelector:
    """A compiled selector. :meth:`evaluate` returns bool or raises :class:`CelRuntimeError`."""

    expression: str
    program: Any

    def evaluate(self, activation: dict[str, Any]) -> bool:
        """Evaluate on a device activation from :func:`device_activation`."""
        try:
            result = self.program.evaluate(activation)
        except CELEvalError as e:
            raise CelRuntimeError(_eval_message(e)) from None
        except (TypeError, ValueError, KeyError, ArithmeticError) as e:
            raise CelRuntimeError(str(e)) from None
        if isinstance(result, CELEvalError):
            raise CelRuntimeError(_eval_message(result))
        if not isinstance(result, celtypes.BoolType | bool):
            raise CelRuntimeError(f"expression must evaluate to bool, got {type(result).__name__}")
        return bool(result)


def _eval_message(e: CELEvalError) -> str:
    args = e.args
    msg = str(args[0]) if args else str(e)
    if "undeclared reference" in msg:
        name = re.search(r"undeclared reference to '([^']*)'", msg)
        return f"undeclared reference to '{name.group(1) if name else '?'}'"
    if args and len(args) > 1 and args[1] is KeyError:
        m = re.search(r"'([^']*)'", msg)
        key = m.group(1) if m else msg
        if len(args) > 2 and args[2]:
            key = str(args[2][0])
        return f"no such key: {key}"
    if msg == "return error for overflow" and len(args) > 2 and args[2]:
        return str(args[2][0])
    msg = msg.split(" (in activation")[0]
    if "no matching overload" in msg:
        return "no matching overload: " + re.sub(r"Token\('RULE', '([a-z_]+)'\)", r"\1", msg).split("overload for ")[-1]
    return msg


# Identifiers a device selector may reference besides comprehension variables: the one
# variable of the environment and CEL's type denotations.
_DECLARED = frozenset(
    {"device", "int", "uint", "double", "bool", "string", "bytes", "list", "map", "type", "null_type",
     "duration", "timestamp"}
)
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter", "transformList", "transformMap"})


def _single_ident(node: Any) -> str | None:
    """The name if ``node`` (an expr subtree) is nothing but one identifier."""
    while isinstance(node, lark.Tree):
        if node.data == "ident":
            return str(node.children[0])
        if len(node.children) != 1:
            return None
        node = node.children[0]
    return None


def _undeclared(ast: Any) -> str | None:
    """First identifier that is neither declared nor bound by a comprehension macro.

    cel-python only notices undeclared references when it evaluates them; upstream's
    type-checker rejects them at compile time (``undeclared reference to 'x'``). Scopes are
    approximated: a name bound by any macro in the expression counts as bound everywhere.
    """
    bound: set[str] = set()
    for node in ast.iter_subtrees():
        if node.data == "member_dot_arg" and len(node.children) >= 3:
            method = str(node.children[1])
            args = node.children[2]
            if method in _MACROS and isinstance(args, lark.Tree):
                exprs = args.children
                for e in exprs[:-1]:
                    name = _single_ident(e)
                    if name:
                        bound.add(name)
    for node in ast.iter_subtrees_topdown():
        if node.data == "ident":
            name = str(node.children[0])
            if name not in _DECLARED and name not in bound:
                return name
    return None


@functools.lru_cache(maxsize=4096)
def compile_selector(expression: str) -> CompiledSelector:
    """Compile ``expression`` (cached by text, like upstream's LRU).

    Raises :class:`CelCompileError` for syntax errors and unsupported constructs.
    """
    for pat, why in _UNSUPPORTED:
        if pat.search(expression):
            raise CelCompileError(why)
    try:
        ast = _ENV.compile(expression)
    except Exception as e:  # celpy raises CELParseError with a multi-line caret diagram
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CelCompileError(f"syntax error: {first}") from None
    name = _undeclared(ast)
    if name is not None:
        raise CelCompileError(f"undeclared reference to '{name}'")
    return CompiledSelector(expression, _ENV.program(ast, functions=FUNCTIONS))
