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
    "Job": "batch/v1",
    "CronJob": "batch/v1",
    "ResourceClaim": RESOURCE_API_VERSION,
    "ResourceClaimTemplate": RESOURCE_API_VERSION,
    "DeviceClass": RESOURCE_API_VERSION,
    "ResourceSlice": RESOURCE_API_VERSION,
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
_DRA_KINDS = ("ResourceClaim", "ResourceClaimTemplate", "DeviceClass", "ResourceSlice")


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
            for j, rc in enumerate((c.get("resources") or {}).get("claims") or []):
                if rc.get("name") not in declared:
                    out.append(
                        FieldProblem(
                            f"{path}.{part}[{i}].resources.claims[{j}].name",
                            f"claim {rc.get('name')!r} is not declared in {path}.resourceClaims: add it there",
                        )
                    )
    return out


TEMPLATE_PATHS = {
    "Deployment": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


def pod_template(obj: Any, kind: str) -> tuple[dict[str, Any] | None, str]:
    """The pod template of a workload of ``kind`` (:data:`TEMPLATE_PATHS`) and its dotted path,
    e.g. ``(obj["spec"]["template"], "spec.template")``; a Pod is its own template (path
    ``""``). The template is None where a step is missing or not a mapping."""
    if kind == "Pod":
        return (obj if isinstance(obj, dict) else None), ""
    cur: Any = obj
    for step in TEMPLATE_PATHS[kind]:
        cur = cur.get(step) if isinstance(cur, dict) else None
    return (cur if isinstance(cur, dict) else None), ".".join(TEMPLATE_PATHS[kind])


def spec_path(template_path: str) -> str:
    """The dotted path of the pod spec under a template at ``template_path`` (``spec`` for a Pod)."""
    return f"{template_path}.spec" if template_path else "spec"


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
            return out + claim_spec_problems(obj.get("spec"), "spec")
        return out + claim_spec_problems((obj.get("spec") or {}).get("spec"), "spec.spec")
    if kind == "DeviceClass":
        return device_class_problems(obj)
    if kind == "ResourceSlice":
        from tessera.inventory.validate import validate_resource_slice

        probs = []
        for text in validate_resource_slice(obj):
            field, sep, message = text.partition(": ")
            probs.append(
                FieldProblem(field, message)
                if sep and " " not in field
                else FieldProblem("spec", text)
            )
        return probs
    if kind == "Pod":
        return pod_spec_problems(obj.get("spec"), "spec")
    if kind in TEMPLATE_PATHS:
        template, path = pod_template(obj, kind)
        if template is None or not isinstance(template.get("spec"), dict):
            return [FieldProblem(path, "required: a workload needs a pod template with a spec")]
        return pod_spec_problems(template.get("spec"), spec_path(path))
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
