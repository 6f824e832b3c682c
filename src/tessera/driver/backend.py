"""Which enforcement backend holds a claim's memory limit on this node.

Two backends, chosen once per node at start and shown in every published device's
``enforcementBackend`` attribute and in each prepared claim's ``status.devices[].data``:

* ``library`` - Tessera's interception library (``libtessera-enforce.so``, preloaded through
  ``/etc/ld.so.preload``) holds each claim to its memory limit and paces its kernel launches
  (``docs/enforcement.md``).
* ``driver-native`` - the NVIDIA driver itself caps the GPU memory of the container's cgroup.
  What exists for this (NVIDIA r615 driver / CUDA 13.4, found in NVIDIA's documentation and
  sources): NVML ``nvmlDeviceSetMemoryLimits_v1(device, {nameSpace: <cgroup path>, softLimit,
  hardLimit})`` (and ``nvmlDeviceGetMemoryLimits_v1``), enforced through the kernel's cgroup
  v2 ``dmem`` controller (kernel >= 6.14) or an internal fallback; cgroup v2 is required and
  MIG devices are not supported. The NVIDIA container toolkit (>= v1.20.1) applies it from a
  CDI ``createRuntime`` hook, ``nvidia-cdi-hook apply-cuda-memory-limits --driver-root R
  --gpu-id UUID...``, which reads ``NVIDIA_GPU_MEMORY_REQUEST`` / ``NVIDIA_GPU_MEMORY_LIMIT``
  (whole MiB, one value for every listed GPU) from the container's environment. Tessera emits
  that hook and those variables in the claim's CDI spec. The library is still preloaded in
  this mode: it paces compute (``cores``) and answers memory queries with the claim's limit.

Detection (``auto``): ``driver-native`` when NVML reports a driver of major version >= 615,
``nvmlDeviceGetMemoryLimits_v1`` answers for the first GPU (a driver without it returns
"function not found" or "not supported"), ``/sys/fs/cgroup`` is cgroup v2, and the
``nvidia-cdi-hook`` binary is found; otherwise ``library``. ``--enforcement-backend`` overrides
it. NOT verified on real hardware: no r615 GPU was available; the fake NVML
(``native/fake``) reports both cases.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

LIBRARY = "library"
DRIVER_NATIVE = "driver-native"
BACKENDS = (LIBRARY, DRIVER_NATIVE)
MIN_DRIVER_MAJOR = 615


@dataclass(frozen=True)
class BackendChoice:
    """The chosen ``backend`` and ``reason`` (one line, for logs and ``/readyz``)."""

    backend: str
    reason: str


def cgroup_v2(root: str = "/sys/fs/cgroup") -> bool:
    """True when ``root`` is a cgroup v2 (unified) hierarchy."""
    return os.path.isfile(os.path.join(root, "cgroup.controllers"))


def find_cdi_hook(explicit: str | None = None) -> str | None:
    """The ``nvidia-cdi-hook`` binary: ``explicit`` if it exists, else from ``PATH``."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which("nvidia-cdi-hook")


def nvml_memory_limits(nvml: object | None, uuids: Sequence[str]) -> tuple[bool, str]:
    """Whether NVML answers ``nvmlDeviceGetMemoryLimits_v1`` for the first GPU, and why not."""
    if nvml is None:
        return False, "no NVML (nvidia-smi fallback)"
    if not uuids:
        return False, "no GPU to ask"
    import pynvml as n

    try:
        h = n.nvmlDeviceGetHandleByUUID(uuids[0].encode())
        lim = n.c_nvmlGetMemoryLimits_v1_t()
        lim.nameSpace = str(Path("/sys/fs/cgroup")).encode()
        n.nvmlDeviceGetMemoryLimits_v1(h, lim)
    except n.NVMLError as e:
        return False, f"nvmlDeviceGetMemoryLimits_v1: {e}"
    except AttributeError:
        return False, "nvidia-ml-py has no nvmlDeviceGetMemoryLimits_v1"
    return True, "nvmlDeviceGetMemoryLimits_v1 answers"


def detect(
    requested: str,
    nvml: object | None,
    driver_version: str | None,
    uuids: Sequence[str],
    cdi_hook: str | None,
    cgroup_root: str = "/sys/fs/cgroup",
) -> BackendChoice:
    """Choose the backend (see module doc). ``requested``: ``auto`` or a backend name (kept as
    given: an operator override)."""
    if requested in BACKENDS:
        return BackendChoice(requested, f"--enforcement-backend {requested}")
    try:
        major = int((driver_version or "").split(".", 1)[0])
    except ValueError:
        major = 0
    if major < MIN_DRIVER_MAJOR:
        return BackendChoice(
            LIBRARY, f"driver {driver_version or 'unknown'} is older than r{MIN_DRIVER_MAJOR}"
        )
    ok, why = nvml_memory_limits(nvml, uuids)
    if not ok:
        return BackendChoice(LIBRARY, why)
    if not cgroup_v2(cgroup_root):
        return BackendChoice(
            LIBRARY, f"{cgroup_root} is not cgroup v2 (driver memory limits need it)"
        )
    if cdi_hook is None:
        return BackendChoice(
            LIBRARY, "nvidia-cdi-hook (NVIDIA container toolkit >= v1.20.1) not found"
        )
    return BackendChoice(DRIVER_NATIVE, f"driver {driver_version}: {why}; cgroup v2; {cdi_hook}")
