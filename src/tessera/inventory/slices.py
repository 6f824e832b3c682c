"""GPUs (+ topology) -> ``resource.k8s.io/v1`` ResourceSlices of one node-local pool."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from tessera.api.quantity import Quantity

from .errors import SliceBuildError
from .model import GPU, MIB, MigDevice, Topology, pcie_root_of, to_semver
from .validate import MAX_DEVICES, MAX_STRING, is_dns_subdomain, validate_resource_slice

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
    memory = _memory(gpu.memory_bytes)
    return {
        "name": f"gpu-{gpu.index}",
        "allowMultipleAllocations": True,
        "attributes": attrs,
        "capacity": {
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
        },
    }


def _mig_device(
    gpu: GPU, mig: MigDevice, numa: int | None, pcie_roots: Mapping[str, str] | None
) -> dict[str, Any]:
    attrs: dict[str, Attr] = {"type": {"string": "mig"}}
    if mig.uuid:
        attrs["uuid"] = {"string": mig.uuid}
    attrs["parentUUID"] = {"string": gpu.uuid}
    attrs["parentIndex"] = {"int": gpu.index}
    if mig.profile:
        attrs["profile"] = {"string": shorten(mig.profile)}
    attrs["gpuInstanceID"] = {"int": mig.gpu_instance_id}
    attrs["computeInstanceID"] = {"int": mig.compute_instance_id}
    attrs.update(_common_attributes(gpu, numa, pcie_roots))
    if gpu.uuid_synthesized:
        attrs["parentUUIDSynthesized"] = {"bool": True}
    capacity: dict[str, Attr] = {"memory": {"value": _memory(mig.memory_bytes)}}
    if mig.sm_count is not None:
        capacity["multiprocessors"] = {"value": str(mig.sm_count)}
    return {
        "name": f"gpu-{gpu.index}-mig-{mig.gpu_instance_id}-{mig.compute_instance_id}",
        "attributes": attrs,
        "capacity": capacity,
    }


def publication_warnings(gpus: Sequence[GPU], source: str) -> list[str]:
    """One line per GPU that :func:`build_resource_slices` publishes with less than a GPU
    normally has, saying what is missing and what is published instead; ``source`` (the
    inventory file, a node) starts each line. Empty when every GPU is published in full.

    - memory reported as unavailable (``N/A``, ``[Not Supported]``: unified memory): a
      dedicated device without ``memory`` capacity - whole-GPU claims only;
    - MIG mode with no MIG device listed (a ``--query-gpu`` CSV and HAMi's annotation never
      list them; in ``nvidia-smi -q`` output it means no MIG instance exists): nothing.
    """
    out: list[str] = []
    for g in sorted(gpus, key=lambda g: g.index):
        what = f"{source}: GPU {g.index} ({g.uuid}, {g.product_name})"
        if g.mig_enabled and not g.mig_devices:
            out.append(
                f"{what} is in MIG mode but the inventory lists no MIG device, so nothing is "
                "published for it: create MIG instances and capture `nvidia-smi -q -x` (a "
                "--query-gpu CSV or HAMi's annotation cannot list them), or disable MIG mode"
            )
        elif not g.mig_enabled and g.memory_bytes is None:
            out.append(
                f"{what}: memory total is {g.memory_reported or 'not reported'} (unified memory, "
                f"or not reported), so gpu-{g.index} is published as a dedicated device without "
                "a memory capacity: whole-GPU claims can use it, memory shares cannot"
            )
    return out


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
) -> list[dict[str, Any]]:
    """The ResourceSlices (``resource.k8s.io/v1``) that publish ``gpus`` as one pool.

    Pool: ``name`` = ``node_name``, ``generation``, ``resourceSliceCount`` = number of slices;
    ``spec.nodeName`` = ``node_name``; ``metadata.name`` = ``<node>-<driver>`` (``-<k>`` appended
    when the pool needs several slices; hashed down to 253 characters if longer). At most 128
    devices per slice, in GPU index order.

    Devices (KEP-5075 consumable capacity):

    - a GPU without MIG -> ``gpu-<index>``, ``allowMultipleAllocations: true``, capacity
      ``memory`` (bytes as a BinarySI quantity; policy default = all of it, validRange min 1Mi
      step 1Mi) and ``cores`` (100; policy default 0, validRange 0..100 step 1), attributes
      ``type=gpu``, ``uuid``, ``index``, ``productName``, and when known ``architecture``,
      ``cudaComputeCapability``, ``driverVersion``, ``cudaDriverVersion`` (semver),
      ``pcieBusID``, ``resource.kubernetes.io/pcieRoot``, ``numaNode``, ``nvlinkDomain``,
      ``uuidSynthesized``;
    - a GPU whose memory is unknown (``memory_bytes`` None: unified memory) -> ``gpu-<index>``
      as a dedicated device (no ``allowMultipleAllocations``) with the same attributes and
      capacity ``cores`` (100) only: a claim asking for no memory gets it whole, a claim asking
      for memory does not match it;
    - a MIG-enabled GPU -> no shareable parent; each MIG device a dedicated
      ``gpu-<index>-mig-<gi>-<ci>`` with ``type=mig``, ``parentUUID``, ``parentIndex``,
      ``gpuInstanceID``, ``computeInstanceID``, ``uuid``/``profile`` when known, the parent's
      descriptive attributes, capacity ``memory`` and ``multiprocessors`` (no requestPolicy).

    ``numaNode`` comes from the GPU, else from ``topology.numa``; ``nvlinkDomain`` from
    ``topology.nvlink_domains()``. ``pcie_roots`` maps a normalised bus id to its root complex
    (``pci0000:64``) for callers that can read sysfs; otherwise the root is published only when
    the bus id alone determines it (see :func:`~tessera.inventory.model.pcie_root_of`).

    Raises :class:`SliceBuildError` for an invalid node or driver name or generation, duplicate
    GPU indices or UUIDs, or a topology with another GPU count. Every returned slice passes
    :func:`validate_resource_slice`.
    """
    _check_inputs(node_name, gpus, topology, driver, generation)
    domains = topology.nvlink_domains() if topology else {}
    devices: list[dict[str, Any]] = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        numa = gpu.numa_node
        if numa is None and topology is not None:
            numa = topology.numa.get(gpu.index)
        if gpu.mig_enabled:
            for mig in sorted(gpu.mig_devices, key=lambda m: m.index):
                devices.append(_mig_device(gpu, mig, numa, pcie_roots))
        else:
            devices.append(_gpu_device(gpu, numa, domains.get(gpu.index), pcie_roots))
    chunks = [devices[i : i + MAX_DEVICES] for i in range(0, len(devices), MAX_DEVICES)] or [[]]
    base = f"{node_name}-{driver}"
    slices: list[dict[str, Any]] = []
    for k, chunk in enumerate(chunks):
        suffix = f"-{k}" if len(chunks) > 1 else ""
        slices.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": _slice_name(base, suffix)},
                "spec": {
                    "driver": driver,
                    "pool": {
                        "name": node_name,
                        "generation": generation,
                        "resourceSliceCount": len(chunks),
                    },
                    "nodeName": node_name,
                    "devices": chunk,
                },
            }
        )
    for s in slices:
        problems = validate_resource_slice(s)
        if problems:  # a bug here, not bad input: say exactly what
            raise SliceBuildError(
                "; ".join(problems), source=f"node {node_name!r}", field=s["metadata"]["name"]
            )
    return slices
