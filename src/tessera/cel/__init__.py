"""The Kubernetes device-selector CEL environment (dra-spec.md section 3), on cel-python.

One variable, ``device``, with ``driver`` (string), ``attributes`` (domain -> id -> value),
``capacity`` (domain -> id -> Quantity) and ``allowMultipleAllocations`` (bool). Looking up an
unknown *domain* yields an empty map; an unknown *id* inside a domain is a runtime error, as
upstream. Version attributes are semver objects; capacities are Quantity objects; both compare
only through their member functions (``compareTo``, ``isGreaterThan``, ``isLessThan``) and
``==``, as in the Kubernetes CEL libraries (``apiserver/pkg/cel/library/{quantity,semverlib}.go``).

Modules: ``syntax`` (grammar with CEL's optional syntax, parse tree -> expression tree with
cel-go's macro expansion), ``cost`` (checker and cel-go's cost estimate with the Kubernetes
estimators), ``interp`` (evaluation with cel-go's runtime cost), ``values`` (uint, optional,
Quantity, semver), ``env`` (the public API below). Selected in docs/cel.md against other CEL
implementations; what of the Kubernetes environment is not implemented is listed there.
"""

from tessera.cel.env import (
    COST_LIMIT_MESSAGE,
    MAX_COST,
    TOO_COMPLEX,
    CelCompileError,
    CelCostError,
    CelRuntimeError,
    CompiledSelector,
    DeviceView,
    QuantityValue,
    SemverValue,
    check_selector,
    compile_selector,
    device_activation,
)

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
