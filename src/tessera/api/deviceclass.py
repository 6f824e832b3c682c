"""The DeviceClass every Tessera claim names, and who owns an extended resource name.

One definition, used by the local control plane (:mod:`tessera.localcluster.cluster`), ``tessera
simulate`` and the shipped manifest ``deploy/deviceclass.yaml`` (a test keeps the file equal
to :func:`device_class`).

``spec.extendedResourceName: nvidia.com/gpu`` (KEP-5004, DRAExtendedResource, GA in Kubernetes
1.37) lets kube-scheduler itself serve a pod that asks only ``resources.limits:
nvidia.com/gpu: N``: it synthesises a claim for N devices of this class (no capacity request,
so each device books its whole memory; see ``docs/webhook.md``). Pure code, no I/O.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tessera import DEVICE_CLASS_NAME, DRIVER_NAME
from tessera.api.requests import claim_requests
from tessera.api.vendors import Vendor

#: The extended resource Tessera's DeviceClass maps (HAMi's and NVIDIA's device plugin's name).
EXTENDED_RESOURCE_NAME = "nvidia.com/gpu"
#: The name every DeviceClass also answers to (``deviceclass.resource.kubernetes.io/<class>``).
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
#: The DeviceClass of MIG devices only (static MIG instances and dynamic MIG placements).
MIG_DEVICE_CLASS_NAME = f"mig.{DEVICE_CLASS_NAME}"


def device_class() -> dict[str, Any]:
    """The ``resource.k8s.io/v1`` DeviceClass ``gpu.tessera.dev``: every device of driver
    ``gpu.tessera.dev``, and ``extendedResourceName: nvidia.com/gpu``. A new dict per call."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS_NAME},
        "spec": {
            "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}],
            "extendedResourceName": EXTENDED_RESOURCE_NAME,
        },
    }


def vendor_device_class(vendor: Vendor) -> dict[str, Any]:
    """The ``resource.k8s.io/v1`` DeviceClass another vendor's driver installs (its row of
    :mod:`tessera.api.vendors`: ``device_class`` selecting ``device.driver == driver`` and, where
    the row has one, ``type == device_type``), as Hygon's HCU driver and HAMi-DRA's Ascend docs
    write it. ``simulate`` uses it for a cluster whose nodes publish that driver's devices but
    whose input names no such class. A new dict per call."""
    expr = f'device.driver == "{vendor.driver}"'
    if vendor.device_type:
        expr += f' && device.attributes["{vendor.driver}"].type == "{vendor.device_type}"'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": vendor.device_class},
        "spec": {"selectors": [{"cel": {"expression": expr}}]},
    }


def mig_device_class(name: str = MIG_DEVICE_CLASS_NAME) -> dict[str, Any]:
    """The ``resource.k8s.io/v1`` DeviceClass of Tessera's MIG devices (``type == "mig"``,
    ``docs/mig.md``); the chart installs it as ``mig.gpu.tessera.dev``. A new dict per call."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": (
                            f'device.driver == "{DRIVER_NAME}" && has(device.attributes["{DRIVER_NAME}"].type) && '
                            f'device.attributes["{DRIVER_NAME}"].type == "mig"'
                        )
                    }
                }
            ],
        },
    }


def class_users(objects: Iterable[Mapping[str, Any]], class_name: str) -> list[str]:
    """``Kind namespace/name`` (``Kind name`` without a namespace) of every ResourceClaim and
    ResourceClaimTemplate (dicts, as the API server returns them) with a request or subrequest
    naming DeviceClass ``class_name``
    (``spec.devices.requests[].exactly.deviceClassName``, ``...firstAvailable[].deviceClassName``;
    a template's claim spec is ``spec.spec``). In input order."""
    out = []
    for obj in objects:
        kind = obj.get("kind")
        if kind not in ("ResourceClaim", "ResourceClaimTemplate"):
            continue
        names = {alt.device_class_name for r in claim_requests(obj) for alt in r.alternatives}
        if class_name in names:
            meta = obj.get("metadata") or {}
            ns = meta.get("namespace")
            out.append(f"{kind} {ns}/{meta.get('name')}" if ns else f"{kind} {meta.get('name')}")
    return out


@dataclass(frozen=True)
class ExtendedResourceOwner:
    """Which DeviceClass serves an extended resource name.

    ``resource``: the name (``nvidia.com/gpu``); ``winner``: the DeviceClass kube-scheduler
    uses for it (None when no class maps it); ``contenders``: every class that maps it, winner
    first, then the others newest first.
    """

    resource: str
    winner: str | None
    contenders: tuple[str, ...]

    @property
    def contested(self) -> bool:
        """More than one DeviceClass maps the name."""
        return len(self.contenders) > 1

    def message(self) -> str:
        """One line for logs: who serves the name, and who else claims it."""
        if self.winner is None:
            return f"no DeviceClass maps {self.resource}: pods asking it are served by device plugins only"
        if not self.contested:
            return f"{self.resource} is served by DeviceClass {self.winner}"
        others = ", ".join(self.contenders[1:])
        return (
            f"{self.resource} is mapped by {len(self.contenders)} DeviceClasses ({self.winner}, {others}); "
            f"kube-scheduler uses {self.winner} (the most recently created; equal times: the lowest name) "
            "and ignores the others for it"
        )


def _created(cls: Mapping[str, Any]) -> _dt.datetime:
    raw = (cls.get("metadata") or {}).get("creationTimestamp")
    if isinstance(raw, str) and raw:
        try:
            return _dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            pass
    return _dt.datetime.min.replace(tzinfo=_dt.UTC)


def implicit_class(name: str) -> str | None:
    """The class an implicit name ``deviceclass.resource.kubernetes.io/<class>`` names, else None."""
    return name[len(IMPLICIT_PREFIX) :] if name.startswith(IMPLICIT_PREFIX) else None


def extended_resource_owner(
    classes: Iterable[Mapping[str, Any]], resource: str = EXTENDED_RESOURCE_NAME
) -> ExtendedResourceOwner:
    """The DeviceClass kube-scheduler maps ``resource`` to, among ``classes`` (DeviceClass dicts
    as the API server returns them).

    Upstream's rule (``k8s.io/dynamic-resource-allocation/deviceclass/extendedresourcecache``,
    KEP-5004): of the classes whose ``spec.extendedResourceName`` is ``resource``, the one created
    last wins; equal ``metadata.creationTimestamp``: the lexicographically lowest name. A class
    without a timestamp counts as the oldest. The implicit name
    ``deviceclass.resource.kubernetes.io/<class>`` always maps to that class.
    """
    if resource.startswith(IMPLICIT_PREFIX):
        name = resource[len(IMPLICIT_PREFIX) :]
        found = any((c.get("metadata") or {}).get("name") == name for c in classes)
        return ExtendedResourceOwner(resource, name if found else None, (name,) if found else ())
    mapping = [
        c
        for c in classes
        if isinstance(c.get("spec"), Mapping) and c["spec"].get("extendedResourceName") == resource
    ]
    # Newest first; among equal times the lowest name first.
    ordered = sorted(mapping, key=lambda c: str((c.get("metadata") or {}).get("name") or ""))
    ordered.sort(key=_created, reverse=True)
    names = tuple(str((c.get("metadata") or {}).get("name") or "") for c in ordered)
    return ExtendedResourceOwner(resource, names[0] if names else None, names)


def served_extended_resources(classes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Every extended resource name ``classes`` (DeviceClass dicts) serve, mapped to the class
    kube-scheduler synthesises a claim on (KEP-5004, ``extendedresourcecache``): each class's
    ``spec.extendedResourceName`` given to its owner (:func:`extended_resource_owner`: the
    newest class, equal times the lowest name), and the implicit
    ``deviceclass.resource.kubernetes.io/<class>`` of every class, also of one that sets
    ``extendedResourceName`` (kubernetes PR #133363).

    Upstream builds its map from informer events, so a class that loses a tie on its explicit
    name *while arriving after the winner* also misses its implicit name there; that
    order-dependent corner is not modelled (docs/webhook.md). Returns a new dict."""
    listed = list(classes)
    out: dict[str, str] = {}
    explicit = sorted(
        {
            str(c["spec"]["extendedResourceName"])
            for c in listed
            if isinstance(c.get("spec"), Mapping) and c["spec"].get("extendedResourceName")
        }
    )
    for name in explicit:
        winner = extended_resource_owner(listed, name).winner
        if winner is not None:
            out[name] = winner
    for c in listed:
        cls = (c.get("metadata") or {}).get("name")
        if cls:
            out[IMPLICIT_PREFIX + str(cls)] = str(cls)
    return out
