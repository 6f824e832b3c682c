"""``tessera lint``: find mistakes in DeviceClasses, ResourceClaims and ResourceClaimTemplates
before they are applied.

Checks, each reported as a :class:`Finding` naming file, document, object and field:

* API validation (:mod:`tessera.api.validation`): wrong apiVersion, misplaced fields;
* selectors that do not compile, and selectors whose estimated worst-case cost is over the
  API server's limit (``Forbidden: too complex, exceeds cost limit``, :func:`tessera.cel.check_selector`);
* API-shape mistakes: ``device.attributes["memory"]`` (attributes are keyed by *domain*, and
  memory is a capacity), an attribute read under ``device.capacity`` or the reverse;
* ordering a Quantity or semver with ``<``/``>=`` (no such overload in Kubernetes CEL);
* domains and names no published device has (closest existing name suggested, ``difflib``);
  without a cluster, names are checked against Tessera's own device schema for
  ``gpu.tessera.dev`` and domains against known drivers;
* unguarded reads of attributes that not every device has (a runtime error aborts scheduling
  of the pod, dra-spec.md 3.2); with a cluster, by evaluating every selector on every
  published device, which also finds selectors that match no device at all;
* capacity requests naming a capacity no device publishes, ``cores`` over 100, and DeviceClass
  names that do not exist;
* with a cluster, a request for ``count`` devices that share counters (KEP-4815: placements of a
  dynamic-MIG GPU) more than any node can hold at once;
* a Pod (or a workload's pod template) whose container references two or more claims served by
  Tessera's driver (their ResourceClaims or ResourceClaimTemplates among the input): the
  container sees one claim's limits file only, and the enforcement library refuses the other
  claims' GPUs (docs/enforcement.md, section 1).

Pure: takes loaded manifests and ResourceSlice dicts, returns findings.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera import DEVICE_CLASS_NAME, DRIVER_NAME
from tessera.allocator import SliceIndex
from tessera.allocator.model import Device
from tessera.api.deviceclass import IMPLICIT_PREFIX, device_class, implicit_class
from tessera.api.loader import WORKLOAD_KINDS, Manifest
from tessera.api.pods import spec_claims, spec_containers
from tessera.api.quantity import Quantity, QuantityError
from tessera.api.requests import claim_requests
from tessera.api.validation import manifest_problems, pod_template, spec_path
from tessera.api.vendors import CONVERTED, HYGON
from tessera.cel import (
    CelCompileError,
    CelCostError,
    CelRuntimeError,
    SemverValue,
    check_selector,
    compile_selector,
)
from tessera.cel import reading as celtools

# Tessera's published device schema (src/tessera/inventory/slices.py): what a selector can read
# on a gpu.tessera.dev device, used when no cluster is given. Full GPUs and MIG devices differ.
ALWAYS_ATTRIBUTES = {"type", "productName", "unit"}
GPU_ONLY_ATTRIBUTES = {"index", "nvlinkDomain", "uuidSynthesized"}
MIG_ONLY_ATTRIBUTES = {"parentUUID", "parentIndex", "profile", "parentUUIDSynthesized"}
# Existing MIG instances only (static MIG): a dynamic-MIG placement has no instance yet.
STATIC_MIG_ATTRIBUTES = {"gpuInstanceID", "computeInstanceID"}
# Devices of dynamic-MIG GPUs only (docs/mig.md): placements, and the whole GPU's migDynamic.
DYNAMIC_MIG_ATTRIBUTES = {
    "placementStart",
    "memorySlices",
    "computeSlices",
    "mediaExtensions",
    "migDynamic",
    "migProfile",
}
# Published only when the inventory reports them (a MIG device's uuid and SM count included).
OPTIONAL_ATTRIBUTES = {
    "uuid",
    "architecture",
    "cudaComputeCapability",
    "driverVersion",
    "cudaDriverVersion",
    "pcieBusID",
    "numaNode",
    "multiprocessors",
}
VERSION_ATTRIBUTES = {"cudaComputeCapability", "driverVersion", "cudaDriverVersion"}
CAPACITIES = {"memory", "cores"}
ALL_ATTRIBUTES = (
    ALWAYS_ATTRIBUTES
    | GPU_ONLY_ATTRIBUTES
    | MIG_ONLY_ATTRIBUTES
    | STATIC_MIG_ATTRIBUTES
    | DYNAMIC_MIG_ATTRIBUTES
    | OPTIONAL_ATTRIBUTES
)


@dataclass(frozen=True)
class Finding:
    """One problem: where (``file``, ``doc`` 1-based, ``obj`` as ``Kind ns/name``, ``field``
    path), what is wrong (``problem``) and how to fix it (``fix``)."""

    file: str
    doc: int
    obj: str
    field: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.file} (document {self.doc}): {self.obj}: {self.field}: {self.problem}. fix: {self.fix}"


def _closest(name: str, options: Sequence[str] | set[str]) -> str | None:
    m = difflib.get_close_matches(name, sorted(options), n=1, cutoff=0.6)
    return m[0] if m else None


#: Distinct selectors (and HAMi request shapes) whose findings a world keeps; past it the
#: cache starts again. A run of ``lint`` rarely has more; the webhook's world lives until the
#: slices change and sees every user's selectors (UUID lists make each one distinct).
FINDINGS_CACHE = 4096


class _World:
    """What devices exist: from ResourceSlices when given, else Tessera's schema."""

    def __init__(
        self, slices: Sequence[Mapping[str, Any]], classes: Mapping[str, Mapping[str, Any]]
    ) -> None:
        self.index = SliceIndex(slices) if slices else None
        self.devices: list[Device] = list(self.index.devices()) if self.index else []
        self.published = bool(self.devices)
        self.classes = classes
        self.class_members: dict[str, list[Device]] = {}  # _class_devices, computed once per class
        self.selector_findings: dict[tuple[str, str | None], list[tuple[str, str]]] = {}
        self.hami_findings: dict[str, list[tuple[str, str, str]]] = {}
        self.attrs: dict[str, dict[str, list[Device]]] = {}
        self.caps: dict[str, dict[str, list[Device]]] = {}
        self.versions: set[str] = set()
        self.by_domain: dict[str, list[Device]] = {}
        for d in self.devices:
            for k, v in d.attributes.items():
                dom, _, name = k.rpartition("/")
                self.attrs.setdefault(dom, {}).setdefault(name, []).append(d)
                if isinstance(v, SemverValue):
                    self.versions.add(k)
            for k in d.capacity:
                dom, _, name = (k if "/" in k else f"{d.driver}/{k}").rpartition("/")
                self.caps.setdefault(dom, {}).setdefault(name, []).append(d)
        for dom in set(self.attrs) | set(self.caps):
            self.by_domain[dom] = [
                d
                for d in self.devices
                if any(k.rpartition("/")[0] == dom for k in d.attributes) or d.driver == dom
            ]
        if not self.published:
            self.attrs = {DRIVER_NAME: {a: [] for a in ALL_ATTRIBUTES}}
            self.caps = {DRIVER_NAME: {c: [] for c in CAPACITIES}}
            self.versions = {f"{DRIVER_NAME}/{a}" for a in VERSION_ATTRIBUTES}
        self.domains = set(self.attrs) | set(self.caps) | {DRIVER_NAME}
        for cls in classes.values():
            for s in (cls.get("spec") or {}).get("selectors") or []:
                expr = ((s or {}).get("cel") or {}).get("expression") or ""
                for c in celtools.comparisons(expr):
                    if "device.driver" in celtools.text_of(c.left, expr) and c.op == "==":
                        lit = celtools.string_literal(c.right)
                        if lit:
                            self.domains.add(lit)

    def capacity_domain(self, name: str) -> str:
        for dom, names in self.caps.items():
            if name in names:
                return dom
        return DRIVER_NAME


@dataclass
class _Sel:
    """One selector to lint: its expression and where it lives."""

    m: Manifest
    field: str
    expression: str
    class_name: str | None  # the request's class (None for a DeviceClass's own selectors)


def _selectors_of(m: Manifest) -> Iterator[tuple[str, dict[str, Any]]]:
    """(field path of the request or class, request body) for everything holding selectors."""
    if m.kind == "DeviceClass":
        yield "spec", (m.obj.get("spec") or {})
        return
    base = "spec" if m.kind == "ResourceClaim" else "spec.spec"
    for r in claim_requests(m.obj):
        for alt in r.alternatives:
            yield f"{base}.{alt.field}", alt.body
        if not r.alternatives and r.body.get("deviceClassName"):  # v1beta1: the request itself
            yield f"{base}.devices.requests[{r.index}]", r.body


class LintWorld(_World):
    """The devices :func:`lint` checks against, indexed once: build it from the cluster's
    ResourceSlice dicts (and DeviceClasses by name; Tessera's ``gpu.tessera.dev`` is always
    known) and pass it as ``lint(..., world=...)`` while the slices do not change (``tessera
    webhook`` lints each new template shape against the slices it watches). Its caches (each
    class's devices, each selector's findings) fill as it is used: not thread-safe, one
    :func:`lint` at a time."""

    def __init__(
        self,
        slices: Sequence[Mapping[str, Any]],
        classes: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        known = dict(classes or {})
        known.setdefault(DEVICE_CLASS_NAME, device_class())
        super().__init__(slices, known)


def lint(
    manifests: Sequence[Manifest],
    slices: Sequence[Mapping[str, Any]] = (),
    *,
    world: LintWorld | None = None,
) -> list[Finding]:
    """Findings for every object in ``manifests``, in input order: first what the API server
    would refuse in any object (:func:`tessera.api.validation.manifest_problems`, the judgement
    ``simulate`` and ``explain`` make too), then for valid DeviceClasses, ResourceClaims and
    ResourceClaimTemplates the checks above, and for valid Pods and workloads what the HAMi
    conversion refuses (``nvidia.com/gpumem: "4Gi"``, negative values). An invalid object is
    reported and not linted further; every other object still is. ``slices``: ResourceSlice
    dicts of the cluster (valid ResourceSlices among ``manifests`` are added); without any,
    names are checked against Tessera's schema. ``world``: a prepared :class:`LintWorld` used
    instead of ``slices`` and of the manifests' own DeviceClasses and ResourceSlices."""
    problems = {id(m): manifest_problems(m) for m in manifests}
    valid = [m for m in manifests if not problems[id(m)]]
    if world is None:
        classes: dict[str, Mapping[str, Any]] = {
            m.name: m.obj for m in valid if m.kind == "DeviceClass"
        }
        world = LintWorld(
            list(slices) + [m.obj for m in valid if m.kind == "ResourceSlice"], classes
        )
    claim_objs: dict[tuple[str, str, str], Manifest] = {
        (m.kind, m.namespace, m.name): m
        for m in valid
        if m.kind in ("ResourceClaim", "ResourceClaimTemplate")
    }
    out: list[Finding] = []
    for m in manifests:

        def add(field: str, problem: str, fix: str, m: Manifest = m) -> None:
            out.append(Finding(m.source.file, m.source.doc, m.ref(), field, problem, fix))

        for fp in problems[id(m)]:
            problem, fix = _split_fix(fp.message)
            add(fp.field, problem, fix)
        if problems[id(m)]:
            continue
        if m.kind == "Node":
            _check_hami_node(add, m)
            continue
        if m.kind == "Pod" or m.kind in WORKLOAD_KINDS:
            _check_hami(add, m, world)
            _check_extended(add, m, world)
            _check_tessera_claims_per_container(add, m, world, claim_objs)
            continue
        if m.kind not in ("DeviceClass", "ResourceClaim", "ResourceClaimTemplate"):
            continue
        for path, body in _selectors_of(m):
            cls_name = body.get("deviceClassName") if m.kind != "DeviceClass" else None
            if m.kind != "DeviceClass":
                _check_request(add, path, body, world)
                _check_counters(add, path, body, world)
            for i, s in enumerate(body.get("selectors") or []):
                expr = (
                    ((s or {}).get("cel") or {}).get("expression") if isinstance(s, dict) else None
                )
                if isinstance(expr, str) and expr.strip():
                    _check_selector(
                        add, f"{path}.selectors[{i}].cel.expression", expr, world, cls_name
                    )
    return out


def _check_hami_node(add: Any, m: Manifest) -> None:
    """A Node's HAMi register annotation, read as ``simulate`` reads it (one judgement:
    :func:`tessera.inventory.node.node_register_slices`)."""
    from tessera.api.errors import ManifestError
    from tessera.inventory.node import node_register_slices

    try:
        node_register_slices(m)
    except ManifestError as e:
        add(
            e.field or "metadata.annotations",
            e.message,
            "write what HAMi's device plugin writes: its JSON list of "
            "{id, index, count, devmem, devcore, type, numa, mode, health}",
        )


def _check_hami(add: Any, m: Manifest, world: _World) -> None:
    """What the HAMi conversion refuses in a Pod (or a workload's pod template)."""
    from tessera.convert import ConversionError, convert_pod, mentions_hami

    template, path = pod_template(m.obj, m.kind)
    if template is None:
        return
    base = spec_path(path)
    if m.kind == "Pod":
        pod = m.obj
    else:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**(template.get("metadata") or {}), "name": m.name or "workload"},
            "spec": template.get("spec"),
        }
    if not mentions_hami(pod):
        return  # nothing to convert: the conversion refuses nothing (its warnings are simulate's)
    spec = pod.get("spec") or {}
    # Pods that differ only in name convert alike: convert each shape once.
    key = json.dumps(
        [
            spec,
            (pod.get("metadata") or {}).get("annotations"),
            (pod.get("metadata") or {}).get("labels"),
        ],
        sort_keys=True,
        default=str,
    )
    cached = world.hami_findings.get(key)
    if cached is not None:
        for f in cached:
            add(*f)
        return
    found: list[tuple[str, str, str]] = []
    if len(world.hami_findings) >= FINDINGS_CACHE:
        world.hami_findings.clear()
    world.hami_findings[key] = found
    sizes = sorted(
        {
            int(d.capacity["memory"].value.value)
            for d in world.devices
            if "memory" in d.capacity and d.driver == DRIVER_NAME
        },
        reverse=True,
    )
    # Other vendors' requests are checked as if their drivers were installed (the values HAMi
    # refuses are refused either way); a Hygon cores percentage needs the cards' compute units,
    # known only from a cluster's dra.hygon.com devices.
    units = sorted(
        {
            int(d.capacity["cores"].value.value)
            for d in world.devices
            if "cores" in d.capacity and d.driver == HYGON.driver
        },
        reverse=True,
    )
    try:
        convert_pod(
            pod,
            memory_sizes=sizes or [80 * 2**30],
            vendors=[v.key for v in CONVERTED],
            compute_units=units,
        )
    except ConversionError as e:
        if not units and e.field in {f.cores for f in HYGON.hami}:
            return  # a percentage of cards this input does not describe: not a mistake
        field = base
        for part in ("initContainers", "containers"):
            for i, c in enumerate(spec.get(part) or []):
                if e.container and c.get("name") == e.container:
                    field = f"{base}.{part}[{i}].resources"
                    if e.field:
                        field += f"[{e.field}]" if "/" in e.field else f".{e.field}"
        text = str(e)
        head = f"pod {e.pod}" + (f", container {e.container}" if e.container else "") + ": "
        text = text.split(head, 1)[1] if head in text else text
        problem, fix = _split_fix(text)
        if fix.startswith("correct the field"):
            problem, _, rest = text.partition("; ")
            fix = rest or "see docs/convert.md for the values HAMi accepts"
        found.append((field, problem, fix))
        add(field, problem, fix)


def _check_extended(add: Any, m: Manifest, world: _World) -> None:
    """An implicit extended resource ``deviceclass.resource.kubernetes.io/<class>`` (KEP-5004)
    naming a DeviceClass that does not exist: no device plugin can advertise such a name, so
    the pod would stay pending ("Insufficient")."""
    template, path = pod_template(m.obj, m.kind)
    if template is None:
        return
    spec = template.get("spec")
    if not isinstance(spec, Mapping):
        return
    base = spec_path(path)
    for part in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(part) or []):
            res = (c or {}).get("resources") if isinstance(c, Mapping) else None
            if not isinstance(res, Mapping):
                continue
            for block in ("limits", "requests"):
                names = res.get(block)
                if not isinstance(names, Mapping):
                    continue
                for name in names:
                    cls = implicit_class(str(name))
                    if cls is None or cls in world.classes:
                        continue
                    near = _closest(cls, set(world.classes))
                    add(
                        f"{base}.{part}[{i}].resources.{block}[{name}]",
                        f"DeviceClass {cls!r} does not exist, so nothing serves {name} and the pod "
                        f"stays pending (known: {', '.join(sorted(world.classes))})",
                        f"use {IMPLICIT_PREFIX}{near}"
                        if near
                        else "name an existing DeviceClass or add its manifest to the input",
                    )


def _tessera_class(world: _World, name: Any) -> bool:
    """Whether DeviceClass ``name`` hands out devices of Tessera's driver: Tessera's own class,
    or a class in the input whose selectors compare ``device.driver`` with it."""
    if name == DEVICE_CLASS_NAME:
        return True
    cls = world.classes.get(name) if isinstance(name, str) else None
    if not cls:
        return False
    for s in (cls.get("spec") or {}).get("selectors") or []:
        expr = ((s or {}).get("cel") or {}).get("expression") or ""
        for c in celtools.comparisons(expr):
            if (
                "device.driver" in celtools.text_of(c.left, expr)
                and c.op == "=="
                and celtools.string_literal(c.right) == DRIVER_NAME
            ):
                return True
    return False


def _check_tessera_claims_per_container(
    add: Any, m: Manifest, world: _World, claim_objs: Mapping[tuple[str, str, str], Manifest]
) -> None:
    """A container that references two or more claims served by Tessera's driver.

    Each claim's CDI spec mounts its limits file at the one fixed path, so the container sees
    the last claim's only (CDI replaces a mount of the same destination), and the enforcement
    library refuses the GPUs of the others. A claim is Tessera's when its ResourceClaim or
    ResourceClaimTemplate is among the input and one of its requests names a Tessera class
    (:func:`_tessera_class`); claims not in the input are not judged."""
    template, path = pod_template(m.obj, m.kind)
    spec, base = (template or {}).get("spec"), spec_path(path)
    if not isinstance(spec, dict):
        return
    ns = m.namespace
    served: dict[str, str] = {}  # pod claim name -> the object that makes it
    for pc in spec_claims(spec):
        if not pc.name:
            continue
        if pc.claim_name:
            key = ("ResourceClaim", ns, pc.claim_name)
        elif pc.template_name:
            key = ("ResourceClaimTemplate", ns, pc.template_name)
        else:
            continue
        obj = claim_objs.get(key)
        if obj is not None and any(
            _tessera_class(world, body.get("deviceClassName")) for _, body in _selectors_of(obj)
        ):
            served[pc.name] = f"{key[0]} {key[1]}/{key[2]}"
    if len(served) < 2:
        return
    for c in spec_containers(spec):
        names: list[str] = []
        for ref in c.claims:
            if ref.name in served and ref.name not in names:
                names.append(ref.name)
        if len(names) < 2:
            continue
        listed = ", ".join(f"{n} ({served[n]})" for n in names)
        add(
            f"{base}.{c.field.removeprefix('spec.')}.resources.claims",
            f"container {c.body.get('name')!r} references {len(names)} claims served by "
            f"{DRIVER_NAME}: {listed}; the container sees the limits file of one of them "
            "only, and the enforcement library refuses the GPUs of the others",
            "one ResourceClaim with several requests, or one claim per container",
        )


def _split_fix(message: str) -> tuple[str, str]:
    """Validation messages carry their fix after ': ' or in '(... : fix)'; split them."""
    if "(found 'expression' beside 'cel': " in message:
        head, _, fix = message.partition(" (found 'expression' beside 'cel': ")
        return f"{head}; found 'expression' beside 'cel'", fix.rstrip(")")
    for marker in (": write ", ": use ", ": name ", ": did you mean ", ": it belongs under "):
        if marker in message:
            head, _, fix = message.partition(marker)
            return head, marker[2:] + fix
    return message, "correct the field as the message says (the Kubernetes API's rules for it)"


def _check_request(add: Any, path: str, body: Mapping[str, Any], world: _World) -> None:
    cls = body.get("deviceClassName")
    if isinstance(cls, str) and cls and cls not in world.classes:
        near = _closest(cls, set(world.classes))
        known = ", ".join(sorted(world.classes))
        add(
            f"{path}.deviceClassName",
            f"DeviceClass {cls!r} does not exist (known: {known})",
            f"use {near!r}"
            if near
            else "name an existing DeviceClass or add its manifest to the input",
        )
    reqs = (
        (body.get("capacity") or {}).get("requests")
        if isinstance(body.get("capacity"), dict)
        else None
    )
    if not isinstance(reqs, dict):
        return
    published: set[str] = set()
    if world.published:
        cands = _class_devices(world, cls) if isinstance(cls, str) else world.devices
        for d in cands:
            published |= set(d.capacity)
    elif cls == DEVICE_CLASS_NAME:
        published = set(CAPACITIES)
    for k, v in reqs.items():
        where = f"{path}.capacity.requests[{k}]"
        if published and k not in published:
            near = _closest(str(k), published)
            add(
                where,
                f"no device{' of class ' + str(cls) if cls else ''} publishes a capacity {k!r} "
                f"(published: {', '.join(sorted(published))}); no device can satisfy this request",
                f"use {near!r}" if near else "request a published capacity",
            )
        try:
            amount = Quantity.parse(v, beyond_int64=True)
        except QuantityError:
            continue
        if amount.value < 0:
            add(
                where,
                f"{amount.canonical()} is negative: the API server accepts it, but the scheduler "
                "refuses to allocate the claim (Kubernetes v1.37: 'capacity value is negative')",
                "ask for a positive amount, or leave the capacity out to get the default",
            )
            continue
        if world.published and k in published:
            with_cap = [d for d in cands if k in d.capacity]
            biggest = max(with_cap, key=lambda d: d.capacity[k].value.value)
            top = biggest.capacity[k].value
            if amount.value > top.value:
                add(
                    where,
                    f"{amount.canonical()} is more than any device has: the largest {k} of a matching device is "
                    f"{top.canonical()} ({'/'.join(biggest.id)}); no device can satisfy this request",
                    f"ask for at most {top.canonical()} per device, or use several devices (count: N)",
                )
        if str(k).rpartition("/")[2] == "cores":
            q = amount
            if q.value > 100:
                add(
                    where,
                    f"cores {q.canonical()} is over 100: cores is percent of one GPU's SMs (0-100)",
                    "ask for at most 100 per device, and count: N for several GPUs",
                )


def _check_counters(add: Any, path: str, body: Mapping[str, Any], world: _World) -> None:
    """A request for ``count`` devices that share counters (KEP-4815: MIG placements of one
    dynamic-MIG GPU, compute instances of one GPU instance) may ask more than any node can hold
    at once, even though enough devices match: say how many fit together at most, and which
    counters limit them (``memory slices of gpu-0``). Only with a cluster, for ExactCount."""
    if world.index is None or body.get("allocationMode", "ExactCount") != "ExactCount":
        return
    count = body.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 2:
        return
    cls = body.get("deviceClassName")
    cands = _class_devices(world, cls) if isinstance(cls, str) else world.devices
    sels = []
    for s in body.get("selectors") or []:
        expr = ((s or {}).get("cel") or {}).get("expression") if isinstance(s, dict) else None
        try:
            sels.append(compile_selector(str(expr)))
        except CelCompileError:
            return  # reported by the selector checks
    matching: dict[tuple[str, str], list[Device]] = {}
    for d in cands:
        try:
            if all(sel.evaluate(d.activation()) for sel in sels):
                matching.setdefault((d.driver, d.pool), []).append(d)
        except CelRuntimeError:
            continue
    if not any(d.consumes_counters for devs in matching.values() for d in devs):
        return
    from tessera.allocator import AllocatedState
    from tessera.scheduler.usage import counter_usage

    usage = counter_usage(world.index, AllocatedState())
    best: tuple[int, tuple[str, str], list[str]] = (0, ("", ""), [])
    for key, devs in matching.items():
        if len(devs) < count:
            continue
        together, limits = _most_together(devs, usage)
        if together >= count:
            return  # this pool can take them
        if together > best[0] or not best[1][1]:
            best = (together, key, limits)
    if best[1][1]:
        together, (_, pool), limits = best
        add(
            f"{path}.count",
            f"{count} devices asked, but at most {together} of the devices matching this request can be "
            f"allocated together on one node ({pool}): they consume shared counters ({'; '.join(limits)})",
            f"ask for at most {together}, or split the request over claims (one per GPU)",
        )


def _most_together(
    devs: Sequence[Device], usage: Mapping[tuple[str, str, str], Any]
) -> tuple[int, list[str]]:
    """How many of ``devs`` (one pool) can be allocated at once given the counters they consume,
    and the counter sets that limit them. Devices of different counter sets are independent; per
    set an exact search over what is left (a set holds a few dozen MIG placements at most)."""
    by_set: dict[str, list[dict[str, Any]]] = {}
    free = 0
    for d in devs:
        if not d.consumes_counters:
            free += 1
            continue
        (cs, vals), *rest = d.consumes_counters
        if rest:
            free += 1  # several sets: not modelled here, counted as fitting
            continue
        by_set.setdefault(cs, []).append(dict(vals))
    total = free
    limits: list[str] = []
    for cs, needs in sorted(by_set.items()):
        u = usage.get((devs[0].driver, devs[0].pool, cs))
        if u is None:
            continue
        names = sorted({c for n in needs for c in n})
        start = tuple(u.available.get(c, 0) for c in names)
        vecs = [tuple(n.get(c, 0) for c in names) for n in needs]
        memo: dict[tuple[int, tuple[Any, ...]], int] = {}

        def most(
            i: int,
            left: tuple[Any, ...],
            vecs: list[tuple[Any, ...]] = vecs,
            memo: dict[tuple[int, tuple[Any, ...]], int] = memo,
        ) -> int:
            if i == len(vecs):
                return 0
            key = (i, left)
            if key not in memo:
                skip = most(i + 1, left)
                take = 0
                if all(a >= b for a, b in zip(left, vecs[i], strict=True)):
                    take = 1 + most(i + 1, tuple(a - b for a, b in zip(left, vecs[i], strict=True)))
                memo[key] = max(skip, take)
            return memo[key]

        n = most(0, start)
        total += n
        if n < len(needs):
            from tessera.inventory.mig import summarize_counters

            limits.append(f"counter set {u.name}: {summarize_counters(u.published)}")
    return total, limits


def _class_devices(world: _World, cls: str) -> list[Device]:
    c = world.classes.get(cls)
    if c is None:
        return world.devices
    known = world.class_members.get(cls)
    if known is not None:
        return known
    out: list[Device] = []
    for d in world.devices:
        ok = True
        for s in (c.get("spec") or {}).get("selectors") or []:
            expr = ((s or {}).get("cel") or {}).get("expression") or ""
            try:
                ok = compile_selector(expr).evaluate(d.activation())
            except (CelCompileError, CelRuntimeError):
                ok = False
            if not ok:
                break
        if ok:
            out.append(d)
    world.class_members[cls] = out
    return out


def _check_selector(add: Any, field: str, expr: str, world: _World, cls: str | None) -> None:
    # The same expression in many objects (one per generated template) is analysed once.
    key = (expr, cls)
    cached = world.selector_findings.get(key)
    if cached is None:
        found: list[tuple[str, str]] = []

        def add_here(f: str, problem: str, fix: str) -> None:
            found.append((problem, fix))

        _static(add_here, field, expr, world)
        if world.published and not found:
            _evaluate(add_here, field, expr, world, cls)
        if len(world.selector_findings) >= FINDINGS_CACHE:
            world.selector_findings.clear()  # a long-lived world (the webhook's) stays bounded
        cached = world.selector_findings[key] = found
    for problem, fix in cached:
        add(field, problem, fix)


def _static(add: Any, field: str, expr: str, world: _World) -> None:
    try:
        check_selector(expr)
    except CelCostError as e:
        add(
            field,
            f"Forbidden: {e} ({e.detail}; the API server rejects the object)",
            "bound the work: iterate over fewer or smaller lists, avoid nested macros over large ranges",
        )
    except CelCompileError as e:
        msg = str(e)
        if not msg.startswith("found no matching overload for '_<") and not msg.startswith(
            "found no matching overload for '_>"
        ):
            add(
                field,
                f"does not compile: {msg}",
                "correct the expression (Kubernetes CEL syntax, one variable: device)",
            )
        else:
            # Ordering Quantity/semver values: the checks below say which and how to write it.
            generic: list[tuple[str, str, str]] = []
            _static_reads(lambda f, p, x: generic.append((f, p, x)), field, expr, world)
            if not generic:
                add(
                    field,
                    f"does not compile: {msg}",
                    "correct the expression (Kubernetes CEL syntax, one variable: device)",
                )
            for g in generic:
                add(*g)
            return
        if celtools.parse(expr) is None:
            return
    _static_reads(add, field, expr, world)


def _static_reads(add: Any, field: str, expr: str, world: _World) -> None:
    reads = celtools.reads(expr)
    guarded = {(r.kind, r.domain, r.name) for r in reads if r.in_has}
    shape_reads: set[int] = set()
    for r in reads:
        if r.domain is None:
            continue
        if r.kind == "attributes" and "." not in r.domain and r.domain not in world.domains:
            shape_reads.add(id(r.node))
            add(field, *_shape_message(r, expr, world))
            continue
        if r.domain not in world.domains:
            near = _closest(r.domain, world.domains)
            if world.published or near:
                add(
                    field,
                    f"`{r.text}`: no device publishes domain {r.domain!r}; an unknown domain reads as an empty map, "
                    "so "
                    + (
                        f"`.{r.name}` is a runtime error (no such key) that aborts scheduling"
                        if r.name
                        else "nothing is found"
                    ),
                    f"write device.{r.kind}[{_q(near)}]"
                    if near
                    else f"use a published domain ({', '.join(sorted(world.domains))})",
                )
            continue
        if r.name is None:
            continue
        names = (
            world.attrs.get(r.domain, {})
            if r.kind == "attributes"
            else world.caps.get(r.domain, {})
        )
        other = (
            world.caps.get(r.domain, {})
            if r.kind == "attributes"
            else world.attrs.get(r.domain, {})
        )
        known = r.kind == "attributes" and r.domain == DRIVER_NAME and r.name in ALL_ATTRIBUTES
        if known and (r.in_has or (r.kind, r.domain, r.name) in guarded):
            continue  # a Tessera attribute these devices lack (MIG's parentUUID...), read guarded
        if names and r.name not in names:
            if r.name in other:
                if r.kind == "attributes":
                    add(
                        field,
                        f"`{r.text}`: {r.name} is a capacity, not an attribute (a Quantity under device.capacity)",
                        _capacity_fix(r, expr, r.domain),
                    )
                else:
                    add(
                        field,
                        f"`{r.text}`: {r.name} is an attribute, not a capacity",
                        f"write device.attributes[{_q(r.domain)}].{r.name}",
                    )
            else:
                near = _closest(r.name, set(names))
                add(
                    field,
                    f"`{r.text}`: no device publishes {r.kind[:-1] if r.kind == 'attributes' else 'capacity'} "
                    f"{r.domain}/{r.name}; reading it is a runtime error (no such key) that aborts scheduling",
                    f"write device.{r.kind}[{_q(r.domain)}].{near}"
                    if near
                    else f"use one of: {', '.join(sorted(names))}",
                )
            continue
        if r.in_has or (r.kind, r.domain, r.name) in guarded or world.published:
            continue  # with published devices, the evaluation below is exact
        if r.kind == "attributes" and r.domain == DRIVER_NAME and r.name not in ALWAYS_ATTRIBUTES:
            if r.name in GPU_ONLY_ATTRIBUTES:
                lacking = f"MIG devices publish no {r.name}"
            elif r.name in MIG_ONLY_ATTRIBUTES:
                lacking = f"full GPUs publish no {r.name}"
            elif r.name in STATIC_MIG_ATTRIBUTES:
                lacking = f"only existing MIG instances publish {r.name} (full GPUs and dynamic-MIG placements do not)"
            elif r.name in DYNAMIC_MIG_ATTRIBUTES:
                lacking = f"only the devices of dynamic-MIG GPUs publish {r.name}"
            else:
                lacking = f"{r.name} is published only where the GPU inventory reports it"
            add(
                field,
                f"`{r.text}` is read without has(): {lacking}, and reading it on a device without it is a "
                "runtime error that aborts scheduling of the pod",
                f"guard it: has({r.text}) && ...",
            )
    for c in celtools.comparisons(expr):
        if c.op not in ("<", "<=", ">", ">="):
            continue
        kinds = [_operand_type(x, expr, world) for x in (c.left, c.right)]
        sides = [celtools.read_of(x, expr) for x in (c.left, c.right)]
        if any(sr is not None and id(sr.node) in shape_reads for sr in sides):
            continue
        t = next((k for k in kinds if k), None)
        if t is None:
            continue
        lt, rt = celtools.text_of(c.left, expr), celtools.text_of(c.right, expr)
        add(
            field,
            f"`{c.text}` orders {t} values with {c.op}: Kubernetes CEL has no such overload (the API server "
            "rejects it)",
            f"write {lt}.compareTo({rt}) {c.op} 0",
        )


def _q(s: str | None) -> str:
    return f'"{s}"'


def _capacity_fix(r: celtools.Read, expr: str, domain: str) -> str:
    name = r.name if r.kind == "attributes" and r.domain == domain else r.domain
    target = f"device.capacity[{_q(domain)}].{name}"
    for c in celtools.comparisons(expr):
        for side, other in ((c.left, c.right), (c.right, c.left)):
            sr = celtools.read_of(side, expr)
            if sr is not None and sr.node is r.node:
                rhs = re.sub(
                    r"quantity\('([^'\"]*)'\)", r'quantity("\1")', celtools.text_of(other, expr)
                )
                if not rhs.startswith("quantity("):
                    rhs = f"quantity({_q(rhs)})" if rhs.isdigit() else rhs
                op = (
                    c.op
                    if side is c.left
                    else {"<": ">", "<=": ">=", ">": "<", ">=": "<="}.get(c.op, c.op)
                )
                if op in ("==", "!="):
                    return f"write {target} {op} {rhs}"
                return f"write {target}.compareTo({rhs}) {op} 0"
    return f'write {target}.compareTo(quantity("40Gi")) >= 0'


def _shape_message(r: celtools.Read, expr: str, world: _World) -> tuple[str, str]:
    key = r.domain or ""
    if key in {n for names in world.caps.values() for n in names} or key in CAPACITIES:
        dom = world.capacity_domain(key)
        return (
            f"`{r.text}` reads attribute domain {key!r}: device.attributes is keyed by domain "
            f"(e.g. {dom}), and {key} is a capacity (a Quantity under device.capacity), not an attribute",
            _capacity_fix(r, expr, dom),
        )
    attr_domains = [dom for dom, names in world.attrs.items() if key in names]
    if attr_domains:
        dom = attr_domains[0]
        return (
            f"`{r.text}` reads attribute domain {key!r}: device.attributes is keyed by domain (e.g. {dom}), "
            f"then by attribute name",
            f"write device.attributes[{_q(dom)}].{key}",
        )
    return (
        f"`{r.text}`: {key!r} is not a domain; device.attributes is keyed by domain (a DNS name such as {DRIVER_NAME})",
        f'write device.attributes["<domain>"].<name>, e.g. device.attributes["{DRIVER_NAME}"].productName',
    )


def _operand_type(node: Any, expr: str, world: _World) -> str | None:
    call = celtools.call_name(node)
    if call in ("quantity", ".add", ".sub"):
        return "Quantity"
    if call == "semver":
        return "semver"
    r = celtools.read_of(node, expr)
    if r is not None and r.domain and r.name:
        if r.kind == "capacity":
            return "Quantity"
        if f"{r.domain}/{r.name}" in world.versions:
            return "semver"
    return None


def _evaluate(add: Any, field: str, expr: str, world: _World, cls: str | None) -> None:
    """Evaluate the selector on every published device (a request's selector only on devices
    its class selects, as the allocator does): runtime errors, and no device matching."""
    try:
        sel = compile_selector(expr)
    except CelCompileError:
        return
    devices = _class_devices(world, cls) if cls else world.devices
    errors: list[tuple[Device, str]] = []
    matched = 0
    for d in devices:
        try:
            if sel.evaluate(d.activation()):
                matched += 1
        except CelRuntimeError as e:
            errors.append((d, str(e)))
    if errors:
        d, msg = errors[0]
        hint = (
            "guard the read with has(...) so devices without it simply do not match"
            if "no such key" in msg
            else "fix the expression"
        )
        add(
            field,
            f"CEL runtime error on {len(errors)} of {len(devices)} devices (e.g. {'/'.join(d.id)}: {msg}); "
            "a runtime error aborts scheduling of the pod",
            hint,
        )
    elif devices and matched == 0:
        scope = (
            f"of the {len(devices)} devices of class {cls}"
            if cls
            else f"of the {len(devices)} published devices"
        )
        add(
            field,
            f"matches none {scope}",
            "check the values against the ResourceSlices (tessera explain shows the false sub-expression)",
        )
