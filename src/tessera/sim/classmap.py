"""``--class-map FROM=TO``: run requests written for another driver's DeviceClass on another
class (``simulate``, ``explain``).

A request naming class FROM gets TO, and everything in it that reads FROM's driver is rewritten
for TO's driver: the attribute and capacity domain in its CEL selectors
(``device.attributes['gpu.nvidia.com'].profile``) and in the claim's ``constraints[]``
``matchAttribute`` / ``distinctAttribute`` (``gpu.nvidia.com/parentUUID``). From the NVIDIA DRA
driver (k8s-dra-driver-gpu, driver ``gpu.nvidia.com``) to Tessera's each attribute it publishes
is mapped to Tessera's equivalent (:data:`NVIDIA_EQUIVALENTS`); one without an equivalent is
left as it is, with a warning naming it. The devices FROM selects are kept: FROM's own
selectors (the DeviceClass given in the manifests, or the NVIDIA chart's class selectors,
``type == 'mig'`` for ``mig.nvidia.com``), rewritten the same way, go before the request's,
so that a selector reading ``profile`` never meets a full GPU (a CEL runtime error would abort
scheduling, dra-spec.md 3.2).

Pure: no I/O.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tessera import DEVICE_CLASS_NAME, DRIVER_NAME
from tessera.api.deviceclass import MIG_DEVICE_CLASS_NAME
from tessera.api.loader import Manifest
from tessera.api.requests import device_requests

NVIDIA_DRIVER = "gpu.nvidia.com"
STANDARD_DOMAIN = "resource.kubernetes.io"

#: The NVIDIA DRA driver's DeviceClasses (its Helm chart) and the device ``type`` each selects.
NVIDIA_CLASS_TYPES: dict[str, str] = {
    "gpu.nvidia.com": "gpu",
    "mig.nvidia.com": "mig",
    "vfio.gpu.nvidia.com": "vfio",
}

#: What the NVIDIA DRA driver publishes -> Tessera's equivalent, as (kind, domain, name) with
#: kind ``attributes`` or ``capacity``. ``None``: no equivalent (a warning names it). A capacity
#: whose equivalent is an int attribute (``multiprocessors``) is read as the quantity
#: ``quantity("0").add(attribute)``.
NVIDIA_EQUIVALENTS: dict[tuple[str, str, str], tuple[str, str, str] | None] = {
    **{
        ("attributes", NVIDIA_DRIVER, n): ("attributes", DRIVER_NAME, n)
        for n in (
            "productName",
            "uuid",
            "index",
            "type",
            "architecture",
            "cudaComputeCapability",
            "cudaDriverVersion",
            "driverVersion",
            "parentUUID",
            "profile",
        )
    },
    ("attributes", NVIDIA_DRIVER, "numa"): ("attributes", DRIVER_NAME, "numaNode"),
    ("attributes", STANDARD_DOMAIN, "pciBusID"): ("attributes", DRIVER_NAME, "pcieBusID"),
    ("attributes", STANDARD_DOMAIN, "pcieRoot"): ("attributes", STANDARD_DOMAIN, "pcieRoot"),
    ("capacity", NVIDIA_DRIVER, "memory"): ("capacity", DRIVER_NAME, "memory"),
    ("capacity", NVIDIA_DRIVER, "multiprocessors"): ("attributes", DRIVER_NAME, "multiprocessors"),
    **{
        ("attributes", NVIDIA_DRIVER, n): None
        for n in (
            "brand",
            "minor",
            "addressingMode",
            "deviceID",
            "vendorID",
            "iommuFDEnabled",
        )
    },
    **{
        ("capacity", NVIDIA_DRIVER, n): None
        for n in (
            "copyEngines",
            "decoders",
            "encoders",
            "jpegEngines",
            "ofaEngines",
            "addressableMemory",
        )
    },
}

# device.attributes['domain'] / device.capacity["domain"], then .name or ['name'].
_READ = re.compile(
    r"device\s*\.\s*(attributes|capacity)\s*\[\s*(['\"])([^'\"]*)\2\s*\]"
    r"(?:(\s*\.\s*)([A-Za-z_]\w*)|\s*\[\s*(['\"])([A-Za-z_]\w*)\6\s*\])?"
)
_DRIVER_EQ = re.compile(r"device\s*\.\s*driver\s*==\s*(['\"])([^'\"]+)\1")


@dataclasses.dataclass
class ClassMapping:
    """One ``FROM=TO`` mapping: the classes, the drivers whose names and domains are rewritten,
    and FROM's own selectors (CEL texts, not yet rewritten) that the requests keep."""

    source: str
    target: str
    source_driver: str
    target_driver: str
    guards: list[str]

    @property
    def nvidia_to_tessera(self) -> bool:
        return self.source_driver == NVIDIA_DRIVER and self.target_driver == DRIVER_NAME


def _class_selectors(obj: Mapping[str, Any] | None) -> list[str]:
    sels = ((obj or {}).get("spec") or {}).get("selectors") or []
    return [
        e
        for s in sels
        if isinstance(s, dict) and isinstance(e := (s.get("cel") or {}).get("expression"), str)
    ]


def class_driver(name: str, classes: Mapping[str, Mapping[str, Any]]) -> str:
    """The driver DeviceClass ``name`` selects: ``device.driver == "X"`` in its selectors
    (``classes``: the DeviceClasses of the input, by name), Tessera's for its own classes, the
    NVIDIA driver for its chart's classes, else the class name (a driver's class is often
    named after it)."""
    for expr in _class_selectors(classes.get(name)):
        m = _DRIVER_EQ.search(expr)
        if m:
            return m.group(2)
    if name in (DEVICE_CLASS_NAME, MIG_DEVICE_CLASS_NAME):
        return DRIVER_NAME
    if name in NVIDIA_CLASS_TYPES:
        return NVIDIA_DRIVER
    return name


def class_guards(name: str, classes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The selectors of DeviceClass ``name``: from the input's DeviceClass, else the NVIDIA
    chart's for its classes, else none known."""
    if name in classes:
        return _class_selectors(classes[name])
    t = NVIDIA_CLASS_TYPES.get(name)
    if t is not None:
        return [
            f"device.driver == '{NVIDIA_DRIVER}' && device.attributes['{NVIDIA_DRIVER}'].type == '{t}'"
        ]
    return []


def mapping_for(source: str, target: str, classes: Mapping[str, Mapping[str, Any]]) -> ClassMapping:
    return ClassMapping(
        source,
        target,
        class_driver(source, classes),
        class_driver(target, classes),
        class_guards(source, classes),
    )


def _equivalent(
    cm: ClassMapping, kind: str, domain: str, name: str | None, unmapped: set[str]
) -> tuple[str, str, str | None] | None:
    """(kind, domain, name) to read instead, or None to leave the read as it is."""
    if cm.nvidia_to_tessera and name is not None:
        key = (kind, domain, name)
        if key in NVIDIA_EQUIVALENTS:
            eq = NVIDIA_EQUIVALENTS[key]
            if eq is None:
                unmapped.add(f"{'capacity' if kind == 'capacity' else 'attribute'} {domain}/{name}")
                return None
            return eq
        if domain == cm.source_driver:
            unmapped.add(f"{'capacity' if kind == 'capacity' else 'attribute'} {domain}/{name}")
            return (kind, cm.target_driver, name)
        return None
    if domain == cm.source_driver:
        return (kind, cm.target_driver, name)
    return None


def map_expression(cm: ClassMapping, expr: str, unmapped: set[str]) -> str:
    """``expr`` with every attribute/capacity read of FROM's driver read from TO's instead
    (names through :data:`NVIDIA_EQUIVALENTS` for NVIDIA -> Tessera); reads with no
    equivalent are added to ``unmapped``. ``device.driver == "FROM-driver"`` becomes TO's."""

    def read(m: re.Match[str]) -> str:
        kind, q, domain = m.group(1), m.group(2), m.group(3)
        name = m.group(5) or m.group(7)
        eq = _equivalent(cm, kind, domain, name, unmapped)
        if eq is None:
            return m.group(0)
        k2, d2, n2 = eq
        if name is None:
            return f"device.{k2}[{q}{d2}{q}]"
        if kind == "capacity" and k2 == "attributes":
            # An int as a Quantity at a fixed CEL cost (quantity(string(x)) has no bound).
            return f"quantity({q}0{q}).add(device.attributes[{q}{d2}{q}].{n2})"
        if m.group(5) is not None:
            return f"device.{k2}[{q}{d2}{q}]{m.group(4)}{n2}"
        return f"device.{k2}[{q}{d2}{q}][{m.group(6)}{n2}{m.group(6)}]"

    out = _READ.sub(read, expr)
    if cm.source_driver != cm.target_driver:
        out = _DRIVER_EQ.sub(
            lambda m: (
                f"device.driver == {m.group(1)}{cm.target_driver}{m.group(1)}"
                if m.group(2) == cm.source_driver
                else m.group(0)
            ),
            out,
        )
    return out


def map_attribute(cm: ClassMapping, qualified: str, unmapped: set[str]) -> str:
    """A constraint's fully qualified attribute (``gpu.nvidia.com/parentUUID``) for TO's
    driver; as it is, and named in ``unmapped``, where there is no equivalent."""
    domain, sep, name = qualified.rpartition("/")
    if not sep:
        return qualified
    eq = _equivalent(cm, "attributes", domain, name, unmapped)
    return qualified if eq is None else f"{eq[1]}/{eq[2]}"


def map_device_classes(
    manifests: Sequence[Manifest], class_map: Mapping[str, str], notes: list[str]
) -> list[Manifest]:
    """``--class-map FROM=TO`` over ``manifests`` (see the module docstring). Returns new
    manifests (inputs untouched); appends to ``notes`` one line per changed object
    (``--class-map: FROM -> TO``) and one per attribute or capacity it reads that TO's driver
    has no equivalent for."""
    classes = {m.name: m.obj for m in manifests if m.kind == "DeviceClass"}
    mappings = {src: mapping_for(src, dst, classes) for src, dst in class_map.items()}
    out: list[Manifest] = []
    for m in manifests:
        if m.kind not in ("ResourceClaim", "ResourceClaimTemplate"):
            out.append(m)
            continue
        obj = copy.deepcopy(m.obj)
        spec = obj.get("spec") or {}
        if m.kind == "ResourceClaimTemplate":
            spec = spec.get("spec") or {}
        devices = spec.get("devices") or {}
        changed: list[str] = []
        unmapped: set[str] = set()
        used: list[ClassMapping] = []
        mapped_requests: set[str] = set()
        for r in device_requests(spec):
            for alt in r.alternatives:
                sub = alt.body  # the copy's own dict: rewritten in place
                cm = mappings.get(alt.device_class_name)
                if cm is None:
                    continue
                sub["deviceClassName"] = cm.target
                sels = [{"cel": {"expression": g}} for g in cm.guards] + list(
                    sub.get("selectors") or []
                )
                for sel in sels:
                    cel = (sel or {}).get("cel") or {}
                    if isinstance(cel.get("expression"), str):
                        cel["expression"] = map_expression(cm, cel["expression"], unmapped)
                if sels:
                    sub["selectors"] = sels
                changed.append(f"{cm.source} -> {cm.target}")
                used.append(cm)
                mapped_requests.add(r.name)
                mapped_requests.add(alt.name)  # the subrequest's "<request>/<sub>"
        for c in devices.get("constraints") or []:
            reqs = c.get("requests") or []
            if reqs and not any(q in mapped_requests for q in reqs):
                continue
            for key in ("matchAttribute", "distinctAttribute"):
                attr = c.get(key)
                if not isinstance(attr, str):
                    continue
                for cm in _unique(used):
                    new = map_attribute(cm, attr, unmapped)
                    if new != attr:
                        c[key] = new
                        break
        if changed:
            notes.append(f"{m.source}: {m.ref()}: --class-map: {', '.join(sorted(set(changed)))}")
            for u in sorted(unmapped):
                notes.append(
                    f"{m.source}: {m.ref()}: --class-map: {u} has no equivalent on "
                    f"{_unique(used)[0].target_driver} devices: left as it is (selectors reading it "
                    "match no device, or stop with a CEL runtime error; constraints on it fail)"
                )
            out.append(dataclasses.replace(m, obj=obj))
        else:
            out.append(m)
    return out


def _unique(cms: Iterable[ClassMapping]) -> list[ClassMapping]:
    seen: dict[tuple[str, str], ClassMapping] = {}
    for cm in cms:
        seen.setdefault((cm.source_driver, cm.target_driver), cm)
    return list(seen.values())
