"""Other vendors' inventories -> their devices -> the ResourceSlices their DRA drivers publish.

The NVIDIA inventories (:mod:`tessera.inventory.parse`) describe the GPUs Tessera's own driver
publishes. A mixed fleet also has nodes (or cards of one node) that other vendors' DRA drivers
publish; this module reads what those vendors' tools print and builds the slices of the driver
the vendor table names (:mod:`tessera.api.vendors`: driver, DeviceClass ``type``, attribute and
capacity names, units), so that ``simulate``, ``explain`` and ``lint`` plan such nodes.

Read (detected from the text, see :func:`detect_vendor_format`):

* ``npu-smi info`` (Huawei Ascend; the table of CANN 23.x-25.x: two rows per chip, ``NPU Name
  Health ...`` and ``Chip Bus-Id AICore(%) Memory-Usage(MB) HBM-Usage(MB)``): each chip row is
  one NPU of HAMi's Ascend driver. ``HBM-Usage(MB)``'s total is its memory (npu-smi's "MB" are
  MiB: 65536 on a 64 GiB 910B3); where a chip has no HBM (the 310P), ``Memory-Usage(MB)``'s.

  What such a table does **not** give, and the slices therefore lack or derive (never
  invent): no UUID (the Ascend driver's is ``<node>-<logic ID>``, and the table's NPU index is
  used as the logic ID of chip 0: right for one chip per card, the 910 series), no AICore count
  (the driver publishes ``cores`` as 0-100 percent, so none is needed).
* ``rocm-smi --showallinfo --json`` (AMD; ``card<N>`` objects): each card is one whole GPU of
  AMD's DRA driver (``gpu.amd.com``, type ``amdgpu``): ``cardIndex`` N, ``pciAddr`` ("PCI Bus",
  lower case), ``deviceID`` ("Device ID"), ``productName`` ("Card series" as rocm-smi prints it:
  the driver's own name is normalised from sysfs and may differ), ``driverVersion`` (the
  ``system`` object's "Driver version"), ``memory`` ("VRAM Total Memory (B)"). Not in it, so not
  published: the render node index (the driver names devices ``gpu-<card>-<render>``; these are
  ``gpu-<card>``), the driver's UUID (a hash over the render index too), ``family``, and the
  ``computeUnits`` / ``simdUnits`` capacities (KFD topology, not rocm-smi).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.api.slice_validation import is_dns_subdomain, validate_resource_slice
from tessera.api.vendors import ASCEND, Vendor

from .errors import MalformedInputError, SliceBuildError
from .model import MIB

VENDOR_FORMATS = ("npu-smi-info", "rocm-smi-json")

_NPU_SMI_HEAD = re.compile(r"^\|\s*NPU\s+Name\s*\|\s*Health\s*\|", re.MULTILINE)
_NPU_ROW = re.compile(r"^\|\s*(\d+)\s+(\S+)\s*\|\s*(\S+)\s*\|")
_CHIP_ROW = re.compile(
    r"^\|\s*(\d+)\s*\|\s*([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*\|(.*)\|\s*$"
)
_USAGE = re.compile(r"(\d+)\s*/\s*(\d+)")


@dataclass(frozen=True, slots=True)
class VendorDevice:
    """One device of another vendor, as its tool prints it.

    ``vendor``: the row of :mod:`tessera.api.vendors`; ``index``: the tool's device index (the
    NPU ID); ``chip``: the chip of that card (0 for single-chip cards); ``product_name``: as
    printed (``910B3``: the ``productName`` the Ascend driver publishes); ``memory_bytes``: its
    memory (bytes); ``bus_id``: PCI address, lower case; ``health``: as printed (``OK``);
    ``compute_units``: the card's compute units where the tool prints them, else None;
    ``device_id`` (PCI device ID) and ``driver_version`` where the tool prints them.
    """

    vendor: Vendor
    index: int
    chip: int
    product_name: str
    memory_bytes: int
    bus_id: str | None
    health: str
    compute_units: int | None = None
    device_id: str | None = None
    driver_version: str | None = None


def detect_vendor_format(text: str) -> str | None:
    """One of :data:`VENDOR_FORMATS`, or None when the text is none of them."""
    if _NPU_SMI_HEAD.search(text):
        return "npu-smi-info"
    if text.lstrip().startswith("{") and '"card' in text and _VRAM_TOTAL in text:
        return "rocm-smi-json"
    return None


_VRAM_TOTAL = "VRAM Total Memory (B)"
_CARD = re.compile(r"^card(\d{1,4})$")


def parse_rocm_smi_json(text: str, source: str = "<rocm-smi --json>") -> list[VendorDevice]:
    """The GPUs of ``rocm-smi --json`` output (see the module docstring), in card order.

    Raises :class:`MalformedInputError` naming the card and field when the JSON does not
    parse, a card has no "VRAM Total Memory (B)" integer or no "Card series"."""
    import json

    from tessera.api.vendors import AMD

    try:
        doc = json.loads(text)
    except ValueError as e:
        raise MalformedInputError(f"not JSON ({e})", source=source, field="json") from None
    if not isinstance(doc, dict):
        raise MalformedInputError("not a JSON object of cards", source=source, field="json")
    system = doc.get("system")
    driver = str(system.get("Driver version") or "") or None if isinstance(system, dict) else None
    out: list[VendorDevice] = []
    for key, card in doc.items():
        m = _CARD.match(str(key))
        if not m or not isinstance(card, dict):
            continue
        vram = str(card.get(_VRAM_TOTAL, "")).strip()
        if not vram.isdigit() or int(vram) <= 0:
            raise MalformedInputError(
                f"{key}: no VRAM total in bytes (got {card.get(_VRAM_TOTAL)!r}); capture "
                "`rocm-smi --showallinfo --json` (or --showmeminfo vram --json)",
                source=source,
                field=f"{key}.{_VRAM_TOTAL}",
            )
        series = str(card.get("Card series") or "").strip()
        if not series:
            raise MalformedInputError(
                f"{key}: no product name; capture `rocm-smi --showallinfo --json`",
                source=source,
                field=f"{key}.Card series",
            )
        bus = str(card.get("PCI Bus") or "").strip().lower() or None
        out.append(
            VendorDevice(
                vendor=AMD,
                index=int(m.group(1)),
                chip=0,
                product_name=series,
                memory_bytes=int(vram),
                bus_id=bus,
                health="",
                device_id=str(card.get("Device ID") or "") or None,
                driver_version=driver,
            )
        )
    if not out:
        raise MalformedInputError("no card<N> object", source=source, field="json")
    return sorted(out, key=lambda d: d.index)


def parse_npu_smi_info(text: str, source: str = "<npu-smi info>") -> list[VendorDevice]:
    """The NPUs of an ``npu-smi info`` table (see the module docstring), in table order.

    Raises :class:`MalformedInputError` naming the line when an NPU row has no chip row with
    a memory total, or when the table has no NPU at all."""
    out: list[VendorDevice] = []
    npu: tuple[int, str, str, int] | None = None  # index, name, health, line
    lines = text.splitlines()
    for no, line in enumerate(lines, 1):
        if _NPU_SMI_HEAD.match(line) or line.lstrip().startswith("| Chip "):
            continue
        if line.lstrip().startswith("| NPU ") and "Process" in line:
            break  # the process table follows the device table
        m = _NPU_ROW.match(line)
        if m and not _CHIP_ROW.match(line):
            if npu is not None:
                raise MalformedInputError(
                    f"NPU {npu[0]} has no chip row (Chip | Bus-Id | ... HBM-Usage(MB))",
                    source=source,
                    field="Chip",
                    line=npu[3],
                )
            npu = (int(m.group(1)), m.group(2), m.group(3), no)
            continue
        c = _CHIP_ROW.match(line)
        if c and npu is not None:
            usages = _USAGE.findall(c.group(3))
            # Memory-Usage(MB) then HBM-Usage(MB): the HBM total where there is HBM.
            totals = [int(t) for _, t in usages]
            mib = next((t for t in reversed(totals) if t > 0), 0)
            if not mib:
                raise MalformedInputError(
                    f"NPU {npu[0]} chip {c.group(1)}: no memory total in Memory-Usage(MB) or "
                    "HBM-Usage(MB) (expected 'used / total')",
                    source=source,
                    field="HBM-Usage(MB)",
                    line=no,
                )
            out.append(
                VendorDevice(
                    vendor=ASCEND,
                    index=npu[0],
                    chip=int(c.group(1)),
                    product_name=npu[1],
                    memory_bytes=mib * MIB,
                    bus_id=c.group(2).lower(),
                    health=npu[2],
                )
            )
            npu = None
    if npu is not None:
        raise MalformedInputError(
            f"NPU {npu[0]} has no chip row", source=source, field="Chip", line=npu[3]
        )
    if not out:
        raise MalformedInputError(
            "an npu-smi table without any NPU row", source=source, field="NPU"
        )
    return out


def parse_vendor_inventory(text: str, source: str) -> list[VendorDevice]:
    """The devices of another vendor's inventory (format detected). Raises
    :class:`~tessera.inventory.errors.UnsupportedFormatError` naming the formats read."""
    from .errors import UnsupportedFormatError

    fmt = detect_vendor_format(text)
    if fmt == "npu-smi-info":
        return parse_npu_smi_info(text, source)
    if fmt == "rocm-smi-json":
        return parse_rocm_smi_json(text, source)
    raise UnsupportedFormatError(
        "not another vendor's inventory this package reads; give `npu-smi info` output or "
        "`rocm-smi --showallinfo --json`",
        source=source,
        field="format",
    )


def _quantity(n: int) -> str:
    from tessera.api.quantity import Quantity

    return Quantity.from_int(n, "BinarySI").canonical()


def _capacity(value: str, step: str, minimum: str) -> dict[str, Any]:
    return {
        "value": value,
        "requestPolicy": {
            "default": value,
            "validRange": {"min": minimum, "max": value, "step": step},
        },
    }


def _ascend_device(node: str, d: VendorDevice) -> dict[str, Any]:
    """One device as HAMi's Ascend driver publishes it with HAMivNPUCore on
    (``cmd/ascend-dra-kubeletplugin/discovery.go``: ``enumerateDevices``' attributes,
    ``buildLibvNPUDeviceCapacities``' capacities)."""
    v = d.vendor
    attrs: dict[str, Any] = {
        "index": {"int": d.index},
        "physicalID": {"int": d.index},
        "uuid": {"string": f"{node}-{d.index}"},
        "model": {"string": d.product_name},
        "productName": {"string": d.product_name},
        "brand": {"string": "Huawei"},
        "type": {"string": v.device_type},
    }
    caps: dict[str, Any] = {}
    for c in v.capacities:
        if c.name == "memory":
            caps["memory"] = _capacity(_quantity(d.memory_bytes), "1Mi", "1Mi")
        elif c.name == "cores" and v.cores_unit == "percent":
            caps["cores"] = _capacity("100", "1", "0")
    return {
        "name": f"npu-{d.index}-{d.chip}",
        "allowMultipleAllocations": True,
        "attributes": attrs,
        "capacity": caps,
    }


def _amd_device(node: str, d: VendorDevice) -> dict[str, Any]:
    """One whole GPU as AMD's DRA driver publishes it (``deviceinfo.go`` ``GetDevice``), with
    only what the inventory gives (module docstring): no render index, UUID, family,
    ``computeUnits`` or ``simdUnits``."""
    from tessera.api.quantity import Quantity

    from .model import to_semver

    attrs: dict[str, Any] = {"type": {"string": "amdgpu"}, "cardIndex": {"int": d.index}}
    if d.bus_id:
        attrs["pciAddr"] = {"string": d.bus_id}
    if d.device_id:
        attrs["deviceID"] = {"string": d.device_id}
    attrs["productName"] = {"string": d.product_name[:64]}
    ver = to_semver(d.driver_version) if d.driver_version else None
    if ver:
        attrs["driverVersion"] = {"version": ver}
    return {
        "name": f"gpu-{d.index}",
        "attributes": attrs,
        "capacity": {
            "memory": {"value": Quantity.from_int(d.memory_bytes, "BinarySI").canonical()}
        },
    }


_BUILDERS = {ASCEND.key: _ascend_device, "amd": _amd_device}


def vendor_resource_slices(
    node: str, devices: Sequence[VendorDevice], *, where: str = ""
) -> list[dict[str, Any]]:
    """The ResourceSlices (``resource.k8s.io/v1`` dicts) each vendor's DRA driver publishes for
    ``devices`` on ``node``: one slice per vendor, named ``<node>-<driver>``, pool ``node``,
    in the driver's attribute and capacity names (:mod:`tessera.api.vendors`). Raises
    :class:`SliceBuildError` for a bad node name, a vendor without a builder, or duplicate
    devices."""
    src = where or f"node {node}"
    if not is_dns_subdomain(node):
        raise SliceBuildError(f"{node!r} is not a valid node name", source=src, field="nodeName")
    by_vendor: dict[str, list[dict[str, Any]]] = {}
    vendors: dict[str, Vendor] = {}
    for d in devices:
        build = _BUILDERS.get(d.vendor.key)
        if build is None:
            raise SliceBuildError(
                f"no ResourceSlice builder for vendor {d.vendor.key!r}",
                source=src,
                field="vendor",
            )
        vendors[d.vendor.key] = d.vendor
        by_vendor.setdefault(d.vendor.key, []).append(build(node, d))
    out: list[dict[str, Any]] = []
    for key, devs in by_vendor.items():
        v = vendors[key]
        names = [x["name"] for x in devs]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise SliceBuildError(f"device {dup!r} twice", source=src, field="devices")
        s = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{v.driver}"},
            "spec": {
                "driver": v.driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": devs,
            },
        }
        problems = validate_resource_slice(s)
        if problems:
            raise SliceBuildError(str(problems[0]), source=src, field="devices")
        out.append(s)
    return out


def load_vendor_inventory(path: str | Path) -> list[VendorDevice]:
    """Read ``path`` (UTF-8, the size limit of NVIDIA inventories) and
    :func:`parse_vendor_inventory` it with ``source=str(path)``."""
    from .parse import _read

    return parse_vendor_inventory(_read(path), str(path))
