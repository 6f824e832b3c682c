"""Data model of a node's GPUs and their interconnect, and the pure helpers that normalise the
values read from ``nvidia-smi`` (semver, PCI addresses, architecture and compute capability).

Units: memory in bytes (exact ints; nvidia-smi's "MiB" x 1048576). Indices are nvidia-smi
indices (the order nvidia-smi lists the GPUs in, i.e. PCI bus order), not minor numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device (a compute instance inside a GPU instance) of a MIG-enabled GPU.

    ``memory_bytes`` is the memory of its GPU instance (compute instances of one GPU instance
    share it); ``sm_count`` its multiprocessors; ``profile`` the name nvidia-smi -L prints
    (``3g.40gb``, ``1c.3g.71gb``) when the input carries it; ``uuid`` the ``MIG-...`` UUID when the
    input carries a real one. Upstream: NVML ``nvmlDeviceGetMigDeviceHandleByIndex`` fields as
    printed by ``nvidia-smi -q`` "MIG Device" / ``<mig_device>``.
    """

    index: int
    uuid: str | None
    profile: str | None
    memory_bytes: int
    sm_count: int | None
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile of a MIG-capable GPU model (NVIDIA MIG User Guide, "Supported MIG
    Profiles"; NVML ``nvmlDeviceGetGpuInstanceProfileInfo`` / ``...PossiblePlacements``).

    - ``name``: as nvidia-smi prints it (``1g.5gb``, ``1g.5gb+me``, ``3g.71gb``).
    - ``compute_slices``: the ``<n>g`` part, SM slices (of 7 on A100/H100/H200/B200, 4 on A30).
    - ``memory_slices``: memory slices one instance occupies = NVML's placement ``size``.
    - ``starts``: the memory slice each possible placement starts at (NVML placement ``start``).
    - ``memory_mib``: the instance's memory in MiB (NVML ``memorySizeMB``).
    - ``multiprocessors``: its SM count, None where no source gives it.
    - ``media_extensions``: a ``+me`` profile (it takes the GPU's only media-extension set).
    """

    name: str
    compute_slices: int
    memory_slices: int
    starts: tuple[int, ...]
    memory_mib: int
    multiprocessors: int | None = None
    media_extensions: bool = False

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB


@dataclass(frozen=True, slots=True)
class MigModel:
    """The MIG geometry of one GPU model: ``memory_slices`` (8, or 4 on A30), ``compute_slices``
    (7, or 4 on A30) and its ``profiles``, smallest first; ``name`` says which model (or which
    inventory) it comes from and ``source`` where its figures come from."""

    name: str
    memory_slices: int
    compute_slices: int
    profiles: tuple[MigProfile, ...]
    source: str = ""

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.profiles if p.name == name), None)

    @property
    def full(self) -> MigProfile:
        """The profile that takes the whole GPU (all compute slices, most memory)."""
        return max(self.profiles, key=lambda p: (p.compute_slices, p.memory_slices, p.memory_mib))


@dataclass(frozen=True, slots=True)
class GPU:
    """One physical GPU as read from an inventory.

    - ``index``: nvidia-smi index (0-based, listing order).
    - ``uuid``: ``GPU-xxxxxxxx-...``; if the input's UUID was masked or duplicated it is replaced
      by a synthesized one and ``uuid_synthesized`` is True (see :func:`synthesize_uuid`).
    - ``architecture``: e.g. "Hopper", "Ada Lovelace"; reported or derived (see
      :func:`derive_architecture`), None if unknown.
    - ``cuda_compute_capability``: "9.0"; reported or derived, None if unknown.
    - ``driver_version`` / ``cuda_version``: as reported ("535.161.08", "12.2").
    - ``pcie_bus_id``: normal form ``dddd:bb:dd.f``, lower-case hex (see :func:`normalize_bus_id`).
    - ``numa_node``: the NUMA node, when the inventory says (HAMi does; nvidia-smi -q does not).
    - ``memory_bytes``: FB memory total in bytes; None when the inventory reports it as not
      available (``N/A``, ``[Not Supported]``: unified-memory GPUs such as the GB10 have no
      framebuffer of their own), with the reported text in ``memory_reported``.
    - ``mig_enabled`` / ``mig_devices``: current MIG mode and the MIG devices present.
    - ``mig_model``: the MIG profiles the inventory itself reports for this GPU (HAMi's
      register annotation carries NVML's, ``migProfiles``); None when it reports none (the
      model's documented table is used then, :func:`tessera.inventory.mig.mig_model_for`).
    - ``mig_on_demand``: the inventory says MIG instances are made per workload (a HAMi node
      in ``mig`` mode): such a GPU is published for dynamic MIG unless the operator says
      otherwise.
    - ``memory_reserved_bytes``: FB memory the NVIDIA driver and firmware keep for themselves
      (NVML ``nvmlMemory_v2_t.reserved``, nvidia-smi "FB Memory Usage/Reserved"), part of
      ``memory_bytes`` but never available to applications; None when the input does not say.
      :attr:`usable_memory_bytes` leaves it out.
    """

    index: int
    uuid: str
    product_name: str
    architecture: str | None
    cuda_compute_capability: str | None
    driver_version: str | None
    cuda_version: str | None
    pcie_bus_id: str | None
    numa_node: int | None
    memory_bytes: int | None
    mig_enabled: bool
    mig_devices: tuple[MigDevice, ...] = ()
    uuid_synthesized: bool = False
    memory_reported: str | None = None
    mig_model: MigModel | None = None
    mig_on_demand: bool = False
    memory_reserved_bytes: int | None = None

    @property
    def usable_memory_bytes(self) -> int | None:
        """What applications can have of the GPU's memory: ``memory_bytes`` less the
        driver-reserved part (bytes; None when the memory is not reported). This is the
        ``memory`` capacity a shareable GPU is published with, so that the shares on one GPU
        never sum past what really exists (KAI-Scheduler#2212: pods OOM below their request
        when the reserve is counted as free)."""
        if self.memory_bytes is None:
            return None
        return self.memory_bytes - (self.memory_reserved_bytes or 0)


_SMALL_INT = re.compile(r"^\s*([0-9]{1,9})\s*$")


def small_int(text: object, default: int | None = None) -> int | None:
    """``text`` as a non-negative integer of at most 9 ASCII digits (an index, an id, a count),
    else ``default``: a longer or non-ASCII number in an inventory is not a value nvidia-smi
    writes, and converting it could cost unbounded time."""
    if isinstance(text, bool):
        return default
    if isinstance(text, int):
        return text if 0 <= text < 10**9 else default
    if not isinstance(text, str):
        return default
    m = _SMALL_INT.match(text)
    return int(m.group(1)) if m else default


_NV_LINK = re.compile(r"^NV(\d+)$")


@dataclass(frozen=True)
class Topology:
    """GPU-to-GPU connections from ``nvidia-smi topo -m``.

    - ``gpus``: number of GPU columns in the matrix (GPU0..GPU<n-1>).
    - ``links``: ``{(i, j): kind}`` for i != j, both directions, with ``kind`` as printed:
      ``NV<n>`` (n bonded NVLinks), ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS`` (``SOC`` on old
      drivers). Pairs the input does not show (truncated excerpts) are absent.
    - ``numa``: ``{gpu: node}`` from the "NUMA Affinity" column; None when the column is empty,
      ``N/A``, spans several nodes (``6-7``) or the GPU's row is missing.
    - ``complete``: False when some GPU rows are missing (a truncated excerpt).
    """

    gpus: int
    links: dict[tuple[int, int], str] = field(default_factory=dict)
    numa: dict[int, int | None] = field(default_factory=dict)
    complete: bool = True

    def nvlink_domains(self) -> dict[int, int]:
        """``{gpu: domain}`` for every GPU joined to another by NVLink (``NV#``), where the
        domain is the smallest GPU index of its connected component. GPUs without NVLink are
        absent."""
        parent = list(range(self.gpus))

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        linked: set[int] = set()
        for (i, j), kind in self.links.items():
            if _NV_LINK.match(kind):
                linked.update((i, j))
                ri, rj = find(i), find(j)
                if ri != rj:
                    parent[max(ri, rj)] = min(ri, rj)
        return {g: find(g) for g in sorted(linked)}


# ---- value normalisation ------------------------------------------------------------------

_VERSION_PARTS = re.compile(r"^\s*([0-9]{1,9})(?:\.([0-9]{1,9}))?(?:\.([0-9]{1,9}))?\s*$")


def to_semver(version: str | None) -> str | None:
    """A dotted numeric version as strict semver 2.0.0: leading zeros dropped, missing parts
    0 (``"535.161.08"`` -> ``"535.161.8"``, ``"460.39"`` -> ``"460.39.0"``, ``"9.0"`` ->
    ``"9.0.0"``). None for None or anything else (``"N/A"``, four parts)."""
    if version is None:
        return None
    m = _VERSION_PARTS.match(version)
    if not m:
        return None
    return ".".join(str(int(p)) if p is not None else "0" for p in m.groups())


_BUS_ID = re.compile(
    r"^\s*(?:(?P<dom>[0-9A-Fa-f]{1,8}):)?(?P<bus>[0-9A-Fa-f]{1,2}):(?P<dev>[0-9A-Fa-f]{1,2})"
    r"\.(?P<fn>[0-7])\s*$"
)


def normalize_bus_id(bus_id: str | None) -> str | None:
    """nvidia-smi's ``00000000:19:00.0`` in the Linux sysfs/lspci form ``0000:19:00.0``:
    lower-case hex, domain 4 digits (more only if it needs them), bus 2, device 2, function 1.
    None for None, ``N/A`` or anything that is not a PCI address."""
    if bus_id is None:
        return None
    m = _BUS_ID.match(bus_id)
    if not m:
        return None
    dom = int(m.group("dom") or "0", 16)
    return f"{dom:04x}:{int(m.group('bus'), 16):02x}:{int(m.group('dev'), 16):02x}.{m.group('fn')}"


def pcie_root_of(bus_id: str | None) -> str | None:
    """The PCIe root complex ``pci<domain>:<bus>`` when the bus address alone determines it.

    Upstream (``k8s.io/dynamic-resource-allocation/deviceattribute``) reads it from sysfs: the
    ``pci<dddd>:<bb>`` directory above the device. An inventory has no sysfs path, so only one
    case is certain: a device on bus 00 sits on its domain's root bus (a bridge's secondary bus
    is always numbered above its primary, so bus 00 is never behind a bridge). For any other bus
    the root is unknown here and None is returned: a GPU on bus 65 may hang below root 64.
    """
    norm = normalize_bus_id(bus_id)
    if norm is None:
        return None
    dom, bus, _ = norm.split(":", 2)
    if int(bus, 16) != 0:
        return None
    return f"pci{dom}:{bus}"


# ---- architecture and compute capability -------------------------------------------------

#: Compute capability -> architecture name as nvidia-smi prints it ("Product Architecture").
_ARCH_BY_CC_MAJOR: dict[int, str] = {
    3: "Kepler",
    5: "Maxwell",
    6: "Pascal",
    9: "Hopper",
    10: "Blackwell",
    12: "Blackwell",
}
_ARCH_BY_CC: dict[str, str] = {
    "7.0": "Volta",
    "7.2": "Volta",
    "7.5": "Turing",
    "8.0": "Ampere",
    "8.6": "Ampere",
    "8.7": "Ampere",
    "8.9": "Ada Lovelace",
}
#: Architectures that have exactly one compute capability among products nvidia-smi reports on.
_CC_BY_ARCH: dict[str, str] = {
    "Volta": "7.0",
    "Turing": "7.5",
    "Ada Lovelace": "8.9",
    "Hopper": "9.0",
}
#: Product-name patterns -> (architecture, compute capability). First match wins. Sources:
#: NVIDIA's CUDA GPU compute-capability table; only whole product families are listed.
_BY_NAME: tuple[tuple[re.Pattern[str], str, str], ...] = tuple(
    (re.compile(p, re.IGNORECASE), arch, cc)
    for p, arch, cc in (
        (r"\bGB?300\b|\bB300\b", "Blackwell", "10.3"),
        (r"\bGB?200\b|\bB100\b", "Blackwell", "10.0"),
        (r"\bGB10\b", "Blackwell", "12.1"),
        (r"\bRTX PRO \d+ Blackwell\b|\bRTX 50\d0\b", "Blackwell", "12.0"),
        (r"\bGH200\b|\bH100\b|\bH200\b|\bH800\b|\bH20\b", "Hopper", "9.0"),
        (
            r"\bL40S?\b|\bL4\b|\bL20\b|\bRTX 40\d0\b|\bAda Generation\b|\bRTX \d+ Ada\b",
            "Ada Lovelace",
            "8.9",
        ),
        (r"\bA100\b|\bA800\b|\bA30\b", "Ampere", "8.0"),
        (r"\bA10G?\b|\bA40\b|\bA16\b|\bA2\b|\bRTX A\d+\b|\bRTX 30\d0\b", "Ampere", "8.6"),
        (r"\bT4\b|\bRTX 20\d0\b|\bGTX 16\d0\b|\bQuadro RTX\b|\bTITAN RTX\b", "Turing", "7.5"),
        (r"\bV100S?\b|\bTITAN V\b", "Volta", "7.0"),
        (r"\bP100\b", "Pascal", "6.0"),
        (r"\bP4\b|\bP4-|\bP40\b|\bQuadro P\d+\b|\bGTX 10\d0\b|\bTITAN Xp?\b", "Pascal", "6.1"),
    )
)


#: What nvidia-smi prints for a value it cannot give (bracketed in CSV: ``[N/A]``).
_UNAVAILABLE = ("N/A", "NOT SUPPORTED", "UNKNOWN ERROR", "UNKNOWN")


def is_unavailable(value: str | None) -> bool:
    """True when ``value`` is nvidia-smi's word for "no value": ``N/A``, ``Not Supported``,
    ``Unknown Error`` (bare or in brackets, any case) or empty. None (absent) is not."""
    if value is None:
        return False
    v = value.strip().strip("[]").strip().upper()
    return v == "" or v in _UNAVAILABLE


def _known(value: str | None) -> str | None:
    if value is None or is_unavailable(value):
        return None
    return value.strip()


def derive_architecture(
    reported: str | None, compute_capability: str | None, product_name: str
) -> str | None:
    """The architecture: as reported (nvidia-smi "Product Architecture"), else from the compute
    capability (Volta 7.0/7.2, Turing 7.5, Ampere 8.0/8.6/8.7, Ada Lovelace 8.9, Hopper 9.0,
    Blackwell 10.x/12.x, Pascal 6.x), else from the product name table, else None."""
    arch = _known(reported)
    if arch:
        return arch
    cc = _known(compute_capability)
    if cc:
        if cc in _ARCH_BY_CC:
            return _ARCH_BY_CC[cc]
        major = cc.split(".", 1)[0]
        if major.isdigit() and int(major) in _ARCH_BY_CC_MAJOR:
            return _ARCH_BY_CC_MAJOR[int(major)]
    for pattern, name_arch, _cc in _BY_NAME:
        if pattern.search(product_name):
            return name_arch
    return None


def derive_compute_capability(
    reported: str | None, architecture: str | None, product_name: str
) -> str | None:
    """The CUDA compute capability ("9.0"): as reported (``--query-gpu=compute_cap``), else from
    the product-name table when it agrees with the architecture, else from an architecture that
    has a single compute capability (Volta, Turing, Ada Lovelace, Hopper), else None."""
    cc = _known(reported)
    if cc:
        return cc
    for pattern, name_arch, name_cc in _BY_NAME:
        if pattern.search(product_name):
            if architecture is None or architecture == name_arch:
                return name_cc
            break
    if architecture is not None:
        return _CC_BY_ARCH.get(architecture)
    return None
