"""Compile and evaluate device selectors. See the package docstring for the environment."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.api.quantity import Quantity
from tessera.cel import cost as _cost
from tessera.cel.interp import (
    COST_LIMIT_MESSAGE,
    TYPE_NAMES,
    CostState,
    DomainMap,
    Fn,
    compile_expr,
    known_function,
    type_name,
)
from tessera.cel.syntax import CelSyntaxError, Expr, parse
from tessera.cel.values import CelError, QuantityValue, SemverValue, TypeValue

MAX_COST = _cost.MAX_COST
TOO_COMPLEX = "too complex, exceeds cost limit"  # the API server's field.Forbidden detail


class CelCompileError(ValueError):
    """The expression does not compile. ``str()`` gives the reason on one line."""


class CelCostError(CelCompileError):
    """The estimated worst-case cost is over :data:`MAX_COST`: the API server rejects the
    selector (``Forbidden: too complex, exceeds cost limit``). ``estimate`` is the estimate."""

    def __init__(self, estimate: int) -> None:
        super().__init__(TOO_COMPLEX)
        self.estimate = estimate

    @property
    def detail(self) -> str:
        """The figures, for a message after the API server's wording."""
        return f"estimated worst-case cost {self.estimate} exceeds the limit of {MAX_COST}"


class CelRuntimeError(ValueError):
    """Evaluation failed on a device (e.g. ``no such key``). Upstream aborts allocation on it."""


# Functions of the Kubernetes CEL environment that Tessera does not implement (compile errors
# that say so, rather than "undeclared reference"). None of them is useful on a device.
NOT_IMPLEMENTED = frozenset(
    {
        "ip",
        "cidr",
        "isIP",
        "isCIDR",
        "url",
        "isURL",
        "timestamp",
        "duration",
        "getDate",
        "getDayOfMonth",
        "getDayOfWeek",
        "getDayOfYear",
        "getFullYear",
        "getHours",
        "getMilliseconds",
        "getMinutes",
        "getMonth",
        "getSeconds",
        "format.named",
        "validate",
        "authorizer",
        "jsonpatch.escapeKey",
        "math.greatest",
        "math.least",
        "base64.encode",
        "base64.decode",
        "strings.reverse",
    }
)


def _known(name: str, member: bool) -> bool:
    if name in NOT_IMPLEMENTED:
        raise _cost.CheckError(
            f"{name}() of the Kubernetes CEL environment is not implemented by Tessera (device selectors do not "
            "need it)"
        )
    return known_function(name, member)


# ---------------------------------------------------------------------------------------------
# The device variable.


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
    if isinstance(v, bool | str | SemverValue | QuantityValue):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, Quantity):
        return QuantityValue(v)
    if isinstance(v, list | tuple):
        return [_cel_value(x) for x in v]
    raise ValueError(f"unsupported attribute value {v!r}")


def _by_domain(values: Mapping[str, Any]) -> DomainMap:
    grouped = DomainMap()
    for key, v in values.items():
        domain, _, ident = key.rpartition("/")
        grouped.setdefault(domain, {})[ident] = _cel_value(v)
    return grouped


def device_activation(dev: DeviceView) -> dict[str, Any]:
    """The CEL activation (``{"device": ...}``) for one device; opaque to callers, who pass it
    to :meth:`CompiledSelector.evaluate`."""
    return {
        "device": {
            "driver": dev.driver,
            "attributes": _by_domain(dev.attributes),
            "capacity": _by_domain(dev.capacity),
            "allowMultipleAllocations": bool(dev.allow_multiple_allocations),
        }
    }


_TYPE_VALUES = {name: TypeValue(n) for name, n in TYPE_NAMES.items()}


@dataclass(frozen=True)
class CompiledSelector:
    """A compiled selector. :meth:`evaluate` returns bool or raises :class:`CelRuntimeError`.

    ``cost``: the estimated worst-case cost (``min``, ``max`` in CEL cost units) that the API
    server compares with :data:`MAX_COST`; ``tree``: the expression tree, macros expanded.
    """

    expression: str
    tree: Expr = field(repr=False)
    cost: _cost.Cost
    program: Fn = field(repr=False)

    def evaluate(self, activation: dict[str, Any], cost_limit: int | None = MAX_COST) -> bool:
        """Evaluate on a device activation from :func:`device_activation`.

        ``cost_limit``: the runtime cost limit (upstream's is :data:`MAX_COST`); past it the
        evaluation stops with ``operation cancelled: actual cost limit exceeded``."""
        return self.evaluate_cost(activation, cost_limit)[0]

    def evaluate_cost(
        self, activation: dict[str, Any], cost_limit: int | None = MAX_COST
    ) -> tuple[bool, int]:
        """Like :meth:`evaluate`, and the actual cost of the evaluation (cel-go's
        ``EvalDetails.ActualCost``)."""
        st = CostState(cost_limit)
        try:
            result = self.program(activation, st)
        except CelError as e:
            raise CelRuntimeError(str(e)) from None
        except RecursionError:
            raise CelRuntimeError("expression too deeply nested") from None
        if not isinstance(result, bool):
            raise CelRuntimeError(
                f"CEL result of type {type_name(result)} could not be converted to bool"
            )
        return result, st.cost


@functools.lru_cache(maxsize=4096)
def compile_selector(expression: str) -> CompiledSelector:
    """Compile ``expression`` (cached by text, like upstream's LRU) in the environment of
    device selectors, and estimate its cost.

    Raises :class:`CelCompileError` for syntax errors, undeclared references, functions that do
    not exist and results that cannot be bool. A cost over :data:`MAX_COST` is *not* an error
    here (the allocator evaluates stored selectors whatever their cost): see
    :func:`check_selector`.
    """
    try:
        tree = parse(expression)
        checked = _cost.check(tree, _known)
    except (CelSyntaxError, _cost.CheckError) as e:
        raise CelCompileError(str(e)) from None
    except RecursionError:
        raise CelCompileError("expression too deeply nested") from None
    estimate = _cost.estimate(checked)
    return CompiledSelector(expression, tree, estimate, compile_expr(tree, _TYPE_VALUES))


def check_selector(expression: str) -> CompiledSelector:
    """The API server's validation of a new selector (``resource.k8s.io`` validation,
    ``validateCELExpression``): it must compile, and its estimated cost must not exceed
    :data:`MAX_COST`. Raises :class:`CelCompileError` or :class:`CelCostError`."""
    sel = compile_selector(expression)
    if sel.cost.max > MAX_COST:
        raise CelCostError(sel.cost.max)
    return sel


__all__ = [
    "COST_LIMIT_MESSAGE",
    "MAX_COST",
    "TOO_COMPLEX",
    "CelCompileError",
    "CelCostError",
    "CelRuntimeError",
    "CompiledSelector",
    "DeviceView",
    "QuantityValue",
    "SemverValue",
    "check_selector",
    "compile_selector",
    "device_activation",
]
