"""Discovery: the node's GPUs through NVML (``nvidia-ml-py``), else ``nvidia-smi -q -x``.

Either way the result is :class:`tessera.inventory.GPU` values, so the ResourceSlices come from
the one slice builder (:func:`tessera.inventory.build_resource_slices`) that ``tessera simulate``
uses. NVML also gives what slices do not carry: each GPU's device minor number (its
``/dev/nvidia<minor>`` node), its health, and XID events (:class:`XidWatcher`).

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
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field

from tessera.api.errors import TesseraError
from tessera.inventory import GPU, InventoryError, parse_inventory
from tessera.inventory.model import derive_architecture, normalize_bus_id

#: XIDs that NVIDIA's own device plugin treats as application errors, not GPU faults
#: (k8s-device-plugin ``health.go``): 13 graphics engine exception, 31 GPU memory page fault,
#: 43 GPU stopped processing, 45 preemptive cleanup, 68 video processor exception,
#: 109 context switch timeout.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


class DiscoveryError(TesseraError, RuntimeError):
    """Neither NVML nor nvidia-smi could list the GPUs; the message says why."""


@dataclass(frozen=True)
class NodeGPU:
    """A GPU as the node driver sees it: the inventory ``gpu``, its device ``minor`` number
    (``None`` when unknown) and the NVML ``driver_version``."""

    gpu: GPU
    minor: int | None


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


def discover_nvml(nvml: object) -> Inventory:
    """List the GPUs through NVML (``nvml`` as returned by :func:`load_nvml`).

    Per GPU: UUID, name, total memory, PCI bus id, compute capability, minor number, current
    MIG mode (a MIG-enabled GPU is listed with no MIG devices: NVML's MIG enumeration is not
    read yet, so it publishes nothing). A GPU that answers ``GPU_IS_LOST`` is left out here and
    reported by :func:`probe`.
    """
    import pynvml as n

    driver = _s(n.nvmlSystemGetDriverVersion())
    try:
        cuda: int | None = int(n.nvmlSystemGetCudaDriverVersion())
    except n.NVMLError:
        cuda = None
    cuda_str = f"{cuda // 1000}.{(cuda % 1000) // 10}" if cuda else None
    gpus: list[NodeGPU] = []
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
        except n.NVMLError as e:
            if getattr(e, "value", None) == n.NVML_ERROR_GPU_IS_LOST:
                continue
            raise DiscoveryError(f"NVML: GPU {i}: {e}") from e
        gpu = GPU(
            index=i, uuid=uuid, product_name=name,
            architecture=derive_architecture(None, cc, name), cuda_compute_capability=cc,
            driver_version=driver, cuda_version=cuda_str, pcie_bus_id=bus, numa_node=None,
            memory_bytes=mem, mig_enabled=mig,
        )
        gpus.append(NodeGPU(gpu, minor))
    return Inventory(gpus, "nvml", driver, cuda)


def discover_smi(nvidia_smi: str = "nvidia-smi", run: Callable[[list[str]], str] | None = None) -> Inventory:
    """List the GPUs from ``nvidia-smi -q -x`` with the inventory parser (minor numbers from
    ``<minor_number>``). Raises :class:`DiscoveryError`."""
    def _run(argv: list[str]) -> str:
        exe = shutil.which(argv[0])
        if exe is None:
            raise DiscoveryError(f"{argv[0]} not found on PATH")
        proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise DiscoveryError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()[:300]}")
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
    (:data:`APPLICATION_XIDS`). Stops when :meth:`stop` is called."""

    def __init__(self, uuids: list[str], on_xid: Callable[[str, int], None],
                 log: Callable[[str], None] | None = None) -> None:
        super().__init__(name="tessera-xid", daemon=True)
        self.uuids = uuids
        self.on_xid = on_xid
        self._stop = threading.Event()
        self._log = log or (lambda _m: None)

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
