"""The vendor table: each DRA driver Tessera converts HAMi requests for, or plans beside.

One place for what differs between vendors: the driver name, its DeviceClass, the ``type``
its shareable devices carry, its attribute and capacity names **with their units**, and the
HAMi resources of that vendor with how each maps onto the driver's capacities. The HAMi edge
(:mod:`tessera.convert`) builds claims from it; planning (``simulate``, ``explain``, ``lint``)
and the inventories read the same rows, so that a capacity's unit is stated once.

Units are explicit everywhere: ``memory`` is bytes for every driver below, while ``cores``
differs: Tessera's and HAMi's Ascend driver publish a percentage 0-100 (of the GPU's SMs, of
the NPU's AICores), Hygon's HCU driver an absolute count of the card's compute units (CUs).

Sources (read, not copied; each row says which of its facts come from where):

* Tessera: ``tessera.inventory.slices`` (this repository).
* NVIDIA's DRA driver ``gpu.nvidia.com`` (NVIDIA/k8s-dra-driver-gpu): the peer Tessera's
  ``--class-map`` maps from (``tessera.sim.classmap``); not a conversion target.
* HAMi's Ascend driver: Project-HAMi/ascend-dra-driver @ dc1db52, ``pkg/consts/consts.go``
  (driver, attribute and capacity names, type ``HAMivNPUCore``),
  ``cmd/ascend-dra-kubeletplugin/discovery.go`` ``buildLibvNPUDeviceCapacities`` (``memory``
  bytes, step 1Mi, min 1Mi; ``cores`` 0..100 step 1, default 100); the DeviceClass
  ``hami-vnpu-core.project-hami.io`` from Project-HAMi/HAMi-DRA @ 15adbee ``docs/ascend-dra.md``
  and ``pkg/constants/constants.go``. HAMi's chip table (resource names, chip names, memory,
  AICores, vNPU templates): Project-HAMi/HAMi v2.10.0 (4707fb0)
  ``charts/hami/templates/scheduler/device-configmap.yaml`` (``vnpus.configs``); the rounding of
  memory up to a template and the soft-split mode ``huawei.com/vnpu-mode: hami-core``:
  ``pkg/device/ascend/device.go`` (``trimMemory``, ``MutateAdmission``).
* AMD's DRA driver: ROCm/k8s-gpu-dra-driver @ c2b31bd ``cmd/gpu-kubeletplugin/deviceinfo.go``
  (``GetDevice``: attributes, capacities ``memory`` bytes, ``computeUnits``, ``simdUnits``, no
  request policy; device ``gpu-<card>-<render>``), ``docs/driver-attributes.md`` @ ca02b0c
  (types ``amdgpu`` / ``amdgpu-partition``), ``deployments/helm/k8s-gpu-dra-driver/templates/
  deviceclass.yaml`` @ 4482249 (DeviceClass ``gpu.amd.com``: ``device.driver == 'gpu.amd.com'``).
* Hygon's HCU driver: HYGON-AI/k8s-hcu-dra-driver ``internal/driver/allocatable_device.go``
  @ 643ba6d (type ``hcu``, attributes, ``cores`` = the card's CUs, ``memory`` bytes step 1Mi,
  ``slices`` 4 per card, default 1 per allocation), ``internal/driver/const.go`` @ 10135b2
  (driver ``dra.hygon.com``, 4 vHCUs per card), ``deployments/static/hcu-dra-driver.yaml`` @
  cbc4e9d (DeviceClass ``dra.hygon.com``: ``type == "hcu"``). HAMi's resource names: HAMi v2.10.0
  ``pkg/device/hygon/device.go`` and ``examples/hygon/`` (``hygon.com/dcunum|dcumem|dcucores``,
  ``hygon.com/use-dcutype``...), HAMi-DRA @ 052848d ``pkg/config/dra_device.go``
  (``hygon.com/hcunum|hcumem|hcucores``, ``hygon.com/use-hcutype``; a percentage times the
  card's CUs, rounded up, at least 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera import DEVICE_CLASS_NAME, DRIVER_NAME

MIB = 2**20


@dataclass(frozen=True, slots=True)
class Capacity:
    """One capacity a driver publishes per device: ``name`` (the key in
    ``devices[].capacity``), ``unit`` (what one unit of its value is), ``consumable`` (has a
    ``requestPolicy``: claims share the device by consuming it) and ``note``."""

    name: str
    unit: str
    consumable: bool
    note: str = ""


@dataclass(frozen=True, slots=True)
class VnpuTemplate:
    """One of HAMi's Ascend vNPU templates (hard split): ``name`` (``vir01``), ``memory_mib``
    and ``ai_cores`` (AICores of the template)."""

    name: str
    memory_mib: int
    ai_cores: int


@dataclass(frozen=True, slots=True)
class AscendChip:
    """One Ascend chip of HAMi's ``vnpus.configs``: its ``common_word`` (``Ascend310P``: the
    resource names are ``huawei.com/<common_word>``, ``-memory``, ``-core``), ``chip_name`` (the
    ``productName`` HAMi's Ascend DRA driver publishes, ``310P3``), ``memory_allocatable_mib``
    (what HAMi books for a whole card), ``memory_capacity_mib`` (the largest request HAMi
    accepts), ``ai_cores`` (AICores per chip), ``templates`` (smallest memory first) and
    ``pairs`` (HAMi's 910C super-pod rule: one NPU is rounded up to 2, other odd counts are
    refused)."""

    common_word: str
    chip_name: str
    memory_allocatable_mib: int
    memory_capacity_mib: int
    ai_cores: int
    templates: tuple[VnpuTemplate, ...]
    pairs: bool = False

    @property
    def count(self) -> str:
        return f"huawei.com/{self.common_word}"

    @property
    def memory(self) -> str:
        return f"huawei.com/{self.common_word}-memory"

    @property
    def cores(self) -> str:
        return f"huawei.com/{self.common_word}-core"

    @property
    def use_uuid(self) -> str:
        return f"hami.io/use-{self.common_word}-uuid"

    @property
    def nouse_uuid(self) -> str:
        return f"hami.io/no-use-{self.common_word}-uuid"

    def template_for(self, memory_mib: int) -> VnpuTemplate | None:
        """The smallest template holding ``memory_mib`` (HAMi's ``trimMemory``), or None when
        none does (then HAMi books the whole card if ``memory_mib`` <= the capacity)."""
        for t in self.templates:
            if memory_mib <= t.memory_mib:
                return t
        return None


@dataclass(frozen=True, slots=True)
class HamiFamily:
    """One spelling of a vendor's HAMi resources: ``count`` (devices), ``memory`` (MiB per
    device) and ``cores`` (percent of each device's compute), the pod annotations that select
    devices by UUID and by type (comma lists), and for Ascend the chip it names."""

    name: str
    count: str
    memory: str
    cores: str
    use_uuid: str = ""
    nouse_uuid: str = ""
    use_type: str = ""
    nouse_type: str = ""
    chip: AscendChip | None = None

    def names(self) -> tuple[str, ...]:
        return (self.count, self.memory, self.cores)

    def annotations(self) -> tuple[str, ...]:
        return tuple(
            a for a in (self.use_uuid, self.nouse_uuid, self.use_type, self.nouse_type) if a
        )


@dataclass(frozen=True, slots=True)
class Vendor:
    """One row of the vendor table.

    * ``key``: the short name users give (``tessera convert --vendor hygon``).
    * ``title``: the vendor and driver in words; ``devices``: what its devices are called;
      ``noun``: one of them in planning's reasons (``NPU``).
    * ``driver`` / ``device_class``: the DRA driver name (attribute and capacity domain) and
      the DeviceClass its claims name; a cluster has the driver when it has that class.
    * ``device_type``: the ``type`` attribute of its shareable devices ("" when none).
    * ``request_name``: the request name of the claims Tessera writes for it (HAMi-DRA's).
    * ``attributes``: the attribute names it publishes (in its own domain).
    * ``unit_attribute``: the attribute that differs between two devices of one claim
      (``distinctAttribute`` when a container asks for several).
    * ``capacities``: its capacities, with units.
    * ``cores_unit``: ``percent`` (0-100 of the device) or ``compute-units`` (absolute).
    * ``hami``: the HAMi resource spellings converted onto it (empty: not converted).
    * ``enforcement``: who enforces a share on its devices.
    """

    key: str
    title: str
    driver: str
    device_class: str
    device_type: str
    request_name: str
    attributes: tuple[str, ...]
    unit_attribute: str
    capacities: tuple[Capacity, ...]
    cores_unit: str
    hami: tuple[HamiFamily, ...] = field(default=())
    type_prefixes: tuple[str, ...] = ()
    uuid_prefixes: tuple[str, ...] = ()
    enforcement: str = ""
    devices: str = ""
    noun: str = "device"

    def capacity(self, name: str) -> Capacity | None:
        for c in self.capacities:
            if c.name == name:
                return c
        return None

    def resource_names(self) -> frozenset[str]:
        return frozenset(n for f in self.hami for n in f.names())

    def annotation_names(self) -> frozenset[str]:
        return frozenset(a for f in self.hami for a in f.annotations())


_BYTES = "bytes"

TESSERA = Vendor(
    key="tessera",
    devices="NVIDIA GPUs",
    noun="GPU",
    title="NVIDIA GPUs through Tessera's driver",
    driver=DRIVER_NAME,
    device_class=DEVICE_CLASS_NAME,
    device_type="gpu",
    request_name="gpu",
    # multiprocessors: the SM count, where an input gives it (MIG devices and placements; no
    # inventory or NVML call gives a whole GPU's, docs/inventory.md "SM count").
    attributes=(
        "uuid",
        "productName",
        "type",
        "unit",
        "nvlinkDomain",
        "numaNode",
        "profile",
        "multiprocessors",
    ),
    unit_attribute="unit",
    capacities=(
        Capacity("memory", _BYTES, True, "the GPU's memory less the driver's reserve; step 1Mi"),
        Capacity("cores", "percent of the GPU's SMs", True, "0-100, step 1"),
    ),
    cores_unit="percent",
    enforcement="Tessera's enforcement library (docs/enforcement.md)",
)

NVIDIA = Vendor(
    key="nvidia",
    devices="NVIDIA GPUs",
    noun="GPU",
    title="NVIDIA's DRA driver (k8s-dra-driver-gpu)",
    driver="gpu.nvidia.com",
    device_class="gpu.nvidia.com",
    device_type="gpu",
    request_name="gpu",
    attributes=("uuid", "productName", "type", "index", "minor", "architecture", "brand"),
    unit_attribute="uuid",
    capacities=(Capacity("memory", _BYTES, False, "whole GPUs and MIG devices, not shared"),),
    cores_unit="",
    enforcement="none for sharing: whole GPUs, MIG, or time-slicing/MPS by the driver's config",
)

#: HAMi v2.10's Ascend chips (``vnpus.configs``), in HAMi's order.
ASCEND_CHIPS: tuple[AscendChip, ...] = (
    AscendChip(
        "Ascend910A",
        "910A",
        32768,
        32768,
        30,
        (
            VnpuTemplate("vir02", 2184, 2),
            VnpuTemplate("vir04", 4369, 4),
            VnpuTemplate("vir08", 8738, 8),
            VnpuTemplate("vir16", 17476, 16),
        ),
    ),
    AscendChip(
        "Ascend910B2",
        "910B2",
        65536,
        65536,
        24,
        (
            VnpuTemplate("vir03_1c_8g", 8192, 3),
            VnpuTemplate("vir06_1c_16g", 16384, 6),
            VnpuTemplate("vir12_3c_32g", 32768, 12),
        ),
    ),
    AscendChip(
        "Ascend910B3",
        "910B3",
        65536,
        65536,
        20,
        (VnpuTemplate("vir05_1c_16g", 16384, 5), VnpuTemplate("vir10_3c_32g", 32768, 10)),
    ),
    AscendChip(
        "Ascend910B4-1",
        "910B4-1",
        65536,
        65536,
        20,
        (VnpuTemplate("vir05_1c_16g", 16384, 5), VnpuTemplate("vir10_3c_32g", 32768, 10)),
    ),
    AscendChip(
        "Ascend910B4",
        "910B4",
        32768,
        32768,
        20,
        (VnpuTemplate("vir05_1c_8g", 8192, 5), VnpuTemplate("vir10_3c_16g", 16384, 10)),
    ),
    AscendChip(
        "Ascend310P",
        "310P3",
        21527,
        24576,
        8,
        (
            VnpuTemplate("vir01", 3072, 1),
            VnpuTemplate("vir02", 6144, 2),
            VnpuTemplate("vir04", 12288, 4),
        ),
    ),
    AscendChip(
        "Ascend910C",
        "Ascend910",
        65536,
        65536,
        20,
        (VnpuTemplate("vir05_1c_16g", 16384, 5), VnpuTemplate("vir10_3c_32g", 32768, 10)),
        pairs=True,
    ),
)

#: HAMi's Ascend pod annotation for the soft split (``hami-core``): memory as asked, ``-core``
#: allowed. Without it HAMi hard-splits: memory rounded up to a vNPU template, no ``-core``.
ASCEND_VNPU_MODE = "huawei.com/vnpu-mode"
ASCEND_SOFT_SPLIT = "hami-core"

ASCEND = Vendor(
    key="ascend",
    devices="Ascend NPUs",
    noun="NPU",
    title="Huawei Ascend NPUs through HAMi's Ascend driver (HAMivNPUCore)",
    driver="ascend.project-hami.io",
    device_class="hami-vnpu-core.project-hami.io",
    device_type="HAMivNPUCore",
    request_name="npu",
    attributes=("index", "physicalID", "uuid", "model", "productName", "brand", "type"),
    unit_attribute="uuid",
    capacities=(
        Capacity("memory", _BYTES, True, "the NPU's memory; step 1Mi, min 1Mi"),
        Capacity("cores", "percent of the NPU's AICores", True, "0-100, step 1"),
    ),
    cores_unit="percent",
    hami=tuple(
        HamiFamily(
            name=c.common_word.lower(),
            count=c.count,
            memory=c.memory,
            cores=c.cores,
            use_uuid=c.use_uuid,
            nouse_uuid=c.nouse_uuid,
            use_type="hami.io/use-nputype",
            nouse_type="hami.io/no-use-nputype",
            chip=c,
        )
        for c in ASCEND_CHIPS
    ),
    enforcement="HAMi's vNPU core (libvnpu), injected by the Ascend driver",
)

HYGON = Vendor(
    key="hygon",
    devices="Hygon DCUs",
    noun="DCU",
    title="Hygon DCUs through Hygon's HCU driver (k8s-hcu-dra-driver)",
    driver="dra.hygon.com",
    device_class="dra.hygon.com",
    device_type="hcu",
    request_name="hcu",
    attributes=("type", "uuid", "productName", "architecture", "brand"),
    unit_attribute="uuid",
    capacities=(
        Capacity("memory", _BYTES, True, "the card's memory; step 1Mi"),
        Capacity("cores", "compute units (CUs) of the card", True, "0..the card's CUs, step 1"),
        Capacity(
            "slices",
            "virtual HCUs",
            True,
            "4 per card; each allocation consumes 1 by default (the driver's vHCU limit)",
        ),
    ),
    cores_unit="compute-units",
    hami=(
        # HAMi's device plugin (v2.10, its examples)
        HamiFamily(
            name="hygon-dcu",
            count="hygon.com/dcunum",
            memory="hygon.com/dcumem",
            cores="hygon.com/dcucores",
            use_uuid="hygon.com/use-gpuuuid",
            nouse_uuid="hygon.com/nouse-gpuuuid",
            use_type="hygon.com/use-dcutype",
            nouse_type="hygon.com/nouse-dcutype",
        ),
        # HAMi-DRA's default names for the HCU driver (2026)
        HamiFamily(
            name="hygon-hcu",
            count="hygon.com/hcunum",
            memory="hygon.com/hcumem",
            cores="hygon.com/hcucores",
            use_uuid="hygon.com/use-gpuuuid",
            nouse_uuid="hygon.com/nouse-gpuuuid",
            use_type="hygon.com/use-hcutype",
            nouse_type="hygon.com/nouse-hcutype",
        ),
    ),
    # HAMi registers a card's type as DCU-<name> and its UUID as DCU-<serial> (examples/hygon);
    # the HCU driver publishes productName <name> (K100_AI) and uuid <serial>.
    type_prefixes=("DCU-", "HCU-"),
    uuid_prefixes=("DCU-", "HCU-"),
    enforcement="Hygon's virtual devices (vHCU), made by the HCU driver",
)

AMD = Vendor(
    key="amd",
    devices="AMD GPUs",
    noun="GPU",
    title="AMD GPUs through AMD's DRA driver (ROCm/k8s-gpu-dra-driver)",
    driver="gpu.amd.com",
    device_class="gpu.amd.com",
    # Whole GPUs are type "amdgpu", partitions "amdgpu-partition"; none is shareable, and the
    # driver's DeviceClass selects on the driver only.
    device_type="",
    request_name="gpu",
    attributes=(
        "type",
        "uuid",
        "pciAddr",
        "cardIndex",
        "renderIndex",
        "deviceID",
        "family",
        "productName",
        "driverVersion",
        "driverSrcVersion",
        "partitionProfile",
    ),
    unit_attribute="uuid",
    capacities=(
        Capacity("memory", _BYTES, False, "the GPU's (or partition's) VRAM; not shared"),
        Capacity("computeUnits", "compute units (CUs)", False, "not shared"),
        Capacity("simdUnits", "SIMD units", False, "not shared"),
    ),
    cores_unit="",
    enforcement="none for sharing: whole GPUs and the driver's partitions",
)

#: Every row, Tessera's first.
VENDORS: tuple[Vendor, ...] = (TESSERA, NVIDIA, ASCEND, HYGON, AMD)
#: The rows whose devices planning publishes from other vendors' inventories and whose
#: DeviceClass a cluster publishing their devices has (``tessera.inventory.vendor_devices``).
PLANNED: tuple[Vendor, ...] = (ASCEND, HYGON, AMD)
#: The rows whose HAMi requests :mod:`tessera.convert` turns into claims for their drivers
#: (NVIDIA's HAMi requests go to Tessera's driver).
CONVERTED: tuple[Vendor, ...] = (ASCEND, HYGON)


def vendor(key: str) -> Vendor:
    """The row named ``key``; raises :class:`KeyError` listing the known keys."""
    for v in VENDORS:
        if v.key == key:
            return v
    raise KeyError(f"unknown vendor {key!r}; known: {', '.join(v.key for v in VENDORS)}")


def installed_vendors(device_classes: list[str] | tuple[str, ...] | set[str]) -> frozenset[str]:
    """The keys of the :data:`CONVERTED` vendors whose DeviceClass is among
    ``device_classes`` (names): their drivers are installed."""
    names = set(device_classes)
    return frozenset(v.key for v in CONVERTED if v.device_class in names)


def hygon_compute_units(cores_percent: int, card_units: int) -> int:
    """Hygon's ``cores`` capacity for HAMi's ``dcucores`` percentage on a card of
    ``card_units`` CUs: ``ceil(percent * units / 100)``, at least 1 (HAMi-DRA's
    ``ConvertCores``). ``cores_percent`` 0..100, ``card_units`` >= 1."""
    return max(1, -(-cores_percent * card_units // 100))


def vendor_of_driver(driver: str) -> Vendor | None:
    """The row whose DRA driver is ``driver`` (Tessera's before NVIDIA's), or None."""
    return next((v for v in VENDORS if v.driver == driver), None)


def capacity_unit(driver: str, name: str) -> str | None:
    """The unit of capacity ``name`` of ``driver``'s devices as its row states it
    (``percent of the NPU's AICores``), or None where the table has no such row or capacity."""
    v = vendor_of_driver(driver)
    c = v.capacity(name) if v else None
    return c.unit if c else None
