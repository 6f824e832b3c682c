"""``tessera driver``: the node agent that ties discovery, publishing and prepare together.

:class:`NodeDriver` (one per node) starts in this order, and refuses to start with a one-line
:class:`DriverStartError` when something it needs is missing:

1. the kubelet's ``--root-dir`` must exist (the plugin sockets live under it), and the health
   address is bound (served from step 12: a taken port refuses the start before anything is
   written, published or made);
2. the API server must allow what the driver does (SelfSubjectAccessReview for each verb);
3. the checkpoint is loaded;
4. NVML is loaded (else ``nvidia-smi -q -x`` is the inventory); dynamic MIG needs NVML;
5. the guard (:mod:`tessera.driver.guard`): no other manager of these GPUs may run on the node;
6. MIG instances the driver made are recovered (:meth:`NodeDriver.recover_mig`): those of an
   interrupted unprepare, or of an interrupted prepare whose claim is gone, are destroyed;
   those of a prepare still in progress are adopted (the kubelet's retry uses them);
   then every prepared claim's recorded plan is checked against what NVML lists
   (:meth:`NodeDriver._reconcile_claims`: after a reboot a GPU may be gone or at another
   minor, a MIG instance gone): a stale claim is planned again at the kubelet's next prepare;
7. discovery (the driver's own MIG instances left out: what remains was made by someone else);
8. the enforcement backend is chosen (:mod:`tessera.driver.backend`);
9. the ResourceSlices are published (:mod:`tessera.driver.publish`; a dynamic-MIG setting the
   GPUs cannot have is refused here);
10. leftovers of interrupted writes are removed;
11. the DRA and registration gRPC servers listen (:mod:`tessera.driver.kubelet`);
12. background threads: rescans (health, GPUs coming and going), XID events, claim status;
    ``/healthz`` and ``/readyz`` are served.

Prepare/unprepare are batch calls (one per kubelet request), safe to run concurrently: each
claim is serialized on its own lock, the checkpoint is written once per batch and phase.
MIG instances are made and destroyed under one lock (``_mig_lock``), which rescans take too,
so a discovery never sees an instance whose checkpoint record it cannot see.

**Two instances on one node** (a rolling update, ``--rolling-update-id``; see
:mod:`tessera.driver.kubelet` for the sockets): both serve the kubelet and share the state
directory. A claim's lock is a file lock (:mod:`tessera.driver.locks`), so it holds between
the instances too, and the checkpoint is re-read under it and written under its own file lock:
neither instance loses the other's entries or answers from an older view. Only the newest
instance publishes ResourceSlices and rescans: at start it writes its id to
``<state>/publisher``; an older instance that finds another id there stops publishing (it is
being replaced) and resumes only if the file is gone again. An instance that starts while
another runs leaves the other's work alone: leftovers are removed only under their claim's
lock, and temporary files only by an instance alone on the node. :meth:`NodeDriver.stop`
hands over (the kubelet's next calls go to the other instance), lets the calls in flight
finish, removes only its own sockets and logs what it did.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import socket
import socketserver
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera import DRIVER_NAME
from tessera.api.errors import TesseraError
from tessera.enforcement._files import write_atomic
from tessera.enforcement.layout import DEFAULT_STATE_DIR, REGION_FILE, claims_dir
from tessera.enforcement.limits import DEFAULT_CONTEXT_OVERHEAD
from tessera.inventory.errors import SliceBuildError
from tessera.inventory.mig import DynamicMIG
from tessera.inventory.slices import publication_warnings
from tessera.kube.client import ApiError, KubeClient

from . import backend as backends
from . import guard
from .checkpoint import Checkpoint, CheckpointError, ClaimState, claim_state
from .discovery import (
    DiscoveryError,
    Inventory,
    NodeGPU,
    XidWatcher,
    discover_nvml,
    discover_smi,
    load_nvml,
    probe,
)
from .kubelet import ClaimRef, PluginServers, PrepareResult
from .locks import FileLock, InstanceLock
from .mig import (
    MIG_MINORS,
    MigError,
    MigOps,
    MigSlot,
    entry_slots,
    owned,
    read_mig_minors,
    without_owned,
)
from .prepare import (
    ClaimError,
    ClaimPlan,
    Layout,
    NodeDevice,
    materialize,
    node_devices,
    plan_claim,
    plan_stale,
    remove_files,
    write_node_shares,
    write_preload,
)
from .publish import GpuRegistry, Publisher

#: Where a dynamic-MIG setting given to the driver is named in its errors.
DYNAMIC_MIG_OPTION = "--dynamic-mig"
#: An interrupted prepare older than this is checked against the API server at rescans; its
#: instances are destroyed when its claim is gone (the kubelet will not retry it).
STALE_PREPARE_SECONDS = 60.0

#: What the driver asks the API server to allow: (verb, group, resource, subresource).
REQUIRED_ACCESS: tuple[tuple[str, str, str, str], ...] = (
    ("get", "resource.k8s.io", "resourceclaims", ""),
    ("list", "resource.k8s.io", "resourceslices", ""),
    ("create", "resource.k8s.io", "resourceslices", ""),
    ("patch", "resource.k8s.io", "resourceslices", ""),
    ("delete", "resource.k8s.io", "resourceslices", ""),
)


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


@dataclass
class Stats:
    """Counters shown by ``/readyz`` and used by benchmarks (seconds, per claim)."""

    api_read: list[float] = field(default_factory=list)
    prepare: list[float] = field(default_factory=list)
    prepare_work: list[float] = field(default_factory=list)
    checkpoint_wait: list[float] = field(default_factory=list)
    status_errors: int = 0
    first_publish: float | None = None


class NodeDriver:
    """The node driver; :meth:`start`, then serve until :meth:`stop`.

    ``client``: API client; ``log``: one line per event (stderr by default).
    """

    def __init__(
        self, cfg: DriverConfig, client: KubeClient, log: Callable[[str], None] | None = None
    ) -> None:
        self.cfg = cfg
        self.client = client
        self.log = log or (lambda m: print(f"tessera driver: {m}", flush=True))
        self.layout = Layout(
            state_dir=cfg.state_dir,
            cdi_dir=cfg.cdi_dir,
            dev_root=cfg.dev_root,
            library=cfg.library,
            driver=cfg.driver,
            driver_root=cfg.driver_root,
            cdi_hook=cfg.cdi_hook,
            nvidia_cdi_kind=cfg.nvidia_cdi_kind,
            mig_minors=cfg.mig_minors,
            context_overhead=cfg.context_overhead,
        )
        self.registry = GpuRegistry(cfg.state_dir / "gpus.json")
        self.checkpoint: Checkpoint | None = None
        self.publisher: Publisher | None = None
        self.servers: PluginServers | None = None
        self.backend = backends.BackendChoice(backends.LIBRARY, "not chosen yet")
        self.nvml: object | None = None
        self.stats = Stats()
        self.started_at = time.monotonic()
        #: This instance's name in ``<state>/publisher`` (the rolling-update id, else made up).
        self.instance_id = (
            cfg.instance or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        )
        self.lease = cfg.state_dir / "publisher"
        self.instances = InstanceLock(cfg.state_dir / "instances.lock")
        #: No other instance ran when this one started (it may clean up interrupted writes).
        self.alone = True
        #: Another instance publishes now: this one only answers the kubelet until it stops.
        self.retired = False
        self.stopping = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._xid: XidWatcher | None = None
        self._status_q: queue.Queue[ClaimPlan | None] = queue.Queue()
        self._http: socketserver.ThreadingTCPServer | None = None
        self.ready = threading.Event()
        self.mig: MigOps | None = None
        self._mig_lock = threading.Lock()
        self._devices_cache: tuple[object, int, dict[str, NodeDevice]] | None = None
        self._minors_cache: tuple[float, dict[str, int]] | None = None
        self._warned: set[str] = set()

    # ---- start / stop -----------------------------------------------------------------
    def start(self) -> None:
        """Start everything (see module doc). Raises :class:`DriverStartError`."""
        cfg = self.cfg
        if not cfg.kubelet_root.is_dir():
            raise DriverStartError(
                f"kubelet directory {cfg.kubelet_root} does not exist: run the driver on a node "
                "whose kubelet uses it, or pass the kubelet's --root-dir as --kubelet-root-dir"
            )
        # Bound first (served once ready): a port that is taken refuses the start before
        # anything is written, published or made.
        if cfg.health_address:
            self._bind_http(cfg.health_address)
        try:
            self._start()
        except BaseException:
            if self._http is not None:
                self._http.server_close()
                self._http = None
            raise

    def _start(self) -> None:
        cfg = self.cfg
        self._check_access()
        try:
            self.checkpoint = Checkpoint(cfg.state_dir / "checkpoint.json")
            self.alone = self.instances.join()
        except CheckpointError as e:
            raise DriverStartError(str(e)) from e
        except OSError as e:
            raise DriverStartError(f"--state-dir {cfg.state_dir}: {e.strerror or e}") from e
        if not self.alone:
            self.log(
                "another driver instance serves this node (a rolling update): sharing its state "
                f"directory {cfg.state_dir}; this one takes over publishing"
            )
        inv = self._discover()
        # The guard before anything is made or destroyed: another manager of these GPUs on the
        # node refuses the start.
        guard.check_node(
            self.client,
            cfg.node_name,
            guard.discovered_uuids(g.gpu for g in inv.gpus),
            device_plugin_dir=cfg.device_plugin_dir,
            driver=cfg.driver,
            log=self.log,
        )
        if self.nvml is not None:
            self.mig = MigOps(self.nvml)
        elif cfg.dynamic_mig is not None:
            raise DriverStartError(
                f"{DYNAMIC_MIG_OPTION}: making MIG instances needs NVML, which could not be loaded "
                "(GPUs were read from nvidia-smi); install the NVIDIA driver's libnvidia-ml.so.1 or "
                f"pass --nvml-library PATH, or drop {DYNAMIC_MIG_OPTION}"
            )
        if self.mig is not None and self.recover_mig():
            inv = self._discover()
        self._reconcile_claims(inv)
        self.registry.update(self._foreign_only(inv), {})
        self.backend = backends.detect(
            cfg.enforcement_backend,
            self.nvml,
            inv.driver_version,
            [g.gpu.uuid for g in inv.gpus],
            backends.find_cdi_hook(cfg.cdi_hook),
            cfg.cgroup_root,
        )
        self.layout = Layout(
            **{**self.layout.__dict__, "cdi_hook": backends.find_cdi_hook(cfg.cdi_hook)}
        )
        self.log(
            f"{len(inv.gpus)} GPU(s) from {inv.source} (driver {inv.driver_version}); "
            f"enforcement backend {self.backend.backend}: {self.backend.reason}"
        )
        self.publisher = Publisher(
            self.client,
            cfg.node_name,
            cfg.driver,
            self.registry,
            self.backend.backend,
            xid_recovery=cfg.xid_recovery_seconds,
            dynamic_mig=cfg.dynamic_mig,
            dynamic_where=DYNAMIC_MIG_OPTION,
            log=self.log,
        )
        self._claim_lease()
        try:
            self.publisher.sync()
        except ApiError as e:
            raise DriverStartError(f"publishing ResourceSlices of node {cfg.node_name}: {e}") from e
        except SliceBuildError as e:
            raise DriverStartError(str(e)) from e
        self._warn_publication()
        self.stats.first_publish = time.monotonic() - self.started_at
        write_preload(self.layout)
        self._reconcile_files()
        self.servers = PluginServers(
            cfg.kubelet_root, cfg.driver, self, instance=cfg.instance, log=self.log
        )
        try:
            self.servers.start()
        except OSError as e:
            raise DriverStartError(f"kubelet plugin sockets: {e}") from e
        self._spawn(self._rescan_loop, "tessera-rescan")
        if cfg.write_claim_status:
            self._spawn(self._status_loop, "tessera-status")
        if self.nvml is not None:
            self._xid = XidWatcher(
                [r.gpu.uuid for r in self.registry.snapshot()], self._on_xid, self.log
            )
            self._xid.start()
        if self._http is not None:
            self._spawn(self._http.serve_forever, "tessera-health")
        self.ready.set()
        self.log(
            f"serving {self.servers.dra_path} (registration {self.servers.registration_path}); "
            f"slices published {self.stats.first_publish:.3f} s after start"
        )

    def stop(self, why: str = "asked to") -> None:
        """Stop serving; prepared claims stay prepared (checkpoint). The kubelet is handed
        over first (:meth:`PluginServers.stop`: registration socket removed, calls still
        served for ``handoff_seconds``, those in flight finished), then background threads and
        the health endpoint stop. Logs what it stopped, the sockets removed and how long it
        took; ``why`` starts that line (e.g. ``"SIGTERM"``)."""
        t0 = time.monotonic()
        self.stopping = True
        self.log(
            f"stopping ({why}): handing over to the kubelet, then background threads and /readyz"
        )
        self._stop.set()
        self._wake.set()
        self._status_q.put(None)
        stopped = []
        report = None
        if self.servers is not None:
            report = self.servers.stop(
                grace=self.cfg.stop_grace_seconds, handoff=self.cfg.handoff_seconds
            )
            stopped.append("kubelet plugin servers")
        if self._xid is not None:
            self._xid.stop()
            stopped.append("XID watcher")
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            stopped.append("health endpoint")
        for t in self._threads:
            t.join(timeout=5)
        left = [t.name for t in self._threads if t.is_alive()]
        stopped.extend(t.name for t in self._threads if not t.is_alive())
        self._release_lease()
        self.instances.leave()
        sockets = ", ".join(str(p) for p in report.removed) if report and report.removed else "none"
        self.log(
            f"stopped in {time.monotonic() - t0:.2f} s: {', '.join(stopped) or 'nothing was running'}; "
            f"sockets removed: {sockets}; "
            + (
                f"{report.answered} call(s) answered after deregistration, "
                f"{report.in_flight} in flight when it stopped taking calls (finished)"
                if report
                else "no kubelet calls served"
            )
            + (f"; threads still running: {', '.join(left)}" if left else "")
        )

    # ---- who publishes (rolling updates) -------------------------------------------------
    def _lease_holder(self) -> str | None:
        try:
            return self.lease.read_text().strip() or None
        except FileNotFoundError:
            return None

    def _claim_lease(self) -> None:
        """Name this instance as the node's publisher in ``<state>/publisher``."""
        write_atomic(str(self.lease), (self.instance_id + "\n").encode(), 0o644, ".publisher.")
        self.retired = False

    def _release_lease(self) -> None:
        """At stop: remove ``<state>/publisher`` when it names this instance (an older one
        still running then publishes again)."""
        if self._lease_holder() == self.instance_id:
            self.lease.unlink(missing_ok=True)

    def publishes(self) -> bool:
        """Whether this instance publishes now: ``<state>/publisher`` names it, or names nobody
        (then it claims it). Logs the hand-over when another instance took it."""
        holder = self._lease_holder()
        if holder is None:
            self._claim_lease()
            self.log("no other instance publishes: publishing again")
            return True
        if holder == self.instance_id:
            return True
        if not self.retired:
            self.retired = True
            self.log(
                f"driver instance {holder} now publishes this node's ResourceSlices: this one "
                "stops publishing and rescanning, and answers the kubelet until it stops"
            )
        return False

    def _spawn(self, fn: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _check_access(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        def ask(a: tuple[str, str, str, str]) -> bool:
            verb, group, resource, sub = a
            return self.client.allowed(verb, resource, group=group, subresource=sub)[0]

        try:
            with ThreadPoolExecutor(len(REQUIRED_ACCESS)) as pool:
                answers = list(pool.map(ask, REQUIRED_ACCESS))
        except ApiError as e:
            raise DriverStartError(f"API server {self.client.server}: {e}") from e
        denied = [
            f"{verb} {resource}{'/' + sub if sub else ''}"
            for (verb, _g, resource, sub), ok in zip(REQUIRED_ACCESS, answers, strict=True)
            if not ok
        ]
        if denied:
            raise DriverStartError(
                f"the API server denies this identity: {', '.join(denied)} (group resource.k8s.io); "
                "grant the driver's ServiceAccount the ClusterRole in docs/driver.md"
            )

    def _discover(self) -> Inventory:
        try:
            if self.nvml is None:
                self.nvml = load_nvml(self.cfg.nvml_library)
            return discover_nvml(self.nvml)
        except DiscoveryError as nvml_err:
            self.nvml = None
            try:
                return discover_smi(self.cfg.nvidia_smi)
            except DiscoveryError as smi_err:
                raise DriverStartError(
                    f"no GPU inventory: NVML: {nvml_err}; nvidia-smi fallback: {smi_err} "
                    "(install the NVIDIA driver, or pass --nvml-library PATH)"
                ) from smi_err

    def _foreign_only(self, inv: Inventory) -> list[NodeGPU]:
        """The discovered GPUs without the MIG devices of the driver's own instances."""
        assert self.checkpoint is not None
        mine = owned(self.checkpoint.entries().values())
        return [without_owned(ng, mine) for ng in inv.gpus] if mine else list(inv.gpus)

    def _warn_publication(self) -> None:
        """Log, once each, what the slices leave out (a MIG-mode GPU without instances...)."""
        for line in publication_warnings(
            [r.gpu for r in self.registry.snapshot()],
            f"node {self.cfg.node_name}",
            self.cfg.dynamic_mig,
        ):
            if line not in self._warned:
                self._warned.add(line)
                self.log(f"warning: {line}")

    # ---- MIG instances left by a crash ------------------------------------------------------
    def _claim_gone(self, ref: ClaimRef) -> str | None:
        """Why the claim of an interrupted prepare will never be prepared here (None: it may
        be: the API server does not say otherwise, or cannot be asked)."""
        try:
            claim = self.client.get("resource.k8s.io/v1", "ResourceClaim", ref.name, ref.namespace)
        except ApiError as e:
            return "deleted" if e.status == 404 else None
        if (claim.get("metadata") or {}).get("uid") != ref.uid:
            return "replaced by another claim of that name"
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        ) or []
        if not any(
            r.get("driver") == self.cfg.driver and r.get("pool") == self.cfg.node_name
            for r in results
        ):
            return "no longer allocated on this node"
        return None

    def _release(self, uid: str, slots: Sequence[MigSlot]) -> list[str]:
        """Destroy the instances of ``slots`` (the driver's, for claim ``uid``) that no other
        claim still uses (the whole dynamic GPU is shared). Call with ``_mig_lock`` held.
        Returns what was destroyed; raises :class:`MigError`."""
        assert self.checkpoint is not None and self.mig is not None
        others = {
            s.key
            for u, e in self.checkpoint.entries().items()
            if u != uid and claim_state(e) in (ClaimState.PREPARING, ClaimState.PREPARED)
            for s in entry_slots(e)
        }
        gone = []
        for s in slots:
            if s.key in others:
                continue
            if self.mig.destroy(s):
                gone.append(f"{s.profile} at slice {s.start} of GPU {s.gpu_index}")
        return gone

    def recover_mig(self) -> bool:
        """At start: settle the MIG instances of checkpoint entries an earlier process left
        unfinished. ``unpreparing``: its instances are destroyed and the entry removed (the
        kubelet's retry of the unprepare then finds nothing to do). ``preparing``: when the
        claim is gone from the API server (or no longer allocated here), likewise; otherwise its
        instances are adopted as they are, and the kubelet's retry of the prepare uses them.
        Instances no entry names are never touched. Returns True when it destroyed anything."""
        assert self.checkpoint is not None and self.mig is not None
        changed = False
        for uid, listed in self.checkpoint.entries().items():
            if claim_state(listed) not in (
                ClaimState.PREPARING,
                ClaimState.UNPREPARING,
            ) or not entry_slots(listed):
                continue
            lk = self._lock_for(uid)
            if not lk.acquire(blocking=False):
                continue  # another driver instance is preparing or unpreparing it right now
            try:
                changed = self._recover_one(uid) or changed
            finally:
                self._release_claims([lk])
        return changed

    def _recover_one(self, uid: str) -> bool:
        """:meth:`recover_mig` for one entry, read again under its claim's lock (held);
        True when it destroyed an instance."""
        assert self.checkpoint is not None and self.mig is not None
        entry = self.checkpoint.get(uid)
        if entry is None:
            return False
        slots = entry_slots(entry)
        state = claim_state(entry)
        if state not in (ClaimState.PREPARING, ClaimState.UNPREPARING) or not slots:
            return False
        ref = ClaimRef(**entry["claim"])
        why = (
            "its unprepare was interrupted"
            if state == ClaimState.UNPREPARING
            else self._claim_gone(ref)
        )
        if why is None:
            have = [s for s in slots if self.mig.find(s) is not None]
            self.log(
                f"ResourceClaim {ref.namespace}/{ref.name}: prepare was interrupted; adopted "
                f"{len(have)} of its {len(slots)} MIG instance(s) for the kubelet's retry"
            )
            return False
        try:
            with self._mig_lock:
                gone = self._release(uid, slots)
        except MigError as e:
            self.log(
                f"ResourceClaim {ref.namespace}/{ref.name}: {why}; its MIG instances stay: {e}"
            )
            return False
        remove_files(uid, self.layout)
        self.checkpoint.update(drop=[uid])
        self.log(
            f"ResourceClaim {ref.namespace}/{ref.name}: {why}; destroyed its MIG instance(s): "
            f"{', '.join(gone) or 'none left'}"
        )
        return bool(gone)

    def _cleanup_stale(self) -> None:
        """At rescans: interrupted prepares older than :data:`STALE_PREPARE_SECONDS` whose
        claim is gone get their instances destroyed (the kubelet will not retry them)."""
        assert self.checkpoint is not None
        if self.mig is None:
            return
        now = time.time()
        for uid, entry in self.checkpoint.entries().items():
            if (
                claim_state(entry) != ClaimState.PREPARING
                or now - float(entry.get("since", now)) < STALE_PREPARE_SECONDS
            ):
                continue
            lk = self._lock_for(uid)
            if not lk.acquire(blocking=False):
                continue  # a prepare or unprepare of it is running
            try:
                entry2 = self.checkpoint.get(uid)
                if entry2 is None or claim_state(entry2) != ClaimState.PREPARING:
                    continue
                ref = ClaimRef(**entry2["claim"])
                why = self._claim_gone(ref)
                if why is None:
                    continue
                try:
                    with self._mig_lock:
                        gone = self._release(uid, entry_slots(entry2))
                except MigError as e:
                    self.log(
                        f"ResourceClaim {ref.namespace}/{ref.name}: {why}; its MIG instances stay: {e}"
                    )
                    continue
                remove_files(uid, self.layout)
                self.checkpoint.update(drop=[uid])
                self.log(
                    f"ResourceClaim {ref.namespace}/{ref.name}: {why} before its prepare finished; "
                    f"destroyed its MIG instance(s): {', '.join(gone) or 'none left'}"
                )
            finally:
                self._release_claims([lk])

    # ---- what a reboot took away ----------------------------------------------------------
    def _reconcile_claims(self, inv: Inventory) -> None:
        """At start: check every prepared claim's recorded plan against the GPUs and MIG
        devices NVML lists now (:func:`~.prepare.plan_stale`). A stale plan (a GPU gone or at
        another minor, a MIG instance gone: a reboot) is never answered again: its files are
        removed and its entry dropped, so the kubelet's next prepare plans the claim afresh from
        its allocation (a vanished GPU then fails it in one line); a claim with dynamic-MIG
        slots keeps them as a ``preparing`` entry (the placements stay the driver's), and the
        retry makes its instances again. One checkpoint write; each claim under its lock (one
        another instance holds is left alone)."""
        assert self.checkpoint is not None
        gpus = {
            ng.gpu.uuid: (ng.minor, frozenset(m.uuid for m in ng.gpu.mig_devices if m.uuid))
            for ng in inv.gpus
        }
        put: dict[str, dict[str, Any]] = {}
        drop: list[str] = []
        locks: list[FileLock] = []
        try:
            for uid, entry in sorted(self.checkpoint.entries().items()):
                if claim_state(entry) != ClaimState.PREPARED:
                    continue
                plan = ClaimPlan.from_json(entry["plan"])
                why = plan_stale(plan, gpus)
                if why is None:
                    continue
                lk = self._lock_for(uid)
                if not lk.acquire(blocking=False):
                    continue
                locks.append(lk)
                remove_files(uid, self.layout)
                ref = plan.ref
                # Placements on a GPU that is gone hold nothing any more (and NVML could not
                # destroy them at unprepare): only those on present GPUs stay recorded.
                kept = [m for m in plan.mig if m.gpu_uuid in gpus]
                if kept:
                    put[uid] = {
                        "state": ClaimState.PREPARING.value,
                        "since": time.time(),
                        "claim": {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid},
                        "slots": [
                            dataclasses.replace(m, gi=None, ci=None, uuid=None).to_json()
                            for m in kept
                        ],
                    }
                else:
                    drop.append(uid)
                self.log(
                    f"ResourceClaim {ref.namespace}/{ref.name}: its recorded plan is stale: {why}; "
                    "removed its files and prepared state: the kubelet's next prepare plans it "
                    "again from its allocation"
                    + (" (its MIG placements stay recorded and are made again)" if kept else "")
                )
            if put or drop:
                try:
                    self.checkpoint.update(put=put, drop=drop)
                except OSError as e:
                    raise DriverStartError(
                        f"--state-dir {self.cfg.state_dir}: checkpoint: {e.strerror or e}"
                    ) from e
        finally:
            self._release_claims(locks)

    # ---- files left by a crash -----------------------------------------------------------
    def _reconcile_files(self) -> None:
        """At start: remove the files of claims the checkpoint does not record as prepared,
        and write a recorded claim's files again where they are missing or differ. Each claim
        is handled under its lock, and skipped while another driver instance holds it (it is
        being prepared or unprepared there). Temporary files of interrupted writes are removed
        only when no other instance runs (:attr:`alone`): another's may be in flight."""
        assert self.checkpoint is not None
        # Only prepared claims have files; an interrupted prepare writes them again.
        known = {
            u for u, e in self.checkpoint.entries().items() if claim_state(e) == ClaimState.PREPARED
        }
        removed = []
        prefix = f"{self.cfg.driver}-claim_"
        leftovers: set[str] = set()
        if self.cfg.cdi_dir.is_dir():
            for p in self.cfg.cdi_dir.iterdir():
                if p.name.startswith(".tessera-cdi."):
                    if self.alone:
                        p.unlink(missing_ok=True)
                        removed.append(p.name)
                elif (
                    p.name.startswith(prefix)
                    and p.name.endswith(".json")
                    and p.name[len(prefix) : -5] not in known
                ):
                    leftovers.add(p.name[len(prefix) : -5])
        claims = claims_dir(self.cfg.state_dir)
        if claims.is_dir():
            for d in claims.iterdir():
                if d.name not in known:
                    leftovers.add(d.name)
                elif self.alone:
                    for f in d.iterdir():
                        if f.name.startswith("."):
                            f.unlink(missing_ok=True)
        for uid in sorted(leftovers):
            lk = self._lock_for(uid)
            if not lk.acquire(blocking=False):
                continue
            try:
                entry = self.checkpoint.get(uid)
                if entry is None or claim_state(entry) != ClaimState.PREPARED:
                    remove_files(uid, self.layout)
                    removed.append(f"claim {uid}")
            finally:
                self._release_claims([lk])
        if self.alone:
            for f in self.cfg.state_dir.glob(".*"):
                if f.is_file() and f.name.split(".")[1] in (
                    "checkpoint",
                    "gpus",
                    "preload",
                    "publisher",
                ):
                    f.unlink(missing_ok=True)
        if removed:
            self.log(f"removed leftovers not in the checkpoint: {', '.join(sorted(removed))}")
        repaired = []
        for uid in sorted(known):
            lk = self._lock_for(uid)
            if not lk.acquire(blocking=False):
                continue
            try:
                entry = self.checkpoint.get(uid)
                if (
                    entry is not None
                    and claim_state(entry) == ClaimState.PREPARED
                    and materialize(ClaimPlan.from_json(entry["plan"]), self.layout)
                ):
                    repaired.append(uid)
            finally:
                self._release_claims([lk])
        if repaired:
            self.log(f"rewrote the files of recorded claims: {', '.join(sorted(repaired))}")

    # ---- kubelet calls ------------------------------------------------------------------
    def _lock_for(self, uid: str) -> FileLock:
        """A new lock object for claim ``uid`` (``<state>/locks/<uid>``): node-wide, between
        threads and driver instances (:mod:`tessera.driver.locks`)."""
        return FileLock(self.cfg.state_dir / "locks" / uid)

    def _release_claims(self, locks: Sequence[FileLock]) -> None:
        """Release claim locks (held); a claim the checkpoint no longer names loses its lock file."""
        assert self.checkpoint is not None
        for lk in locks:
            lk.release(remove=self.checkpoint.get(lk.path.name) is None)

    def read_claim(self, ref: ClaimRef) -> dict[str, Any]:
        """GET the ResourceClaim (the kubelet only sends namespace, name, uid)."""
        t0 = time.perf_counter()
        try:
            return self.client.get("resource.k8s.io/v1", "ResourceClaim", ref.name, ref.namespace)
        finally:
            self.stats.api_read.append(time.perf_counter() - t0)

    def _devices(self) -> dict[str, NodeDevice]:
        """The node's published devices as prepare needs them (rebuilt when the slices or
        the registry change)."""
        assert self.publisher is not None
        key = (self.publisher.published, self.registry.version)
        c = self._devices_cache
        if c is None or c[0] is not key[0] or c[1] != key[1]:
            c = (key[0], key[1], node_devices(self.registry.snapshot(), self.publisher.published))
            self._devices_cache = c
        return c[2]

    def _mig_minors(self) -> dict[str, int]:
        """``/proc/driver/nvidia-caps/mig-minors`` (read again when it changes)."""
        try:
            mtime = self.layout.mig_minors.stat().st_mtime
        except OSError:
            return {}
        c = self._minors_cache
        if c is None or c[0] != mtime:
            c = (mtime, read_mig_minors(self.layout.mig_minors))
            self._minors_cache = c
        return c[1]

    def _claim_error(self, ref: ClaimRef, e: ApiError) -> PrepareResult:
        return PrepareResult(
            error=f"ResourceClaim {ref.namespace}/{ref.name}: {e.reason or 'error'}: {e.message}"
        )

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """NodePrepareResources for a batch of claims; one result per claim UID.

        Per claim: the recorded plan when the checkpoint has one, else a new plan from the
        ResourceClaim; a claim with dynamic-MIG devices first gets its instances
        (:meth:`_make_instances`); its files are written, then new claims are recorded (one
        checkpoint write for the batch, shared with concurrent batches), then the answer is
        given.
        """
        assert self.checkpoint is not None
        out: dict[str, PrepareResult] = {}
        fetched: dict[str, dict[str, Any]] = {}
        for ref in claims:
            entry = self.checkpoint.get(ref.uid)
            if entry is not None and claim_state(entry) == ClaimState.PREPARED:
                continue  # prepared before: the recorded plan is used
            try:
                fetched[ref.uid] = self.read_claim(ref)
            except ApiError as e:
                out[ref.uid] = self._claim_error(ref, e)
        todo = [r for r in claims if r.uid not in out]
        locks = []
        for u in sorted({r.uid for r in todo}):
            lk = self._lock_for(u)
            try:
                lk.acquire()
            except OSError as e:
                # A read-only or full state directory: this claim fails, the others go on.
                ref = next(r for r in todo if r.uid == u)
                out[u] = PrepareResult(
                    error=f"ResourceClaim {ref.namespace}/{ref.name}: its lock: {io_fault(e)}{NOT_KEPT}"
                )
                continue
            locks.append(lk)
        todo = [r for r in todo if r.uid not in out]
        new: dict[str, dict[str, Any]] = {}
        plans: dict[str, ClaimPlan] = {}
        try:
            t0 = time.perf_counter()
            devices = self._devices()
            minors = (
                self._mig_minors() if any(d.mig or d.placement for d in devices.values()) else {}
            )
            pending: dict[str, ClaimPlan] = {}
            for ref in todo:
                entry = self.checkpoint.get(ref.uid)
                if entry is not None and claim_state(entry) == ClaimState.PREPARED:
                    plans[ref.uid] = ClaimPlan.from_json(entry["plan"])
                    continue
                if entry is not None and claim_state(entry) == ClaimState.UNPREPARING:
                    err = self._unprepare_one(ref, entry)  # finish it before preparing again
                    if err:
                        out[ref.uid] = PrepareResult(error=err)
                        continue
                if ref.uid not in fetched:  # recorded when we looked, unprepared since
                    try:
                        fetched[ref.uid] = self.read_claim(ref)
                    except ApiError as e:
                        out[ref.uid] = self._claim_error(ref, e)
                        continue
                try:
                    plan = plan_claim(
                        fetched[ref.uid],
                        ref,
                        self.cfg.node_name,
                        devices,
                        self.backend.backend,
                        self.layout,
                        mig_minors=minors,
                    )
                except ClaimError as e:
                    out[ref.uid] = PrepareResult(error=str(e))
                    continue
                if plan.pending:
                    pending[ref.uid] = plan
                    continue
                plans[ref.uid] = plan
                new[ref.uid] = {"state": ClaimState.PREPARED.value, "plan": plan.to_json()}
            if pending:
                for uid, plan in self._make_instances(
                    pending, fetched, devices, minors, out
                ).items():
                    plans[uid] = plan
                    new[uid] = {"state": ClaimState.PREPARED.value, "plan": plan.to_json()}
            for uid, plan in list(plans.items()):
                try:
                    materialize(plan, self.layout)
                except OSError as e:
                    recorded = new.pop(uid, None) is None
                    if not recorded:
                        # Not recorded: nothing of it may stay (each file was written whole or
                        # not at all; those written before the fault go too).
                        self._remove_quietly(uid)
                    out[uid] = PrepareResult(
                        error=f"ResourceClaim {plan.ref.namespace}/{plan.ref.name}: writing its "
                        f"files: {io_fault(e)}"
                        + (
                            "; it stays prepared, and its files are written again at the "
                            "kubelet's retry"
                            if recorded
                            else NOT_KEPT
                        )
                    )
                    plans.pop(uid)
            t1 = time.perf_counter()
            if new:
                try:
                    self.checkpoint.update(put=new)
                except OSError as e:
                    for uid in new:
                        self._remove_quietly(uid)
                        plans.pop(uid, None)
                        out[uid] = PrepareResult(
                            error=f"ResourceClaim {fetched[uid]['metadata'].get('namespace')}/"
                            f"{fetched[uid]['metadata'].get('name')}: recording it in the "
                            f"checkpoint: {io_fault(e)}{NOT_KEPT}"
                        )
            if new:
                self._write_shares()
            for uid, plan in plans.items():
                out[uid] = PrepareResult(devices=plan.devices)
            t2 = time.perf_counter()
            n = max(1, len(todo))
            self.stats.prepare.extend([(t2 - t0) / n] * len(todo))
            self.stats.prepare_work.extend([(t1 - t0) / n] * len(todo))
            self.stats.checkpoint_wait.extend([(t2 - t1) / n] * len(todo))
        finally:
            self._release_claims(locks)
        for uid in new:
            if uid in plans:
                self._status_q.put(plans[uid])
        return out

    def _remove_quietly(self, uid: str) -> None:
        """Remove the files of a claim whose prepare failed; a removal that fails too (a
        read-only directory) is logged, and start-up or the next prepare removes them."""
        try:
            remove_files(uid, self.layout)
        except OSError as e:
            self.log(f"claim {uid}: removing the files of a failed prepare: {io_fault(e)}")

    def _foreign_problem(self, uid: str, slots: Sequence[MigSlot]) -> str | None:
        """Why the placements of ``slots`` are taken by instances the driver did not make (or
        by another claim's), or None. Checked before a claim's first intent is recorded."""
        assert self.checkpoint is not None and self.mig is not None
        entries = {u: e for u, e in self.checkpoint.entries().items() if u != uid}
        mine = owned(entries.values())
        shared_users = {
            s.key
            for e in entries.values()
            if claim_state(e) in (ClaimState.PREPARING, ClaimState.PREPARED)
            for s in entry_slots(e)
            if s.shared
        }
        for s in slots:
            for gi in self.mig.occupied(s):
                exact = (gi.profile_id, gi.start, gi.size) == (s.profile_id, s.start, s.size)
                if s.shared and exact and s.key in shared_users:
                    continue  # the whole GPU's instance, shared with claims prepared before
                whose = (
                    "another claim's"
                    if (gi.profile_id, gi.start, gi.size) in (mine.get(s.gpu_uuid) or set())
                    else "one the driver did not make"
                )
                return (
                    f"{s.device}: GPU {s.gpu_index} ({s.gpu_uuid}) memory slices {s.start}-{s.start + s.size - 1} "
                    f"are held by GPU instance {gi.id} ({whose}); destroy it or leave the GPU out of "
                    f"{DYNAMIC_MIG_OPTION}"
                )
        return None

    def _make_instances(
        self,
        pending: dict[str, ClaimPlan],
        fetched: dict[str, dict[str, Any]],
        devices: dict[str, NodeDevice],
        minors: dict[str, int],
        out: dict[str, PrepareResult],
    ) -> dict[str, ClaimPlan]:
        """Make the dynamic-MIG instances of ``pending`` plans and plan those claims again
        with them; errors go to ``out``. Order, for crash safety: the claim's slots are
        recorded (``preparing``: one checkpoint write for all), then the instances are made -
        or found, when an interrupted attempt made them - under ``_mig_lock``. A failure
        destroys what the claim holds alone and removes its record."""
        assert self.checkpoint is not None
        done: dict[str, ClaimPlan] = {}
        if self.mig is None:
            for uid, plan in pending.items():
                out[uid] = PrepareResult(
                    error=f"ResourceClaim {plan.ref.namespace}/{plan.ref.name}: its dynamic-MIG "
                    "devices need NVML, which this driver could not load"
                )
            return done
        intents: dict[str, dict[str, Any]] = {}
        resolved: dict[str, list[MigSlot]] = {}
        for uid, plan in pending.items():
            ref = plan.ref
            what = f"ResourceClaim {ref.namespace}/{ref.name}"
            try:
                slots = [self.mig.resolve(s) for s in plan.mig]
            except MigError as e:
                out[uid] = PrepareResult(error=f"{what}: {e}")
                continue
            entry = self.checkpoint.get(uid)
            prior = (
                entry_slots(entry)
                if entry is not None and claim_state(entry) == ClaimState.PREPARING
                else None
            )
            if prior is not None and {s.key for s in prior} != {s.key for s in slots}:
                # Allocated again since the interrupted attempt: undo that attempt first.
                try:
                    with self._mig_lock:
                        self._release(uid, prior)
                except MigError as e:
                    out[uid] = PrepareResult(error=f"{what}: {e}")
                    continue
                prior = None
            if prior is None:
                problem = self._foreign_problem(uid, slots)
                if problem:
                    out[uid] = PrepareResult(error=f"{what}: {problem}")
                    continue
            resolved[uid] = slots
            intents[uid] = {
                "state": ClaimState.PREPARING.value,
                "since": time.time(),
                "claim": {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid},
                "slots": [s.to_json() for s in slots],
            }
        if intents:
            try:
                self.checkpoint.update(put=intents)
            except OSError as e:
                for uid in intents:
                    out[uid] = PrepareResult(
                        error=f"ResourceClaim {pending[uid].ref.namespace}/{pending[uid].ref.name}: checkpoint: {e}"
                    )
                return done
        failed: list[str] = []
        for uid, slots in resolved.items():
            ref = pending[uid].ref
            what = f"ResourceClaim {ref.namespace}/{ref.name}"
            made: dict[tuple[str, str, int], MigSlot] = {}
            try:
                with self._mig_lock:
                    for s in slots:
                        m = self.mig.realise(s)
                        made[m.key] = m
            except MigError as e:
                out[uid] = PrepareResult(error=f"{what}: {e}")
                try:
                    with self._mig_lock:
                        self._release(uid, slots)
                    failed.append(uid)
                except MigError as e2:
                    self.log(
                        f"{what}: undoing a failed prepare: {e2} (retried with the kubelet's next call)"
                    )
                continue
            try:
                done[uid] = plan_claim(
                    fetched[uid],
                    ref,
                    self.cfg.node_name,
                    devices,
                    self.backend.backend,
                    self.layout,
                    mig_minors=minors,
                    instances=made,
                )
            except ClaimError as e:
                out[uid] = PrepareResult(error=str(e))
        if failed:
            self.checkpoint.update(drop=failed)
        return done

    def _unprepare_one(self, ref: ClaimRef, entry: dict[str, Any]) -> str:
        """Destroy the MIG instances of a claim being unprepared (recorded ``unpreparing``
        first) and remove its files and entry; returns an error line, or ''. Call with the
        claim's lock held."""
        assert self.checkpoint is not None
        slots = entry_slots(entry)
        if slots and claim_state(entry) != ClaimState.UNPREPARING:
            self.checkpoint.update(
                put={
                    ref.uid: {
                        "state": ClaimState.UNPREPARING.value,
                        "claim": {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid},
                        "slots": [s.to_json() for s in slots],
                    }
                }
            )
        remove_files(ref.uid, self.layout)
        if slots:
            if self.mig is None:
                return f"ResourceClaim {ref.namespace}/{ref.name}: its MIG instances need NVML to be destroyed"
            try:
                with self._mig_lock:
                    self._release(ref.uid, slots)
            except MigError as e:
                return f"ResourceClaim {ref.namespace}/{ref.name}: {e}"
        self.checkpoint.update(drop=[ref.uid])
        return ""

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """NodeUnprepareResources: remove each claim's files, then its checkpoint entry. A
        claim with dynamic-MIG instances is recorded ``unpreparing`` first, and its instances
        are destroyed (those of the whole GPU only with its last share) before the entry goes."""
        assert self.checkpoint is not None
        out: dict[str, str] = {}
        locks = [self._lock_for(u) for u in sorted({r.uid for r in claims})]
        for lk in locks:
            lk.acquire()
        try:
            gone = []
            for ref in claims:
                entry = self.checkpoint.get(ref.uid)
                if entry is not None and entry_slots(entry):
                    out[ref.uid] = self._unprepare_one(ref, entry)
                    continue
                try:
                    remove_files(ref.uid, self.layout)
                except OSError as e:
                    out[ref.uid] = (
                        f"ResourceClaim {ref.namespace}/{ref.name}: removing its files: {e}"
                    )
                    continue
                gone.append(ref.uid)
                out[ref.uid] = ""
            if gone:
                self.checkpoint.update(drop=gone)
                self._write_shares()
        finally:
            self._release_claims(locks)
        return out

    def _write_shares(self) -> None:
        """The node's per-GPU shares files, from every prepared claim in the checkpoint (what
        best-effort tenants are held to); a failure is logged, pacing then keeps the last."""
        assert self.checkpoint is not None
        plans = [
            ClaimPlan.from_json(e["plan"])
            for e in self.checkpoint.entries().values()
            if claim_state(e) == ClaimState.PREPARED and e.get("plan")
        ]
        try:
            write_node_shares(self.layout, plans)
        except (OSError, ValueError) as e:
            self.log(f"warning: writing the GPU shares files in {self.layout.shares_dir}: {e}")

    # ---- background work -----------------------------------------------------------------
    def _on_xid(self, uuid: str, xid: int) -> None:
        if self.registry.record_xid(uuid, xid):
            self.log(f"GPU {uuid}: XID {xid}")
            self._wake.set()

    def rescan(self) -> None:
        """One discovery + health pass, then publish if anything changed."""
        assert self.publisher is not None
        try:
            with self._mig_lock:  # no instance made or destroyed while NVML is read
                inv = (
                    discover_nvml(self.nvml)
                    if self.nvml is not None
                    else discover_smi(self.cfg.nvidia_smi)
                )
                gpus = self._foreign_only(inv)
        except DiscoveryError as e:
            self.log(f"rescan: {e}")
            return
        seen = {g.gpu.uuid for g in inv.gpus}
        health = {
            r.gpu.uuid: (probe(self.nvml, r.gpu.uuid) if self.nvml is not None else "missing")
            for r in self.registry.snapshot()
            if r.gpu.uuid not in seen
        }
        self.registry.update(gpus, health)
        try:
            self.publisher.sync()
        except ApiError as e:
            self.log(f"publishing: {e}")
        except SliceBuildError as e:
            if str(e) not in self._warned:
                self._warned.add(str(e))
                self.log(f"not publishing the change: {e}")
        self._warn_publication()
        try:
            self._cleanup_stale()
        except (ApiError, OSError) as e:
            self.log(f"checking interrupted prepares: {e}")
        self.reconcile()

    def reconcile(self) -> None:
        """Reconcile every prepared claim's charge with NVML's per-process figures
        (:mod:`tessera.enforcement.reconcile`): write into each claim directory's
        ``driver/usage`` what its processes hold beyond their charges and each live slot's
        host pid (:func:`~tessera.enforcement.reconcile.reconcile_claim`). Needs NVML and the
        host's PID namespace (the chart runs the driver with ``hostPID``); without NVML it does
        nothing. A claim whose region cannot be read is skipped."""
        if self.nvml is None:
            return
        from tessera.enforcement.reconcile import nvml_per_process, reconcile_claim
        from tessera.enforcement.region import RegionError, read_region

        try:
            figures = nvml_per_process(self.nvml)
        except Exception as e:
            self.log(f"reconcile: NVML per-process figures: {e}")
            return
        root = claims_dir(self.cfg.state_dir)
        for d in sorted(root.iterdir()) if root.is_dir() else []:
            region = d / REGION_FILE
            if not region.is_file():
                continue
            try:
                reconcile_claim(d, read_region(str(region)), figures)
            except (RegionError, OSError) as e:
                self.log(f"reconcile: claim {d.name}: {e}")

    def _rescan_loop(self) -> None:
        while not self._stop.is_set():
            assert self.publisher is not None
            wait = self.cfg.rescan_seconds
            nxt = self.publisher.next_change()
            if nxt is not None:
                wait = min(wait, nxt + 0.05)
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                if not self.publishes():
                    continue
            except OSError as e:
                self.log(f"{self.lease}: {e.strerror or e}; rescanning anyway")
            self.rescan()

    def _status_loop(self) -> None:
        while True:
            plan = self._status_q.get()
            if plan is None or self._stop.is_set():
                return
            if not plan.status:
                continue
            obj = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {
                    "name": plan.ref.name,
                    "namespace": plan.ref.namespace,
                    "uid": plan.ref.uid,
                },
                "status": {"devices": [dict(e, data=e["data"]) for e in plan.status]},
            }
            try:
                self.client.apply_status(
                    obj, field_manager=f"{self.cfg.driver}-{self.cfg.node_name}"
                )
            except ApiError as e:
                self.stats.status_errors += 1
                self.log(
                    f"ResourceClaim {plan.ref.namespace}/{plan.ref.name}: status.devices not written: {e}"
                )

    # ---- health endpoints -----------------------------------------------------------------
    def health(self) -> tuple[bool, bool, dict[str, Any]]:
        """``(live, ready, details)``: live while the gRPC servers and threads run; ready once
        started, the slices published, the kubelet has confirmed the registration
        (``NotifyRegistrationStatus`` with ``plugin_registered``) and the DRA service answers
        a call on its socket (an empty ``NodePrepareResources``, at most 2 s), and not while
        stopping. ``details``: what ``/readyz`` shows (``registered``, ``serving``,
        ``stopping``, ``publishing``, ``instance``, counters)."""
        alive = all(t.is_alive() for t in self._threads) and self.servers is not None
        started = (
            self.ready.is_set()
            and alive
            and self.publisher is not None
            and self.publisher.generation is not None
        )
        registered = self.servers.registered.is_set() if self.servers else False
        serving = (
            self.servers.answers(timeout=2.0)
            if self.servers is not None and self.ready.is_set()
            else False
        )
        ready = started and registered and serving and not self.stopping
        details = {
            "node": self.cfg.node_name,
            "instance": self.instance_id,
            "serving": serving,
            "stopping": self.stopping,
            "publishing": not self.retired,
            "backend": self.backend.backend,
            "backendReason": self.backend.reason,
            "gpus": len(self.registry.records),
            "generation": self.publisher.generation if self.publisher else None,
            "registered": registered,
            "registrationError": self.servers.registration_error if self.servers else "",
            "firstPublishSeconds": self.stats.first_publish,
            "preparedClaims": sum(
                1
                for e in self.checkpoint.entries().values()
                if claim_state(e) == ClaimState.PREPARED
            )
            if self.checkpoint
            else 0,
            "statusErrors": self.stats.status_errors,
        }
        return alive, ready, details

    def _bind_http(self, address: str) -> None:
        """``GET /healthz``, ``/livez``, ``/readyz`` over plain HTTP/1.0 (socketserver: the
        http.server module alone costs a node agent half a second of start-up): the listening
        socket, served from the end of :meth:`start`. Raises :class:`DriverStartError`."""
        host, _, port = address.rpartition(":")
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                line = self.rfile.readline(8192).decode("latin-1").split()
                while self.rfile.readline(8192).strip():
                    pass  # headers
                path = line[1].split("?")[0] if len(line) >= 2 and line[0] == "GET" else ""
                live, ready, details = outer.health()
                ok = {"/healthz": live, "/livez": live, "/readyz": ready}.get(path)
                if ok is None:
                    status, body = "404 Not Found", b'{"error": "not found"}\n'
                else:
                    status = "200 OK" if ok else "503 Service Unavailable"
                    body = (json.dumps({"ok": ok, **details}) + "\n").encode()
                self.wfile.write(
                    f"HTTP/1.0 {status}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        try:
            self._http = Server((host or "127.0.0.1", int(port)), Handler)
        except OSError as e:
            raise DriverStartError(f"--health-address {address}: {e.strerror}") from e

    @property
    def health_port(self) -> int | None:
        return self._http.server_address[1] if self._http is not None else None
