"""HAMi-style container requests -> ``resource.k8s.io/v1`` ResourceClaimTemplates.

:func:`convert_pod` is pure: it reads a Pod dict and returns a new Pod dict plus the templates
it needs. The mutating webhook and ``tessera simulate`` both call it, so a HAMi manifest gets the
same claim in the cluster and in the simulator. ``docs/convert.md`` has the full table of HAMi
inputs and Tessera claims, and every deliberate divergence from HAMi.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tessera import (
    COMPUTE_POLICIES,
    CONFIG_API_VERSION,
    CONFIG_KIND,
    DEVICE_CLASS_NAME,
    DRIVER_NAME,
)
from tessera.api import vendors as vendor_table
from tessera.api.errors import TesseraError
from tessera.api.quantity import Format, Quantity, QuantityError

from . import cel, hami
from .names import dns_label, dns_subdomain, short_hash

MIB = 2**20
MAX_GPUS_PER_CONTAINER = 32  # a claim's allocation holds at most 32 results (dra-spec 1.9)
MAX_SUBREQUESTS = 8  # firstAvailable subrequests per request (dra-spec 1.9)
MAX_GPUMEM_MIB = 2**31 - 1  # HAMi: gpumem must fit an int32 (hami.md 1.3)
REQUEST_NAME = "gpu"
MANAGED_BY = "tessera"
HAMI_REQUEST_ANNOTATION = f"{DRIVER_NAME}/hami-request"
CONTAINER_ANNOTATION = f"{DRIVER_NAME}/container"

_PLAIN_INT = re.compile(r"^[+-]?[0-9]+$")
# Digits of 2^63-1, the largest value a Kubernetes quantity (and HAMi's int64 fields) holds.
_INT64_DIGITS = 19


def _short(text: str) -> str:
    """``text`` quoted, its middle elided when longer than 40 characters (a 5,000-digit value)."""
    if len(text) <= 40:
        return repr(text)
    return repr(f"{text[:16]}...{text[-8:]}") + f" ({len(text):,} characters)"


_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


class ConversionError(TesseraError, ValueError):
    """A HAMi request cannot be converted. One line: the pod, the container (if any), the
    resource or annotation, what is wrong and how to fix it.

    ``pod`` (``namespace/name``), ``container`` and ``field`` are also kept as attributes.
    """

    def __init__(
        self, message: str, *, pod: str = "", container: str = "", field: str = ""
    ) -> None:
        super().__init__(message)
        self.pod = pod
        self.container = container
        self.field = field


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """One container's GPU request in HAMi's own terms, after HAMi's defaults were applied.

    * ``gpus``: physical GPUs (``nvidia.com/gpu``), each a distinct device; 1..32.
    * ``memory_mib``: MiB per GPU (``nvidia.com/gpumem``), or ``None``.
    * ``memory_percentage``: percent of each GPU's memory, 1..100, or ``None``; exactly one of
      ``memory_mib`` / ``memory_percentage`` is set, and 100 means the whole memory.
    * ``cores``: percent of each GPU's SMs, 0..100 (0 = no compute reservation).
    * ``priority``: ``nvidia.com/priority`` if given (recorded, not enforced).
    * ``family``: ``"nvidia"`` or ``"volcano"`` (which resource names were used).
    * ``init``: the container is an initContainer.
    * ``claim_name`` / ``template_name``: the pod claim and ResourceClaimTemplate it got.
    * ``policy``: the compute policy (``strict`` / ``work-conserving``) HAMi's
      ``GPU_CORE_UTILIZATION_POLICY`` maps to (:func:`core_policy`).
    * ``vendor``: the vendor table's key of the driver the claim is for (``tessera`` for
      NVIDIA's HAMi resources; ``ascend``, ``hygon``: :mod:`tessera.api.vendors`); for those
      ``gpus`` counts their devices, ``memory_mib`` is what the claim books (after Ascend's
      template rounding; None with ``memory_percentage`` 100: the whole memory) and ``cores``
      stays HAMi's percentage (the claim carries it in the driver's unit).
    * ``template``: the Ascend vNPU template the memory was rounded up to ("" when none).
    """

    container: str
    gpus: int
    memory_mib: int | None
    memory_percentage: int | None
    cores: int
    priority: int | None = None
    family: str = "nvidia"
    init: bool = False
    claim_name: str = ""
    template_name: str = ""
    policy: str = COMPUTE_POLICIES[1]
    vendor: str = vendor_table.TESSERA.key
    template: str = ""

    @property
    def whole_memory(self) -> bool:
        """The request books each GPU's whole memory."""
        return self.memory_mib is None and self.memory_percentage == 100

    def hami_view(self) -> str:
        """HAMi's normalised request, e.g. ``nvidia.com/gpu=2,nvidia.com/gpumem=3000,...``."""
        vfam = _VENDOR_FAMILIES.get(self.family)
        if vfam is not None:
            parts = [f"{vfam.count}={self.gpus}"]
            if self.memory_mib is not None:
                parts.append(f"{vfam.memory}={self.memory_mib}")
            parts.append(f"{vfam.cores}={self.cores}")
            return ",".join(parts)
        fam = hami.VOLCANO if self.family == "volcano" else hami.NVIDIA
        parts = [f"{fam.count}={self.gpus}"]
        if self.memory_mib is not None:
            parts.append(f"{fam.memory}={self.memory_mib}")
        else:
            parts.append(f"{fam.percentage}={self.memory_percentage}")
        parts.append(f"{fam.cores}={self.cores}")
        if self.priority is not None:
            parts.append(f"{hami.PRIORITY}={self.priority}")
        return ",".join(parts)


#: The other vendors' HAMi spellings by name (``hygon-dcu``, ``ascend310p``...).
_VENDOR_FAMILIES: dict[str, vendor_table.HamiFamily] = {
    f.name: f for v in vendor_table.CONVERTED for f in v.hami
}


@dataclass(frozen=True)
class Conversion:
    """The result of :func:`convert_pod`.

    * ``pod``: a new Pod dict (the input is never mutated). Converted containers lost their HAMi
      resources and gained ``resources.claims: [{name}]``; ``spec.resourceClaims`` gained
      ``{name, resourceClaimTemplateName}`` per converted container. Unchanged (an equal copy)
      when nothing was converted. The pod, ``metadata``, ``spec``, ``spec.resourceClaims`` and
      the containers down to ``resources.limits/requests/claims`` are new; deeper values
      (annotations, labels, env, volumes...) are shared with the input: copy before mutating them.
    * ``templates``: ``resource.k8s.io/v1`` ResourceClaimTemplate dicts, one per converted
      container, in the pod's namespace (no namespace when the pod has none).
    * ``warnings``: one-line messages about what was ignored, defaulted or left unconverted.
    * ``requests``: one :class:`ContainerRequest` per converted container (initContainers first).
    * ``node_scheduler_policy`` / ``gpu_scheduler_policy``: HAMi's policy annotations, carried
      through unchanged (they stay on the pod too).
    """

    pod: dict[str, Any]
    templates: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    requests: list[ContainerRequest] = field(default_factory=list)
    node_scheduler_policy: str | None = None
    gpu_scheduler_policy: str | None = None

    @property
    def converted(self) -> bool:
        """At least one container was converted."""
        return bool(self.templates)


# ---- small context object for messages ---------------------------------------------------------
@dataclass
class _Ctx:
    source: str
    pod: str  # namespace/name as shown in messages
    warnings: list[str]
    served: frozenset[str] = frozenset()  # extended resources DeviceClasses serve (KEP-5004)
    vendors: frozenset[str] = frozenset()  # vendor keys whose DRA driver is installed

    def where(self, container: str = "") -> str:
        head = f"{self.source}: " if self.source else ""
        tail = f", container {container}" if container else ""
        return f"{head}pod {self.pod}{tail}"

    def error(self, container: str, what: str, text: str) -> ConversionError:
        return ConversionError(
            f"{self.where(container)}: {text}", pod=self.pod, container=container, field=what
        )

    def warn(self, container: str, text: str) -> None:
        self.warnings.append(f"{self.where(container)}: {text}")


# ---- value parsing -------------------------------------------------------------------------------
_HOW = {
    "count": "write a whole number of physical GPUs such as 1",
    "devices": "write a whole number of devices such as 1",
    "memory": "write a whole number of MiB such as 3000",
    "percentage": "write a whole percentage 1-100 such as 50",
    "cores": "write a whole percentage 0-100 such as 30",
    "priority": "write 0 (high) or 1 (low)",
}


def _parse_int(raw: object, name: str, role: str, ctx: _Ctx, container: str) -> int:
    """Parse one HAMi resource value: a YAML int, or a string holding an integer quantity in
    decimal notation (``3000``, and ``3k`` or ``3e3``, which mean 3000: the API server stores
    ``resources.limits`` as canonical Quantities, so a pod written with ``3000`` reaches the
    webhook as ``3k``; HAMi reads both as 3000). Binary suffixes (``1Gi``) are refused: HAMi
    would read ``1Gi`` as 1,073,741,824 MiB."""
    how = _HOW[role]
    if isinstance(raw, bool) or not isinstance(raw, int | str | float):
        raise ctx.error(container, name, f"{name} {raw!r} is not a number; {how}")
    if isinstance(raw, float):
        raise ctx.error(container, name, f"{name} {raw!r} is fractional; {how}")
    if isinstance(raw, int):
        value = raw
    else:
        text = raw.strip()
        if _PLAIN_INT.match(text):
            if (
                len(text.lstrip("+-").lstrip("0")) > _INT64_DIGITS
            ):  # before int(): 5,000 digits raise
                raise ctx.error(
                    container,
                    name,
                    f"{name} {_short(text)} is out of range (at most 2^63-1); {how}",
                )
            value = int(text)
        else:
            try:
                q = Quantity.parse(text)
            except QuantityError:
                raise ctx.error(container, name, f"{name} {raw!r} is not a number; {how}") from None
            if q.sign() < 0:
                raise ctx.error(container, name, f"{name} {raw!r} is negative; {how}")
            if not q.is_integer():
                raise ctx.error(container, name, f"{name} {raw!r} is fractional; {how}")
            if q.format != "BinarySI":
                return int(q.value)
            if role == "memory":
                mib = q.value / MIB
                hint = (
                    str(int(mib)) if mib.denominator == 1 and mib >= 1 else "a number such as 1024"
                )
                raise ctx.error(
                    container,
                    name,
                    f"{name} is in MiB: write {hint}, not {text} "
                    "(HAMi would read the suffixed quantity as that many MiB)",
                )
            raise ctx.error(container, name, f"{name} {raw!r} has a unit suffix or exponent; {how}")
    if value < 0:
        raise ctx.error(container, name, f"{name} {raw!r} is negative; {how}")
    if value >= 2**63:
        raise ctx.error(
            container, name, f"{name} {_short(str(value))} is out of range (at most 2^63-1); {how}"
        )
    return value


def _go_bool(text: str) -> bool | None:
    """Go ``strconv.ParseBool`` (what HAMi uses); ``None`` when not a boolean."""
    t = text.strip()
    if t in _GO_TRUE:
        return True
    if t in _GO_FALSE:
        return False
    return None


def _split_list(text: str) -> list[str]:
    """HAMi's comma lists: split on ',', trim whitespace, drop empty items and duplicates."""
    out: list[str] = []
    for item in text.split(","):
        s = item.strip()
        if s and s not in out:
            out.append(s)
    return out


# ---- pod-level annotations -----------------------------------------------------------------------
@dataclass
class _PodHints:
    selectors: list[str]
    numa_bind: bool
    node_policy: str | None
    gpu_policy: str | None
    #: container position (initContainers first, as HAMi counts) -> MIG profiles HAMi's
    #: scheduler recorded for it in hami.io/vgpu-mig-allocations
    mig_profiles: dict[int, list[str]] = field(default_factory=dict)


def _pod_hints(annotations: Mapping[str, Any], ctx: _Ctx) -> _PodHints:
    """Turn HAMi's pod annotations into CEL selectors and claim options (hami.md 1.4)."""
    selectors: list[str] = []

    def text(key: str) -> str | None:
        v = annotations.get(key)
        if v is None:
            return None
        if not isinstance(v, str):
            raise ctx.error("", key, f"annotation {key} must be a string, got {v!r}; quote it")
        return v

    # Volcano's UUID lists read as HAMi's: an allow list and a deny list, both applied (a UUID
    # in both is denied), on the GPU or a MIG device's parent.
    for key, build in (
        (hami.USE_UUID, cel.uuid_in),
        (hami.NOUSE_UUID, cel.uuid_not_in),
        (hami.VOLCANO_USE_UUID, cel.uuid_in),
        (hami.VOLCANO_NOUSE_UUID, cel.uuid_not_in),
        (hami.USE_TYPE, cel.product_contains_any),
        (hami.NOUSE_TYPE, cel.product_contains_none),
    ):
        raw = text(key)
        if raw is None:
            continue
        items = _split_list(raw)
        if key in (hami.USE_TYPE, hami.NOUSE_TYPE):
            items = _type_needles(items)
        if not items:
            ctx.warn("", f"annotation {key} is empty: no constraint applied")
            continue
        selectors.append(build(items))

    for key in (hami.VGPU_MODE, hami.VOLCANO_VGPU_MODE):
        raw = text(key)
        if raw is not None:
            sel = _vgpu_mode(key, raw, ctx)
            if sel:
                selectors.append(sel)

    numa_bind = False
    raw = text(hami.NUMA_BIND)
    if raw is not None:
        b = _go_bool(raw)
        if b is None:
            raise ctx.error(
                "",
                hami.NUMA_BIND,
                f'annotation {hami.NUMA_BIND} {raw!r} is not a boolean; write "true" or "false"',
            )
        numa_bind = b

    if text(hami.DEVICE_SCORING_WEIGHTS) is not None:
        ctx.warn(
            "",
            f"annotation {hami.DEVICE_SCORING_WEIGHTS} is not supported by Tessera and is ignored",
        )
    if text(hami.VOLCANO_PODGROUP_POLICY) is not None:
        ctx.warn(
            "",
            f"annotation {hami.VOLCANO_PODGROUP_POLICY} is not converted: Tessera does not keep "
            "the pods of one PodGroup on distinct GPUs; ignored",
        )
    for key in sorted(annotations):
        if key in hami.HAMI_RESOURCES:
            ctx.warn(
                "",
                f"annotation {key} is ignored (HAMi ignores it too): {key} is a container "
                "resource; move it to the container's resources.limits",
            )
    return _PodHints(
        selectors=selectors,
        numa_bind=numa_bind,
        node_policy=text(hami.NODE_SCHEDULER_POLICY),
        gpu_policy=text(hami.GPU_SCHEDULER_POLICY),
        mig_profiles=_mig_allocations(text(hami.MIG_ALLOCATIONS), ctx),
    )


def _unknown_selection_annotations(annotations: Mapping[str, Any], ctx: _Ctx) -> None:
    """Warn about each annotation in HAMi's or Volcano's selection namespaces
    (:data:`hami.SELECTION_PREFIXES`) that Tessera does not read: a misspelt selector
    (``nvidia.com/use-gpuuid``) would otherwise be dropped without a word. Scheduler records
    (:data:`hami.SCHEDULER_RECORDS`) are outputs, not requests, and are not warned about."""
    import difflib

    for key in sorted(annotations):
        if (
            not isinstance(key, str)
            or key in hami.POD_ANNOTATIONS
            or key in hami.VENDOR_ANNOTATIONS
            or key in hami.SCHEDULER_RECORDS
            or key in hami.HAMI_RESOURCES
            or not key.startswith(hami.SELECTION_PREFIXES)
        ):
            continue
        if key in hami.OTHER_VENDOR_ANNOTATIONS:
            ctx.warn("", f"annotation {key} selects another vendor's devices (HAMi's XPU); ignored")
            continue
        near = difflib.get_close_matches(key, sorted(hami.POD_ANNOTATIONS), n=1, cutoff=0.8)
        hint = f" (did you mean {near[0]}?)" if near else ""
        ctx.warn("", f"annotation {key} is not one Tessera reads{hint}; ignored")


def _mig_allocations(raw: str | None, ctx: _Ctx) -> dict[int, list[str]]:
    """The profiles of ``hami.io/vgpu-mig-allocations`` per container position.

    HAMi's scheduler writes it (``pkg/device/nvidia/mig_allocations.go``: a JSON list of
    ``{containerIndex, deviceIndex, gpuUUID, profile, placement{start,size}, ...}``); a pod that
    carries it (recreated from a HAMi cluster) keeps the profile HAMi chose: the claim selects
    that profile. The GPU and the placement are chosen again. Anything unreadable is warned about
    and ignored: a scheduler record never rejects a pod.
    """
    if raw is None:
        return {}
    key = hami.MIG_ALLOCATIONS
    try:
        items = json.loads(raw)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, or an int past 4300 digits
        why = (
            e.msg
            if isinstance(e, json.JSONDecodeError)
            else "a number too long or nesting too deep"
        )
        ctx.warn("", f"annotation {key} is not JSON ({why}); ignored")
        return {}
    out: dict[int, list[str]] = {}
    if not isinstance(items, list):
        ctx.warn("", f"annotation {key} is not a JSON list; ignored")
        return {}
    for i, it in enumerate(items):
        c = it.get("containerIndex") if isinstance(it, dict) else None
        prof = it.get("profile") if isinstance(it, dict) else None
        if (
            not isinstance(c, int)
            or isinstance(c, bool)
            or c < 0
            or not isinstance(prof, str)
            or not prof
        ):
            ctx.warn("", f"annotation {key}: entry {i} has no containerIndex and profile; ignored")
            return {}
        names = out.setdefault(c, [])
        if prof not in names:
            names.append(prof)
    return out


def _type_needles(items: list[str]) -> list[str]:
    """HAMi matches against its registered type ``NVIDIA-<NVML name>``; Tessera's productName is
    the NVML name, so a leading ``NVIDIA-`` (any case) is dropped from each needle."""
    out: list[str] = []
    for item in items:
        needle = item[7:] if cel.lower_ascii(item).startswith("nvidia-") and len(item) > 7 else item
        if needle not in out:
            out.append(needle)
    return out


def _vgpu_mode(key: str, raw: str, ctx: _Ctx) -> str | None:
    """HAMi: the device's mode must be a substring of the value (hami-core, mig, mps)."""
    value = cel.lower_ascii(raw.strip())
    types = [t for mode, t in (("hami-core", "gpu"), ("mig", "mig")) if mode in value]
    if "mps" in value:
        ctx.warn("", f"annotation {key} {raw!r}: mps is not supported by Tessera; mps is ignored")
    elif not types:
        raise ctx.error("", key, f"annotation {key} {raw!r} names no mode; write hami-core or mig")
    # mig: the claim takes one whole MIG device per GPU asked (type "mig"): an existing
    # instance, or on a GPU published for dynamic MIG a profile placement the scheduler picks
    # and the node driver creates. Devices are published smallest first, so first fit is the
    # smallest instance or profile whose memory holds gpumem, as HAMi picks it.
    if len(types) == 1:
        return cel.type_is(types[0])
    return None  # both kinds (or mps only): no constraint


# ---- per-container conversion ---------------------------------------------------------------------
def _unsupported_names(container: str, resources: Mapping[str, Any], ctx: _Ctx) -> None:
    names: set[str] = set()
    for part in ("limits", "requests"):
        block = resources.get(part)
        if isinstance(block, Mapping):
            names.update(str(k) for k in block)
    for name in sorted(names - hami.HAMI_RESOURCES - hami.VENDOR_RESOURCES - ctx.served):
        low = name.lower()
        if low.startswith("nvidia.com/mig-"):
            ctx.warn(
                container,
                f"{name} is a MIG-profile resource, not converted (left unchanged): ask "
                f"{hami.GPU} with annotation {hami.VGPU_MODE}: mig, or write a DRA claim "
                'selecting type "mig"',
            )
        elif name in hami.VOLCANO_GPU_SHARE:
            ctx.warn(
                container,
                f"{name} belongs to Volcano's gpu-share plugin, not converted (left unchanged): "
                f"use {hami.VOLCANO_NUMBER} with {hami.VOLCANO_MEMORY} (MiB)",
            )
        elif low.startswith(("nvidia.com/", "volcano.sh/vgpu")):
            ctx.warn(
                container,
                f"{name} is not a resource Tessera converts (left unchanged); HAMi's are "
                + ", ".join(sorted(hami.HAMI_RESOURCES)),
            )
        elif vend := next(
            (v for v in vendor_table.CONVERTED if low.startswith(hami.VENDOR_PREFIXES[v.key])), None
        ):
            ctx.warn(
                container,
                f"{name} is not one of HAMi's names for {vend.devices} (left unchanged); "
                "Tessera converts "
                + (
                    "huawei.com/<chip>, <chip>-memory, <chip>-core for chips "
                    + ", ".join(f.chip.common_word for f in vend.hami if f.chip)
                    if any(f.chip for f in vend.hami)
                    else ", ".join(f"{f.count}, {f.memory}, {f.cores}" for f in vend.hami)
                ),
            )
        elif low.startswith(hami.OTHER_VENDOR_PREFIXES):
            ctx.warn(
                container,
                f"{name} is a HAMi resource of a vendor without a DRA driver in Tessera's vendor "
                "table (left unchanged); converted are NVIDIA's, "
                + ", ".join(v.devices for v in vendor_table.CONVERTED),
            )


def _read(
    resources: Mapping[str, Any],
    fam: hami.ResourceFamily,
    ctx: _Ctx,
    container: str,
) -> dict[str, int]:
    """Values by role; HAMi reads limits, falling back to requests (hami.md 1.3)."""
    roles = {
        "count": fam.count,
        "memory": fam.memory,
        "percentage": fam.percentage,
        "cores": fam.cores,
    }
    if fam.priority:
        roles["priority"] = fam.priority
    return _read_roles(resources, roles, ctx, container)


def _read_roles(
    resources: Mapping[str, Any], roles: Mapping[str, str], ctx: _Ctx, container: str
) -> dict[str, int]:
    """The value of each role's resource name (``roles``: role -> name) that is present:
    limits first, then requests, as HAMi reads every vendor's."""
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    out: dict[str, int] = {}
    for role, name in roles.items():
        in_lim, in_req = name in limits, name in requests
        if not (in_lim or in_req):
            continue
        lim = _parse_int(limits[name], name, role, ctx, container) if in_lim else None
        req = _parse_int(requests[name], name, role, ctx, container) if in_req else None
        if lim is not None and req is not None and lim != req:
            ctx.warn(
                container,
                f"{name} differs between limits ({lim}) and requests ({req}); the limit is used "
                "(as HAMi does)",
            )
        value = lim if lim is not None else req
        assert value is not None
        out[role] = value
    return out


def _check_ranges(
    ctx: _Ctx,
    container: str,
    unit: str,
    count_name: str,
    count: int | None,
    cores_name: str,
    cores: int | None,
    memory_name: str,
    memory: int | None,
) -> None:
    """HAMi's upper bounds on one container's request (hami.md 1.3), for every vendor's names:
    at most :data:`MAX_GPUS_PER_CONTAINER` devices (a claim's allocation holds no more), cores
    a percentage of at most 100 (HAMi clamps larger ones silently), memory in MiB within an
    int32. ``unit`` is the device's word in the message (``GPU``, ``device``); ``None`` is
    unset. Raises :class:`ConversionError` naming the container and resource."""
    if count is not None and count > MAX_GPUS_PER_CONTAINER:
        raise ctx.error(
            container,
            count_name,
            f"{count_name} {count} is over {MAX_GPUS_PER_CONTAINER}: a ResourceClaim allocates "
            f"at most {MAX_GPUS_PER_CONTAINER} devices; ask for {MAX_GPUS_PER_CONTAINER} or fewer",
        )
    if cores is not None and cores > 100:
        raise ctx.error(
            container,
            cores_name,
            f"{cores_name} {cores} is over 100: it is a percentage 0-100 of each {unit}'s "
            "compute (HAMi clamps it silently); write 100 or less",
        )
    if memory is not None and memory > MAX_GPUMEM_MIB:
        raise ctx.error(
            container,
            memory_name,
            f"{memory_name} {memory} is out of range: at most {MAX_GPUMEM_MIB} MiB per {unit}",
        )


def _normalise(
    values: dict[str, int], fam: hami.ResourceFamily, ctx: _Ctx, container: str, init: bool
) -> ContainerRequest | None:
    """Apply HAMi's defaults and checks (hami.md 1.3) to one container's raw values."""
    mem = values.get("memory")
    pct = values.get("percentage")
    cores = values.get("cores")
    gpus = values.get("count")
    priority = values.get("priority")
    sized = [r for r in ("memory", "percentage", "cores") if r in values]
    role_name = {"memory": fam.memory, "percentage": fam.percentage, "cores": fam.cores}

    _check_ranges(ctx, container, "GPU", fam.count, gpus, fam.cores, cores, fam.memory, mem)
    if pct is not None and pct > 100:
        raise ctx.error(
            container,
            fam.percentage,
            f"{fam.percentage} {pct} is over 100: it is a percentage 1-100 of each GPU's memory; "
            "write 100 or less",
        )
    if priority is not None and priority > 1:
        ctx.warn(container, f"{fam.priority} {priority}: HAMi knows 0 (high) and 1 (low)")

    if gpus is None:
        if not sized:
            if priority is not None:
                ctx.warn(container, f"{fam.priority} without a GPU request has no effect; removed")
            return None
        gpus = 1  # HAMi defaultGPUNum
    if gpus == 0:
        if sized:
            what = role_name[sized[0]]
            raise ctx.error(
                container,
                fam.count,
                f"{fam.count} is 0 but {what} is set; ask {fam.count}: 1 or more, or remove {what}",
            )
        ctx.warn(container, f"{fam.count} 0 asks for no GPU; removed")
        return None

    if mem == 0:
        ctx.warn(
            container,
            f"{fam.memory} 0 is treated as unset (as HAMi does): the claim books each GPU's "
            "whole memory",
        )
        mem = None
    if pct == 0:
        ctx.warn(
            container,
            f"{fam.percentage} 0 is treated as unset: the claim books each GPU's whole memory "
            "(never 0 bytes)",
        )
        pct = None

    # "Exclusive default" (HAMi v2.7+): gpucores absent and (percentage 100, or no memory asked).
    if cores is None:
        cores = 100 if (pct == 100 or (mem is None and pct is None)) else 0
    if mem is not None and pct is not None:
        ctx.warn(
            container,
            f"both {fam.memory} and {fam.percentage} are set; {fam.memory} wins (as in HAMi)",
        )
        pct = None
    if mem is None and pct is None:
        pct = 100
    return ContainerRequest(
        container=container,
        gpus=gpus,
        memory_mib=mem,
        memory_percentage=pct,
        cores=cores,
        priority=priority,
        family=fam.name,
        init=init,
    )


def _family(resources: Mapping[str, Any], ctx: _Ctx, container: str) -> hami.ResourceFamily | None:
    present = []
    for fam in hami.FAMILIES:
        for part in ("limits", "requests"):
            block = resources.get(part) or {}
            if any(n in block for n in fam.names()):
                present.append(fam)
                break
    if len(present) > 1:
        raise ctx.error(
            container,
            hami.GPU,
            "asks for both nvidia.com/* and volcano.sh/vgpu-* GPU resources; use one spelling",
        )
    return present[0] if present else None


# ---- claim construction --------------------------------------------------------------------------
@functools.lru_cache(maxsize=1024)
def _quantity(value: int, fmt: Format = "DecimalSI") -> str:
    """``Quantity.from_int(value, fmt).canonical()``, remembered (the same few sizes recur)."""
    return Quantity.from_int(value, fmt).canonical()


def _capacity(memory_bytes: int | None, cores: int) -> dict[str, Any]:
    reqs: dict[str, str] = {}
    if memory_bytes is not None:
        reqs["memory"] = _quantity(memory_bytes, "BinarySI")
    reqs["cores"] = _quantity(cores)
    return {"requests": reqs}


def _selectors(exprs: Sequence[str]) -> list[dict[str, Any]]:
    return [{"cel": {"expression": e}} for e in exprs]


#: Topology levels a multi-GPU request tries in turn, through ``firstAvailable`` (strictest
#: first): all GPUs on one NVLink domain, else on one NUMA node, else anywhere on the node. Each
#: level's subrequests carry a ``matchAttribute`` constraint on its attribute (none for ``any``).
#: kube-scheduler's allocator takes the first subrequest that fits on a node, and its
#: DynamicResources score prefers nodes where an earlier subrequest fits (dra-spec 4.10).
TOPOLOGY_LEVELS: tuple[tuple[str, str | None], ...] = (
    ("nvlink", f"{DRIVER_NAME}/nvlinkDomain"),
    ("numa", f"{DRIVER_NAME}/numaNode"),
    ("any", None),
)
#: The attributes of the strict levels (also what ``tessera simulate --policy topology`` matches).
TOPOLOGY_ATTRIBUTES: tuple[str, ...] = tuple(a for _, a in TOPOLOGY_LEVELS if a)


@dataclass(frozen=True)
class _Sub:
    name: str  # subrequest name ("" for an ``exactly`` request)
    memory_bytes: int | None
    extra: tuple[str, ...]  # extra selectors (the memory size of a percentage)
    attribute: str | None  # matchAttribute of its topology level


def _subrequests(
    req: ContainerRequest, sizes: Sequence[int], numa_bind: bool, ctx: _Ctx
) -> list[_Sub]:
    """The alternatives of the claim's request ``gpu``, in the order they are tried: one per
    memory size of a percentage (``mem-<i>``), times the topology levels of a multi-GPU request
    (:data:`TOPOLOGY_LEVELS`; level-major, at most 8 in all: every size keeps its last level,
    stricter levels fill what is left, largest sizes first). One entry named "" means a plain
    ``exactly`` request."""
    if req.memory_mib is not None:
        variants: list[tuple[str, int | None, tuple[str, ...]]] = [("", req.memory_mib * MIB, ())]
    elif req.memory_percentage == 100:
        variants = [("", None, ())]
    else:
        pct = req.memory_percentage
        assert pct is not None
        if not sizes:
            fam = hami.VOLCANO if req.family == "volcano" else hami.NVIDIA
            raise ctx.error(
                req.container,
                fam.percentage,
                f"{fam.percentage} {pct} needs the cluster's GPU memory sizes to become a byte "
                "request: give the cluster's nodes (`tessera convert --cluster FILE` or "
                "--node NAME=INVENTORY), or write "
                f"{fam.memory} in MiB instead",
            )
        variants = [
            (
                f"mem-{i}",
                max((size * pct // 100) // MIB * MIB, MIB),
                (cel.memory_is(_quantity(size, "BinarySI")),),
            )
            for i, size in enumerate(sizes)
        ]
    if req.gpus == 1:
        return [_Sub(name, mem, extra, None) for name, mem, extra in variants]
    # numa-bind puts every GPU on one NUMA node through a constraint on the whole request: the
    # last level is then "numa" with no constraint of its own.
    levels = [TOPOLOGY_LEVELS[0], ("numa", None)] if numa_bind else list(TOPOLOGY_LEVELS)
    budget = MAX_SUBREQUESTS - len(variants)  # room for the levels before the last
    subs: list[_Sub] = []
    for level, attr in levels:
        last = level == levels[-1][0]
        for name, mem, extra in variants:
            if not last:
                if budget == 0:
                    break
                budget -= 1
            sub = f"{level}-{name}" if name else level
            subs.append(_Sub(sub, mem, extra, attr))
    return subs


#: HAMi's ``GPU_CORE_UTILIZATION_POLICY`` (container env, set by HAMi's webhook from
#: ``gpuCorePolicy``): ``force`` always limits, ``disable`` never does, anything else (the
#: default) limits only while the GPU is shared. Tessera's ``strict`` is ``force``; its
#: ``work-conserving`` (guaranteed cores, idle time shared) is the default's intent.
HAMI_CORE_POLICY_ENV = "GPU_CORE_UTILIZATION_POLICY"


def core_policy(container: Mapping[str, Any]) -> tuple[str, str | None]:
    """The Tessera compute policy of a HAMi container, and a warning or None.

    Reads ``env[].value`` of :data:`HAMI_CORE_POLICY_ENV` (case-insensitive, as HAMi-core):
    ``force`` -> ``strict``; unset or ``default`` -> ``work-conserving``; ``disable`` ->
    ``work-conserving`` with a warning (Tessera still guarantees the cores)."""
    value = None
    for e in container.get("env") or []:
        if isinstance(e, Mapping) and e.get("name") == HAMI_CORE_POLICY_ENV:
            value = e.get("value")
    v = str(value or "default").lower()
    if v == "force":
        return "strict", None
    if v == "disable":
        return "work-conserving", (
            f"{HAMI_CORE_POLICY_ENV}=disable: the claim is work-conserving (its cores are "
            "guaranteed and it may use idle GPU time); Tessera has no unlimited share"
        )
    return "work-conserving", None


def _device_request(
    req: ContainerRequest,
    selectors: Sequence[str],
    subs: Sequence[_Sub],
) -> dict[str, Any]:
    """The claim's single request ``gpu``: ``exactly``, or ``firstAvailable`` over ``subs``."""

    def exact(memory_bytes: int | None, extra: Sequence[str] = ()) -> dict[str, Any]:
        body: dict[str, Any] = {
            "deviceClassName": DEVICE_CLASS_NAME,
            "allocationMode": "ExactCount",
            "count": req.gpus,
        }
        exprs = [*selectors, *extra]
        if exprs:
            body["selectors"] = _selectors(exprs)
        body["capacity"] = _capacity(memory_bytes, req.cores)
        return body

    if len(subs) == 1 and not subs[0].name:
        return {"name": REQUEST_NAME, "exactly": exact(subs[0].memory_bytes, subs[0].extra)}
    return {
        "name": REQUEST_NAME,
        "firstAvailable": [{"name": s.name, **exact(s.memory_bytes, s.extra)} for s in subs],
    }


def _claim_spec(
    req: ContainerRequest,
    hints: _PodHints,
    sizes: Sequence[int],
    ctx: _Ctx,
    mig_profiles: Sequence[str] = (),
) -> dict[str, Any]:
    selectors = (
        [*hints.selectors, cel.profile_in(mig_profiles)] if mig_profiles else hints.selectors
    )
    subs = _subrequests(req, sizes, hints.numa_bind, ctx)
    devices: dict[str, Any] = {"requests": [_device_request(req, selectors, subs)]}
    constraints: list[dict[str, Any]] = []
    if req.gpus > 1:
        # `unit` names the hardware a device gives: a GPU's UUID, a MIG instance or placement
        # of its own. N units = N GPUs, or N MIG devices that may share a parent GPU.
        constraints.append({"requests": [REQUEST_NAME], "distinctAttribute": f"{DRIVER_NAME}/unit"})
        if hints.numa_bind:
            constraints.append(
                {"requests": [REQUEST_NAME], "matchAttribute": f"{DRIVER_NAME}/numaNode"}
            )
        for _, attr in TOPOLOGY_LEVELS:
            refs = [f"{REQUEST_NAME}/{s.name}" for s in subs if attr and s.attribute == attr]
            if refs:
                constraints.append({"requests": refs, "matchAttribute": attr})
    if constraints:
        devices["constraints"] = constraints
    if 0 < req.cores < 100 and req.policy != COMPUTE_POLICIES[0]:
        # what HAMi's GPU_CORE_UTILIZATION_POLICY means, as Tessera's opaque device config
        devices["config"] = [
            {
                "requests": [REQUEST_NAME],
                "opaque": {
                    "driver": DRIVER_NAME,
                    "parameters": {
                        "apiVersion": CONFIG_API_VERSION,
                        "kind": CONFIG_KIND,
                        "policy": req.policy,
                    },
                },
            }
        ]
    return {"devices": devices}


def _memory_sizes(memory_sizes: Sequence[int], ctx: _Ctx) -> list[int]:
    sizes: list[int] = []
    for s in memory_sizes:
        if isinstance(s, bool) or not isinstance(s, int) or s < MIB:
            raise ConversionError(
                f"{ctx.where()}: memory_sizes must be GPU memory sizes in bytes (integers "
                f">= 1Mi), got {s!r}",
                pod=ctx.pod,
                field="memory_sizes",
            )
        if s not in sizes:
            sizes.append(s)
    sizes.sort(reverse=True)
    return sizes


# ---- HAMi's other vendors (tessera.api.vendors) -----------------------------------------------------
def _vendor_families(
    resources: Mapping[str, Any], ctx: _Ctx, container: str
) -> list[tuple[vendor_table.Vendor, vendor_table.HamiFamily]]:
    """The other vendors' HAMi spellings the container names, in table order. Two spellings
    of one card (Hygon's ``dcu*`` and ``hcu*``) are refused; Ascend's chips are each their own
    (HAMi serves each chip as a device type of its own)."""
    out: list[tuple[vendor_table.Vendor, vendor_table.HamiFamily]] = []
    for vend in vendor_table.CONVERTED:
        fams = [f for f in vend.hami if any(_present(resources, n) for n in f.names())]
        if len(fams) > 1 and all(f.chip is None for f in fams):
            raise ctx.error(
                container,
                fams[0].count,
                f"asks for {' and '.join(f.count.rsplit('num', 1)[0] + '*' for f in fams)}: "
                "two spellings of the same cards; use one",
            )
        out.extend((vend, f) for f in fams)
    return out


def _vendor_request(
    values: Mapping[str, int],
    vend: vendor_table.Vendor,
    fam: vendor_table.HamiFamily,
    annotations: Mapping[str, Any],
    ctx: _Ctx,
    container: str,
    init: bool,
) -> tuple[bool, ContainerRequest | None]:
    """HAMi's reading of one container's request for ``vend``'s devices (``fam``'s names):
    (strip the names from the container, the request or None).

    HAMi reads a container as asking for these devices only when it names the count
    (``hygon.com/dcunum``, ``huawei.com/Ascend310P``; ``pkg/device/hygon``,
    ``pkg/device/ascend``): memory or cores alone are left unchanged, with a warning. Hygon:
    memory absent or 0 books the whole card, cores absent means 100. Ascend
    (:data:`tessera.api.vendors.ASCEND_VNPU_MODE`): in HAMi's soft split (``hami-core``, or a
    ``-core`` given: HAMi-DRA's own example writes it without the annotation, with a warning)
    memory is booked as asked and ``-core`` is a percentage (absent: 0); otherwise (HAMi's hard
    split) memory is rounded up to the chip's smallest vNPU template that holds it and the claim
    takes the template's share of the AICores, rounded up (above every template and within the
    chip's memory: the whole card; beyond it: refused; several NPUs on a template: refused, as
    HAMi does); the 910C counts NPUs in pairs (1 becomes 2, other odd counts are refused)."""
    count = values.get("devices")
    mem = values.get("memory")
    cores = values.get("cores")
    if count is None:
        asked = [n for r, n in (("memory", fam.memory), ("cores", fam.cores)) if r in values]
        ctx.warn(
            container,
            f"{', '.join(asked)} without {fam.count} asks for no device (HAMi reads none); "
            f"left unchanged: add {fam.count}: 1",
        )
        return False, None
    if count == 0:
        sized = [n for r, n in (("memory", fam.memory), ("cores", fam.cores)) if r in values]
        if sized:
            raise ctx.error(
                container,
                fam.count,
                f"{fam.count} is 0 but {sized[0]} is set; ask {fam.count}: 1 or more, or "
                f"remove {sized[0]}",
            )
        ctx.warn(container, f"{fam.count} 0 asks for no device; removed")
        return True, None
    _check_ranges(ctx, container, "device", fam.count, count, fam.cores, cores, fam.memory, mem)
    template = ""
    chip = fam.chip
    asked_count = count
    if chip is None:  # Hygon
        if mem == 0:
            ctx.warn(
                container, f"{fam.memory} 0 is treated as unset: the claim books the whole card"
            )
        memory_mib = mem or None
        share = 100 if cores is None else cores
    else:
        if chip.pairs and count % 2:
            if count != 1:
                raise ctx.error(
                    container,
                    fam.count,
                    f"{fam.count} {count}: {chip.common_word} NPUs are allocated in pairs (one "
                    "module); ask 1 (HAMi makes it 2) or an even number",
                )
            ctx.warn(
                container,
                f"{fam.count} 1 is 2: {chip.common_word} NPUs are allocated in pairs (as HAMi does)",
            )
            count = 2
        mode = annotations.get(vendor_table.ASCEND_VNPU_MODE)
        soft = mode == vendor_table.ASCEND_SOFT_SPLIT
        if not soft and cores:  # 0 is no request, in either split (HAMi refuses only > 0)
            # HAMi's device plugin refuses -core in its hard split; HAMi-DRA's own example
            # (docs/ascend-dra.md) writes it without the annotation, for the soft-split driver.
            ctx.warn(
                container,
                f"{fam.cores} is read as HAMi's soft split (memory as asked, no vNPU template), "
                f"what the driver does; HAMi's device plugin needs annotation "
                f'{vendor_table.ASCEND_VNPU_MODE}: "{vendor_table.ASCEND_SOFT_SPLIT}" for it',
            )
            soft = True
        if soft:
            if mem == 0:
                ctx.warn(
                    container, f"{fam.memory} 0 is treated as unset: the claim books the whole NPU"
                )
            memory_mib = mem or None
            share = cores or 0
        else:
            memory_mib, share = None, 100
            if mem is not None:
                t = chip.template_for(mem)
                if t is not None:
                    memory_mib, template = t.memory_mib, t.name
                    share = -(-100 * t.ai_cores // chip.ai_cores)
                elif mem > chip.memory_capacity_mib:
                    raise ctx.error(
                        container,
                        fam.memory,
                        f"{fam.memory} {mem} is more than an {chip.common_word} holds "
                        f"({chip.memory_capacity_mib} MiB); write {chip.memory_capacity_mib} or "
                        "less (MiB)",
                    )
            if template and asked_count > 1:  # HAMi checks the count as written (910C: 1)
                raise ctx.error(
                    container,
                    fam.memory,
                    f"{fam.memory} {mem} is a vNPU template ({template}), which serves one NPU "
                    f"(HAMi refuses it for several too): ask {fam.count}: 1, or whole NPUs "
                    f"(no {fam.memory})",
                )
    return True, ContainerRequest(
        container=container,
        gpus=count,
        memory_mib=memory_mib,
        memory_percentage=None if memory_mib is not None else 100,
        cores=share,
        family=fam.name,
        init=init,
        vendor=vend.key,
        template=template,
    )


def _vendor_selectors(
    vend: vendor_table.Vendor,
    fam: vendor_table.HamiFamily,
    annotations: Mapping[str, Any],
    ctx: _Ctx,
) -> list[str]:
    """The claim's selectors: the driver's shareable device type (HAMi-DRA's selector),
    Ascend's chip by ``productName``, and the pod's UUID and type annotations of ``fam``
    (comma lists; UUIDs exact, types a case-insensitive substring of ``productName`` as HAMi's
    ``CheckType``; HAMi's ``DCU-`` prefixes are also tried without it)."""
    out = [cel.type_is(vend.device_type, vend.driver)]
    if fam.chip is not None:
        out.append(cel.attr_in("productName", [fam.chip.chip_name], vend.driver))

    def items(key: str, prefixes: Sequence[str]) -> list[str] | None:
        raw = annotations.get(key) if key else None
        if raw is None:
            return None
        if not isinstance(raw, str):
            raise ctx.error("", key, f"annotation {key} must be a string, got {raw!r}; quote it")
        got = _split_list(raw)
        if not got:
            ctx.warn("", f"annotation {key} is empty: no constraint applied")
            return None
        more = [
            i[len(p) :] for i in got for p in prefixes if i.upper().startswith(p) and i[len(p) :]
        ]
        return [*got, *(m for m in more if m not in got)]

    for key, build in ((fam.use_uuid, cel.attr_in), (fam.nouse_uuid, cel.attr_not_in)):
        uuids = items(key, vend.uuid_prefixes)
        if uuids:
            out.append(build("uuid", uuids, vend.driver))
    for key, typ in (
        (fam.use_type, cel.product_contains_any),
        (fam.nouse_type, cel.product_contains_none),
    ):
        needles = items(key, vend.type_prefixes)
        if needles:
            out.append(typ(needles, vend.driver))
    return out


def _vendor_claim_spec(
    req: ContainerRequest,
    vend: vendor_table.Vendor,
    fam: vendor_table.HamiFamily,
    annotations: Mapping[str, Any],
    compute_units: Sequence[int],
    ctx: _Ctx,
) -> dict[str, Any]:
    """The claim for ``vend``'s driver: one request (:attr:`Vendor.request_name`) on its
    DeviceClass, ``count`` devices (distinct by :attr:`Vendor.unit_attribute` when several),
    capacity ``memory`` in bytes when not the whole device and ``cores`` in the driver's unit:
    a percentage for Ascend; for Hygon the card's compute units
    (:func:`tessera.api.vendors.hygon_compute_units`), one ``firstAvailable`` subrequest per
    compute-unit count of the cluster's cards (``cu-<i>``, selecting cards of that count) when
    the percentage is strictly between 0 and 100 (100 books the whole card by the driver's
    default, 0 is 1 CU on any card)."""
    selectors = _vendor_selectors(vend, fam, annotations, ctx)
    reqs: dict[str, str] = {}
    if req.memory_mib is not None:
        reqs["memory"] = _quantity(req.memory_mib * MIB, "BinarySI")
    variants: list[tuple[str, dict[str, str], list[str]]]
    if vend.cores_unit == "percent":
        reqs["cores"] = _quantity(req.cores)
        variants = [("", reqs, [])]
    elif req.cores >= 100:
        variants = [("", reqs, [])]
    elif req.cores == 0:
        variants = [("", {**reqs, "cores": _quantity(vendor_table.hygon_compute_units(0, 1))}, [])]
    else:
        units = sorted({u for u in compute_units if u >= 1}, reverse=True)
        if not units:
            raise ctx.error(
                req.container,
                fam.cores,
                f"{fam.cores} {req.cores} is a percentage, and {vend.driver} counts compute "
                "units: the cluster's cards must be known (their ResourceSlices: among the "
                "manifests for tessera convert, watched by the webhook)",
            )
        if len(units) > MAX_SUBREQUESTS:
            units = units[:MAX_SUBREQUESTS]
            ctx.warn(
                req.container,
                f"only the {MAX_SUBREQUESTS} largest compute-unit counts are candidates",
            )
        variants = [
            (
                f"cu-{i}" if len(units) > 1 else "",
                {**reqs, "cores": _quantity(vendor_table.hygon_compute_units(req.cores, u))},
                [cel.capacity_is("cores", _quantity(u), vend.driver)],
            )
            for i, u in enumerate(units)
        ]

    def exact(capacity: dict[str, str], extra: Sequence[str]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "deviceClassName": vend.device_class,
            "allocationMode": "ExactCount",
            "count": req.gpus,
            "selectors": _selectors([*selectors, *extra]),
        }
        if capacity:
            body["capacity"] = {"requests": dict(capacity)}
        return body

    if len(variants) == 1 and not variants[0][0]:
        request: dict[str, Any] = {
            "name": vend.request_name,
            "exactly": exact(variants[0][1], variants[0][2]),
        }
    else:
        request = {
            "name": vend.request_name,
            "firstAvailable": [{"name": n, **exact(c, e)} for n, c, e in variants],
        }
    devices: dict[str, Any] = {"requests": [request]}
    if req.gpus > 1:
        devices["constraints"] = [
            {
                "requests": [vend.request_name],
                "distinctAttribute": f"{vend.driver}/{vend.unit_attribute}",
            }
        ]
    return {"devices": devices}


# ---- naming ----------------------------------------------------------------------------------------
def _base_name(meta: Mapping[str, Any], spec: Mapping[str, Any]) -> tuple[str, str, bool]:
    """(base for object names, name for messages, derived-from-content flag)."""
    name = meta.get("name")
    if isinstance(name, str) and name:
        return name, name, False
    gen = meta.get("generateName")
    if isinstance(gen, str) and gen.strip("-."):
        return gen.strip("-."), f"{gen}*", False
    owners = [o for o in meta.get("ownerReferences") or [] if isinstance(o, Mapping)]
    owners.sort(key=lambda o: not o.get("controller"))
    for o in owners:
        oname = o.get("name")
        if isinstance(oname, str) and oname:
            kind = o.get("kind") or "owner"
            return oname, f"{oname} (template of {kind})", False
    digest = short_hash(json.dumps(spec, sort_keys=True, default=str), 10)
    return f"pod-{digest}", f"<unnamed pod-{digest}>", True


def _containers(spec: Mapping[str, Any], ctx: _Ctx) -> list[tuple[dict[str, Any], bool]]:
    out: list[tuple[dict[str, Any], bool]] = []
    for key, init in (("initContainers", True), ("containers", False)):
        items = spec.get(key) or []
        if not isinstance(items, list):
            raise ctx.error("", key, f"spec.{key} must be a list")
        for c in items:
            if not isinstance(c, dict):
                raise ctx.error("", key, f"spec.{key} holds a non-object entry {c!r}")
            out.append((c, init))
    return out


def _has_hami(resources: Any) -> bool:
    if not isinstance(resources, Mapping):
        return False
    return any(
        isinstance(resources.get(p), Mapping)
        and any(n in resources[p] for n in (*hami.HAMI_RESOURCES, *hami.VENDOR_RESOURCES))
        for p in ("limits", "requests")
    )


#: The name prefixes :func:`convert_pod` reads: HAMi's, NVIDIA's (its resources, MIG profiles,
#: selection annotations) and Volcano's vGPU spelling.
HAMI_MARKS = ("hami.io/", "nvidia.com/", "volcano.sh/", *hami.VENDOR_MARKS)


def mentions_hami(pod: Mapping[str, Any]) -> bool:
    """Whether :func:`convert_pod` has anything to read in ``pod``: a container's or an
    initContainer's ``resources.limits``/``requests`` name, or a pod annotation, starting with
    one of :data:`HAMI_MARKS`. A pod without converts to itself with no warning, so the webhook,
    ``simulate`` and ``lint`` skip the conversion for it (the one pre-check they share). Never
    raises: malformed parts count as not mentioning HAMi."""
    md = pod.get("metadata")
    annotations = md.get("annotations") if isinstance(md, Mapping) else None
    if isinstance(annotations, Mapping) and any(str(k).startswith(HAMI_MARKS) for k in annotations):
        return True
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return False
    for part in ("initContainers", "containers"):
        items = spec.get(part)
        for c in items if isinstance(items, list) else ():
            res = c.get("resources") if isinstance(c, Mapping) else None
            if not isinstance(res, Mapping):
                continue
            for block in (res.get("limits"), res.get("requests")):
                if isinstance(block, Mapping) and any(str(k).startswith(HAMI_MARKS) for k in block):
                    return True
    return False


# ---- entry point -------------------------------------------------------------------------------------
def convert_pod(
    pod: dict[str, Any],
    *,
    memory_sizes: Sequence[int] = (),
    source: str = "",
    served: Collection[str] = (),
    vendors: Collection[str] = (),
    compute_units: Sequence[int] = (),
) -> Conversion:
    """Convert a Pod's HAMi-style GPU requests into DRA ResourceClaimTemplates.

    ``pod`` is a Pod dict in Kubernetes shape (``kind`` absent or ``Pod``); for Deployments, Jobs
    etc. pass ``spec.template`` wrapped as a Pod, with ``metadata.name`` (or ``generateName`` or an
    ``ownerReferences`` entry) naming the workload. ``memory_sizes`` are the distinct GPU memory
    sizes of the cluster in bytes (needed only for ``gpumem-percentage`` below 100);
    ``source`` (e.g. a file name) prefixes every message. ``served``: extended resource names
    the cluster's DeviceClasses serve (KEP-5004,
    :func:`tessera.api.deviceclass.served_extended_resources`): such a name that is not
    HAMi's is left for kube-scheduler without a "not converted" warning (HAMi's own names are
    converted whoever serves them: the webhook runs before the scheduler).

    ``vendors``: the keys (:mod:`tessera.api.vendors`, ``ascend``, ``hygon``) of the other
    vendors whose DRA driver the cluster has (:func:`tessera.api.vendors.installed_vendors` of
    its DeviceClasses). Their HAMi resources become one claim per vendor (per Ascend chip) per
    container, for that driver; a vendor not in ``vendors`` keeps its resources, with a warning.
    ``compute_units``: the distinct compute-unit counts of the cluster's Hygon cards
    (:func:`tessera.convert.compute_unit_sizes`), needed for a ``dcucores`` below 100.

    Per container and initContainer with HAMi resources (:data:`HAMI_RESOURCES`), HAMi's
    normalisation is reproduced: limits before requests; gpumem/gpucores/percentage alone imply
    one GPU; gpucores absent with no memory asked (or percentage 100) means cores 100; no memory
    asked means the whole memory; gpumem beats percentage. The container then gets one claim
    whose template has one request ``gpu`` on DeviceClass ``gpu.tessera.dev`` with
    ``count`` = GPUs, ``capacity.requests`` memory (bytes) and cores (percent), a
    ``distinctAttribute: gpu.tessera.dev/unit`` constraint when count > 1, and CEL selectors from
    the pod's HAMi annotations. Template names are ``<pod>-<container>-gpu`` and pod claim names
    ``<container>-gpu`` (hashed suffix when too long or not DNS-valid).

    Raises :class:`ConversionError` for values HAMi would misread or that make no sense
    (negative, fractional, non-numeric, suffixed gpumem, cores or percentage over 100, 0 GPUs
    with memory, more than 32 GPUs, a percentage without ``memory_sizes``, malformed
    annotations, privileged containers, a preset ``spec.nodeName``).
    """
    if not isinstance(pod, dict):
        raise ConversionError(
            f"{source + ': ' if source else ''}expected a Pod dict, got {type(pod).__name__}"
        )
    kind = pod.get("kind")
    meta = pod.get("metadata") or {}
    spec = pod.get("spec")
    ns = meta.get("namespace") if isinstance(meta, Mapping) else None
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        raise ConversionError(
            f"{source + ': ' if source else ''}expected a Pod with metadata and spec "
            "(for a workload pass spec.template wrapped as a Pod)"
        )
    base, shown, hashed = _base_name(meta, spec)
    ctx = _Ctx(
        source=source,
        pod=f"{ns}/{shown}" if ns else shown,
        warnings=[],
        served=frozenset(served),
        vendors=frozenset(vendors),
    )
    if kind not in (None, "Pod"):
        raise ctx.error(
            "", "kind", f"kind {kind} is not a Pod; pass its pod template wrapped as a Pod"
        )

    containers = _containers(spec, ctx)
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    if not isinstance(annotations, Mapping) or not isinstance(labels, Mapping):
        raise ctx.error("", "metadata", "metadata.annotations and metadata.labels must be maps")
    has_hami = any(_has_hami(c.get("resources")) for c, _ in containers)
    try:
        hints = _pod_hints(annotations, ctx)
    except ConversionError as e:
        if has_hami:
            raise
        # Nothing to convert: a bad HAMi annotation must not reject an unrelated pod.
        ctx.warnings.append(f"{e} (ignored: no container asks for a GPU)")
        hints = _PodHints([], False, None, None, {})
    result_pod = _writable_copy(pod)

    def done(templates: list[dict[str, Any]], requests: list[ContainerRequest]) -> Conversion:
        return Conversion(
            pod=result_pod,
            templates=templates,
            warnings=ctx.warnings,
            requests=requests,
            node_scheduler_policy=hints.node_policy,
            gpu_scheduler_policy=hints.gpu_policy,
        )

    if not has_hami:
        for c, _ in containers:
            if isinstance(c.get("resources"), Mapping):
                _unsupported_names(str(c.get("name", "")), c["resources"], ctx)
        if hints.selectors or hints.numa_bind:
            ctx.warn("", "HAMi annotations have no effect: no container asks for a GPU")
        return done([], [])
    if labels.get(hami.WEBHOOK_LABEL) == "ignore":
        ctx.warn("", f"label {hami.WEBHOOK_LABEL}=ignore: left unconverted, as HAMi would")
        return done([], [])
    _unknown_selection_annotations(annotations, ctx)

    sizes = _memory_sizes(memory_sizes, ctx)
    if len(sizes) > MAX_SUBREQUESTS:
        dropped = ", ".join(Quantity.from_int(s, "BinarySI").canonical() for s in sizes[8:])
        sizes = sizes[:MAX_SUBREQUESTS]
        # warned below, only if a percentage request actually uses them
    else:
        dropped = ""
    if hashed:
        ctx.warn("", f"pod has no name, generateName or owner; object names use {base}")

    out_spec = result_pod["spec"]
    out_containers = [c for c, _ in _containers(out_spec, ctx)]
    existing_claims = {
        rc.get("name") for rc in out_spec.get("resourceClaims") or [] if isinstance(rc, Mapping)
    }
    templates: list[dict[str, Any]] = []
    requests: list[ContainerRequest] = []
    for position, ((c, init), out_c) in enumerate(zip(containers, out_containers, strict=True)):
        cname = c.get("name")
        if not isinstance(cname, str) or not cname:
            raise ctx.error("", "name", "a container without a name cannot be converted")
        resources = c.get("resources")
        if not isinstance(resources, Mapping):
            continue
        for part in ("limits", "requests"):
            if resources.get(part) is not None and not isinstance(resources[part], Mapping):
                raise ctx.error(cname, f"resources.{part}", f"resources.{part} must be a map")
        _unsupported_names(cname, resources, ctx)
        fam = _family(resources, ctx, cname)
        req = None
        if fam is not None:
            req = _normalise(_read(resources, fam, ctx, cname), fam, ctx, cname, init)
            _strip(out_c, fam)
        if req is not None:
            policy, why = core_policy(c)
            if why and 0 < req.cores < 100:
                ctx.warn(cname, why)
            req = replace(req, policy=policy)
            _refuse_privileged(c, cname, ctx)
            if req.memory_percentage not in (None, 100) and dropped:
                ctx.warn(
                    cname,
                    f"only the {MAX_SUBREQUESTS} largest GPU memory sizes are candidates "
                    f"(firstAvailable holds {MAX_SUBREQUESTS}); not tried: {dropped}",
                )
            claim = dns_label(f"{cname}-gpu")
            if claim in existing_claims:
                raise ctx.error(
                    cname,
                    "spec.resourceClaims",
                    f"the pod already has a resource claim named {claim}; rename it",
                )
            existing_claims.add(claim)
            tname = dns_subdomain(f"{base}-{cname}-gpu")
            req = replace(req, claim_name=claim, template_name=tname)
            profiles = hints.mig_profiles.get(position, [])
            if profiles:
                ctx.warn(
                    cname,
                    f"{hami.MIG_ALLOCATIONS} (written by HAMi's scheduler) recorded MIG profile(s) "
                    f"{', '.join(profiles)}: the claim asks for that profile; GPU and placement are "
                    "chosen again",
                )
            templates.append(_template(req, tname, ns, hints, sizes, ctx, profiles))
            requests.append(req)
            _attach(out_spec, out_c, claim, tname)
        # HAMi's other vendors: one claim per vendor (per Ascend chip) per container, for the
        # vendor's DRA driver (HAMi-DRA's shape), or left alone where the driver is missing.
        for vend, vfam in _vendor_families(resources, ctx, cname):
            if vend.key not in ctx.vendors:
                asked = sorted(n for n in vfam.names() if _present(resources, n))
                ctx.warn(
                    cname,
                    f"{', '.join(asked)}: the cluster has no DRA driver {vend.driver} for "
                    f"{vend.devices} (no DeviceClass {vend.device_class}); left unchanged "
                    f"(tessera convert: --vendor {vend.key} says it is installed)",
                )
                continue
            values = _read_roles(
                resources,
                {"devices": vfam.count, "memory": vfam.memory, "cores": vfam.cores},
                ctx,
                cname,
            )
            strip, vreq = _vendor_request(values, vend, vfam, annotations, ctx, cname, init)
            if strip:
                _strip_names(out_c, vfam.names())
            if vreq is None:
                continue
            _refuse_privileged(c, cname, ctx)
            suffix = vend.request_name if vfam.chip is None else vfam.name
            claim = dns_label(f"{cname}-{suffix}")
            if claim in existing_claims:
                raise ctx.error(
                    cname,
                    "spec.resourceClaims",
                    f"the pod already has a resource claim named {claim}; rename it",
                )
            existing_claims.add(claim)
            tname = dns_subdomain(f"{base}-{cname}-{suffix}")
            vreq = replace(vreq, claim_name=claim, template_name=tname)
            spec_ = _vendor_claim_spec(vreq, vend, vfam, annotations, compute_units, ctx)
            templates.append(_template(vreq, tname, ns, hints, sizes, ctx, claim_spec=spec_))
            requests.append(vreq)
            _attach(out_spec, out_c, claim, tname)

    if templates and out_spec.get("nodeName"):
        raise ctx.error(
            "",
            "spec.nodeName",
            "spec.nodeName is preset, so the scheduler never allocates the GPU claims (HAMi "
            "denies it too); use a nodeSelector instead",
        )
    if not templates and (hints.selectors or hints.numa_bind):
        ctx.warn("", "HAMi annotations have no effect: no container asks for a GPU")
    return done(templates, requests)


def _writable_copy(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``pod`` in which everything :func:`convert_pod` writes is new: the pod, its
    ``metadata`` and ``spec`` dicts, ``spec.resourceClaims``, the container lists, each
    container, its ``resources`` and their ``limits``/``requests``/``claims``. Other nested
    values (annotations, env, volumes...) are shared with ``pod``, not copied (no deep copy per
    admitted pod)."""
    out = dict(pod)
    if isinstance(out.get("metadata"), Mapping):
        out["metadata"] = dict(out["metadata"])
    spec = out.get("spec")
    if not isinstance(spec, Mapping):
        return out
    spec = out["spec"] = dict(spec)
    if isinstance(spec.get("resourceClaims"), list):
        spec["resourceClaims"] = list(spec["resourceClaims"])
    for key in ("initContainers", "containers"):
        items = spec.get(key)
        if not isinstance(items, list):
            continue
        copied = []
        for c in items:
            if isinstance(c, dict):
                c = dict(c)
                res = c.get("resources")
                if isinstance(res, dict):
                    res = c["resources"] = dict(res)
                    for part in ("limits", "requests"):
                        if isinstance(res.get(part), dict):
                            res[part] = dict(res[part])
                    if isinstance(res.get("claims"), list):
                        res["claims"] = list(res["claims"])
            copied.append(c)
        spec[key] = copied
    return out


def _strip(container: dict[str, Any], fam: hami.ResourceFamily) -> None:
    """Remove the family's resources from limits and requests; drop blocks left empty."""
    _strip_names(container, fam.names())


def _strip_names(container: dict[str, Any], names: Sequence[str]) -> None:
    """Remove ``names`` from the container's limits and requests; drop blocks left empty."""
    res = container.get("resources")
    if not isinstance(res, dict):
        return
    for part in ("limits", "requests"):
        block = res.get(part)
        if isinstance(block, dict):
            for n in names:
                block.pop(n, None)
            if not block:
                del res[part]


def _present(resources: Mapping[str, Any], name: str) -> bool:
    return any(
        isinstance(resources.get(p), Mapping) and name in resources[p]
        for p in ("limits", "requests")
    )


def _attach(out_spec: dict[str, Any], out_c: dict[str, Any], claim: str, tname: str) -> None:
    """The pod's claim ``claim`` from template ``tname``, used by container ``out_c``."""
    out_spec.setdefault("resourceClaims", []).append(
        {"name": claim, "resourceClaimTemplateName": tname}
    )
    out_res = out_c.setdefault("resources", {})
    out_res.setdefault("claims", []).append({"name": claim})


def _refuse_privileged(c: Mapping[str, Any], cname: str, ctx: _Ctx) -> None:
    sc = c.get("securityContext") or {}
    if isinstance(sc, Mapping) and sc.get("privileged") is True:
        raise ctx.error(
            cname,
            "securityContext.privileged",
            "a privileged container sees every GPU on the node, so its share cannot be "
            "enforced (HAMi denies it too); drop privileged or leave GPU requests out",
        )


def _template(
    req: ContainerRequest,
    name: str,
    namespace: str | None,
    hints: _PodHints,
    sizes: Sequence[int],
    ctx: _Ctx,
    mig_profiles: Sequence[str] = (),
    claim_spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = {"app.kubernetes.io/managed-by": MANAGED_BY}
    meta["annotations"] = {
        HAMI_REQUEST_ANNOTATION: req.hami_view(),
        CONTAINER_ANNOTATION: req.container,
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": meta,
        "spec": {
            "spec": claim_spec
            if claim_spec is not None
            else _claim_spec(req, hints, sizes, ctx, mig_profiles)
        },
    }
