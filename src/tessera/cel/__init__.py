"""The Kubernetes device-selector CEL environment (dra-spec.md section 3), on cel-python.

One variable, ``device``, with ``driver`` (string), ``attributes`` (domain -> id -> value),
``capacity`` (domain -> id -> Quantity) and ``allowMultipleAllocations`` (bool). Looking up an
unknown *domain* yields an empty map; an unknown *id* inside a domain is a runtime error, as
upstream. Version attributes are semver objects; capacities are Quantity objects; both compare
only through their member functions (``compareTo``, ``isGreaterThan``, ``isLessThan``) and
``==``, as in the Kubernetes CEL libraries (``apiserver/pkg/cel/library/{quantity,semverlib}.go``).

Differences from upstream, each reported as a compile error rather than silently: optional
chaining (``.?``, ``orValue``) and ``cel.bind`` are not available in cel-python 0.5.
"""

from tessera.cel.env import (
    CelCompileError,
    CelRuntimeError,
    CompiledSelector,
    DeviceView,
    SemverValue,
    compile_selector,
    device_activation,
)

__all__ = [
    "CelCompileError",
    "CelRuntimeError",
    "CompiledSelector",
    "DeviceView",
    "SemverValue",
    "compile_selector",
    "device_activation",
]
