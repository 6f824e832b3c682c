"""Discovery: the node's GPUs through NVML (``nvidia-ml-py``), else ``nvidia-smi -q -x``.

Either way the result is :class:`tessera.inventory.GPU` values, so the ResourceSlices come from
the one slice builder (:func:`tessera.inventory.build_resource_slices`) that ``tessera simulate``
uses. NVML also gives what slices do not carry: each GPU's device minor number (its
``/dev/nvidia<minor>`` node), its health, and XID events (:class:`XidWatcher`).

From NVML, per GPU, what ``nvidia-smi`` shows of the same machine: identity, memory, PCI bus,
compute capability, MIG mode and, in MIG mode, its MIG devices (``nvidia-smi -q``'s "MIG Device"
and ``nvidia-smi -L``: GPU-instance and compute-instance ids, UUID, memory, SMs, profile), its
NUMA node (``nvidia-smi topo -m``'s "NUMA Affinity": ``nvmlDeviceGetMemoryAffinity``, scope
node) and the GPUs it reaches over NVLink (``topo -m``'s ``NV#``:
``nvmlDeviceGetP2PStatus(..., NVML_P2P_CAPS_INDEX_NVLINK)``), plus every GPU instance with
its placement (:class:`GpuInstance`: the node driver's own instances are recognised by it).

Health of a known GPU (:func:`probe`):

* ``ok`` - NVML answers for it;
* ``lost`` - NVML returns ``NVML_ERROR_GPU_IS_LOST`` (fallen off the bus; XID 79);
* ``missing`` - NVML no longer lists its UUID (``NVML_ERROR_NOT_FOUND``).

The nvidia-smi fallback reports no health and no events (every GPU it lists is ``ok``).
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tessera.api.errors import TesseraError
from tessera.inventory import GPU, InventoryError, parse_inventory
from tessera.inventory.model import MigDevice, derive_architecture, normalize_bus_id

#: XIDs that NVIDIA's own device plugin treats as application errors, not GPU faults
#: (k8s-device-plugin ``health.go``): 13 graphics engine exception, 31 GPU memory page fault,
#: 43 GPU stopped processing, 45 preemptive cleanup, 68 video processor exception,
#: 109 context switch timeout.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

#: What a critical XID means, in the words of NVIDIA's XID catalogue ("XID Errors", r550+),
#: for the health message the kubelet shows (:meth:`tessera.driver.publish.GpuRecord.condition`).
#: An XID not listed reads "critical XID".
XID_MEANINGS: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


class DiscoveryError(TesseraError, RuntimeError):
    """Neither NVML nor nvidia-smi could list the GPUs; the message says why."""


@dataclass(frozen=True)
class GpuInstance:
    """A MIG GPU instance as NVML lists it (``nvmlDeviceGetGpuInstances`` +
    ``nvmlGpuInstanceGetInfo``): its ``id``, GPU-instance ``profile_id``, placement ``start`` and
    ``size`` (memory slices) and its compute instances as ``(id, profile id, MIG UUID)``."""

    id: int
    profile_id: int
    start: int
    size: int
    compute_instances: tuple[tuple[int, int, str], ...] = ()


@dataclass(frozen=True)
class NodeGPU:
    """A GPU as the node driver sees it: the inventory ``gpu``, its device ``minor`` number
    (``None`` when unknown), the UUIDs of the GPUs it reaches over NVLink (``nvlink``) and its
    MIG GPU instances (``instances``; NVML only)."""

    gpu: GPU
    minor: int | None
    nvlink: tuple[str, ...] = ()
    instances: tuple[GpuInstance, ...] = ()


@dataclass
class Inventory:
    """One discovery pass: GPUs in index order, the source (``nvml`` or ``nvidia-smi``),
    the driver version and NVML's CUDA driver version (``13040`` = 13.4) when known."""

    gpus: list[NodeGPU]
    source: str
    driver_version: str | None = None
    cuda_driver_version: int | None = None
    health: dict[str, str] = field(default_factory=dict)


def load_nvml(library: str | None = None) -> object:
    """Initialise NVML and return the ``pynvml`` module.

    ``library``: a path to ``libnvidia-ml.so.1`` to use instead of the loader's search; it is
    loaded first, so ``pynvml``'s ``dlopen("libnvidia-ml.so.1")`` finds it by its soname.
    Raises :class:`DiscoveryError` when NVML cannot be loaded or initialised.
    """
    import pynvml

    if library:
        try:
            ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise DiscoveryError(f"NVML library {library}: cannot load: {e}") from e
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise DiscoveryError(f"NVML: {e}") from e
    return pynvml


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _code(e: Exception) -> int | None:
    return getattr(e, "value", None)


def _reserved_memory(n: Any, h: Any, total: int | None) -> int | None:
    """FB memory the driver and firmware keep on GPU ``h`` (``nvmlDeviceGetMemoryInfo_v2``
    ``reserved``, bytes), left out of the published ``memory`` capacity; None where the driver
    does not report it (before r510, or no framebuffer)."""
    if total is None:
        return None
    try:
        v = int(n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2).reserved)
    except (n.NVMLError, AttributeError, TypeError):
        return None
    return v if 0 < v < total else None


def _numa_node(n: Any, h: Any) -> int | None:
    """The one NUMA node nearest the GPU's memory (``nvmlDeviceGetMemoryAffinity``, scope
    node), as ``nvidia-smi topo -m`` prints it under "NUMA Affinity"; None when NVML does not
    say or names several nodes."""
    words = 4  # 256 NUMA nodes
    try:
        aff = n.nvmlDeviceGetMemoryAffinity(h, words, n.NVML_AFFINITY_SCOPE_NODE)
    except n.NVMLError:
        return None
    nodes = [w * 64 + b for w in range(words) for b in range(64) if (int(aff[w]) >> b) & 1]
    return nodes[0] if len(nodes) == 1 else None


def _gpu_instances(n: Any, h: Any) -> tuple[list[GpuInstance], dict[tuple[int, int], str]]:
    """Every GPU instance of a GPU in MIG mode with its compute instances, and the profile
    name of each compute instance by ``(GI id, CI id)`` (NVML's ``MIG 1c.3g.71gb`` without
    ``MIG``)."""
    out: list[GpuInstance] = []
    names: dict[tuple[int, int], str] = {}
    seen: set[int] = set()
    for const in range(int(n.NVML_GPU_INSTANCE_PROFILE_COUNT)):
        try:
            info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, const)
        except n.NVMLError:
            continue  # not a profile of this GPU
        if info.id in seen:
            continue
        seen.add(info.id)
        arr = (n.c_nvmlGpuInstance_t * max(1, int(info.instanceCount)))()
        count = ctypes.c_uint(0)
        try:
            n.nvmlDeviceGetGpuInstances(h, info.id, arr, ctypes.byref(count))
        except n.NVMLError:
            continue
        for k in range(count.value):
            gi = arr[k]
            gii = n.nvmlGpuInstanceGetInfo(gi)
            cis: list[tuple[int, int, str]] = []
            ci_seen: set[int] = set()
            for cconst in range(int(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
                try:
                    cinfo = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                        gi, cconst, n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                    )
                except n.NVMLError:
                    continue
                if cinfo.id in ci_seen:
                    continue
                ci_seen.add(cinfo.id)
                carr = (n.c_nvmlComputeInstance_t * max(1, int(cinfo.instanceCount)))()
                ccount = ctypes.c_uint(0)
                try:
                    n.nvmlGpuInstanceGetComputeInstances(gi, cinfo.id, carr, ctypes.byref(ccount))
                except n.NVMLError:
                    continue
                for j in range(ccount.value):
                    cii = n.nvmlComputeInstanceGetInfo(carr[j])
                    cis.append((int(cii.id), int(cinfo.id), ""))
                    name = _s(getattr(cinfo, "name", b"")).removeprefix("MIG ").strip()
                    if name:
                        names[(int(gii.id), int(cii.id))] = name
            out.append(
                GpuInstance(
                    int(gii.id),
                    int(gii.profileId),
                    int(gii.placement.start),
                    int(gii.placement.size),
                    tuple(sorted(cis)),
                )
            )
    return sorted(out, key=lambda g: g.id), names


def _mig_devices(n: Any, h: Any, names: dict[tuple[int, int], str]) -> list[MigDevice]:
    """The MIG devices of a GPU in MIG mode (``nvmlDeviceGetMigDeviceHandleByIndex``), as
    ``nvidia-smi -q`` and ``-L`` list them."""
    out: list[MigDevice] = []
    for i in range(int(n.nvmlDeviceGetMaxMigDeviceCount(h))):
        try:
            m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
        except n.NVMLError as e:
            if _code(e) == n.NVML_ERROR_NOT_FOUND:
                continue
            raise
        gi, ci = int(n.nvmlDeviceGetGpuInstanceId(m)), int(n.nvmlDeviceGetComputeInstanceId(m))
        try:
            sms: int | None = int(n.nvmlDeviceGetAttributes(m).multiprocessorCount)
        except n.NVMLError:
            sms = None
        out.append(
            MigDevice(
                index=i,
                uuid=_s(n.nvmlDeviceGetUUID(m)),
                profile=names.get((gi, ci)),
                memory_bytes=int(n.nvmlDeviceGetMemoryInfo(m).total),
                sm_count=sms,
                gpu_instance_id=gi,
                compute_instance_id=ci,
            )
        )
    return out


def _with_uuids(instances: list[GpuInstance], migs: list[MigDevice]) -> tuple[GpuInstance, ...]:
    by_ids = {(m.gpu_instance_id, m.compute_instance_id): m.uuid or "" for m in migs}
    return tuple(
        GpuInstance(
            g.id,
            g.profile_id,
            g.start,
            g.size,
            tuple((c, p, by_ids.get((g.id, c), "")) for c, p, _ in g.compute_instances),
        )
        for g in instances
    )


def discover_nvml(nvml: object) -> Inventory:
    """List the GPUs through NVML (``nvml`` as returned by :func:`load_nvml`).

    Per GPU: UUID, name, total memory, PCI bus id, compute capability, minor number, NUMA node,
    current MIG mode and, in MIG mode, its MIG devices and GPU instances (see the module doc);
    per pair of GPUs whether they reach each other over NVLink. A GPU that answers
    ``GPU_IS_LOST`` is left out here and reported by :func:`probe`.
    """
    import pynvml as n

    driver = _s(n.nvmlSystemGetDriverVersion())
    try:
        cuda: int | None = int(n.nvmlSystemGetCudaDriverVersion())
    except n.NVMLError:
        cuda = None
    cuda_str = f"{cuda // 1000}.{(cuda % 1000) // 10}" if cuda else None
    gpus: list[NodeGPU] = []
    handles: list[Any] = []
    for i in range(n.nvmlDeviceGetCount()):
        try:
            h = n.nvmlDeviceGetHandleByIndex(i)
            uuid = _s(n.nvmlDeviceGetUUID(h))
            name = _s(n.nvmlDeviceGetName(h))
            try:
                mem: int | None = int(n.nvmlDeviceGetMemoryInfo(h).total)
            except n.NVMLError as e:
                if getattr(e, "value", None) != n.NVML_ERROR_NOT_SUPPORTED:
                    raise
                mem = None  # unified memory (no framebuffer of its own): published whole
            reserved = _reserved_memory(n, h, mem)
            bus = normalize_bus_id(_s(n.nvmlDeviceGetPciInfo(h).busId))
            try:
                major, minor_cc = n.nvmlDeviceGetCudaComputeCapability(h)
                cc: str | None = f"{major}.{minor_cc}"
            except n.NVMLError:
                cc = None
            try:
                minor: int | None = int(n.nvmlDeviceGetMinorNumber(h))
            except n.NVMLError:
                minor = None
            try:
                mig = bool(n.nvmlDeviceGetMigMode(h)[0])
            except n.NVMLError:
                mig = False
            migs: list[MigDevice] = []
            instances: tuple[GpuInstance, ...] = ()
            if mig:
                gis, names = _gpu_instances(n, h)
                migs = _mig_devices(n, h, names)
                instances = _with_uuids(gis, migs)
            numa = _numa_node(n, h)
        except n.NVMLError as e:
            if _code(e) == n.NVML_ERROR_GPU_IS_LOST:
                continue
            raise DiscoveryError(f"NVML: GPU {i}: {e}") from e
        gpu = GPU(
            index=i,
            uuid=uuid,
            product_name=name,
            architecture=derive_architecture(None, cc, name),
            cuda_compute_capability=cc,
            driver_version=driver,
            cuda_version=cuda_str,
            pcie_bus_id=bus,
            numa_node=numa,
            memory_bytes=mem,
            mig_enabled=mig,
            mig_devices=tuple(migs),
            memory_reserved_bytes=reserved,
        )
        gpus.append(NodeGPU(gpu, minor, instances=instances))
        handles.append(h)
    peers: dict[int, list[str]] = {k: [] for k in range(len(gpus))}
    for a in range(len(gpus)):
        for b in range(a + 1, len(gpus)):
            try:
                linked = (
                    n.nvmlDeviceGetP2PStatus(handles[a], handles[b], n.NVML_P2P_CAPS_INDEX_NVLINK)
                    == n.NVML_P2P_STATUS_OK
                )
            except n.NVMLError:
                linked = False
            if linked:
                peers[a].append(gpus[b].gpu.uuid)
                peers[b].append(gpus[a].gpu.uuid)
    gpus = [replace(ng, nvlink=tuple(sorted(peers[k]))) for k, ng in enumerate(gpus)]
    return Inventory(gpus, "nvml", driver, cuda)


def discover_smi(
    nvidia_smi: str = "nvidia-smi", run: Callable[[list[str]], str] | None = None
) -> Inventory:
    """List the GPUs from ``nvidia-smi -q -x`` with the inventory parser (minor numbers from
    ``<minor_number>``). Raises :class:`DiscoveryError`."""

    def _run(argv: list[str]) -> str:
        exe = shutil.which(argv[0])
        if exe is None:
            raise DiscoveryError(f"{argv[0]} not found on PATH")
        proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise DiscoveryError(
                f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()[:300]}"
            )
        return proc.stdout

    text = (run or _run)([nvidia_smi, "-q", "-x"])
    try:
        gpus = parse_inventory(text, "nvidia-smi -q -x")
    except InventoryError as e:
        raise DiscoveryError(str(e)) from e
    minors: dict[str, int] = {}
    try:
        root = ET.fromstring(text)
        for g in root.iter("gpu"):
            u, m = g.findtext("uuid"), g.findtext("minor_number")
            if u and m and m.strip().isdigit():
                minors[u.strip()] = int(m)
    except ET.ParseError:
        pass
    driver = gpus[0].driver_version if gpus else None
    return Inventory([NodeGPU(g, minors.get(g.uuid)) for g in gpus], "nvidia-smi", driver)


def probe(nvml: object, uuid: str) -> str:
    """Health of the GPU ``uuid`` now: ``ok``, ``lost`` or ``missing`` (see module doc)."""
    import pynvml as n

    try:
        h = n.nvmlDeviceGetHandleByUUID(uuid.encode())
        n.nvmlDeviceGetMemoryInfo(h)
    except n.NVMLError as e:
        code = getattr(e, "value", None)
        if code == n.NVML_ERROR_NOT_FOUND:
            return "missing"
        if code == n.NVML_ERROR_GPU_IS_LOST:
            return "lost"
        return "lost"
    return "ok"


class XidWatcher(threading.Thread):
    """Waits for NVML XID events (``nvmlEventTypeXidCriticalError``) on the given GPUs and
    calls ``on_xid(uuid, xid)`` for each one that is not an application error
    (:data:`APPLICATION_XIDS`). Stops when :meth:`stop` is called.

    With ``on_presence``, every ``probe_seconds`` it also calls :func:`probe` for each GPU (two
    local NVML calls each, no API call) and calls ``on_presence({uuid: health})`` when the GPUs that
    do not answer ``ok`` changed since the last probe: a GPU that fell off the bus or vanished
    without an XID event is then seen within ``probe_seconds``, not at the next rescan."""

    def __init__(
        self,
        uuids: list[str],
        on_xid: Callable[[str, int], None],
        log: Callable[[str], None] | None = None,
        *,
        on_presence: Callable[[dict[str, str]], None] | None = None,
        probe_seconds: float = 2.0,
    ) -> None:
        super().__init__(name="tessera-xid", daemon=True)
        self.uuids = uuids
        self.on_xid = on_xid
        self.on_presence = on_presence
        self.probe_seconds = probe_seconds
        self._stop = threading.Event()
        self._log = log or (lambda _m: None)
        self._absent: dict[str, str] = {}
        self._probed = 0.0

    def _probe(self) -> None:
        """Probe each GPU when ``probe_seconds`` passed; report a change of the absent ones."""
        if self.on_presence is None or time.monotonic() - self._probed < self.probe_seconds:
            return
        self._probed = time.monotonic()
        absent = {u: h for u in self.uuids if (h := probe(None, u)) != "ok"}
        if absent != self._absent:
            self._absent = absent
            self.on_presence(dict(absent))

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        import pynvml as n

        try:
            es = n.nvmlEventSetCreate()
        except n.NVMLError as e:
            self._log(f"XID events unavailable: {e}")
            return
        by_handle: dict[int | None, str] = {}
        try:
            for u in self.uuids:
                try:
                    h = n.nvmlDeviceGetHandleByUUID(u.encode())
                    n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es)
                    by_handle[ctypes.cast(h, ctypes.c_void_p).value] = u
                except n.NVMLError as e:
                    self._log(f"GPU {u}: XID events not registered: {e}")
            while not self._stop.is_set():
                self._probe()
                try:
                    data = n.nvmlEventSetWait(es, 500)
                except n.NVMLError as e:
                    if getattr(e, "value", None) == n.NVML_ERROR_TIMEOUT:
                        continue
                    self._log(f"XID event wait failed: {e}")
                    self._stop.wait(1.0)
                    continue
                xid = int(data.eventData)
                if xid in APPLICATION_XIDS:
                    continue
                # By handle: a GPU that just failed may no longer answer nvmlDeviceGetUUID.
                uuid = by_handle.get(ctypes.cast(data.device, ctypes.c_void_p).value)
                if uuid is not None:
                    self.on_xid(uuid, xid)
        finally:
            with contextlib.suppress(n.NVMLError):
                n.nvmlEventSetFree(es)
