"""Device-level figures from NVML, through nvidia-ml-py (``pynvml``).

A thin interface: :class:`Nvml` opens the library once (``libnvidia-ml.so.1``, found by the
dynamic loader, so ``LD_LIBRARY_PATH`` can point it at ``native/fake``'s fake NVML in tests)
and :meth:`Nvml.sample` returns one :class:`GpuSample` per GPU. Anything else that yields
``GpuSample`` lists can stand in for it (the collector takes a callable).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any

from tessera.api.errors import TesseraError


class NvmlUnavailable(TesseraError):
    """NVML cannot be used here (nvidia-ml-py or libnvidia-ml.so.1 missing, or init failed)."""


@dataclass(frozen=True)
class GpuSample:
    """One GPU as NVML reports it now.

    ``index``: NVML index (physical order); ``memory_total``/``memory_used``: bytes
    (``nvmlDeviceGetMemoryInfo``); ``utilization_gpu``/``utilization_memory``: percent 0..100
    over NVML's last sample period, None where the device does not report it.
    """

    index: int
    uuid: str
    name: str
    memory_total: int
    memory_used: int
    utilization_gpu: int | None
    utilization_memory: int | None


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class Nvml:
    """An initialised NVML. Raises :class:`NvmlUnavailable` from the constructor with one
    line saying what is missing and how to run without it (``--no-nvml``)."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as e:  # pragma: no cover - a dependency of the package
            raise NvmlUnavailable(
                f"nvidia-ml-py is not installed ({e}): install it, or pass --no-nvml"
            ) from e
        self._nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise NvmlUnavailable(
                f"NVML is not available ({e}): run on a node with the NVIDIA driver (libnvidia-ml.so.1), "
                "or pass --no-nvml to export the shares' figures without device-level ones"
            ) from e
        self._lock = threading.Lock()
        self._open = True
        self._handles: list[tuple[int, Any, str, str]] = []
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                self._handles.append(
                    (i, h, _text(pynvml.nvmlDeviceGetUUID(h)), _text(pynvml.nvmlDeviceGetName(h)))
                )
        except pynvml.NVMLError as e:
            raise NvmlUnavailable(
                f"NVML could not enumerate the GPUs ({e}): check the driver, or pass --no-nvml"
            ) from e

    @property
    def count(self) -> int:
        return len(self._handles)

    def sample(self) -> list[GpuSample]:
        """Memory and utilisation of every GPU. A GPU whose query fails is left out (its
        series disappear until it answers again); utilisation a GPU does not support is None."""
        nv = self._nv
        out: list[GpuSample] = []
        with self._lock:
            for i, h, uuid, name in self._handles:
                try:
                    mem = nv.nvmlDeviceGetMemoryInfo(h)
                except nv.NVMLError:
                    continue
                ug: int | None = None
                um: int | None = None
                try:
                    util = nv.nvmlDeviceGetUtilizationRates(h)
                    ug, um = int(util.gpu), int(util.memory)
                except nv.NVMLError:
                    pass
                out.append(GpuSample(i, uuid, name, int(mem.total), int(mem.used), ug, um))
        return out

    def close(self) -> None:
        """Shut NVML down (idempotent)."""
        with self._lock:
            if self._open:
                self._open = False
                self._handles = []
                with contextlib.suppress(self._nv.NVMLError):
                    self._nv.nvmlShutdown()
