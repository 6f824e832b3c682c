"""Pure checks of a ``resource.k8s.io/v1`` ResourceSlice against the API server's validation
rules and limits (Kubernetes 1.36 ``pkg/apis/resource/validation``; dra-spec.md 1.2, 1.8, 1.9)."""

from __future__ import annotations

import itertools
import re
from typing import Any

from tessera.api.quantity import Quantity, QuantityError

MAX_DEVICES = 128
MAX_DEVICES_WITH_COUNTERS = 64  # taints, consumesCounters or list-typed attributes
MAX_COUNTER_SETS = 8  # sharedCounters per slice (1.35+)
MAX_COUNTERS = 32  # counters per set, and per consumption
MAX_CONSUMES_COUNTERS = 2  # consumesCounters entries per device
MAX_ATTRS_AND_CAPS = 32
MAX_ATTRIBUTE_VALUES = 48
MAX_STRING = 64
MAX_VALID_VALUES = 10
INT64 = (-(2**63), 2**63 - 1)

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NUM = r"(?:0|[1-9]\d*)"
_PRE = r"(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
SEMVER = re.compile(
    rf"^{_NUM}\.{_NUM}\.{_NUM}(?:-{_PRE}(?:\.{_PRE})*)?(?:\+[0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*)?$"
)
_SCALAR_TYPES = ("int", "bool", "string", "version")
_LIST_TYPES = ("ints", "bools", "strings", "versions")
_DEVICE_FIELDS = {
    "name", "attributes", "capacity", "allowMultipleAllocations", "consumesCounters", "nodeName",
    "nodeSelector", "allNodes", "taints", "bindsToNode", "bindingConditions",
    "bindingFailureConditions", "nodeAllocatableResources",
}  # fmt: skip
_NODE_SELECTION = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")


#: One problem of a slice: ``(field path, what is wrong)``, e.g.
#: ``("spec.devices[0].name", "'GPU' is not a DNS label ...")``.
SliceProblem = tuple[str, str]


def is_dns_label(s: object) -> bool:
    """RFC 1123 label: lower-case alphanumerics and '-', at most 63 characters."""
    return isinstance(s, str) and len(s) <= 63 and bool(_LABEL.match(s))


def is_dns_subdomain(s: object, max_len: int = 253) -> bool:
    """RFC 1123 subdomain: dot-separated labels, at most ``max_len`` characters."""
    return isinstance(s, str) and 0 < len(s) <= max_len and bool(_SUBDOMAIN.match(s))


def qualified_name_problem(name: object) -> str | None:
    """None if ``name`` is a valid attribute/capacity name: a C identifier of at most 32
    characters, optionally prefixed by ``<DNS subdomain of at most 63>/``."""
    if not isinstance(name, str):
        return "name is not a string"
    parts = name.split("/")
    if len(parts) > 2:
        return "more than one '/'"
    ident = parts[-1]
    if len(parts) == 2 and not is_dns_subdomain(parts[0], 63):
        return f"domain {parts[0]!r} is not a DNS subdomain of at most 63 characters"
    if not (_C_IDENT.match(ident) and len(ident) <= 32):
        return f"{ident!r} is not a C identifier of at most 32 characters"
    return None


def _quantity(v: Any, path: str, out: list[SliceProblem]) -> Quantity | None:
    try:
        q = Quantity.parse(v)
    except QuantityError as err:
        out.append((path, str(err)))
        return None
    if q.sign() < 0:
        out.append((path, "must not be negative"))
        return None
    return q


def _attribute(name: str, attr: Any, path: str, out: list[SliceProblem]) -> int:
    """Check one attribute; returns how many values it carries."""
    if not isinstance(attr, dict):
        out.append((path, "must be a map with one of int, bool, string, version"))
        return 0
    kinds = [k for k in attr if k in _SCALAR_TYPES + _LIST_TYPES]
    extra = [k for k in attr if k not in _SCALAR_TYPES + _LIST_TYPES]
    if extra:
        out.append((path, f"unknown field(s) {sorted(extra)}"))
    if len(kinds) != 1:
        out.append((path, f"exactly one of int, bool, string, version must be set (found {kinds})"))
        return 0
    kind = kinds[0]
    values = attr[kind] if kind in _LIST_TYPES else [attr[kind]]
    if kind in _LIST_TYPES and (not isinstance(values, list) or not values):
        out.append((f"{path}.{kind}", "must be a non-empty list"))
        return 0
    scalar = kind.rstrip("s") if kind in _LIST_TYPES else kind
    for v in values:
        if scalar == "int":
            if not isinstance(v, int) or isinstance(v, bool) or not INT64[0] <= v <= INT64[1]:
                out.append((f"{path}.{kind}", f"{v!r} is not an int64"))
        elif scalar == "bool":
            if not isinstance(v, bool):
                out.append((f"{path}.{kind}", f"{v!r} is not a bool"))
        elif not isinstance(v, str):
            out.append((f"{path}.{kind}", f"{v!r} is not a string"))
        elif len(v) > MAX_STRING:
            out.append((f"{path}.{kind}", f"longer than {MAX_STRING} characters ({len(v)})"))
        elif scalar == "version" and not SEMVER.match(v):
            out.append(
                (f"{path}.{kind}", f"{v!r} is not a semantic version 2.0.0 (e.g. 535.161.8)")
            )
    return len(values)


def _policy(policy: Any, value: Quantity, path: str, out: list[SliceProblem]) -> None:
    if not isinstance(policy, dict):
        out.append((path, "must be a map"))
        return
    unknown = set(policy) - {"default", "validValues", "validRange"}
    if unknown:
        out.append((path, f"unknown field(s) {sorted(unknown)}"))
    default = _quantity(policy["default"], f"{path}.default", out) if "default" in policy else None
    if "validValues" in policy and "validRange" in policy:
        out.append((path, "validValues and validRange are mutually exclusive"))
    if ("validValues" in policy or "validRange" in policy) and "default" not in policy:
        out.append((f"{path}.default", "required when validValues or validRange is set"))
    if default is not None and default > value:
        out.append((f"{path}.default", f"{default.canonical()} exceeds the capacity value"))
    if "validValues" in policy:
        vals = policy["validValues"]
        if not isinstance(vals, list) or not vals or len(vals) > MAX_VALID_VALUES:
            out.append((f"{path}.validValues", f"must list 1..{MAX_VALID_VALUES} quantities"))
            return
        qs = [_quantity(v, f"{path}.validValues[{i}]", out) for i, v in enumerate(vals)]
        known = [q for q in qs if q is not None]
        if any(b <= a for a, b in itertools.pairwise(known)):
            out.append((f"{path}.validValues", "must be strictly ascending"))
        if any(q > value for q in known):
            out.append((f"{path}.validValues", "a value exceeds the capacity value"))
        if default is not None and default not in known:
            out.append((f"{path}.validValues", "must contain the default"))
    if "validRange" in policy:
        rng = policy["validRange"]
        rp = f"{path}.validRange"
        if not isinstance(rng, dict) or "min" not in rng:
            out.append((f"{rp}.min", "required"))
            return
        lo = _quantity(rng["min"], f"{rp}.min", out)
        hi = _quantity(rng["max"], f"{rp}.max", out) if "max" in rng else None
        step = _quantity(rng["step"], f"{rp}.step", out) if "step" in rng else None
        if lo is None:
            return
        v = value.value_int()
        mn = lo.value_int()
        if mn > v:
            out.append((f"{rp}.min", "exceeds the capacity value"))
        if default is not None and default < lo:
            out.append((f"{path}.default", "below validRange.min"))
        if hi is not None:
            if hi < lo:
                out.append((f"{rp}.max", "below min"))
            if hi > value:
                out.append((f"{rp}.max", "exceeds the capacity value"))
            if default is not None and default > hi:
                out.append((f"{path}.default", "above validRange.max"))
        if step is not None:
            st = step.value_int()
            if st <= 0:
                out.append((f"{rp}.step", "must be positive"))
                return
            if mn + st > v:
                out.append((f"{rp}.step", "min + step exceeds the capacity value"))
            if default is not None and (default.value_int() - mn) % st:
                out.append((f"{path}.default", "not min + k*step"))
            if hi is not None and (hi.value_int() - mn) % st:
                out.append((f"{rp}.max", "not min + k*step"))


def _device(dev: Any, path: str, out: list[SliceProblem]) -> bool:
    """Check one device; True when it uses a feature that lowers the device limit to 64."""
    if not isinstance(dev, dict):
        out.append((path, "must be a map"))
        return False
    unknown = set(dev) - _DEVICE_FIELDS
    if unknown:
        out.append((path, f"unknown field(s) {sorted(unknown)}"))
    if not is_dns_label(dev.get("name")):
        out.append((f"{path}.name", f"{dev.get('name')!r} is not a DNS label (<=63, a-z0-9-)"))
    attrs = dev.get("attributes") or {}
    caps = dev.get("capacity") or {}
    if not isinstance(attrs, dict) or not isinstance(caps, dict):
        out.append((path, "attributes and capacity must be maps"))
        return False
    if len(attrs) + len(caps) > MAX_ATTRS_AND_CAPS:
        out.append(
            (path, f"{len(attrs)} attributes + {len(caps)} capacities exceed {MAX_ATTRS_AND_CAPS}")
        )
    nvalues = 0
    lists = False
    for name, attr in attrs.items():
        ap = f"{path}.attributes[{name}]"
        problem = qualified_name_problem(name)
        if problem:
            out.append((ap, problem))
        nvalues += _attribute(name, attr, ap, out)
        lists = lists or (isinstance(attr, dict) and any(k in _LIST_TYPES for k in attr))
    if nvalues > MAX_ATTRIBUTE_VALUES:
        out.append((f"{path}.attributes", f"{nvalues} values exceed {MAX_ATTRIBUTE_VALUES}"))
    shared = dev.get("allowMultipleAllocations")
    if shared is not None and not isinstance(shared, bool):
        out.append((f"{path}.allowMultipleAllocations", "must be a bool"))
    for name, cap in caps.items():
        cp = f"{path}.capacity[{name}]"
        problem = qualified_name_problem(name)
        if problem:
            out.append((cp, problem))
        if not isinstance(cap, dict):
            out.append((cp, "must be a map with value (and requestPolicy)"))
            continue
        unknown = set(cap) - {"value", "requestPolicy"}
        if unknown:
            out.append((cp, f"unknown field(s) {sorted(unknown)}"))
        value = _quantity(
            cap.get("value", 0), f"{cp}.value", out
        )  # unset: 0, as the API server decodes it
        if "requestPolicy" in cap:
            if shared is not True:
                out.append(
                    (f"{cp}.requestPolicy", "forbidden unless allowMultipleAllocations is true")
                )
            elif value is not None:
                _policy(cap["requestPolicy"], value, f"{cp}.requestPolicy", out)
    _consumes_counters(dev.get("consumesCounters"), f"{path}.consumesCounters", out)
    return bool(dev.get("taints") or dev.get("consumesCounters") or lists)


def _counter_map(counters: Any, path: str, out: list[SliceProblem]) -> None:
    """``map[name]{value: Quantity}``: 1..32 DNS-label names (KEP-4815, dra-spec.md 1.2)."""
    if not isinstance(counters, dict) or not counters:
        out.append((path, f"required, a map of 1..{MAX_COUNTERS} counters"))
        return
    if len(counters) > MAX_COUNTERS:
        out.append((path, f"{len(counters)} counters exceed {MAX_COUNTERS}"))
    for name, c in counters.items():
        if not is_dns_label(name):
            out.append((f"{path}[{name}]", f"{name!r} is not a DNS label (<=63, a-z0-9-)"))
        if not isinstance(c, dict) or "value" not in c:
            out.append((f"{path}[{name}].value", "required"))
            continue
        _quantity(c["value"], f"{path}[{name}].value", out)


def _consumes_counters(entries: Any, path: str, out: list[SliceProblem]) -> None:
    if entries is None:
        return
    _counter_sets(entries, path, "counterSet", MAX_CONSUMES_COUNTERS, "entries", out)


def _counter_sets(
    entries: Any, path: str, key: str, limit: int, unit: str, out: list[SliceProblem]
) -> None:
    """A list of at most ``limit`` counter sets, each named by its ``key`` field (a DNS label,
    unique in the list) with a ``counters`` map: a slice's ``sharedCounters`` (``name``) and a
    device's ``consumesCounters`` (``counterSet``) follow the same rule."""
    if not isinstance(entries, list) or len(entries) > limit:
        out.append((path, f"must be a list of at most {limit} {unit}"))
        return
    seen: set[str] = set()
    for i, e in enumerate(entries):
        name = e.get(key) if isinstance(e, dict) else None
        if not is_dns_label(name):
            out.append((f"{path}[{i}].{key}", f"{name!r} is not a DNS label"))
        elif name in seen:
            out.append((f"{path}[{i}].{key}", f"duplicate counter set {name!r}"))
        else:
            seen.add(str(name))
        _counter_map(
            e.get("counters") if isinstance(e, dict) else None, f"{path}[{i}].counters", out
        )


def validate_resource_slice(obj: Any) -> list[str]:
    """:func:`resource_slice_problems` as one ``<field path>: <problem>`` string each (empty
    when the API server would accept the slice)."""
    return [f"{field}: {problem}" for field, problem in resource_slice_problems(obj)]


def resource_slice_problems(obj: Any) -> list[SliceProblem]:
    """Problems of a ``resource.k8s.io/v1`` ResourceSlice dict, one ``(field path, problem)``
    each; empty when the API server would accept it.

    Checks (dra-spec.md 1.2/1.8/1.9): apiVersion/kind; metadata.name DNS subdomain; driver DNS
    subdomain <= 63; pool name (<= 253, '/'-separated subdomains), generation >= 0,
    resourceSliceCount > 0; exactly one node selection; <= 128 devices (64 with taints,
    consumesCounters or list attributes); unique DNS-label device names; attribute/capacity
    names (C identifier <= 32, optional domain prefix); one typed value per attribute, strings
    <= 64, versions strict semver; attributes + capacities <= 32, attribute values <= 48;
    capacity values are quantities; requestPolicy only on allowMultipleAllocations devices and
    internally consistent (default, validValues, validRange min/max/step); counters
    (KEP-4815): at most 8 ``sharedCounters`` sets per slice and never beside devices, set and
    counter names DNS labels, 1..32 counters per set or consumption, at most 2
    ``consumesCounters`` entries per device with distinct sets, values quantities.
    """
    out: list[SliceProblem] = []
    if not isinstance(obj, dict):
        return [("<root>", "a ResourceSlice must be a map")]
    if obj.get("apiVersion") != "resource.k8s.io/v1":
        out.append(("apiVersion", f"{obj.get('apiVersion')!r} is not 'resource.k8s.io/v1'"))
    if obj.get("kind") != "ResourceSlice":
        out.append(("kind", f"{obj.get('kind')!r} is not 'ResourceSlice'"))
    meta = obj.get("metadata") or {}
    if not is_dns_subdomain(meta.get("name") if isinstance(meta, dict) else None):
        out.append(("metadata.name", "must be a DNS subdomain of at most 253 characters"))
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [*out, ("spec", "required")]
    if not is_dns_subdomain(spec.get("driver"), 63):
        out.append(
            ("spec.driver", f"{spec.get('driver')!r} is not a lower-case DNS subdomain <= 63")
        )
    pool = spec.get("pool")
    if not isinstance(pool, dict):
        out.append(("spec.pool", "required"))
    else:
        name = pool.get("name")
        if not (
            isinstance(name, str)
            and len(name) <= 253
            and all(is_dns_subdomain(p) for p in name.split("/"))
        ):
            out.append(("spec.pool.name", f"{name!r} is not '/'-separated DNS subdomains (<= 253)"))
        gen = pool.get("generation")
        if not isinstance(gen, int) or isinstance(gen, bool) or gen < 0:
            out.append(("spec.pool.generation", f"{gen!r} is not an integer >= 0"))
        count = pool.get("resourceSliceCount")
        if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
            out.append(("spec.pool.resourceSliceCount", f"{count!r} is not an integer > 0"))
    chosen = [k for k in _NODE_SELECTION if spec.get(k) not in (None, False, "")]
    if len(chosen) != 1:
        out.append(
            ("spec", f"exactly one of {', '.join(_NODE_SELECTION)} must be set (found {chosen})")
        )
    devices = spec.get("devices") or []
    if not isinstance(devices, list):
        return [*out, ("spec.devices", "must be a list")]
    shared = spec.get("sharedCounters")
    if devices and shared:
        out.append(("spec", "a slice carries devices or sharedCounters, not both"))
    if shared is not None:
        _counter_sets(shared, "spec.sharedCounters", "name", MAX_COUNTER_SETS, "counter sets", out)
    reduced = False
    names: set[str] = set()
    for i, dev in enumerate(devices):
        reduced = _device(dev, f"spec.devices[{i}]", out) or reduced
        name = dev.get("name") if isinstance(dev, dict) else None
        if isinstance(name, str):
            if name in names:
                out.append((f"spec.devices[{i}].name", f"duplicate device name {name!r}"))
            names.add(name)
    limit = MAX_DEVICES_WITH_COUNTERS if reduced else MAX_DEVICES
    if len(devices) > limit:
        out.append(("spec.devices", f"{len(devices)} devices exceed the limit of {limit}"))
    return out
