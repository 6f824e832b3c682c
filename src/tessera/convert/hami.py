"""HAMi's request language: the extended-resource and annotation names Tessera reads.

Names and meanings follow HAMi v2.10 legacy (device-plugin) mode: ``nvidia.com/gpu`` counts
physical GPUs, ``nvidia.com/gpumem`` is MiB per GPU, ``nvidia.com/gpumem-percentage`` is percent
of each GPU's memory, ``nvidia.com/gpucores`` is percent of each GPU's SMs and
``nvidia.com/priority`` is HAMi's task priority. Volcano's vGPU device plugin spells the same
things ``volcano.sh/vgpu-*``; both spellings map to the same claim.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.api import vendors as _vendors

# ---- extended resources (container resources.limits / requests) ------------------------------
GPU = "nvidia.com/gpu"
GPUMEM = "nvidia.com/gpumem"
GPUMEM_PERCENTAGE = "nvidia.com/gpumem-percentage"
GPUCORES = "nvidia.com/gpucores"
PRIORITY = "nvidia.com/priority"

VOLCANO_NUMBER = "volcano.sh/vgpu-number"
VOLCANO_MEMORY = "volcano.sh/vgpu-memory"
VOLCANO_MEMORY_PERCENTAGE = "volcano.sh/vgpu-memory-percentage"
VOLCANO_CORES = "volcano.sh/vgpu-cores"


@dataclass(frozen=True, slots=True)
class ResourceFamily:
    """One spelling of HAMi's four (five) resources. ``priority`` is ``None`` where absent."""

    name: str
    count: str
    memory: str
    percentage: str
    cores: str
    priority: str | None

    def names(self) -> tuple[str, ...]:
        base = (self.count, self.memory, self.percentage, self.cores)
        return (*base, self.priority) if self.priority else base


NVIDIA = ResourceFamily("nvidia", GPU, GPUMEM, GPUMEM_PERCENTAGE, GPUCORES, PRIORITY)
VOLCANO = ResourceFamily(
    "volcano", VOLCANO_NUMBER, VOLCANO_MEMORY, VOLCANO_MEMORY_PERCENTAGE, VOLCANO_CORES, None
)
FAMILIES = (NVIDIA, VOLCANO)

HAMI_RESOURCES: frozenset[str] = frozenset(n for f in FAMILIES for n in f.names())
"""Every extended-resource name :func:`tessera.convert.convert_pod` converts and strips."""

# ---- pod annotations ---------------------------------------------------------------------
USE_UUID = "nvidia.com/use-gpuuuid"
NOUSE_UUID = "nvidia.com/nouse-gpuuuid"
USE_TYPE = "nvidia.com/use-gputype"
NOUSE_TYPE = "nvidia.com/nouse-gputype"
VGPU_MODE = "nvidia.com/vgpu-mode"
VOLCANO_VGPU_MODE = "volcano.sh/vgpu-mode"
#: Volcano's vGPU scheduler spells the UUID allow/deny lists its own way (comma lists, entries
#: trimmed, exact match on the physical GPU's UUID, deny wins: volcano ``pkg/scheduler/api/
#: devices/nvidia/vgpu`` ``newGPUUUIDFilter``); its type lists are HAMi's names.
VOLCANO_USE_UUID = "volcano.sh/vgpu-use-gpuuuid"
VOLCANO_NOUSE_UUID = "volcano.sh/vgpu-nouse-gpuuuid"
#: Volcano: ``spread`` keeps two pods of one PodGroup off one GPU. Not converted (warned).
VOLCANO_PODGROUP_POLICY = "volcano.sh/vgpu-podgroup-policy"
NUMA_BIND = "nvidia.com/numa-bind"
NODE_SCHEDULER_POLICY = "hami.io/node-scheduler-policy"
GPU_SCHEDULER_POLICY = "hami.io/gpu-scheduler-policy"
DEVICE_SCORING_WEIGHTS = "hami.io/device-scoring-weights"
WEBHOOK_LABEL = "hami.io/webhook"  # label; value "ignore" skips HAMi's webhook
#: Written by HAMi's scheduler on MIG pods: per container device, the profile and placement.
MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"

SELECTOR_ANNOTATIONS = (
    USE_UUID,
    NOUSE_UUID,
    USE_TYPE,
    NOUSE_TYPE,
    VGPU_MODE,
    VOLCANO_VGPU_MODE,
    VOLCANO_USE_UUID,
    VOLCANO_NOUSE_UUID,
)
#: Every pod annotation :func:`tessera.convert.convert_pod` reads (converted, kept or warned).
POD_ANNOTATIONS = frozenset(
    {
        *SELECTOR_ANNOTATIONS,
        NUMA_BIND,
        NODE_SCHEDULER_POLICY,
        GPU_SCHEDULER_POLICY,
        DEVICE_SCORING_WEIGHTS,
        MIG_ALLOCATIONS,
        VOLCANO_PODGROUP_POLICY,
    }
)
# ---- the decision records a HAMi-protocol scheduler writes on a pod --------------------------
VGPU_NODE = "hami.io/vgpu-node"
VGPU_TIME = "hami.io/vgpu-time"
DEVICES_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
DEVICES_ALLOCATED = "hami.io/vgpu-devices-allocated"
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"
NVIDIA_VENDOR_KEY = "NVIDIA"

#: What HAMi's and Volcano's schedulers and device plugins write on a pod they placed: records
#: of their own decision, not requests (a new placement rewrites them). ``tessera simulate``
#: keeps a bound pod's node and GPUs from them (``tessera.sim.inputs``).
SCHEDULER_RECORDS = frozenset(
    {
        VGPU_NODE,
        VGPU_TIME,
        DEVICES_TO_ALLOCATE,
        DEVICES_ALLOCATED,
        BIND_PHASE,
        BIND_TIME,
        "volcano.sh/vgpu-node",
        "volcano.sh/vgpu-time",
        "volcano.sh/vgpu-ids-new",
        "volcano.sh/devices-to-allocate",
        "volcano.sh/bind-phase",
        "volcano.sh/bind-time",
        "volcano.sh/predicate-time",
        "volcano.sh/gpu-index",
    }
)
#: Pod-annotation prefixes in whose names an unknown key is a likely misspelling of a device,
#: type or node selection (``nvidia.com/use-gpuuid``), so it is warned about, never dropped
#: silently.
SELECTION_PREFIXES = ("nvidia.com/use-", "nvidia.com/nouse-", "volcano.sh/vgpu-", "hami.io/")
#: Annotations of HAMi's other vendors that select devices: not NVIDIA, so not Tessera's.
OTHER_VENDOR_ANNOTATIONS = frozenset({"hami.io/use-xpu-uuid", "hami.io/no-use-xpu-uuid"})

# ---- HAMi's other vendors with a DRA driver in the vendor table (tessera.api.vendors) --------
#: Their resources (count, memory MiB, cores %), converted into claims for their drivers.
VENDOR_RESOURCES: frozenset[str] = frozenset(
    n for v in _vendors.CONVERTED for n in v.resource_names()
)
#: Their selection annotations, and Ascend's split mode.
VENDOR_ANNOTATIONS: frozenset[str] = frozenset(
    {*(a for v in _vendors.CONVERTED for a in v.annotation_names()), _vendors.ASCEND_VNPU_MODE}
)
#: Name prefixes of those resources and annotations (what :func:`mentions_hami` also reads).
VENDOR_MARKS = ("hygon.com/", "huawei.com/")
#: Per vendor key, the lower-case prefix of its resource names: another name under it is
#: warned about as not one of HAMi's for that vendor (a typo, or the vendor's own plugin's).
VENDOR_PREFIXES = {"ascend": "huawei.com/ascend", "hygon": "hygon.com/"}

# ---- HAMi-ish names that Tessera recognises but does not convert ------------------------------
# Resource-name prefixes of HAMi's other vendors (hami.md 1.1) with no DRA driver in the vendor
# table: left unchanged, with a warning.
OTHER_VENDOR_PREFIXES = (
    "cambricon.com/",
    "hygon.com/",
    "metax-tech.com/",
    "mthreads.com/",
    "huawei.com/ascend",
    "iluvatar.ai/",
    "kunlunxin.com/",
    "enflame.com/",
    "vastaitech.com/",
    "birentech.com/",
)
# Volcano's older gpu-share plugin (not the vGPU plugin).
VOLCANO_GPU_SHARE = frozenset({"volcano.sh/gpu-memory", "volcano.sh/gpu-number"})


# ---- the pod device list: HAMi's decision record, codec ---------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerDevice:
    """One GPU of one container in HAMi's pod device list: ``uuid``, the vendor key (``NVIDIA``
    for NVIDIA GPUs, not the model), ``memory_mib`` (MiB of the GPU's memory) and ``cores``
    (percent of its SMs, 0 = no compute limit)."""

    uuid: str
    vendor: str
    memory_mib: int
    cores: int


def encode_pod_devices(containers: list[list[ContainerDevice]]) -> str:
    """HAMi's pod device list (``hami.io/vgpu-devices-to-allocate`` / ``-allocated``): per
    device ``UUID,VENDOR,<MiB>,<cores>:``, containers joined by ``;`` with a trailing ``;``, one
    entry per container in pod order (init containers first), empty for a container with no
    GPU. ``[[], [a], [b]]`` -> ``";GPU-a,NVIDIA,3000,30:;GPU-b,NVIDIA,2000,0:;"``."""
    return "".join(
        "".join(f"{d.uuid},{d.vendor},{d.memory_mib},{d.cores}:" for d in devs) + ";"
        for devs in containers
    )


def decode_pod_devices(value: str, *, what: str = DEVICES_ALLOCATED) -> list[list[ContainerDevice]]:
    """The containers' devices of a HAMi pod device list (the inverse of
    :func:`encode_pod_devices`; the text after the last ``;`` is ignored, as HAMi does).

    Raises :class:`ValueError` naming ``what`` (the annotation) and the entry when a device has
    fewer than four fields or a memory/cores value that is not a whole number ≥ 0 (HAMi's
    ``DecodeContainerDevices`` refuses the same)."""
    out: list[list[ContainerDevice]] = []
    entries = value.split(";")
    for i, entry in enumerate(entries[:-1] if len(entries) > 1 else entries):
        devs: list[ContainerDevice] = []
        for dev in entry.split(":"):
            if not dev.strip():
                continue
            parts = [p.strip() for p in dev.split(",")]
            if len(parts) < 4 or not parts[0]:
                raise ValueError(
                    f"{what}: container entry {i} device {dev!r} needs UUID,VENDOR,MiB,cores"
                )
            try:
                mem, cores = int(parts[2]), int(parts[3])
            except ValueError:
                mem = cores = -1
            if mem < 0 or cores < 0:
                raise ValueError(
                    f"{what}: container entry {i} device {dev!r}: memory and cores must be "
                    "whole numbers >= 0"
                )
            devs.append(ContainerDevice(parts[0], parts[1], mem, cores))
        out.append(devs)
    return out
