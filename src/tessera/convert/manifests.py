"""Whole manifests in, converted manifests out: the HAMi edge for Pods *and* their controllers.

:func:`convert_object` applies :func:`~tessera.convert.convert.convert_pod` to a Pod, or to the
pod template of a workload (:data:`tessera.api.workloads.POD_TEMPLATE_PATHS`: Deployment,
ReplicaSet, StatefulSet, DaemonSet, ReplicationController, Job, CronJob; the template wrapped as
a Pod named after the workload, as ``docs/convert.md`` asks of callers), and puts the result
back in place. Every other object is returned unchanged. ``tessera convert`` is built on
it; ``tessera simulate`` converts the Pods its workloads expand into with the same
:func:`convert_pod`, so both give the same claims. Pure code, no I/O.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera import DRIVER_NAME
from tessera.api import vendors as vendor_table
from tessera.api.quantity import Quantity
from tessera.api.workloads import POD_TEMPLATE_PATHS, foreign_workload

from .convert import Conversion, ConversionError, convert_pod
from .legacy import legacy_pod


def gpu_memory_sizes(slices: Iterable[Mapping[str, Any]]) -> list[int]:
    """The distinct memory sizes, in bytes, largest first, of the devices of driver
    ``gpu.tessera.dev`` in ``slices`` (ResourceSlice dicts): what ``gpumem-percentage`` is
    resolved against (:func:`convert_pod`'s ``memory_sizes``). MIG instances count; the profile
    placements of a dynamic-MIG GPU do not (they are possible instances, not GPUs: the GPU's
    whole-GPU device counts), nor do devices without a ``memory`` capacity (memory unknown).
    Raises :class:`~tessera.api.quantity.QuantityError` for a capacity that is not a quantity."""
    sizes: set[int] = set()
    seen: set[Any] = set()  # capacity texts already parsed (a fleet repeats a few)
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != DRIVER_NAME:
            continue
        for d in spec.get("devices") or []:
            if "placementStart" in ((d or {}).get("attributes") or {}):
                continue
            mem = ((d or {}).get("capacity") or {}).get("memory")
            if isinstance(mem, Mapping) and mem.get("value") is not None:
                text = mem["value"]
                key = (type(text), text) if isinstance(text, (str, int, float)) else None
                if key is None or key not in seen:
                    sizes.add(int(Quantity.parse(text).value))
                    if key is not None:
                        seen.add(key)
    return sorted(sizes, reverse=True)


def compute_unit_sizes(
    slices: Iterable[Mapping[str, Any]], vendor: vendor_table.Vendor = vendor_table.HYGON
) -> list[int]:
    """The distinct ``cores`` capacities (compute units per card), largest first, of the
    devices of ``vendor``'s driver in ``slices`` (ResourceSlice dicts): what a Hygon
    ``dcucores`` percentage is resolved against (:func:`convert_pod`'s ``compute_units``).
    Raises :class:`~tessera.api.quantity.QuantityError` for a capacity that is not a quantity."""
    units: set[int] = set()
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != vendor.driver:
            continue
        for d in spec.get("devices") or []:
            cores = ((d or {}).get("capacity") or {}).get("cores")
            if isinstance(cores, Mapping) and cores.get("value") is not None:
                q = Quantity.parse(cores["value"])
                if q.is_integer() and q.value >= 1:
                    units.add(int(q.value))
    return sorted(units, reverse=True)


@dataclass(frozen=True)
class ObjectConversion:
    """The result of :func:`convert_object`.

    * ``obj``: the object to apply: a new dict when something was converted, else the input.
    * ``templates``: the ResourceClaimTemplates it needs (apply them first), in the object's
      namespace.
    * ``warnings``: :func:`convert_pod`'s one-line warnings.
    * ``conversion``: :func:`convert_pod`'s full result (None for an object with no pod).
    """

    obj: dict[str, Any]
    templates: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    conversion: Conversion | None = None


def _get(obj: Mapping[str, Any], path: Sequence[str]) -> Any:
    cur: Any = obj
    for part in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def convert_object(
    obj: dict[str, Any],
    *,
    memory_sizes: Sequence[int] = (),
    source: str = "",
    served: Collection[str] = (),
    vendors: Collection[str] = (),
    compute_units: Sequence[int] = (),
    legacy_scheduler: str = "",
) -> ObjectConversion:
    """Convert the HAMi-style GPU requests of one manifest.

    ``obj`` is a Kubernetes object dict. A Pod goes through :func:`convert_pod` as is. A
    controller (:data:`POD_TEMPLATE_PATHS`) has its pod template wrapped as a Pod whose
    ``metadata`` is the template's with ``name`` = the controller's name and ``namespace`` =
    the controller's namespace (so templates are named ``<workload>-<container>-gpu``); the
    converted ``spec`` replaces the template's. An object of another API holding pod templates
    (:func:`tessera.api.workloads.foreign_workload`: Argo, Kubeflow, ...) comes back unchanged
    with a warning saying so; anything else comes back unchanged. The input is
    never mutated. ``memory_sizes``, ``source``, ``served``, ``vendors`` and ``compute_units``
    are passed to :func:`convert_pod`.

    ``legacy_scheduler``: legacy mode (no DRA): each pod (template) goes through
    :func:`~.legacy.legacy_pod` instead, keeping its requests and getting this scheduler; no
    templates.

    Raises :class:`ConversionError` as :func:`convert_pod` does, and for a controller whose pod
    template has no ``spec`` mapping.
    """

    def one(pod: dict[str, Any]) -> Conversion:
        if legacy_scheduler:
            return legacy_pod(pod, legacy_scheduler, memory_sizes=memory_sizes, source=source)
        return convert_pod(
            pod,
            memory_sizes=memory_sizes,
            source=source,
            served=served,
            vendors=vendors,
            compute_units=compute_units,
        )

    kind = obj.get("kind")
    if kind == "Pod":
        conv = one(obj)
        return ObjectConversion(conv.pod, conv.templates, conv.warnings, conv)
    path = POD_TEMPLATE_PATHS.get(str(kind))
    if path is None:
        foreign = foreign_workload(
            obj, "converted"
        )  # pod templates of another API: said, not converted
        if foreign is not None:
            meta = obj.get("metadata") or {}
            head = f"{source + ': ' if source else ''}{kind} {meta.get('name', '')}"
            return ObjectConversion(obj, warnings=[f"{head}: {foreign}"])
        return ObjectConversion(obj)
    meta = obj.get("metadata") or {}
    template = _get(obj, path)
    if not isinstance(template, Mapping) or not isinstance(template.get("spec"), Mapping):
        raise ConversionError(
            f"{source + ': ' if source else ''}{kind} {meta.get('name', '')}: "
            f"{'.'.join(path)}.spec is missing: a {kind} needs a pod template with a spec"
        )
    pod_meta = copy.deepcopy(dict(template.get("metadata") or {}))
    pod_meta.pop("generateName", None)
    if meta.get("name"):
        pod_meta["name"] = meta["name"]
    if meta.get("namespace"):
        pod_meta["namespace"] = meta["namespace"]
    else:
        pod_meta.pop("namespace", None)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": template["spec"]}
    conv = one(pod)
    if not conv.templates and conv.pod["spec"] == template["spec"]:
        return ObjectConversion(obj, [], conv.warnings, conv)
    out = copy.deepcopy(obj)
    _get(out, path)["spec"] = conv.pod["spec"]
    return ObjectConversion(out, conv.templates, conv.warnings, conv)
