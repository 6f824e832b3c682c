"""Extended resources served by DeviceClasses (KEP-5004, DRAExtendedResource, GA in 1.37).

A pod asking ``resources.limits: {nvidia.com/mig-1g.10gb: 1}`` (or the implicit
``deviceclass.resource.kubernetes.io/<class>: 1``) needs no ResourceClaim of its own where a
DeviceClass serves that name and no node advertises it: kube-scheduler's DynamicResources
plugin synthesises one claim per pod for all such resources, and allocates it like any other
(``pkg/scheduler/framework/plugins/dynamicresources/extendeddynamicresources.go``,
``createRequestsAndMappings``). This module reproduces that claim:

* which names are served: :func:`tessera.api.deviceclass.served_extended_resources`;
* the container requests read are ``resources.requests`` with ``limits`` copied in where
  requests lack the name (the API server's defaulting); a zero or non-integer amount asks
  nothing;
* one request per container and resource, named ``container-<i>-request-<j>``: ``i`` the
  container's index in initContainers + containers, ``j`` the resource's index among the
  container's sorted request names; ``exactly`` on the serving class, ``ExactCount``,
  ``count`` = the amount;
* an init container (not a sidecar) first reuses the requests of the long-lived containers
  (sidecars and regular containers) at or after its index, and asks only for the rest; of
  all init containers' own requests for one resource only the largest is kept, the others'
  containers mapped to it;
* requests sorted by name (as strings: ``container-10-...`` before ``container-2-...``).

The claim is named ``<pod>-extended-resources-<5 characters>`` (the API server's
``generateName``: the base cut to 58 characters; the simulation derives the suffix from the
pod), annotated ``resource.kubernetes.io/extended-resource-claim: "true"`` and owned by the
pod; the pod's ``status.extendedResourceClaimStatus`` names it with the container-to-request
mappings. Names no class serves are left to device plugins: a simulated node advertises
none, so they stay ``Insufficient``. Pure code, no I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.api.pods import pod_containers
from tessera.api.quantity import Quantity, QuantityError

#: The annotation kube-scheduler puts on the claim it synthesises.
EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
#: Resources kube-scheduler counts against node allocatable without device plugins.
NATIVE_RESOURCES = ("cpu", "memory", "ephemeral-storage", "pods")
# The API server's generateName: base cut to 63 - 5 characters, 5 random of this alphabet.
_GENERATE_BASE = 58
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def is_extended_resource(name: str) -> bool:
    """Whether ``name`` is a resource a device plugin or a DeviceClass must provide (not cpu,
    memory, ephemeral-storage, pods or ``hugepages-*``)."""
    return name not in NATIVE_RESOURCES and not name.startswith("hugepages-")


def container_requests(container: Mapping[str, Any]) -> dict[str, Any]:
    """``resources.requests`` as the API server stores them: each name only in ``limits`` is
    copied into requests (``SetDefaults_Pod``). A new dict."""
    res = container.get("resources") or {}
    req = res.get("requests")
    lim = res.get("limits")
    out = dict(req) if isinstance(req, Mapping) else {}
    if isinstance(lim, Mapping):
        for k, v in lim.items():
            out.setdefault(str(k), v)
    return out


def _amount(raw: Any) -> int:
    """The whole number of ``raw`` (a Quantity), 0 when it is not one (upstream's AsInt64)."""
    try:
        q = Quantity.parse(raw)
    except (QuantityError, TypeError, ValueError):
        return 0
    v = q.value
    return int(v) if v == int(v) else 0


def _containers(pod: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]], int]:
    """The pod's containers as written, init containers first, and how many are init."""
    views = pod_containers(pod)
    return [c.body for c in views], sum(1 for c in views if c.init)


def requested_extended(pod: Mapping[str, Any]) -> list[str]:
    """The extended resources (:func:`is_extended_resource`) any container of ``pod`` asks
    for, in first-seen order (zero amounts included)."""
    return _requested(_containers(pod)[0])


def _requested(containers: Sequence[Mapping[str, Any]]) -> list[str]:
    out: list[str] = []
    for c in containers:
        for name in container_requests(c):
            if is_extended_resource(name) and name not in out:
                out.append(name)
    return out


@dataclass(frozen=True)
class ExtendedRequests:
    """What kube-scheduler makes of a pod's extended resources.

    ``requests``: the synthesised claim's ``spec.devices.requests`` (empty: no claim);
    ``mappings``: ``status.extendedResourceClaimStatus.requestMappings`` entries
    (``containerName``, ``resourceName``, ``requestName``); ``unserved``: names no
    DeviceClass serves and the pod asks a non-zero amount of (a node must advertise them:
    "Insufficient")."""

    requests: list[dict[str, Any]]
    mappings: list[dict[str, str]]
    unserved: list[str]


def _request(
    index: int,
    container: Mapping[str, Any],
    resource: str,
    cls: str,
    reusable: Sequence[dict[str, Any] | None],
) -> tuple[dict[str, Any] | None, list[dict[str, str]]]:
    """One container's request for ``resource`` (upstream's createResourceRequestAndMappings)."""
    reqs = container_requests(container)
    if resource not in reqs:
        return None, []
    want = _amount(reqs[resource])
    if want == 0:
        return None, []
    cname = str(container.get("name", ""))
    mappings: list[dict[str, str]] = []
    got = 0
    for r in reusable:
        if r is None:
            continue
        got += int(r["exactly"]["count"])
        mappings.append(
            {"containerName": cname, "resourceName": resource, "requestName": r["name"]}
        )
        if got >= want:
            return None, mappings
    position = sorted(reqs).index(resource)
    name = f"container-{index}-request-{position}"
    mappings.append({"containerName": cname, "resourceName": resource, "requestName": name})
    request = {
        "name": name,
        "exactly": {"deviceClassName": cls, "allocationMode": "ExactCount", "count": want - got},
    }
    return request, mappings


def extended_requests(pod: Mapping[str, Any], served: Mapping[str, str]) -> ExtendedRequests:
    """The synthesised claim's requests for ``pod`` given ``served`` (extended resource name
    -> DeviceClass name, :func:`tessera.api.deviceclass.served_extended_resources`), as the
    module docstring describes. A pod asking no served resource gets no requests."""
    containers, n_init = _containers(pod)
    wanted: list[str] = []
    unserved: list[str] = []
    for name in _requested(containers):
        if not any(_amount(container_requests(c).get(name, 0)) for c in containers):
            continue  # asks nothing: fits anywhere
        (wanted if name in served else unserved).append(name)
    long_lived: list[int] = []
    short_lived: list[int] = []
    for i, c in enumerate(containers):
        sidecar = c.get("restartPolicy") == "Always"
        (short_lived if i < n_init and not sidecar else long_lived).append(i)
    requests: list[dict[str, Any]] = []
    mappings: list[dict[str, str]] = []
    for resource in sorted(wanted):
        cls = served[resource]
        per_container: list[dict[str, Any] | None] = [None] * len(containers)
        long_maps: list[dict[str, str]] = []
        for i in long_lived:
            r, m = _request(i, containers[i], resource, cls, ())
            per_container[i] = r
            long_maps.extend(m)
        largest: dict[str, Any] | None = None
        short_names: set[str] = set()
        short_maps: list[dict[str, str]] = []
        for i in short_lived:
            r, m = _request(i, containers[i], resource, cls, per_container[i:])
            if r is not None:
                short_names.add(r["name"])
                if largest is None or largest["exactly"]["count"] < r["exactly"]["count"]:
                    largest = r
            short_maps.extend(m)
        if largest is not None and len(short_names) > 1:
            short_names.discard(largest["name"])
            for entry in short_maps:
                if entry["requestName"] in short_names:
                    entry["requestName"] = largest["name"]
        if largest is not None:
            requests.append(largest)
        requests.extend(r for r in per_container if r is not None)
        mappings.extend(long_maps)
        mappings.extend(short_maps)
    requests.sort(key=lambda r: str(r["name"]))
    return ExtendedRequests(requests, mappings, unserved)


def claim_name(pod_name: str, seed: str) -> str:
    """``<pod>-extended-resources-`` + 5 characters, as the API server makes it from the
    scheduler's ``generateName`` (base cut to 58 characters); the characters come from
    ``seed`` (the pod's UID) instead of at random, so a simulation is reproducible."""
    base = f"{pod_name}-extended-resources-"[:_GENERATE_BASE]
    digest = hashlib.sha256(seed.encode()).digest()
    return base + "".join(_ALPHABET[b % len(_ALPHABET)] for b in digest[:5])


def is_extended_claim(claim: Mapping[str, Any]) -> bool:
    """Whether ``claim`` is one kube-scheduler synthesised (its annotation says ``"true"``)."""
    ann = (claim.get("metadata") or {}).get("annotations") or {}
    return isinstance(ann, Mapping) and ann.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true"


def owned_by(claim: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Upstream's findExtendedResourceClaim test: a controller owner reference naming the
    pod by name and UID."""
    md = pod.get("metadata") or {}
    for ref in (claim.get("metadata") or {}).get("ownerReferences") or []:
        if (
            isinstance(ref, Mapping)
            and ref.get("controller") is True
            and ref.get("name") == md.get("name")
            and ref.get("uid") == md.get("uid")
        ):
            return True
    return False


def spec_key(requests: Sequence[Mapping[str, Any]]) -> str:
    """A key for a synthesised spec: pods asking alike share one spec object."""
    return json.dumps(list(requests), sort_keys=True)
