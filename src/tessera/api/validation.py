"""API validation of resource.k8s.io/v1 claims, claim templates and device classes.

Implements the rules of upstream ``pkg/apis/resource/validation`` that a user can break in a
manifest (dra-spec.md 1.3, 1.4, 1.8, 1.9). Each problem is a :class:`FieldProblem` naming the
field path; :func:`check` turns them into one :class:`ManifestError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tessera.api.errors import ManifestError
from tessera.api.loader import RESOURCE_API_VERSION, Manifest
from tessera.api.quantity import Quantity, QuantityError
from tessera.api.requests import device_requests
from tessera.api.workloads import POD_TEMPLATE_PATHS, pod_template

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

MAX_REQUESTS = 32
MAX_SUBREQUESTS = 8
MAX_SELECTORS = 32
MAX_CONSTRAINTS = 32
MAX_TOLERATIONS = 16
MAX_CEL_LENGTH = 10 * 1024


@dataclass(frozen=True)
class FieldProblem:
    """One validation failure: ``field`` is a dotted path such as ``spec.devices.requests[0].name``."""

    field: str
    message: str


def is_dns_label(s: object) -> bool:
    return isinstance(s, str) and len(s) <= 63 and bool(DNS_LABEL.match(s))


def is_dns_subdomain(s: object, max_len: int = 253) -> bool:
    return isinstance(s, str) and len(s) <= max_len and bool(DNS_SUBDOMAIN.match(s))


def qualified_name_problem(name: object, *, fully: bool) -> str | None:
    """Problem with an attribute/capacity QualifiedName (``domain/id`` or ``id``), or None."""
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    parts = name.split("/")
    if len(parts) > 2:
        return "may contain at most one '/' (domain/name)"
    if len(parts) == 2:
        domain, ident = parts
        if not is_dns_subdomain(domain, 63):
            return f"domain {domain!r} must be a DNS subdomain of at most 63 characters"
    else:
        if fully:
            return "must be fully qualified as <domain>/<name>, e.g. gpu.tessera.dev/uuid"
        ident = parts[0]
    if len(ident) > 32 or not C_IDENTIFIER.match(ident):
        return f"name {ident!r} must be a C identifier of at most 32 characters"
    return None


def _selectors(sels: Any, path: str, out: list[FieldProblem]) -> None:
    if sels is None:
        return
    if not isinstance(sels, list):
        out.append(FieldProblem(path, "must be a list of {cel: {expression: ...}}"))
        return
    if len(sels) > MAX_SELECTORS:
        out.append(FieldProblem(path, f"at most {MAX_SELECTORS} selectors, got {len(sels)}"))
    for i, s in enumerate(sels):
        p = f"{path}[{i}]"
        expr = (s.get("cel") or {}).get("expression") if isinstance(s, dict) else None
        if not isinstance(expr, str) or not expr.strip():
            hint = ""
            if isinstance(s, dict) and "expression" in s:
                hint = " (found 'expression' beside 'cel': indent it under 'cel')"
            out.append(
                FieldProblem(f"{p}.cel.expression", f"required: a CEL expression string{hint}")
            )
        elif len(expr) > MAX_CEL_LENGTH:
            out.append(FieldProblem(f"{p}.cel.expression", "longer than 10 KiB"))


def _tolerations(tols: Any, path: str, out: list[FieldProblem]) -> None:
    if tols is None:
        return
    if not isinstance(tols, list):
        out.append(FieldProblem(path, "must be a list"))
        return
    if len(tols) > MAX_TOLERATIONS:
        out.append(FieldProblem(path, f"at most {MAX_TOLERATIONS} tolerations"))
    for i, t in enumerate(tols):
        p = f"{path}[{i}]"
        if not isinstance(t, dict):
            out.append(FieldProblem(p, "must be a mapping"))
            continue
        op = t.get("operator", "Equal")
        if op not in ("Equal", "Exists"):
            out.append(FieldProblem(f"{p}.operator", f"must be Equal or Exists, got {op!r}"))
        if not t.get("key") and op != "Exists":
            out.append(FieldProblem(f"{p}.operator", "an empty key needs operator Exists"))
        if op == "Exists" and t.get("value"):
            out.append(FieldProblem(f"{p}.value", "must be empty with operator Exists"))
        eff = t.get("effect")
        if eff not in (None, "", "NoSchedule", "NoExecute", "None"):
            out.append(
                FieldProblem(f"{p}.effect", f"must be NoSchedule, NoExecute or None, got {eff!r}")
            )


def _exact_fields(req: dict[str, Any], path: str, out: list[FieldProblem], *, sub: bool) -> None:
    cls = req.get("deviceClassName")
    if not cls:
        out.append(FieldProblem(f"{path}.deviceClassName", "required: name the DeviceClass"))
    elif not is_dns_subdomain(cls):
        out.append(
            FieldProblem(f"{path}.deviceClassName", f"{cls!r} is not a valid DeviceClass name")
        )
    mode = req.get("allocationMode", "ExactCount") or "ExactCount"
    count = req.get("count")
    if mode == "ExactCount":
        # 0 (or absent) is defaulted to 1 by the API server (SetDefaults_ExactDeviceRequest).
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or count < 0
        ):
            out.append(FieldProblem(f"{path}.count", f"must be greater than zero, got {count!r}"))
    elif mode == "All":
        if count not in (None, 0):
            out.append(FieldProblem(f"{path}.count", "must not be set with allocationMode All"))
    else:
        out.append(
            FieldProblem(f"{path}.allocationMode", f"must be ExactCount or All, got {mode!r}")
        )
    if sub and "adminAccess" in req:
        out.append(
            FieldProblem(f"{path}.adminAccess", "not allowed in a firstAvailable subrequest")
        )
    _selectors(req.get("selectors"), f"{path}.selectors", out)
    _tolerations(req.get("tolerations"), f"{path}.tolerations", out)
    cap = req.get("capacity")
    if cap is not None:
        reqs = cap.get("requests", {}) if isinstance(cap, dict) else None
        if not isinstance(reqs, dict):
            out.append(
                FieldProblem(
                    f"{path}.capacity.requests", "must be a map of capacity name to quantity"
                )
            )
        else:
            for k, v in reqs.items():
                prob = qualified_name_problem(k, fully=False)
                if prob:
                    out.append(FieldProblem(f"{path}.capacity.requests[{k}]", prob))
                try:
                    # A negative request passes API validation (lint reports it); so does a
                    # decimal one past 2^63-1.
                    Quantity.parse(v, beyond_int64=True)
                except QuantityError as e:
                    out.append(FieldProblem(f"{path}.capacity.requests[{k}]", str(e)))


def claim_spec_problems(spec: Any, path: str = "spec") -> list[FieldProblem]:
    """Problems in a ResourceClaimSpec (``spec`` of a claim, ``spec.spec`` of a template)."""
    out: list[FieldProblem] = []
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        return [FieldProblem(path, "must be a mapping")]
    devices = spec.get("devices") or {}
    if not isinstance(devices, dict):
        return [FieldProblem(f"{path}.devices", "must be a mapping")]
    reqs = devices.get("requests") or []
    if not isinstance(reqs, list):
        return [FieldProblem(f"{path}.devices.requests", "must be a list")]
    if len(reqs) > MAX_REQUESTS:
        out.append(FieldProblem(f"{path}.devices.requests", f"at most {MAX_REQUESTS} requests"))
    names: dict[str, set[str]] = {}
    for i, r in enumerate(reqs):
        p = f"{path}.devices.requests[{i}]"
        if not isinstance(r, dict):
            out.append(FieldProblem(p, "must be a mapping"))
            continue
        name = r.get("name")
        if not is_dns_label(name):
            out.append(
                FieldProblem(f"{p}.name", f"{name!r} must be a DNS label (lower case, digits, '-')")
            )
        elif name in names:
            out.append(FieldProblem(f"{p}.name", f"duplicate request name {name!r}"))
        subs: set[str] = set()
        has_exact = isinstance(r.get("exactly"), dict)
        has_fa = r.get("firstAvailable") is not None
        if has_exact == has_fa:
            out.append(FieldProblem(p, "exactly one of 'exactly' or 'firstAvailable' is required"))
        elif has_exact:
            _exact_fields(r["exactly"], f"{p}.exactly", out, sub=False)
        else:
            fa = r["firstAvailable"]
            if not isinstance(fa, list) or not fa:
                out.append(
                    FieldProblem(f"{p}.firstAvailable", "must be a non-empty list of subrequests")
                )
            else:
                if len(fa) > MAX_SUBREQUESTS:
                    out.append(
                        FieldProblem(
                            f"{p}.firstAvailable", f"at most {MAX_SUBREQUESTS} subrequests"
                        )
                    )
                for j, s in enumerate(fa):
                    sp = f"{p}.firstAvailable[{j}]"
                    if not isinstance(s, dict):
                        out.append(FieldProblem(sp, "must be a mapping"))
                        continue
                    sn = s.get("name")
                    if not is_dns_label(sn):
                        out.append(FieldProblem(f"{sp}.name", f"{sn!r} must be a DNS label"))
                    elif sn in subs:
                        out.append(FieldProblem(f"{sp}.name", f"duplicate subrequest name {sn!r}"))
                    else:
                        subs.add(str(sn))
                    _exact_fields(s, sp, out, sub=True)
        if isinstance(name, str):
            names[name] = subs
    cons = devices.get("constraints") or []
    if not isinstance(cons, list):
        out.append(FieldProblem(f"{path}.devices.constraints", "must be a list"))
        cons = []
    if len(cons) > MAX_CONSTRAINTS:
        out.append(
            FieldProblem(f"{path}.devices.constraints", f"at most {MAX_CONSTRAINTS} constraints")
        )
    for i, c in enumerate(cons):
        p = f"{path}.devices.constraints[{i}]"
        if not isinstance(c, dict):
            out.append(FieldProblem(p, "must be a mapping"))
            continue
        kinds = [k for k in ("matchAttribute", "distinctAttribute") if c.get(k)]
        if len(kinds) != 1:
            out.append(
                FieldProblem(p, "exactly one of matchAttribute or distinctAttribute is required")
            )
        for k in kinds:
            prob = qualified_name_problem(c[k], fully=True)
            if prob:
                out.append(FieldProblem(f"{p}.{k}", prob))
        for j, ref in enumerate(c.get("requests") or []):
            parts = str(ref).split("/")
            ok = (
                len(parts) <= 2
                and parts[0] in names
                and (len(parts) == 1 or parts[1] in names[parts[0]])
            )
            if not ok:
                out.append(
                    FieldProblem(
                        f"{p}.requests[{j}]",
                        f"{ref!r} names no request (or req/subrequest) of this claim",
                    )
                )
    return out


MAX_RESULTS = 32  # resource.AllocationResultsMaxSize
MAX_RESERVED_FOR = 256  # resource.ResourceClaimReservedForMaxSize
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _request_names(spec: Any) -> dict[str, set[str]]:
    """Request name -> its subrequest names (empty for an ``exactly`` request)."""
    out: dict[str, set[str]] = {}
    for r in device_requests(spec if isinstance(spec, dict) else None):
        if isinstance(r.body.get("name"), str):
            out[r.name] = {
                str(alt.body["name"]) for alt in r.first_available if alt.body.get("name")
            }
    return out


def _device_ref_problems(r: dict[str, Any], path: str) -> list[FieldProblem]:
    """``driver``, ``pool``, ``device`` (and ``shareID``) of an allocation result or a device
    status entry: required, and the names a ResourceSlice could publish (upstream
    ``validateDriverName``, ``validatePoolName``, ``validateDeviceName``, ``validateUID``)."""
    out: list[FieldProblem] = []
    driver, pool, device = r.get("driver"), r.get("pool"), r.get("device")
    if not driver:
        out.append(FieldProblem(f"{path}.driver", "Required value: the device's driver"))
    elif not is_dns_subdomain(driver, 63):
        out.append(
            FieldProblem(f"{path}.driver", f"{driver!r} must be a DNS subdomain of at most 63")
        )
    if not pool:
        out.append(FieldProblem(f"{path}.pool", "Required value: the device's pool"))
    elif len(pool) > 253 or not all(is_dns_subdomain(part) for part in str(pool).split("/")):
        out.append(
            FieldProblem(f"{path}.pool", f"{pool!r} must be DNS subdomains separated by '/'")
        )
    if not device:
        out.append(FieldProblem(f"{path}.device", "Required value: the device's name"))
    elif not is_dns_label(device):
        out.append(FieldProblem(f"{path}.device", f"{device!r} must be a DNS label"))
    share = r.get("shareID")
    if share is not None and not (isinstance(share, str) and _UUID.match(share)):
        out.append(
            FieldProblem(
                f"{path}.shareID",
                f"{share!r} must be a UUID in RFC 4122 normalized form "
                "(xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, lower-case hex)",
            )
        )
    return out


def claim_status_problems(status: Any, spec: Any, path: str = "status") -> list[FieldProblem]:
    """What the API server refuses in a ResourceClaim's ``status`` (upstream
    ``validateResourceClaimStatusUpdate`` and ``validateAllocationResult``): each
    ``allocation.devices.results[]`` entry names a request (or ``request/subrequest``) of the
    claim's spec and a ``driver``/``pool``/``device`` (all required), a normalized ``shareID``,
    ``consumedCapacity`` as capacity name -> quantity, valid tolerations; at most 32 results;
    ``config[].source`` FromClaim or FromClass; a ``nodeSelector`` with at least one term;
    ``reservedFor`` entries with resource, name and uid (unique), and only beside an allocation;
    ``devices[]`` naming allocated devices. Tessera keeps such an allocation as it is, so a
    status it cannot read is refused here, naming the field."""
    if not isinstance(status, dict):
        return []
    out: list[FieldProblem] = []
    names = _request_names(spec)
    alloc = status.get("allocation")
    allocated: set[tuple[Any, Any, Any, Any]] = set()
    if isinstance(alloc, dict):
        ap = f"{path}.allocation"
        devices = alloc.get("devices") or {}
        results = devices.get("results") or [] if isinstance(devices, dict) else []
        if len(results) > MAX_RESULTS:
            out.append(
                FieldProblem(
                    f"{ap}.devices.results", f"Too many: {len(results)}: must have at most 32 items"
                )
            )
            results = []
        for i, r in enumerate(results):
            p = f"{ap}.devices.results[{i}]"
            if not isinstance(r, dict):
                continue  # the schema said so
            req = r.get("request")
            parts = str(req).split("/") if req else []
            if not req:
                out.append(FieldProblem(f"{p}.request", "Required value: the request it is for"))
            elif not (
                len(parts) <= 2
                and parts[0] in names
                and (len(parts) == 1 or parts[1] in names[parts[0]])
            ):
                out.append(
                    FieldProblem(
                        f"{p}.request",
                        f"{req!r} must be the name of a request in the claim or the name of a "
                        "request and a subrequest separated by '/'",
                    )
                )
            out.extend(_device_ref_problems(r, p))
            allocated.add((r.get("driver"), r.get("pool"), r.get("device"), r.get("shareID")))
            for k, v in (r.get("consumedCapacity") or {}).items():
                prob = qualified_name_problem(k, fully=False)
                if prob:
                    out.append(FieldProblem(f"{p}.consumedCapacity[{k}]", prob))
                try:
                    Quantity.parse(v)
                except QuantityError as e:
                    out.append(FieldProblem(f"{p}.consumedCapacity[{k}]", str(e)))
            _tolerations(r.get("tolerations"), f"{p}.tolerations", out)
        configs = devices.get("config") or [] if isinstance(devices, dict) else []
        for i, c in enumerate(configs):
            if isinstance(c, dict) and c.get("source") not in ("FromClaim", "FromClass"):
                out.append(
                    FieldProblem(
                        f"{ap}.devices.config[{i}].source",
                        f"unsupported value {c.get('source')!r}: supported values: "
                        '"FromClaim", "FromClass"',
                    )
                )
        ns = alloc.get("nodeSelector")
        if isinstance(ns, dict) and not ns.get("nodeSelectorTerms"):
            out.append(
                FieldProblem(
                    f"{ap}.nodeSelector.nodeSelectorTerms",
                    "Required value: must have at least one node selector term",
                )
            )
    reserved = status.get("reservedFor") or []
    if reserved and not isinstance(alloc, dict):
        out.append(
            FieldProblem(
                f"{path}.reservedFor", "Forbidden: may not be specified when `allocated` is not set"
            )
        )
    if len(reserved) > MAX_RESERVED_FOR:
        out.append(
            FieldProblem(
                f"{path}.reservedFor", f"Too many: {len(reserved)}: must have at most 256 items"
            )
        )
    uids: set[str] = set()
    for i, ref in enumerate(reserved):
        if not isinstance(ref, dict):
            continue
        for key in ("resource", "name", "uid"):
            if not ref.get(key):
                out.append(FieldProblem(f"{path}.reservedFor[{i}].{key}", "Required value"))
        uid = ref.get("uid")
        if uid and uid in uids:
            out.append(FieldProblem(f"{path}.reservedFor[{i}]", f"Duplicate value: uid {uid!r}"))
        uids.add(str(uid))
    for i, d in enumerate(status.get("devices") or []):
        if not isinstance(d, dict):
            continue
        p = f"{path}.devices[{i}]"
        probs = _device_ref_problems(d, p)
        out.extend(probs)
        ref = (d.get("driver"), d.get("pool"), d.get("device"), d.get("shareID"))
        if not probs and ref not in allocated:
            out.append(FieldProblem(p, "must be an allocated device in the claim"))
    return out


def device_class_problems(obj: dict[str, Any]) -> list[FieldProblem]:
    """Problems in a DeviceClass object."""
    out: list[FieldProblem] = []
    name = (obj.get("metadata") or {}).get("name")
    if not is_dns_subdomain(name):
        out.append(FieldProblem("metadata.name", f"{name!r} must be a DNS subdomain"))
    spec = obj.get("spec") or {}
    if not isinstance(spec, dict):
        return [FieldProblem("spec", "must be a mapping")]
    _selectors(spec.get("selectors"), "spec.selectors", out)
    return out


#: Kinds Tessera reads, and the apiVersion it reads each in (schemas/kubernetes.json).
READ_KINDS: dict[str, str] = {
    "Pod": "v1",
    "Node": "v1",
    "Deployment": "apps/v1",
    "ReplicaSet": "apps/v1",
    "StatefulSet": "apps/v1",
    "DaemonSet": "apps/v1",
    "ReplicationController": "v1",
    "Job": "batch/v1",
    "CronJob": "batch/v1",
    "ResourceClaim": RESOURCE_API_VERSION,
    "ResourceClaimTemplate": RESOURCE_API_VERSION,
    "DeviceClass": RESOURCE_API_VERSION,
    "ResourceSlice": RESOURCE_API_VERSION,
    "DeviceTaintRule": RESOURCE_API_VERSION,
}
_RETIRED = {
    "resource.k8s.io/v1alpha1": "retired (the first DRA API, removed in Kubernetes 1.27)",
    "resource.k8s.io/v1alpha2": "retired (classic DRA, removed in Kubernetes 1.31)",
    "resource.k8s.io/v1alpha3": "retired (removed in Kubernetes 1.33)",
    "resource.k8s.io/v1beta1": "not read by Tessera (its request shape differs: no 'exactly')",
}


#: ``resource.k8s.io/v1beta2`` has v1's shape (KEP-4381): its DRA objects are read, and
#: validated, as v1 (``simulate`` says so in a note). Kubernetes v1.37 no longer serves it.
DRA_V1BETA2 = "resource.k8s.io/v1beta2"
_DRA_KINDS = (
    "ResourceClaim",
    "ResourceClaimTemplate",
    "DeviceClass",
    "ResourceSlice",
    "DeviceTaintRule",
)


def _schema_version(kind: str, av: Any) -> Any:
    """The apiVersion whose schema ``kind`` at ``av`` is validated against."""
    return RESOURCE_API_VERSION if av == DRA_V1BETA2 and kind in _DRA_KINDS else av


def _api_version_problem(kind: str, av: Any) -> FieldProblem | None:
    want = READ_KINDS[kind]
    av = _schema_version(kind, av)
    if av == want:
        return None
    from tessera.api.schema import kubernetes

    if isinstance(av, str) and kubernetes().has(f"{av}/{kind}"):
        return None
    why = _RETIRED.get(av, "not served") if isinstance(av, str) else "missing or not a string"
    if kind == "DeviceTaintRule" and av == "resource.k8s.io/v1alpha3":
        why = "an alpha version, off by default (DeviceTaintRule is GA in resource.k8s.io/v1)"
    return FieldProblem(
        "apiVersion", f"{av!r} is {why}: write {want} (Kubernetes {_k8s()} serves {kind} there)"
    )


def _k8s() -> str:
    from tessera.api.schema import kubernetes_version

    return kubernetes_version()


def schema_problems(obj: dict[str, Any]) -> list[FieldProblem] | None:
    """Structural problems of ``obj`` against the Kubernetes OpenAPI schema of its
    apiVersion/kind (unknown fields, wrong types, out-of-range integers); None for a kind
    Tessera does not read."""
    kind = obj.get("kind")
    if kind not in READ_KINDS:
        return None
    av_problem = _api_version_problem(str(kind), obj.get("apiVersion"))
    if av_problem is not None:
        return [av_problem]
    from tessera.api.schema import kubernetes

    av = _schema_version(str(kind), obj["apiVersion"])
    if av != obj["apiVersion"]:
        obj = {**obj, "apiVersion": av}
    return [FieldProblem(p.field, p.message) for p in kubernetes().problems(f"{av}/{kind}", obj)]


def pod_spec_problems(spec: Any, path: str = "spec") -> list[FieldProblem]:
    """What the API server refuses in a PodSpec that its schema lets through: no containers, an
    unnamed container, a pod claim naming neither or both of a claim and a template, a
    container claim not declared in ``resourceClaims``."""
    out: list[FieldProblem] = []
    if not isinstance(spec, dict):
        spec = {}
    ctrs = spec.get("containers")
    if not ctrs:
        out.append(
            FieldProblem(f"{path}.containers", "required: a Pod needs at least one container")
        )
    declared: set[str] = set()
    for i, pc in enumerate(spec.get("resourceClaims") or []):
        p = f"{path}.resourceClaims[{i}]"
        name = pc.get("name")
        if not is_dns_label(name):
            out.append(
                FieldProblem(f"{p}.name", f"{name!r} must be a DNS label (lower case, digits, '-')")
            )
        elif name in declared:
            out.append(FieldProblem(f"{p}.name", f"duplicate pod claim name {name!r}"))
        declared.add(str(name))
        has = [k for k in ("resourceClaimName", "resourceClaimTemplateName") if pc.get(k)]
        if not has:
            out.append(
                FieldProblem(
                    p,
                    "at least one of `resourceClaimName` or `resourceClaimTemplateName` must be set",
                )
            )
        elif len(has) == 2:
            out.append(
                FieldProblem(
                    p,
                    "at most one of `resourceClaimName` or `resourceClaimTemplateName` may be set",
                )
            )
    for part in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(part) or []):
            if not c.get("name"):
                out.append(
                    FieldProblem(
                        f"{path}.{part}[{i}].name", "required: every container needs a name"
                    )
                )
            claims = (c.get("resources") or {}).get("claims") or []
            for j, rc in enumerate(claims):
                if rc.get("name") not in declared:
                    out.append(
                        FieldProblem(
                            f"{path}.{part}[{i}].resources.claims[{j}].name",
                            f"claim {rc.get('name')!r} is not declared in {path}.resourceClaims: add it there",
                        )
                    )
            out.extend(_duplicate_claim_uses(claims, f"{path}.{part}[{i}].resources.claims"))
    return out


def _duplicate_claim_uses(claims: list[Any], path: str) -> list[FieldProblem]:
    """A container's ``resources.claims`` naming one claim (or one request of it) twice, or a
    whole claim beside one of its requests: refused by the API server as ``Duplicate value``
    (upstream ``validateResourceClaimNames``)."""
    out: list[FieldProblem] = []
    seen: set[str] = set()
    for j, rc in enumerate(claims):
        name, request = rc.get("name"), rc.get("request") or ""
        if not isinstance(name, str) or not name:
            continue
        key = f"{name}/{request}" if request else name
        whole_then_part = name in seen
        part_then_whole = not request and any(k.startswith(f"{name}/") for k in seen)
        if whole_then_part or key in seen or part_then_whole:
            what = (
                f"claim {name!r} is already listed whole"
                if whole_then_part
                else f"{key!r} is listed twice"
                if key in seen
                else f"claim {name!r} is listed whole after one of its requests"
            )
            out.append(
                FieldProblem(
                    f"{path}[{j}]",
                    f"Duplicate value: {what} in this container; list each claim (or each of its "
                    "requests) once",
                )
            )
        seen.add(key)
    return out


#: Workload kinds whose API validation requires ``spec.selector`` matching the template's
#: labels (apps/v1 ``ValidateDeploymentSpec``, ``ValidateReplicaSetSpec``,
#: ``ValidateStatefulSetSpec``, ``ValidateDaemonSetSpec``).
SELECTOR_KINDS = ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet")
_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def workload_selector_problems(obj: dict[str, Any], kind: str) -> list[FieldProblem]:
    """What the API server refuses in the ``spec.selector`` of a :data:`SELECTOR_KINDS`
    workload: missing (``Required value``), empty, an unknown operator or values that do not
    fit it, and a selector that does not match ``spec.template.metadata.labels`` (the
    controller could never find its own pods)."""
    raw_spec = obj.get("spec")
    spec: dict[str, Any] = raw_spec if isinstance(raw_spec, dict) else {}
    sel = spec.get("selector")
    low = kind.lower()
    if sel is None:
        return [
            FieldProblem(
                "spec.selector",
                f"Required value: a {kind} needs spec.selector (e.g. matchLabels: {{app: x}}) "
                "matching spec.template.metadata.labels",
            )
        ]
    if not isinstance(sel, dict):
        return []  # the schema said so
    match_labels = sel.get("matchLabels") or {}
    exprs = sel.get("matchExpressions") or []
    if not match_labels and not exprs:
        return [FieldProblem("spec.selector", f"empty selector is invalid for {low}")]
    out: list[FieldProblem] = []
    for i, e in enumerate(exprs):
        p = f"spec.selector.matchExpressions[{i}]"
        op, values = e.get("operator"), e.get("values") or []
        if op not in _SELECTOR_OPERATORS:
            out.append(
                FieldProblem(f"{p}.operator", f"{op!r} is not a valid label selector operator")
            )
        elif op in ("In", "NotIn") and not values:
            out.append(
                FieldProblem(f"{p}.values", "must be specified when `operator` is 'In' or 'NotIn'")
            )
        elif op in ("Exists", "DoesNotExist") and values:
            out.append(
                FieldProblem(
                    f"{p}.values",
                    "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                )
            )
    if out:
        return out
    raw_template = spec.get("template")
    template: dict[str, Any] = raw_template if isinstance(raw_template, dict) else {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    if not label_selector_matches(sel, labels):
        out.append(
            FieldProblem(
                "spec.template.metadata.labels",
                f"`selector` does not match template `labels` ({labels!r}): give the template "
                "the labels spec.selector asks for",
            )
        )
    return out


def label_selector_matches(sel: dict[str, Any], labels: dict[str, Any]) -> bool:
    """A metav1 LabelSelector (``matchLabels`` and ``matchExpressions``, ANDed) against
    ``labels``; an empty selector matches everything."""
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def pod_status_problems(pod: dict[str, Any]) -> list[FieldProblem]:
    """What the API server refuses in a Pod's ``status.resourceClaimStatuses`` (upstream
    ``validatePodResourceClaimStatuses``), which Tessera reads as the names of the claims made
    from templates: each ``name`` one of ``spec.resourceClaims`` and listed once, each
    ``resourceClaimName`` a valid ResourceClaim name."""
    status = pod.get("status")
    if not isinstance(status, dict):
        return []
    spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else None
    declared = {
        rc.get("name") for rc in (spec or {}).get("resourceClaims") or [] if isinstance(rc, dict)
    }
    out: list[FieldProblem] = []
    seen: set[Any] = set()
    for i, st in enumerate(status.get("resourceClaimStatuses") or []):
        if not isinstance(st, dict):
            continue
        p = f"status.resourceClaimStatuses[{i}]"
        name = st.get("name")
        if name not in declared:
            out.append(
                FieldProblem(
                    f"{p}.name",
                    f"{name!r} must match the name of an entry in `spec.resourceClaims`",
                )
            )
        if name in seen:
            out.append(FieldProblem(f"{p}.name", f"Duplicate value: {name!r}"))
        seen.add(name)
        claim = st.get("resourceClaimName")
        if claim is not None and not is_dns_subdomain(claim):
            out.append(
                FieldProblem(
                    f"{p}.resourceClaimName", f"{claim!r} must be a DNS subdomain (a claim's name)"
                )
            )
    return out


#: Where each workload keeps its pod template (one table: :mod:`tessera.api.workloads`).
TEMPLATE_PATHS = POD_TEMPLATE_PATHS


def spec_path(template_path: str) -> str:
    """The dotted path of the pod spec under a template at ``template_path`` (``spec`` for a Pod)."""
    return f"{template_path}.spec" if template_path else "spec"


LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
MAX_TAINT_RULE_CONDITIONS = 8
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")


def label_key_problem(key: object) -> str | None:
    """Problem with a label key (``[prefix/]name``: prefix a DNS subdomain <= 253, name <= 63
    alphanumerics, '-', '_', '.'; upstream ``IsQualifiedName``), or None."""
    if not isinstance(key, str) or not key:
        return "required: a label key such as example.com/fenced"
    prefix, sep, name = key.rpartition("/")
    if sep and not is_dns_subdomain(prefix):
        return f"{key!r}: prefix {prefix!r} must be a lower-case DNS subdomain"
    if len(name) > 63 or not LABEL_NAME.match(name):
        return (
            f"{key!r}: name {name!r} must be at most 63 alphanumerics, '-', '_' or '.', starting and ending "
            "alphanumeric"
        )
    return None


def device_taint_problems(taint: Any, path: str) -> list[FieldProblem]:
    """A ``DeviceTaint`` (KEP-5055): ``key`` a label key, ``value`` a label value (may be
    empty), ``effect`` one of None, NoSchedule, NoExecute (required)."""
    if not isinstance(taint, dict):
        return [FieldProblem(path, "required: {key, value, effect}")]
    out: list[FieldProblem] = []
    kp = label_key_problem(taint.get("key"))
    if kp:
        out.append(FieldProblem(f"{path}.key", kp))
    v = taint.get("value")
    if v not in (None, "") and not (isinstance(v, str) and len(v) <= 63 and LABEL_NAME.match(v)):
        out.append(
            FieldProblem(
                f"{path}.value",
                f"{v!r} must be a label value: at most 63 alphanumerics, '-', '_' or '.', starting and ending "
                "alphanumeric",
            )
        )
    eff = taint.get("effect")
    if eff not in TAINT_EFFECTS:
        got = "missing" if eff in (None, "") else f"got {eff!r}"
        out.append(
            FieldProblem(f"{path}.effect", f"required: one of {', '.join(TAINT_EFFECTS)} ({got})")
        )
    return out


def device_taint_rule_problems(obj: dict[str, Any]) -> list[FieldProblem]:
    """``resource.k8s.io/v1`` DeviceTaintRule (KEP-5055, DRADeviceTaintRules; dra-spec.md
    1.7): ``metadata.name`` a DNS subdomain; ``spec.deviceSelector`` (optional: without it
    no device is tainted) with ``driver`` a DNS subdomain <= 63, ``pool`` '/'-separated DNS
    subdomains <= 253, ``device`` a DNS label; ``spec.taint`` required
    (:func:`device_taint_problems`); at most 8 ``status.conditions``."""
    out: list[FieldProblem] = []
    md = obj.get("metadata") or {}
    if not is_dns_subdomain(md.get("name")):
        out.append(FieldProblem("metadata.name", f"{md.get('name')!r} must be a DNS subdomain"))
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [*out, FieldProblem("spec", "required: deviceSelector and taint")]
    sel = spec.get("deviceSelector")
    if sel is not None:
        drv, pool, dev = sel.get("driver"), sel.get("pool"), sel.get("device")
        if drv is not None and not is_dns_subdomain(drv, 63):
            out.append(
                FieldProblem(
                    "spec.deviceSelector.driver",
                    f"{drv!r} must be a driver name: a lower-case DNS subdomain of at most 63 characters",
                )
            )
        if pool is not None and not (
            isinstance(pool, str)
            and len(pool) <= 253
            and all(is_dns_subdomain(p) for p in pool.split("/"))
        ):
            out.append(
                FieldProblem(
                    "spec.deviceSelector.pool",
                    f"{pool!r} must be a pool name: '/'-separated DNS subdomains, at most 253 characters",
                )
            )
        if dev is not None and not is_dns_label(dev):
            out.append(
                FieldProblem(
                    "spec.deviceSelector.device",
                    f"{dev!r} must be a device name: a DNS label (at most 63 of a-z, 0-9, '-')",
                )
            )
    out.extend(device_taint_problems(spec.get("taint"), "spec.taint"))
    conds = (obj.get("status") or {}).get("conditions") or []
    if len(conds) > MAX_TAINT_RULE_CONDITIONS:
        out.append(
            FieldProblem(
                "status.conditions",
                f"at most {MAX_TAINT_RULE_CONDITIONS} conditions, got {len(conds)}",
            )
        )
    return out


def manifest_problems(m: Manifest) -> list[FieldProblem]:
    """Everything the API server would refuse in ``m``, in this order: an apiVersion it does not
    serve, structural problems (unknown fields, wrong types: :func:`schema_problems`), then the
    validation rules Tessera implements for claims, claim templates, device classes, slices and
    pod specs. [] for a valid object or a kind Tessera does not read. One judgement for every
    command: ``simulate``, ``explain`` and ``lint`` all call this."""
    obj = m.obj
    kind = m.kind
    structural = schema_problems(obj)
    if structural:
        return structural
    if kind in ("ResourceClaim", "ResourceClaimTemplate"):
        md = obj.get("metadata") or {}
        out = []
        if not is_dns_subdomain(md.get("name")):
            out.append(FieldProblem("metadata.name", f"{md.get('name')!r} must be a DNS subdomain"))
        if kind == "ResourceClaim":
            spec_probs = claim_spec_problems(obj.get("spec"), "spec")
            return out + spec_probs + claim_status_problems(obj.get("status"), obj.get("spec"))
        return out + claim_spec_problems((obj.get("spec") or {}).get("spec"), "spec.spec")
    if kind == "DeviceClass":
        return device_class_problems(obj)
    if kind == "ResourceSlice":
        from tessera.api.slice_validation import resource_slice_problems

        return [FieldProblem(field, message) for field, message in resource_slice_problems(obj)]
    if kind == "DeviceTaintRule":
        return device_taint_rule_problems(obj)
    if kind == "Pod":
        return pod_spec_problems(obj.get("spec"), "spec") + pod_status_problems(obj)
    if kind in TEMPLATE_PATHS:
        template, path = pod_template(obj, kind)
        if template is None or not isinstance(template.get("spec"), dict):
            return [FieldProblem(path, "required: a workload needs a pod template with a spec")]
        selector = workload_selector_problems(obj, kind) if kind in SELECTOR_KINDS else []
        return selector + pod_spec_problems(template.get("spec"), spec_path(path))
    return []


def problem_error(m: Manifest, probs: list[FieldProblem]) -> ManifestError:
    """One :class:`ManifestError` for the first of ``probs`` (the count of the others said)."""
    first = probs[0]
    more = f" (and {len(probs) - 1} more problem(s))" if len(probs) > 1 else ""
    return ManifestError(
        first.message + more, file=m.source.file, doc=m.source.doc, obj=m.ref(), field=first.field
    )


VALIDATED = "validated"


def check(m: Manifest) -> None:
    """Raise :class:`ManifestError` for the first problem of ``m`` (all are counted); a
    manifest already checked (``m.extra['validated']``) is not checked again."""
    if m.extra.get(VALIDATED):
        return
    probs = manifest_problems(m)
    if probs:
        raise problem_error(m, probs)
    m.extra[VALIDATED] = True


def check_all(manifests: list[Manifest]) -> None:
    """:func:`check` every manifest, in input order."""
    for m in manifests:
        check(m)
