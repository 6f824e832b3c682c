"""From raw per-GPU fields (as each parser finds them) to :class:`GPU` values: one place for
required-field checks, value normalisation, architecture derivation and UUID policy."""

from __future__ import annotations

import re
import uuid as uuidlib
from dataclasses import dataclass, replace
from pathlib import PurePath
from typing import Any

from .errors import MalformedInputError, MissingFieldError
from .model import (
    GPU,
    MIB,
    MigDevice,
    _known,
    derive_architecture,
    derive_compute_capability,
    is_unavailable,
    normalize_bus_id,
)

_GPU_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_MIG_UUID = re.compile(r"^MIG-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_MIB = re.compile(r"^\s*([0-9]{1,12})\s*(MiB)?\s*$")  # 10^12 MiB: far past any GPU

#: Namespace of synthesized GPU UUIDs: uuid5(NAMESPACE_DNS, "gpu.tessera.dev").
SYNTHESIZED_UUID_NAMESPACE = uuidlib.uuid5(uuidlib.NAMESPACE_DNS, "gpu.tessera.dev")


@dataclass
class RawMig:
    index: int
    gpu_instance_id: int
    compute_instance_id: int
    memory_mib: int
    sm_count: int | None = None
    profile: str | None = None
    uuid: str | None = None


@dataclass
class RawGPU:
    """Fields as found; strings unnormalised. ``line`` locates the GPU in the input."""

    index: int
    uuid: str | None
    product_name: str | None
    memory: str | None  # "81559 MiB" or "81559"; "N/A" / "[Not Supported]" when not reported
    architecture: str | None = None
    compute_capability: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    bus_id: str | None = None
    numa_node: int | None = None
    mig_enabled: bool = False
    migs: list[RawMig] | None = None
    line: int | None = None
    mig_on_demand: bool = False  # HAMi's register annotation: mode "mig" (instances per pod)
    mig_profiles: list[Any] | None = None  # HAMi's migProfiles records, as found
    memory_reserved: str | None = None  # "551 MiB": FB memory the driver and firmware keep


def _reserved(text: str | None, total_mib: int | None) -> int | None:
    """The driver-reserved FB memory in bytes, when the inventory gives a MiB count below the
    total; None otherwise (not reported, or a value that cannot be right)."""
    mib = parse_mib(text)
    if mib is None or total_mib is None or mib >= total_mib:
        return None
    return mib * MIB


def parse_mib(text: str | None) -> int | None:
    """``"81559 MiB"`` / ``"81559"`` -> 81559; None when absent or not a MiB count."""
    if text is None:
        return None
    m = _MIB.match(text)
    return int(m.group(1)) if m else None


def mig_problem(gpu: int, k: int, fields: dict[str, str | None]) -> str:
    """The one-line problem of MIG device ``k`` of GPU ``gpu`` whose ``fields`` (name -> text as
    found) are not all numbers: an instance in an unknown state (nvidia-smi prints ``N/A`` while
    an instance is being created or destroyed), or a cut file (a field missing)."""
    unknown = [f"{n} {v}" for n, v in fields.items() if v is not None and is_unavailable(v)]
    if unknown:
        return (
            f"GPU {gpu}: MIG device {k} is in an unknown state ({', '.join(unknown)}): an instance "
            "was being created or destroyed; capture the inventory again once `nvidia-smi -L` "
            "lists it"
        )
    missing = [n for n, v in fields.items() if v is None or parse_mib(v) is None]
    return (
        f"GPU {gpu}: MIG device {k} lacks {', '.join(missing)} (or it is not a number); capture "
        "`nvidia-smi -q -x` again, complete"
    )


def is_masked_uuid(value: str) -> bool:
    """True for a UUID whose hex digits are all zero (``GPU-00000000-0000-...``)."""
    digits = re.sub(r"[^0-9a-fA-F]", "", value.split("-", 1)[-1])
    return digits != "" and set(digits) == {"0"}


def synthesize_uuid(source: str, bus_id: str | None, index: int) -> str:
    """A stable stand-in GPU UUID: ``"GPU-" + uuid5(SYNTHESIZED_UUID_NAMESPACE,
    "<file name>|<bus id>")`` (``"<file name>|index:<n>"`` without a bus id). The file name is
    the last path component of ``source``, so the result does not depend on where the file is."""
    where = normalize_bus_id(bus_id) or f"index:{index}"
    name = PurePath(source).name or source
    return "GPU-" + str(uuidlib.uuid5(SYNTHESIZED_UUID_NAMESPACE, f"{name}|{where}"))


def build_gpus(raws: list[RawGPU], source: str, *, masked: bool = False) -> list[GPU]:
    """Check and normalise raw records; apply the UUID policy.

    Policy: a GPU UUID that cannot identify one GPU - all-zero, declared masked by the capture
    (``masked: yes``), or shared by two GPUs of the inventory - is replaced by
    :func:`synthesize_uuid` and the GPU marked ``uuid_synthesized``. MIG UUIDs in that situation
    become None (unknown). Raises :class:`MissingFieldError` for a missing/invalid uuid, product
    name or memory.
    """
    gpus: list[GPU] = []
    for raw in raws:
        where = f"GPU {raw.index}"
        uuid = _known(raw.uuid)
        if uuid is None:
            raise MissingFieldError(
                f"{where} has no UUID; capture with `nvidia-smi -q -x`",
                source=source,
                field="uuid",
                line=raw.line,
            )
        if not _GPU_UUID.match(uuid):
            raise MissingFieldError(
                f"{where}: {uuid!r} is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
                source=source,
                field="uuid",
                line=raw.line,
            )
        name = _known(raw.product_name)
        if name is None:
            raise MissingFieldError(
                f"{where} ({uuid}) has no product name",
                source=source,
                field="product_name",
                line=raw.line,
            )
        mib = parse_mib(raw.memory)
        unavailable = mib is None and is_unavailable(raw.memory)
        if not unavailable and (mib is None or mib <= 0):
            raise MissingFieldError(
                f"{where} ({uuid}): FB memory total {raw.memory!r} is not a MiB count",
                source=source,
                field="memory.total",
                line=raw.line,
            )
        arch = derive_architecture(raw.architecture, raw.compute_capability, name)
        cc = derive_compute_capability(raw.compute_capability, arch, name)
        migs = tuple(
            MigDevice(
                index=m.index,
                uuid=(
                    m.uuid
                    if m.uuid
                    and _MIG_UUID.match(m.uuid)
                    and not masked
                    and not is_masked_uuid(m.uuid)
                    else None
                ),
                profile=m.profile,
                memory_bytes=m.memory_mib * MIB,
                sm_count=m.sm_count,
                gpu_instance_id=m.gpu_instance_id,
                compute_instance_id=m.compute_instance_id,
            )
            for m in (raw.migs or [])
        )
        seen_ids: set[tuple[int, int]] = set()
        for m in raw.migs or []:
            ids = (m.gpu_instance_id, m.compute_instance_id)
            if ids in seen_ids:
                raise MalformedInputError(
                    f"{where} lists GPU instance {ids[0]} compute instance {ids[1]} twice; "
                    "the inventory mixes two captures - capture it again",
                    source=source,
                    field="mig_device",
                    line=raw.line,
                )
            seen_ids.add(ids)
        mig_model = None
        if raw.mig_profiles:
            from .mig import model_from_profiles

            try:
                mig_model = model_from_profiles(
                    f"{name} ({source}, GPU {raw.index})", raw.mig_profiles, where
                )
            except ValueError as err:
                raise MalformedInputError(
                    f"{err}; give the annotation as HAMi wrote it",
                    source=source,
                    field="migProfiles",
                    line=raw.line,
                ) from None
        gpus.append(
            GPU(
                index=raw.index,
                uuid=uuid,
                product_name=name,
                architecture=arch,
                cuda_compute_capability=cc,
                driver_version=_known(raw.driver_version),
                cuda_version=_known(raw.cuda_version),
                pcie_bus_id=normalize_bus_id(raw.bus_id),
                numa_node=raw.numa_node,
                memory_bytes=mib * MIB if mib is not None else None,
                memory_reserved_bytes=_reserved(raw.memory_reserved, mib),
                mig_enabled=raw.mig_enabled,
                mig_devices=migs,
                memory_reported=(raw.memory or "").strip() if unavailable else None,
                mig_model=mig_model,
                mig_on_demand=raw.mig_on_demand,
            )
        )
    seen: dict[str, int] = {}
    for g in gpus:
        key = g.uuid.lower()
        seen[key] = seen.get(key, 0) + 1
    out = []
    for g in gpus:
        if masked or is_masked_uuid(g.uuid) or seen[g.uuid.lower()] > 1:
            g = replace(
                g, uuid=synthesize_uuid(source, g.pcie_bus_id, g.index), uuid_synthesized=True
            )
        out.append(g)
    return out
