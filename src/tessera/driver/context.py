"""What the parts of the node driver share (:mod:`tessera.driver.node` builds it): its settings
(:class:`DriverConfig`), counters (:class:`Stats`), the start error, and :class:`DriverContext`,
the state each part reads - the API client, the log, the file layout, the checkpoint, NVML's MIG
operations, the enforcement backend, the GPU registry and publisher - and the claim locks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera import DRIVER_NAME
from tessera.api.errors import TesseraError
from tessera.enforcement.layout import DEFAULT_STATE_DIR
from tessera.enforcement.limits import DEFAULT_CONTEXT_OVERHEAD
from tessera.inventory.mig import DynamicMIG
from tessera.kube.client import KubeClient

from . import backend as backends
from . import guard
from .checkpoint import Checkpoint
from .kubelet import ClaimRef
from .locks import FileLock
from .mig import MIG_MINORS, MigOps, MigSlot
from .prepare import ClaimPlan, Layout, NodeDevice, check_library_reads, plan_claim
from .publish import GpuRegistry, Publisher

#: Where a dynamic-MIG setting given to the driver is named in its errors.
DYNAMIC_MIG_OPTION = "--dynamic-mig"
#: An interrupted prepare older than this is checked against the API server at rescans; its
#: instances are destroyed when its claim is gone (the kubelet will not retry it).
STALE_PREPARE_SECONDS = 60.0
#: How a claim's error ends when a file-system fault stopped its prepare and nothing stayed.
NOT_KEPT = "; nothing of the claim was kept: the kubelet's retry prepares it once that is fixed"


def io_fault(e: OSError) -> str:
    """A file-system fault at prepare (a full disk, a read-only state directory, a failed
    fsync) in words: what the OS said and the path."""
    return f"{e.strerror or e}" + (f" ({e.filename})" if e.filename else "")


class DriverStartError(TesseraError, RuntimeError):
    """The driver cannot start; the message is one line saying what is missing and what to do."""


@dataclass
class DriverConfig:
    """Settings of one node driver (the ``tessera driver`` options)."""

    node_name: str
    kubelet_root: Path = Path("/var/lib/kubelet")
    cdi_dir: Path = Path("/var/run/cdi")
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    dev_root: Path = Path("/")
    library: Path | None = None
    nvml_library: str | None = None
    nvidia_smi: str = "nvidia-smi"
    enforcement_backend: str = "auto"
    cdi_hook: str | None = None
    driver_root: str = "/"
    nvidia_cdi_kind: str | None = None
    driver: str = DRIVER_NAME
    health_address: str | None = "127.0.0.1:51515"
    rescan_seconds: float = 10.0
    xid_recovery_seconds: float = 60.0
    write_claim_status: bool = True
    cgroup_root: str = "/sys/fs/cgroup"
    device_plugin_dir: Path = guard.DEVICE_PLUGIN_DIR
    dynamic_mig: DynamicMIG | None = None
    mig_minors: Path = MIG_MINORS
    #: Bytes of a share's memory each CUDA context is charged (the limits files' context-overhead).
    context_overhead: int = DEFAULT_CONTEXT_OVERHEAD
    #: Rolling-update id (the pod's UID): sockets named after it, so that two instances can
    #: be registered at once. '' for the fixed socket names.
    instance: str = ""
    #: At stop: seconds calls are still served after the registration socket is removed, and
    #: the most the calls in flight then get to finish.
    handoff_seconds: float = 1.0
    stop_grace_seconds: float = 30.0
    #: Prepare calls that plan and write their claims' files at once (the prepare lane,
    #: docs/driver.md §5); 0: every handler (no lane).
    prepare_lanes: int = 1


@dataclass
class Stats:
    """Counters shown by ``/readyz`` and used by benchmarks (seconds, per claim)."""

    api_read: list[float] = field(default_factory=list)
    prepare: list[float] = field(default_factory=list)
    prepare_work: list[float] = field(default_factory=list)
    checkpoint_wait: list[float] = field(default_factory=list)
    #: Per claim: the wait for the prepare lane (before ``prepare``, which excludes it).
    lane_wait: list[float] = field(default_factory=list)
    status_errors: int = 0
    first_publish: float | None = None


@dataclass
class DriverContext:
    """The state the driver's parts share; ``checkpoint``, ``mig`` (NVML's MIG operations,
    None without NVML), ``nvml``, ``publisher`` and ``backend`` are set during start.
    ``mig_lock``: held while MIG instances are made or destroyed and while a rescan reads NVML,
    so that a discovery never sees an instance whose checkpoint record it cannot see."""

    cfg: DriverConfig
    client: KubeClient
    log: Callable[[str], None]
    layout: Layout
    registry: GpuRegistry
    stats: Stats = field(default_factory=Stats)
    checkpoint: Checkpoint | None = None
    mig: MigOps | None = None
    nvml: object | None = None
    publisher: Publisher | None = None
    backend: backends.BackendChoice = field(
        default_factory=lambda: backends.BackendChoice(backends.LIBRARY, "not chosen yet")
    )
    mig_lock: threading.Lock = field(default_factory=threading.Lock)
    #: Warnings logged once (publication warnings, slice build errors).
    warned: set[str] = field(default_factory=set)

    @property
    def store(self) -> Checkpoint:
        """The checkpoint (loaded at start; asserts it was)."""
        assert self.checkpoint is not None
        return self.checkpoint

    def plan(
        self,
        claim: Mapping[str, Any],
        ref: ClaimRef,
        devices: Mapping[str, NodeDevice],
        minors: Mapping[str, int],
        instances: Mapping[tuple[str, str, int], MigSlot] | None = None,
    ) -> ClaimPlan:
        """:func:`~tessera.driver.prepare.plan_claim` on this node, with this driver's backend
        and layout, and what the enforcement library on the host reads now (read again when
        the file changed: another driver instance's start may have replaced it). Raises
        :class:`~tessera.driver.prepare.ClaimError` like it, and for a library that cannot be
        read (:func:`~tessera.driver.prepare.check_library_reads`)."""
        plan = plan_claim(
            claim,
            ref,
            self.cfg.node_name,
            devices,
            self.backend.backend,
            self.layout,
            mig_minors=minors,
            instances=instances,
        )
        check_library_reads(plan, self.layout)
        return plan

    def lock_for(self, uid: str) -> FileLock:
        """A new lock object for claim ``uid`` (``<state>/locks/<uid>``): node-wide, between
        threads and driver instances (:mod:`tessera.driver.locks`)."""
        return FileLock(self.cfg.state_dir / "locks" / uid)

    def release_claims(self, locks: Sequence[FileLock]) -> None:
        """Release claim locks (held); a claim the checkpoint no longer names loses its lock file."""
        for lk in locks:
            lk.release(remove=self.store.get(lk.path.name) is None)
