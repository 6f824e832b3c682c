"""GPUs (+ topology) -> ``resource.k8s.io/v1`` ResourceSlices of one node-local pool."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from tessera.api.quantity import Quantity
from tessera.api.slice_validation import (
    MAX_COUNTER_SETS,
    MAX_DEVICES,
    MAX_DEVICES_WITH_COUNTERS,
    MAX_STRING,
    is_dns_subdomain,
    validate_resource_slice,
)

from .errors import SliceBuildError
from .mig import (
    COMPUTE_SLICES,
    MEDIA_EXTENSIONS,
    DynamicMIG,
    counter_set_name,
    dynamic_mig_models,
    gi_memory_counter,
    memory_slice_counter,
    placement_device_name,
)
from .model import GPU, MIB, MigDevice, MigModel, MigProfile, Topology, pcie_root_of, to_semver

DRIVER = "gpu.tessera.dev"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"

Attr = dict[str, Any]


def shorten(text: str, limit: int = MAX_STRING) -> str:
    """``text`` if it fits ``limit`` characters, else its first ``limit - 9`` characters, ``~``
    and the first 8 hex digits of its SHA-256 (deterministic and still distinct)."""
    if len(text) <= limit:
        return text
    return text[: limit - 9] + "~" + hashlib.sha256(text.encode()).hexdigest()[:8]


def _slice_name(base: str, suffix: str) -> str:
    """A DNS subdomain of at most 253 characters: ``base + suffix``, or, when too long, a prefix
    of ``base`` plus an 8-hex hash of the whole and ``suffix``."""
    name = base + suffix
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    keep = base[: 253 - len(suffix) - 9].rstrip("-.")
    return f"{keep}-{digest}{suffix}"


def _memory(n: int) -> str:
    return Quantity.from_int(n, "BinarySI").canonical()


def _common_attributes(
    gpu: GPU, numa: int | None, pcie_roots: Mapping[str, str] | None
) -> dict[str, Attr]:
    attrs: dict[str, Attr] = {"productName": {"string": shorten(gpu.product_name)}}
    if gpu.architecture:
        attrs["architecture"] = {"string": shorten(gpu.architecture)}
    cc = to_semver(gpu.cuda_compute_capability)
    if cc:
        attrs["cudaComputeCapability"] = {"version": cc}
    drv = to_semver(gpu.driver_version)
    if drv:
        attrs["driverVersion"] = {"version": drv}
    cuda = to_semver(gpu.cuda_version)
    if cuda:
        attrs["cudaDriverVersion"] = {"version": cuda}
    if gpu.pcie_bus_id:
        attrs["pcieBusID"] = {"string": gpu.pcie_bus_id}
        root = (pcie_roots or {}).get(gpu.pcie_bus_id) or pcie_root_of(gpu.pcie_bus_id)
        if root:
            attrs[PCIE_ROOT] = {"string": root}
    if numa is not None:
        attrs["numaNode"] = {"int": numa}
    return attrs


def _gpu_device(
    gpu: GPU, numa: int | None, nvlink: int | None, pcie_roots: Mapping[str, str] | None
) -> dict[str, Any]:
    attrs: dict[str, Attr] = {
        "type": {"string": "gpu"},
        "uuid": {"string": gpu.uuid},
        "unit": {"string": gpu.uuid},
        "index": {"int": gpu.index},
        **_common_attributes(gpu, numa, pcie_roots),
    }
    if nvlink is not None:
        attrs["nvlinkDomain"] = {"int": nvlink}
    if gpu.uuid_synthesized:
        attrs["uuidSynthesized"] = {"bool": True}
    if gpu.memory_bytes is None:
        # Memory unknown (unified memory, N/A): a dedicated device. A claim that asks for no
        # memory gets it whole (cores <= 100 is only a filter on a dedicated device); a claim
        # that asks for memory finds no `memory` capacity and skips it (KEP-5075: every
        # requested capacity must exist on the device).
        return {
            "name": f"gpu-{gpu.index}",
            "attributes": attrs,
            "capacity": {"cores": {"value": "100"}},
        }
    return {
        "name": f"gpu-{gpu.index}",
        "allowMultipleAllocations": True,
        "attributes": attrs,
        # what applications can have: the driver-reserved part is never a share's
        "capacity": _shareable_capacity(gpu.usable_memory_bytes or gpu.memory_bytes),
    }


def _shareable_capacity(memory_bytes: int) -> dict[str, Any]:
    """``memory`` (default: all of it, 1Mi steps) and ``cores`` (default 0, 0..100) of a device
    that claims share (KEP-5075 request policies)."""
    memory = _memory(memory_bytes)
    return {
        "memory": {
            "value": memory,
            "requestPolicy": {
                "default": memory,
                "validRange": {"min": _memory(MIB), "step": _memory(MIB)},
            },
        },
        "cores": {
            "value": "100",
            "requestPolicy": {
                "default": "0",
                "validRange": {"min": "0", "max": "100", "step": "1"},
            },
        },
    }


#: ``cores`` of a dedicated MIG device: all of its own SMs (100 %). A claim's ``cores`` is a
#: filter there (at most 100), so converted and DRA claims that name ``cores`` match MIG devices.
_DEDICATED_CORES = {"cores": {"value": "100"}}


def _mig_device(
    gpu: GPU, mig: MigDevice, numa: int | None, pcie_roots: Mapping[str, str] | None
) -> dict[str, Any]:
    attrs: dict[str, Attr] = {"type": {"string": "mig"}}
    if mig.uuid:
        attrs["uuid"] = {"string": mig.uuid}
    unit = mig.uuid or f"MIG-{gpu.uuid}/{mig.gpu_instance_id}/{mig.compute_instance_id}"
    attrs["unit"] = {"string": unit}
    attrs["parentUUID"] = {"string": gpu.uuid}
    attrs["parentIndex"] = {"int": gpu.index}
    if mig.profile:
        attrs["profile"] = {"string": shorten(mig.profile)}
    attrs["gpuInstanceID"] = {"int": mig.gpu_instance_id}
    attrs["computeInstanceID"] = {"int": mig.compute_instance_id}
    if mig.sm_count is not None:
        attrs["multiprocessors"] = {"int": mig.sm_count}
    attrs.update(_common_attributes(gpu, numa, pcie_roots))
    if gpu.uuid_synthesized:
        attrs["parentUUIDSynthesized"] = {"bool": True}
    return {
        "name": f"gpu-{gpu.index}-mig-{mig.gpu_instance_id}-{mig.compute_instance_id}",
        "attributes": attrs,
        "capacity": {"memory": {"value": _memory(mig.memory_bytes)}, **_DEDICATED_CORES},
    }


def _static_mig(
    gpu: GPU, numa: int | None, pcie_roots: Mapping[str, str] | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(counter sets, devices) of a GPU whose MIG instances exist (static MIG).

    Devices smallest first (memory, then SMs), so the allocator's first fit is the smallest
    instance that holds a request. Compute instances of one GPU instance share its memory:
    each then consumes the whole of a counter ``gi-<id>-memory`` of the GPU's counter set, so
    one claim at a time holds that memory (NVIDIA's device plugin refuses such layouts; here
    they stay usable, one compute instance at a time)."""
    migs = sorted(
        gpu.mig_devices,
        key=lambda m: (m.memory_bytes, m.sm_count or 0, m.gpu_instance_id, m.compute_instance_id),
    )
    per_gi: dict[int, list[MigDevice]] = {}
    for m in migs:
        per_gi.setdefault(m.gpu_instance_id, []).append(m)
    shared = {gi: ms for gi, ms in per_gi.items() if len(ms) > 1}
    devices = [_mig_device(gpu, m, numa, pcie_roots) for m in migs]
    if not shared:
        return [], devices
    cs = counter_set_name(gpu.index)
    counters = {
        gi_memory_counter(gi): {"value": _memory(max(m.memory_bytes for m in ms))}
        for gi, ms in sorted(shared.items())
    }
    for m, d in zip(migs, devices, strict=True):
        if m.gpu_instance_id in shared:
            c = gi_memory_counter(m.gpu_instance_id)
            d["consumesCounters"] = [{"counterSet": cs, "counters": {c: dict(counters[c])}}]
    return [{"name": cs, "counters": counters}], devices


def _placement_order(p: MigProfile) -> list[int]:
    """Placements tried first to last. As HAMi does (``pkg/device/nvidia/mig_topology.go``):
    1g and 3g profiles from the highest start down, so the low slices stay free for the 4g and
    7g profiles that can only start at 0; other profiles from the lowest start up."""
    high_first = p.compute_slices in (1, 3)
    return sorted(p.starts, reverse=high_first)


def _dynamic_gpu(
    gpu: GPU,
    model: MigModel,
    numa: int | None,
    nvlink: int | None,
    pcie_roots: Mapping[str, str] | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(counter set, devices) of a GPU partitioned on demand (KEP-4815 partitionable devices).

    Counter set ``gpu-<index>``: ``memory-slice-<k>`` (1 each), ``compute-slices`` (7, or 4),
    and ``media-extensions`` (1) when a ``+me`` profile is offered. One dedicated device per
    profile placement, ``gpu-<index>-mig-<profile>-<start>``, consuming its memory slices, its
    compute slices and (``+me``) the media extensions; smallest profile first, so first fit is
    the smallest profile that holds a request. Last the whole GPU, ``gpu-<index>``: shareable
    like any GPU (memory = the full profile's, which is what a MIG-mode GPU can give), consuming
    every counter once its first share is placed."""
    cs = counter_set_name(gpu.index)
    has_me = any(p.media_extensions for p in model.profiles)
    counters: dict[str, Attr] = {
        memory_slice_counter(k): {"value": "1"} for k in range(model.memory_slices)
    }
    counters[COMPUTE_SLICES] = {"value": str(model.compute_slices)}
    if has_me:
        counters[MEDIA_EXTENSIONS] = {"value": "1"}
    common = _common_attributes(gpu, numa, pcie_roots)
    devices: list[dict[str, Any]] = []
    for p in model.profiles:
        for start in _placement_order(p):
            use: dict[str, Attr] = {
                memory_slice_counter(k): {"value": "1"}
                for k in range(start, start + p.memory_slices)
            }
            use[COMPUTE_SLICES] = {"value": str(p.compute_slices)}
            if p.media_extensions:
                use[MEDIA_EXTENSIONS] = {"value": "1"}
            attrs: dict[str, Attr] = {
                "type": {"string": "mig"},
                "unit": {"string": f"{gpu.uuid}/{p.name}@{start}"},
                "parentUUID": {"string": gpu.uuid},
                "parentIndex": {"int": gpu.index},
                "profile": {"string": p.name},
                "placementStart": {"int": start},
                "memorySlices": {"int": p.memory_slices},
                "computeSlices": {"int": p.compute_slices},
                "mediaExtensions": {"bool": p.media_extensions},
            }
            if p.multiprocessors is not None:
                attrs["multiprocessors"] = {"int": p.multiprocessors}
            attrs.update(common)
            if gpu.uuid_synthesized:
                attrs["parentUUIDSynthesized"] = {"bool": True}
            devices.append(
                {
                    "name": placement_device_name(gpu.index, p.name, start),
                    "attributes": attrs,
                    "capacity": {"memory": {"value": _memory(p.memory_bytes)}, **_DEDICATED_CORES},
                    "consumesCounters": [{"counterSet": cs, "counters": use}],
                }
            )
    full = model.full
    whole = _gpu_device(gpu, numa, nvlink, pcie_roots)
    memory = (
        # shared, the whole GPU is one full-profile instance: the profile's memory is already
        # what an instance gets (the driver's reserve is outside it)
        full.memory_bytes if gpu.memory_bytes is None else min(full.memory_bytes, gpu.memory_bytes)
    )
    whole["allowMultipleAllocations"] = True
    whole["capacity"] = _shareable_capacity(memory)
    whole["attributes"].update(
        {
            "migDynamic": {"bool": True},
            "migProfile": {"string": full.name},
            "memorySlices": {"int": model.memory_slices},
            "computeSlices": {"int": model.compute_slices},
        }
    )
    whole["consumesCounters"] = [
        {"counterSet": cs, "counters": {k: dict(v) for k, v in counters.items()}}
    ]
    devices.append(whole)
    return [{"name": cs, "counters": counters}], devices


def publication_warnings(
    gpus: Sequence[GPU], source: str, dynamic_mig: DynamicMIG | None = None
) -> list[str]:
    """One line per GPU that :func:`build_resource_slices` publishes with less than a GPU
    normally has, saying what is missing and what is published instead; ``source`` (the
    inventory file, a node) starts each line. Empty when every GPU is published in full.

    - memory reported as unavailable (``N/A``, ``[Not Supported]``: unified memory): a
      dedicated device without ``memory`` capacity - whole-GPU claims only;
    - MIG mode with no MIG device listed (a ``--query-gpu`` CSV and HAMi's annotation never
      list them; in ``nvidia-smi -q`` output it means no MIG instance exists) and not published
      for dynamic MIG (``dynamic_mig``, as given to :func:`build_resource_slices`): nothing;
    - published for dynamic MIG with MIG mode disabled: the node driver must enable MIG mode
      first (a GPU reset on Ampere).
    """
    try:
        dynamic = dynamic_mig_models(gpus, dynamic_mig, source)
    except SliceBuildError:
        dynamic = {}  # build_resource_slices says what is wrong
    out: list[str] = []
    for g in sorted(gpus, key=lambda g: g.index):
        what = f"{source}: GPU {g.index} ({g.uuid}, {g.product_name})"
        if g.index in dynamic:
            if not g.mig_enabled:
                out.append(
                    f"{what} is published for dynamic MIG but its MIG mode is disabled: the node "
                    f"driver must enable it (nvidia-smi -i {g.index} -mig 1; on Ampere GPUs this "
                    "takes effect after a GPU reset) before it can create instances"
                )
        elif g.mig_enabled and not g.mig_devices:
            hint = (
                "or publish it for dynamic MIG (dynamicMIG)"
                if _has_mig_table(g)
                else "or disable MIG mode"
            )
            out.append(
                f"{what} is in MIG mode but the inventory lists no MIG device, so nothing is "
                "published for it: create MIG instances and capture `nvidia-smi -q -x` (a "
                f"--query-gpu CSV or HAMi's annotation cannot list them), {hint}"
            )
        elif not g.mig_enabled and g.memory_bytes is None:
            out.append(
                f"{what}: memory total is {g.memory_reported or 'not reported'} (unified memory, "
                f"or not reported), so gpu-{g.index} is published as a dedicated device without "
                "a memory capacity: whole-GPU claims can use it, memory shares cannot"
            )
    return out


def _has_mig_table(g: GPU) -> bool:
    """Whether ``g`` could be published for dynamic MIG (its model has a profile table)."""
    from .mig import mig_model_for

    return g.mig_model is not None or mig_model_for(g.product_name, g.memory_bytes) is not None


def _check_inputs(
    node_name: str, gpus: Sequence[GPU], topology: Topology | None, driver: str, generation: int
) -> None:
    where = f"node {node_name!r}"
    if not is_dns_subdomain(node_name):
        raise SliceBuildError(
            "node name must be a lower-case DNS subdomain of at most 253 characters",
            source=where,
            field="nodeName",
        )
    if not is_dns_subdomain(driver, 63):
        raise SliceBuildError(
            f"{driver!r} is not a lower-case DNS subdomain of at most 63 characters",
            source=where,
            field="driver",
        )
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
        raise SliceBuildError(
            f"{generation!r} is not an integer >= 0", source=where, field="pool.generation"
        )
    for attr in ("index", "uuid"):
        seen: dict[object, int] = {}
        for g in gpus:
            key = getattr(g, attr)
            if key in seen:
                raise SliceBuildError(
                    f"GPUs {seen[key]} and {g.index} share {attr} {key!r}; each GPU needs its own",
                    source=where,
                    field=attr,
                )
            seen[key] = g.index
    if topology is not None and (
        topology.gpus != len(gpus) or any(not 0 <= g.index < topology.gpus for g in gpus)
    ):
        raise SliceBuildError(
            f"the topology shows {topology.gpus} GPUs but the inventory has {len(gpus)} "
            f"(indices {sorted(g.index for g in gpus)}); take both from the same node",
            source=where,
            field="topology",
        )


def build_resource_slices(
    node_name: str,
    gpus: Sequence[GPU],
    topology: Topology | None = None,
    *,
    driver: str = DRIVER,
    generation: int = 1,
    pcie_roots: Mapping[str, str] | None = None,
    dynamic_mig: DynamicMIG | None = None,
    where: str | None = None,
    taints: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    attributes: Mapping[str, Attr] | None = None,
    nvlink_domains: Mapping[int, int] | None = None,
) -> list[dict[str, Any]]:
    """The ResourceSlices (``resource.k8s.io/v1``) that publish ``gpus`` as one pool.

    Pool: ``name`` = ``node_name``, ``generation``, ``resourceSliceCount`` = number of slices;
    ``spec.nodeName`` = ``node_name``; ``metadata.name`` = ``<node>-<driver>`` (``-<k>`` appended
    when the pool needs several device slices; hashed down to 253 characters if longer). At most
    128 devices per slice (64 when devices consume counters), a GPU's devices kept in one slice,
    in GPU index order. Counter sets (KEP-4815) go into slices of their own,
    ``<node>-<driver>-counters[-<k>]``, at most 8 sets each (a slice carries devices or counters,
    never both).

    Devices (KEP-5075 consumable capacity):

    - a GPU without MIG -> ``gpu-<index>``, ``allowMultipleAllocations: true``, capacity
      ``memory`` (bytes as a BinarySI quantity; policy default = all of it, validRange min 1Mi
      step 1Mi) and ``cores`` (100; policy default 0, validRange 0..100 step 1), attributes
      ``type=gpu``, ``uuid``, ``unit`` (= uuid), ``index``, ``productName``, and when known
      ``architecture``, ``cudaComputeCapability``, ``driverVersion``, ``cudaDriverVersion``
      (semver), ``pcieBusID``, ``resource.kubernetes.io/pcieRoot``, ``numaNode``,
      ``nvlinkDomain``, ``uuidSynthesized``;
    - a GPU whose memory is unknown (``memory_bytes`` None: unified memory) -> ``gpu-<index>``
      as a dedicated device (no ``allowMultipleAllocations``) with the same attributes and
      capacity ``cores`` (100) only: a claim asking for no memory gets it whole, a claim asking
      for memory does not match it;
    - a MIG-enabled GPU with MIG instances (static MIG) -> no shareable parent; each MIG device
      a dedicated ``gpu-<index>-mig-<gi>-<ci>``, smallest first, with ``type=mig``, ``unit``,
      ``parentUUID``, ``parentIndex``, ``gpuInstanceID``, ``computeInstanceID``,
      ``uuid``/``profile``/``multiprocessors`` when known, the parent's descriptive attributes,
      capacity ``memory`` and ``cores`` (100: all of its own SMs). Compute instances of one GPU
      instance consume its memory from counter ``gi-<id>-memory`` of set ``gpu-<index>``;
    - a GPU partitioned on demand (``dynamic_mig``, see
      :func:`~tessera.inventory.mig.dynamic_mig_models`) -> counter set ``gpu-<index>`` and one
      device per profile placement plus the whole GPU (:func:`_dynamic_gpu`, ``docs/mig.md``).

    ``numaNode`` comes from the GPU, else from ``topology.numa``; ``nvlinkDomain`` from
    ``nvlink_domains`` (``{GPU index: domain}``, the driver's, keyed by NVML UUIDs) when given,
    else ``topology.nvlink_domains()``. ``pcie_roots`` maps a normalised bus id to its root complex
    (``pci0000:64``) for callers that can read sysfs; otherwise the root is published only when
    the bus id alone determines it (see :func:`~tessera.inventory.model.pcie_root_of`).

    ``taints`` (DRADeviceTaints, KEP-5055) maps a GPU UUID to the device taints
    (``{key, value, effect}``) of that GPU's devices (its MIG devices too); a pool with any
    taint is cut into slices of at most 64 devices, as the API server requires. ``attributes``
    are added to every device (the node driver's ``enforcementBackend``).

    Raises :class:`SliceBuildError` for an invalid node or driver name or generation, duplicate
    GPU indices or UUIDs, a topology with another GPU count, or a bad ``dynamic_mig`` (a GPU
    the node lacks, one that is not MIG-capable, one holding instances, an unknown profile);
    ``where`` (default ``node '<name>'``) starts those messages. Every returned slice passes
    :func:`validate_resource_slice`.
    """
    _check_inputs(node_name, gpus, topology, driver, generation)
    dynamic = dynamic_mig_models(gpus, dynamic_mig, where or f"node {node_name!r}")
    domains = (
        dict(nvlink_domains)
        if nvlink_domains is not None
        else (topology.nvlink_domains() if topology else {})
    )
    groups: list[list[dict[str, Any]]] = []
    counter_sets: list[dict[str, Any]] = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        numa = gpu.numa_node
        if numa is None and topology is not None:
            numa = topology.numa.get(gpu.index)
        if gpu.index in dynamic:
            sets, devs = _dynamic_gpu(
                gpu, dynamic[gpu.index], numa, domains.get(gpu.index), pcie_roots
            )
        elif gpu.mig_enabled:
            sets, devs = _static_mig(gpu, numa, pcie_roots)
        else:
            sets, devs = [], [_gpu_device(gpu, numa, domains.get(gpu.index), pcie_roots)]
        gpu_taints = (taints or {}).get(gpu.uuid)
        for dev in devs:
            if attributes:
                dev["attributes"].update({k: dict(v) for k, v in attributes.items()})
            if gpu_taints:
                dev["taints"] = [dict(t) for t in gpu_taints]
        counter_sets.extend(sets)
        if devs:
            groups.append(devs)
    tainted = any("taints" in d for g in groups for d in g)
    limit = MAX_DEVICES_WITH_COUNTERS if counter_sets or tainted else MAX_DEVICES
    chunks: list[list[dict[str, Any]]] = []
    for devs in groups:
        for k in range(0, len(devs), limit):
            part = devs[k : k + limit]
            if chunks and len(chunks[-1]) + len(part) <= limit:
                chunks[-1].extend(part)
            else:
                chunks.append(list(part))
    chunks = chunks or [[]]
    set_chunks = [
        counter_sets[i : i + MAX_COUNTER_SETS]
        for i in range(0, len(counter_sets), MAX_COUNTER_SETS)
    ]
    total = len(chunks) + len(set_chunks)
    base = f"{node_name}-{driver}"
    width = len(str(len(chunks) - 1))
    slices: list[dict[str, Any]] = []

    def pool_slice(name: str, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": driver,
                "pool": {"name": node_name, "generation": generation, "resourceSliceCount": total},
                "nodeName": node_name,
                **body,
            },
        }

    for k, chunk in enumerate(chunks):
        suffix = f"-{k:0{width}d}" if len(chunks) > 1 else ""
        slices.append(pool_slice(_slice_name(base, suffix), {"devices": chunk}))
    for k, sets in enumerate(set_chunks):
        suffix = "-counters" + (f"-{k}" if len(set_chunks) > 1 else "")
        slices.append(pool_slice(_slice_name(base, suffix), {"sharedCounters": sets}))
    for s in slices:
        problems = validate_resource_slice(s)
        if problems:  # a bug here, not bad input: say exactly what
            raise SliceBuildError(
                "; ".join(problems), source=f"node {node_name!r}", field=s["metadata"]["name"]
            )
    return slices
