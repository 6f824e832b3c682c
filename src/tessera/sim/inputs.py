"""What a simulation reads from a running cluster's objects besides workloads.

* **Nodes** (``kubectl get nodes -o yaml|json``): each Node becomes a simulated node with its
  labels and taints; HAMi's ``hami.io/node-nvidia-register`` annotation, when present, is the
  node's GPU inventory (HAMi's own wire format, read by :mod:`tessera.inventory`).
* **Pods HAMi already bound** (``kubectl get pods -o yaml`` from a HAMi cluster: ``spec.nodeName``
  with HAMi's ``hami.io/vgpu-node`` / ``hami.io/vgpu-devices-allocated`` annotations, or
  Volcano's ``volcano.sh/vgpu-node`` / ``volcano.sh/vgpu-ids-new``): such a pod
  keeps its node (``spec.nodeName`` becomes a ``kubernetes.io/hostname`` node selector, since a
  preset node name would skip the scheduler's allocation of its converted claims) and, where the
  node publishes the GPUs HAMi gave it, those GPUs (``nvidia.com/use-gpuuuid``).
* Pods that have finished (``status.phase`` Succeeded or Failed) hold no GPU: left out, with a
  warning.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from tessera.api.errors import ManifestError
from tessera.api.loader import Manifest
from tessera.api.modes import MODE_LABEL, MODE_LEGACY, NodeModeError, labels_mode
from tessera.convert.hami import DEVICES_ALLOCATED, USE_UUID, VGPU_NODE
from tessera.inventory.node import HAMI_CORDON, HAMI_REGISTER, node_register_slices
from tessera.sim.cluster import SimNode

HAMI_VGPU_NODE = VGPU_NODE
HAMI_ALLOCATED = DEVICES_ALLOCATED
HAMI_USE_UUID = USE_UUID
#: Volcano's vGPU scheduler writes the same records under its own names (same device list
#: format: volcano ``pkg/scheduler/api/devices/nvidia/vgpu`` ``encodePodDevices``).
VOLCANO_VGPU_NODE = "volcano.sh/vgpu-node"
VOLCANO_ALLOCATED = "volcano.sh/vgpu-ids-new"


def node_from_object(m: Manifest) -> SimNode:
    """A simulated node from a ``v1`` Node object (validated): name, labels, taints, and the
    ResourceSlices of its HAMi register annotation
    (:func:`tessera.inventory.node.node_register_slices`: none without it, cordoned GPUs
    tainted). A Node labelled ``gpu.tessera.dev/mode: legacy`` (:mod:`tessera.api.modes`) is
    served by legacy mode: it publishes no ResourceSlices, and keeps the register and cordon
    annotations, which legacy mode's decision reads (:attr:`SimNode.annotations`). Raises
    :class:`ManifestError` naming the annotation when it is not a readable inventory, and the
    label when it holds no mode."""
    md = m.obj.get("metadata") or {}
    name = str(md.get("name") or "")
    labels = {str(k): str(v) for k, v in (md.get("labels") or {}).items()}
    labels.setdefault("kubernetes.io/hostname", name)
    taints = [
        {k: str(t[k]) for k in ("key", "value", "effect") if t.get(k) is not None}
        for t in (m.obj.get("spec") or {}).get("taints") or []
    ]
    slices = node_register_slices(m)  # the annotation is checked in either mode
    try:
        mode = labels_mode(name, labels)
    except NodeModeError as e:
        raise ManifestError(
            e.args[0],
            file=m.source.file,
            doc=m.source.doc,
            obj=m.ref(),
            field=f"metadata.labels[{MODE_LABEL}]",
        ) from None
    if mode == MODE_LEGACY:
        ann = md.get("annotations") or {}
        kept = {k: str(ann[k]) for k in (HAMI_REGISTER, HAMI_CORDON) if ann.get(k)}
        return SimNode(name, labels, [], f"{m.source}", taints, kept)
    return SimNode(name, labels, slices, f"{m.source}", taints)


def _allocated_uuids(value: str) -> list[str]:
    """GPU UUIDs in HAMi's device list format (``;UUID,NVIDIA,mem,cores:...;``)."""
    out: list[str] = []
    for container in value.split(";"):
        for dev in container.split(":"):
            parts = dev.split(",")
            if (
                len(parts) >= 4
                and parts[0].strip().startswith("GPU-")
                and parts[0].strip() not in out
            ):
                out.append(parts[0].strip())
    return out


def unbind_hami_pods(
    manifests: Sequence[Manifest], nodes: Sequence[SimNode], warnings: list[str]
) -> list[Manifest]:
    """``manifests`` with HAMi-bound pods turned into pods pinned to their node (and GPUs), and
    finished pods left out (see the module docstring). Other manifests are returned as they are."""
    uuids_of: dict[str, set[str]] = {}
    for n in nodes:
        found: set[str] = set()
        for s in n.slices:
            for d in (s.get("spec") or {}).get("devices") or []:
                u = ((d.get("attributes") or {}).get("uuid") or {}).get("string")
                if u:
                    found.add(str(u).lower())
        uuids_of[n.name] = found
    out: list[Manifest] = []
    for m in manifests:
        if m.kind != "Pod":
            out.append(m)
            continue
        phase = (m.obj.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            warnings.append(
                f"{m.source}: {m.ref()}: status.phase {phase}: a finished pod holds no GPU; left out"
            )
            continue
        md = m.obj.get("metadata") or {}
        ann = md.get("annotations") or {}
        spec = m.obj.get("spec") or {}
        node = spec.get("nodeName")
        by = (
            "HAMi"
            if HAMI_VGPU_NODE in ann or HAMI_ALLOCATED in ann
            else "Volcano"
            if VOLCANO_VGPU_NODE in ann or VOLCANO_ALLOCATED in ann
            else None
        )
        if not node or by is None:
            out.append(m)
            continue
        obj = copy.deepcopy(m.obj)
        ospec = obj["spec"]
        del ospec["nodeName"]
        ospec["nodeSelector"] = {
            **(ospec.get("nodeSelector") or {}),
            "kubernetes.io/hostname": str(node),
        }
        record = ann.get(HAMI_ALLOCATED if by == "HAMi" else VOLCANO_ALLOCATED)
        uuids = _allocated_uuids(str(record or ""))
        if (
            uuids
            and HAMI_USE_UUID not in ann
            and {u.lower() for u in uuids} <= uuids_of.get(str(node), set())
        ):
            obj["metadata"].setdefault("annotations", {})[HAMI_USE_UUID] = ",".join(uuids)
        obj.pop("status", None)
        out.append(
            Manifest(obj, m.source, m.owner, {**m.extra, "boundBy": by, "boundTo": str(node)})
        )
    return out
