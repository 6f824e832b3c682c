"""The allocation side of a node, as the API server records it.

What was *allocated* on each of the node's GPUs (``ResourceClaim.status.allocation``'s
``consumedCapacity``, KEP-5075) against what the GPU publishes (its ResourceSlice's
``capacity``), and which pods and containers use each claim (``status.reservedFor`` and the
pods' ``spec.resourceClaims``). This needs no NVML, so over-commitment is visible on any node.

:func:`allocation_view` is pure (API objects in, figures out); :func:`fetch_allocation_view`
reads the objects with a :class:`~tessera.kube.client.KubeClient`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from tessera import DRIVER_NAME
from tessera.allocator import AllocatedState, SliceIndex
from tessera.api.quantity import Quantity
from tessera.kube.client import KubeClient
from tessera.kube.workloads import pod_claim_names
from tessera.monitor.regions import PodRef
from tessera.scheduler.usage import gpu_usage

RESOURCE_API = "resource.k8s.io/v1"


@dataclass(frozen=True)
class GpuAllocation:
    """One GPU of the node: capacity published and allocated (bytes; cores in percent).

    ``index``: the device's ``index`` attribute (NVML order) as text, "" if not published.
    """

    driver: str
    pool: str
    device: str
    uuid: str
    index: str
    model: str
    memory_capacity: Fraction | None
    memory_allocated: Fraction
    cores_capacity: Fraction | None
    cores_allocated: Fraction
    shares: int
    dedicated: bool


@dataclass(frozen=True)
class ShareAllocation:
    """One allocation result of a claim on one of the node's GPUs.

    ``memory``/``cores``: the result's ``consumedCapacity`` (bytes, percent), or the device's
    whole capacity for a result without a shareID (dedicated); None when the device has no
    such capacity (a MIG instance has no ``cores``).
    """

    claim_uid: str
    claim_namespace: str
    claim_name: str
    driver: str
    pool: str
    device: str
    uuid: str
    memory: Fraction | None
    cores: Fraction | None
    shared: bool


@dataclass(frozen=True)
class ClaimInfo:
    """A claim allocated on the node: identity and the pods (with containers) that use it."""

    uid: str
    namespace: str
    name: str
    pods: tuple[PodRef, ...] = ()


@dataclass(frozen=True)
class AllocationView:
    """Everything the API server says about one node's Tessera GPUs, at ``fetched_at``
    (``time.time()``)."""

    node: str
    gpus: tuple[GpuAllocation, ...] = ()
    shares: tuple[ShareAllocation, ...] = ()
    claims: Mapping[str, ClaimInfo] = field(default_factory=dict)
    fetched_at: float = 0.0


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _claim_users(claim: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> tuple[PodRef, ...]:
    """The pods in ``status.reservedFor`` found among ``pods``, with the containers that
    name the claim (``resources.claims``), containers of all kinds in spec order."""
    md = _meta(claim)
    ns, name = md.get("namespace") or "default", md.get("name") or ""
    reserved = [
        r
        for r in (claim.get("status") or {}).get("reservedFor") or []
        if r.get("resource") == "pods"
    ]
    out: list[PodRef] = []
    for r in reserved:
        pod = next(
            (
                p
                for p in pods
                if _meta(p).get("namespace") == ns
                and (
                    _meta(p).get("uid") == r.get("uid")
                    or (not r.get("uid") and _meta(p).get("name") == r.get("name"))
                )
            ),
            None,
        )
        if pod is None:
            out.append(PodRef(ns, str(r.get("name") or ""), str(r.get("uid") or "")))
            continue
        refs = {pc for pc, cname in pod_claim_names(pod).items() if cname == name}
        spec = pod.get("spec") or {}
        ctrs: list[str] = []
        indexes: list[int] = []
        for part in ("initContainers", "containers"):
            for i, c in enumerate(spec.get(part) or []):
                if any(
                    rc.get("name") in refs
                    for rc in ((c.get("resources") or {}).get("claims") or [])
                ):
                    ctrs.append(str(c.get("name", "")))
                    if part == "containers":
                        indexes.append(i)
        out.append(
            PodRef(
                ns,
                str(_meta(pod).get("name") or ""),
                str(_meta(pod).get("uid") or ""),
                tuple(ctrs),
                tuple(indexes),
            )
        )
    return tuple(out)


def allocation_view(
    node: str,
    slices: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]] = (),
    *,
    fetched_at: float = 0.0,
) -> AllocationView:
    """The node's figures from its ResourceSlices (driver ``gpu.tessera.dev``, other
    drivers' slices are ignored), all ResourceClaims (those with results on the node's pools
    count) and the pods bound to the node. Per-GPU totals come from
    :func:`tessera.scheduler.usage.gpu_usage`, the same judgement ``tessera simulate`` prints."""
    mine = [
        dict(s)
        for s in slices
        if (s.get("spec") or {}).get("driver") == DRIVER_NAME
        and (s.get("spec") or {}).get("nodeName") == node
    ]
    index = SliceIndex(mine)
    pools = {(s.driver, s.pool) for s in index.slices}
    devices = {d.id: d for d in index.devices()}
    on_node = []
    for c in claims:
        results = (
            (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
        ) or []
        if any((r.get("driver"), r.get("pool")) in pools for r in results):
            on_node.append(c)
    state = AllocatedState.from_claims(on_node)
    gpus = []
    for u, d in zip(gpu_usage(index, state, {node}), index.devices(), strict=True):
        gpus.append(
            GpuAllocation(
                driver=d.driver,
                pool=d.pool,
                device=d.name,
                uuid=str(u.uuid or ""),
                index=str(d.attributes.get(f"{d.driver}/index", "")),
                model=str(u.model or ""),
                memory_capacity=u.memory_capacity,
                memory_allocated=u.memory_allocated,
                cores_capacity=u.cores_capacity,
                cores_allocated=u.cores_allocated,
                shares=u.shares,
                dedicated=u.dedicated,
            )
        )
    shares: list[ShareAllocation] = []
    infos: dict[str, ClaimInfo] = {}
    for c in on_node:
        md = _meta(c)
        uid = str(md.get("uid") or "")
        ns, name = str(md.get("namespace") or "default"), str(md.get("name") or "")
        infos[uid] = ClaimInfo(uid, ns, name, _claim_users(c, pods))
        for r in c["status"]["allocation"]["devices"]["results"]:
            dev = devices.get((r.get("driver"), r.get("pool"), r.get("device")))
            if dev is None or r.get("adminAccess"):
                continue
            cc = r.get("consumedCapacity") or {}

            def amount(
                key: str,
                cc: Mapping[str, Any] = cc,
                d: Any = dev,
                shared: bool = bool(r.get("shareID")),
            ) -> Fraction | None:
                if shared and key in cc:
                    return Quantity.parse(cc[key]).value
                cap = d.capacity.get(key)
                if cap is None:
                    return None
                return Fraction(0) if shared else cap.value.value

            shares.append(
                ShareAllocation(
                    claim_uid=uid,
                    claim_namespace=ns,
                    claim_name=name,
                    driver=dev.driver,
                    pool=dev.pool,
                    device=dev.name,
                    uuid=str(dev.attributes.get(f"{dev.driver}/uuid", "")),
                    memory=amount("memory"),
                    cores=amount("cores"),
                    shared=bool(r.get("shareID")),
                )
            )
    return AllocationView(node, tuple(gpus), tuple(shares), infos, fetched_at)


def fetch_allocation_view(client: KubeClient, node: str, *, page_size: int = 500) -> AllocationView:
    """Read the node's ResourceSlices, every ResourceClaim and the node's pods (paginated
    lists; read-only: ``get``/``list`` on resourceslices, resourceclaims, pods) and build the
    view. Raises :class:`~tessera.kube.client.ApiError`."""
    slices = [
        s
        for page in client.list_pages(
            RESOURCE_API, "ResourceSlice", limit=page_size, field_selector=f"spec.nodeName={node}"
        )
        for s in page
    ]
    claims = [
        c
        for page in client.list_pages(RESOURCE_API, "ResourceClaim", limit=page_size)
        for c in page
    ]
    pods = [
        p
        for page in client.list_pages(
            "v1", "Pod", limit=page_size, field_selector=f"spec.nodeName={node}"
        )
        for p in page
    ]
    return allocation_view(node, slices, claims, pods, fetched_at=time.time())
