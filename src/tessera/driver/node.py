"""``tessera driver``: the node agent that ties discovery, publishing and prepare together.

:class:`NodeDriver` (one per node) starts in this order, and refuses to start with a one-line
:class:`DriverStartError` when something it needs is missing:

1. the kubelet's ``--root-dir`` must exist (the plugin sockets live under it), and the health
   address is bound (served from step 12: a taken port refuses the start before anything is
   written, published or made);
2. the API server must allow what the driver does (:data:`.access.NODE_AGENT_ACCESS`: a
   SelfSubjectAccessReview for each row);
3. the checkpoint is loaded;
4. NVML is loaded (else ``nvidia-smi -q -x`` is the inventory); dynamic MIG needs NVML;
5. the guard (:mod:`tessera.driver.guard`): no other manager of these GPUs may run on the node;
6. MIG instances the driver made are recovered (:meth:`NodeDriver.recover_mig`): those of an
   interrupted unprepare, or of an interrupted prepare whose claim is gone, are destroyed;
   those of a prepare still in progress are adopted (the kubelet's retry uses them);
   then every prepared claim's recorded plan is checked against what NVML lists
   (:meth:`.startup.StartupReconciler.reconcile_claims`: after a reboot a GPU may be gone or at another
   minor, a MIG instance gone): a stale claim is planned again at the kubelet's next prepare;
7. discovery (the driver's own MIG instances left out: what remains was made by someone else);
8. the enforcement backend is chosen (:mod:`tessera.driver.backend`);
9. the ResourceSlices are published (:mod:`tessera.driver.publish`; a dynamic-MIG setting the
   GPUs cannot have is refused here);
10. leftovers of interrupted writes are removed, recorded claims' missing files are written
    again, and so are the node's per-GPU shares files (what best-effort tenants are held to);
11. the DRA and registration gRPC servers listen (:mod:`tessera.driver.kubelet`);
12. background threads: rescans (health, GPUs coming and going), XID events and presence
    probes, claim status; ``/healthz`` and ``/readyz`` are served.

The devices' health goes to the kubelet too (:mod:`tessera.driver.resourcehealth`, KEP-4680):
every publisher sync leaves a report in :attr:`NodeDriver.health_feed`, streamed by the DRA
socket's ``DRAResourceHealth`` service.

Prepare/unprepare are batch calls (one per kubelet request), safe to run concurrently: each
claim is serialized on its own lock, the checkpoint is written once per batch and phase.
MIG instances are made and destroyed under one lock (``DriverContext.mig_lock``), which rescans take too,
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

**Parts** (composition; :class:`NodeDriver` is the façade the CLI and tests use, and owns the
start and stop order): :class:`~.context.DriverContext` (what the parts share: settings, API
client, log, layout, checkpoint, MIG operations, backend, registry, publisher, claim locks),
:class:`~.claims.ClaimPreparer` (the prepare/unprepare state machine) with
:class:`~.claims.ClaimStatusWriter`, :class:`~.instances.MigInstances` (dynamic-MIG instances,
and those a crash left), :class:`~.startup.StartupReconciler` (stale plans and leftover files
at start), :class:`~.rescan.Rescanner` and :class:`~.rescan.PublishLease` (the slice
publishing and health loop), :class:`~.health.HealthEndpoint` (``/healthz``, ``/readyz``) and
:class:`~.kubelet.PluginServers` (the kubelet-facing gRPC adapter, which calls
:meth:`NodeDriver.prepare` and :meth:`NodeDriver.unprepare`).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from tessera.enforcement.library import LibraryError, library_formats
from tessera.inventory.errors import SliceBuildError
from tessera.kube.access import denied_access
from tessera.kube.client import ApiError, KubeClient

from . import backend as backends
from . import guard
from .access import NODE_AGENT_ACCESS
from .checkpoint import Checkpoint, CheckpointError, ClaimState
from .claims import ClaimPreparer, ClaimStatusWriter
from .context import (
    DYNAMIC_MIG_OPTION,
    NOT_KEPT,
    STALE_PREPARE_SECONDS,
    DriverConfig,
    DriverContext,
    DriverStartError,
    Stats,
    io_fault,
)
from .discovery import DiscoveryError, Inventory, XidWatcher, discover_nvml, discover_smi, load_nvml
from .health import HealthEndpoint
from .instances import MigInstances
from .kubelet import ClaimRef, PluginServers, PrepareResult
from .locks import InstanceLock
from .mig import MigOps
from .prepare import Layout, write_preload
from .publish import GpuRegistry, Publisher
from .rescan import PublishLease, Rescanner, foreign_only, warn_publication
from .resourcehealth import HealthFeed
from .startup import StartupReconciler

__all__ = [
    "DYNAMIC_MIG_OPTION",
    "NOT_KEPT",
    "REQUIRED_ACCESS",
    "STALE_PREPARE_SECONDS",
    "DriverConfig",
    "DriverStartError",
    "NodeDriver",
    "Stats",
    "io_fault",
]

#: What the driver asks the API server to allow: (verb, group, resource, subresource), the
#: rows of :data:`.access.NODE_AGENT_ACCESS` (kept for callers of the tuple form).
REQUIRED_ACCESS: tuple[tuple[str, str, str, str], ...] = tuple(
    (a.verb, a.group, a.resource, a.subresource) for a in NODE_AGENT_ACCESS
)


class NodeDriver:
    """The node driver; :meth:`start`, then serve until :meth:`stop`.

    ``client``: API client; ``log``: one line per event (stderr by default). The work is done
    by its parts (see the module doc); this class starts and stops them in order and answers
    for them.
    """

    def __init__(
        self, cfg: DriverConfig, client: KubeClient, log: Callable[[str], None] | None = None
    ) -> None:
        self.cfg = cfg
        self.client = client
        self.log = log or (lambda m: print(f"tessera driver: {m}", flush=True))
        self.ctx = DriverContext(
            cfg=cfg,
            client=client,
            log=self.log,
            layout=Layout(
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
            ),
            registry=GpuRegistry(cfg.state_dir / "gpus.json"),
        )
        self.servers: PluginServers | None = None
        #: The devices' health for the kubelet (KEP-4680), left by the publisher at each sync.
        self.health_feed = HealthFeed()
        self.started_at = time.monotonic()
        #: This instance's name in ``<state>/publisher`` (the rolling-update id, else made up).
        self.instance_id = (
            cfg.instance or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        )
        self.instances = InstanceLock(cfg.state_dir / "instances.lock")
        #: No other instance ran when this one started (it may clean up interrupted writes).
        self.alone = True
        self.stopping = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._xid: XidWatcher | None = None
        self._http: HealthEndpoint | None = None
        self.ready = threading.Event()
        self.lease = PublishLease(self.ctx, cfg.state_dir / "publisher", self.instance_id)
        self.mig_instances = MigInstances(self.ctx)
        self.status = ClaimStatusWriter(self.ctx, self._stop)
        self.claims = ClaimPreparer(self.ctx, self.mig_instances, self.status)
        self.startup = StartupReconciler(self.ctx)
        self.rescanner = Rescanner(self.ctx, self.mig_instances, self.lease, self._stop, self._wake)

    # ---- what the parts share, as before the split ---------------------------------------
    @property
    def checkpoint(self) -> Checkpoint | None:
        """The checkpoint (None before :meth:`start` loaded it)."""
        return self.ctx.checkpoint

    @property
    def mig(self) -> MigOps | None:
        """NVML's MIG operations (None without NVML, or before start)."""
        return self.ctx.mig

    @property
    def backend(self) -> backends.BackendChoice:
        """The enforcement backend chosen at start, and why."""
        return self.ctx.backend

    @property
    def layout(self) -> Layout:
        return self.ctx.layout

    @property
    def registry(self) -> GpuRegistry:
        return self.ctx.registry

    @property
    def publisher(self) -> Publisher | None:
        return self.ctx.publisher

    @property
    def stats(self) -> Stats:
        return self.ctx.stats

    @property
    def nvml(self) -> object | None:
        return self.ctx.nvml

    @property
    def retired(self) -> bool:
        """Another instance publishes now: this one only answers the kubelet until it stops."""
        return self.lease.retired

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
            self._http = HealthEndpoint(cfg.health_address, self.health)
        try:
            self._start()
        except BaseException:
            if self._http is not None:
                self._http.close()
                self._http = None
            raise

    def _start(self) -> None:
        """Steps 2-12 of the module doc."""
        self._check_access()
        self._open_state()
        inv = self._discover()
        self._check_gpus(inv)
        if self.ctx.mig is not None and self.recover_mig():
            inv = self._discover()
        self.startup.reconcile_claims(inv)
        self.ctx.registry.update(foreign_only(self.ctx, inv), {})
        self._choose_backend(inv)
        self._publish()
        write_preload(self.ctx.layout)
        self.startup.reconcile_files(self.alone)
        self.claims.write_shares()  # a crash between a checkpoint write and the shares files
        self._serve()

    def _open_state(self) -> None:
        """Load the checkpoint and join the node's driver instances (step 3)."""
        cfg = self.cfg
        try:
            self.ctx.checkpoint = Checkpoint(cfg.state_dir / "checkpoint.json")
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

    def _check_gpus(self, inv: Inventory) -> None:
        """The guard, then NVML's MIG operations (steps 5-6): another manager of these GPUs
        on the node, or dynamic MIG without NVML, refuses the start."""
        cfg = self.cfg
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
        if self.ctx.nvml is not None:
            self.ctx.mig = MigOps(self.ctx.nvml)
        elif cfg.dynamic_mig is not None:
            raise DriverStartError(
                f"{DYNAMIC_MIG_OPTION}: making MIG instances needs NVML, which could not be loaded "
                "(GPUs were read from nvidia-smi); install the NVIDIA driver's libnvidia-ml.so.1 or "
                f"pass --nvml-library PATH, or drop {DYNAMIC_MIG_OPTION}"
            )

    def _choose_backend(self, inv: Inventory) -> None:
        """Step 8: the enforcement backend, logged with the inventory."""
        cfg, ctx = self.cfg, self.ctx
        ctx.backend = backends.detect(
            cfg.enforcement_backend,
            ctx.nvml,
            inv.driver_version,
            [g.gpu.uuid for g in inv.gpus],
            backends.find_cdi_hook(cfg.cdi_hook),
            cfg.cgroup_root,
        )
        ctx.layout = Layout(
            **{**ctx.layout.__dict__, "cdi_hook": backends.find_cdi_hook(cfg.cdi_hook)}
        )
        self.log(
            f"{len(inv.gpus)} GPU(s) from {inv.source} (driver {inv.driver_version}); "
            f"enforcement backend {ctx.backend.backend}: {ctx.backend.reason}"
        )
        if ctx.layout.library is not None:
            # Read again at every prepare (check_library_reads); logged here once.
            try:
                formats = library_formats(ctx.layout.library)
                self.log(f"enforcement library {formats.path} reads {formats.describe()}")
            except (OSError, LibraryError) as e:
                self.log(
                    f"enforcement library {ctx.layout.library}: {e}: claims with limits are "
                    "refused until it can be read"
                )

    def _publish(self) -> None:
        """Step 9: claim the publisher lease and publish the ResourceSlices."""
        cfg, ctx = self.cfg, self.ctx
        ctx.publisher = Publisher(
            self.client,
            cfg.node_name,
            cfg.driver,
            ctx.registry,
            ctx.backend.backend,
            xid_recovery=cfg.xid_recovery_seconds,
            dynamic_mig=cfg.dynamic_mig,
            dynamic_where=DYNAMIC_MIG_OPTION,
            log=self.log,
            health=self.health_feed,
            health_watched=ctx.nvml is not None,
        )
        self.lease.claim()
        try:
            ctx.publisher.sync()
        except ApiError as e:
            raise DriverStartError(f"publishing ResourceSlices of node {cfg.node_name}: {e}") from e
        except SliceBuildError as e:
            raise DriverStartError(str(e)) from e
        warn_publication(ctx)
        ctx.stats.first_publish = time.monotonic() - self.started_at

    def _serve(self) -> None:
        """Steps 11-12: the kubelet plugin sockets, the background threads, the health endpoint."""
        cfg = self.cfg
        self.servers = PluginServers(
            cfg.kubelet_root,
            cfg.driver,
            self,
            instance=cfg.instance,
            log=self.log,
            health=self.health_feed,
        )
        try:
            self.servers.start()
        except OSError as e:
            raise DriverStartError(f"kubelet plugin sockets: {e}") from e
        self._spawn(self.rescanner.loop, "tessera-rescan")
        if cfg.write_claim_status:
            self._spawn(self.status.loop, "tessera-status")
        if self.ctx.nvml is not None:
            self._xid = XidWatcher(
                [r.gpu.uuid for r in self.ctx.registry.snapshot()],
                self.rescanner.on_xid,
                self.log,
                on_presence=self.rescanner.on_presence,
            )
            self._xid.start()
        if self._http is not None:
            self._spawn(self._http.serve_forever, "tessera-health")
        self.ready.set()
        self.log(
            f"serving {self.servers.dra_path} (registration {self.servers.registration_path}); "
            f"slices published {self.ctx.stats.first_publish:.3f} s after start"
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
        self.status.close()
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
            stopped.append("health endpoint")
        for t in self._threads:
            t.join(timeout=5)
        left = [t.name for t in self._threads if t.is_alive()]
        stopped.extend(t.name for t in self._threads if not t.is_alive())
        self.lease.release()
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

    def publishes(self) -> bool:
        """Whether this instance publishes now (:meth:`.rescan.PublishLease.publishes`)."""
        return self.lease.publishes()

    def _spawn(self, fn: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _check_access(self) -> None:
        """Step 2: every row of :data:`.access.NODE_AGENT_ACCESS` asked at once
        (SelfSubjectAccessReviews; a row limited to a name is asked for this driver's name).
        A denied required row refuses the start, naming every denied one; a denied optional
        row (the claim status) is logged."""
        rows = [replace(a, name=self.cfg.driver) if a.name else a for a in NODE_AGENT_ACCESS]
        try:
            denied = denied_access(self.client, rows)
        except ApiError as e:
            raise DriverStartError(f"API server {self.client.server}: {e}") from e
        refused = [a.describe() for a in denied if a.required]
        if refused:
            raise DriverStartError(
                f"the API server denies this identity: {', '.join(refused)}; "
                "grant the driver's ServiceAccount the ClusterRole in docs/driver.md"
            )
        optional = [a.describe() for a in denied if not a.required]
        if optional:
            self.log(
                f"warning: the API server denies this identity {', '.join(optional)}: claims "
                "are prepared but their device status is not written (statusErrors in /readyz)"
            )

    def _discover(self) -> Inventory:
        """The GPUs from NVML (loaded the first time), else from ``nvidia-smi``."""
        ctx = self.ctx
        try:
            if ctx.nvml is None:
                ctx.nvml = load_nvml(self.cfg.nvml_library)
            return discover_nvml(ctx.nvml)
        except DiscoveryError as nvml_err:
            ctx.nvml = None
            try:
                return discover_smi(self.cfg.nvidia_smi)
            except DiscoveryError as smi_err:
                raise DriverStartError(
                    f"no GPU inventory: NVML: {nvml_err}; nvidia-smi fallback: {smi_err} "
                    "(install the NVIDIA driver, or pass --nvml-library PATH)"
                ) from smi_err

    # ---- what the parts do, as before the split -------------------------------------------
    def recover_mig(self) -> bool:
        """At start: settle the MIG instances an earlier process left unfinished
        (:meth:`.instances.MigInstances.recover`); True when it destroyed anything."""
        return self.mig_instances.recover()

    def read_claim(self, ref: ClaimRef) -> dict[str, Any]:
        """GET the ResourceClaim (:meth:`.claims.ClaimPreparer.read_claim`)."""
        return self.claims.read_claim(ref)

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """NodePrepareResources for a batch of claims; one result per claim UID
        (:meth:`.claims.ClaimPreparer.prepare`)."""
        return self.claims.prepare(claims)

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """NodeUnprepareResources; one error line (or '') per claim UID
        (:meth:`.claims.ClaimPreparer.unprepare`)."""
        return self.claims.unprepare(claims)

    def rescan(self) -> None:
        """One discovery + health pass, then publish if anything changed
        (:meth:`.rescan.Rescanner.rescan`)."""
        self.rescanner.rescan()

    def reconcile(self) -> None:
        """Reconcile every prepared claim's charge with NVML's per-process figures
        (:meth:`.rescan.Rescanner.reconcile`)."""
        self.rescanner.reconcile()

    # ---- health endpoints -----------------------------------------------------------------
    def health(self) -> tuple[bool, bool, dict[str, Any]]:
        """``(live, ready, details)``: live while the gRPC servers and threads run; ready once
        started, the slices published, the kubelet has confirmed the registration
        (``NotifyRegistrationStatus`` with ``plugin_registered``) and the DRA service answers
        a call on its socket (an empty ``NodePrepareResources``, at most 2 s), and not while
        stopping. ``details``: what ``/readyz`` shows (``registered``, ``serving``,
        ``stopping``, ``publishing``, ``instance``, counters)."""
        ctx = self.ctx
        alive = all(t.is_alive() for t in self._threads) and self.servers is not None
        started = (
            self.ready.is_set()
            and alive
            and ctx.publisher is not None
            and ctx.publisher.generation is not None
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
            "backend": ctx.backend.backend,
            "backendReason": ctx.backend.reason,
            "gpus": len(ctx.registry.records),
            "generation": ctx.publisher.generation if ctx.publisher else None,
            "registered": registered,
            "registrationError": self.servers.registration_error if self.servers else "",
            "firstPublishSeconds": ctx.stats.first_publish,
            "preparedClaims": sum(
                1 for e in ctx.checkpoint.entries().values() if e.state == ClaimState.PREPARED
            )
            if ctx.checkpoint
            else 0,
            "statusErrors": ctx.stats.status_errors,
        }
        return alive, ready, details

    @property
    def health_port(self) -> int | None:
        """The health endpoint's port (None without one)."""
        return self._http.port if self._http is not None else None
