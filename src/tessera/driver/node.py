"""``tessera driver``: the node agent that ties discovery, publishing and prepare together.

:class:`NodeDriver` (one per node) starts in this order, and refuses to start with a one-line
:class:`DriverStartError` when something it needs is missing:

1. the kubelet's ``--root-dir`` must exist (the plugin sockets live under it);
2. the API server must allow what the driver does (SelfSubjectAccessReview for each verb);
3. discovery through NVML (``nvidia-ml-py``), else ``nvidia-smi -q -x``; then the guard
   (:mod:`tessera.driver.guard`): no other manager of these GPUs may run on the node;
4. the enforcement backend is chosen (:mod:`tessera.driver.backend`);
5. the ResourceSlices are published (:mod:`tessera.driver.publish`);
6. the checkpoint is loaded and leftovers of interrupted writes are removed;
7. the DRA and registration gRPC servers listen (:mod:`tessera.driver.kubelet`);
8. background threads: rescans (health, GPUs coming and going), XID events, claim status.

Prepare/unprepare are batch calls (one per kubelet request), safe to run concurrently: each
claim is serialized on its own lock, the checkpoint is written once per batch and phase.
"""

from __future__ import annotations

import json
import queue
import socketserver
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera import DRIVER_NAME
from tessera.api.errors import TesseraError
from tessera.kube.client import ApiError, KubeClient

from . import backend as backends
from . import guard
from .checkpoint import PREPARED, Checkpoint
from .discovery import (
    DiscoveryError,
    Inventory,
    XidWatcher,
    discover_nvml,
    discover_smi,
    load_nvml,
    probe,
)
from .kubelet import ClaimRef, PluginServers, PrepareResult
from .prepare import (
    ClaimError,
    ClaimPlan,
    Layout,
    materialize,
    plan_claim,
    remove_files,
    write_preload,
)
from .publish import GpuRegistry, Publisher

#: What the driver asks the API server to allow: (verb, group, resource, subresource).
REQUIRED_ACCESS: tuple[tuple[str, str, str, str], ...] = (
    ("get", "resource.k8s.io", "resourceclaims", ""),
    ("list", "resource.k8s.io", "resourceslices", ""),
    ("create", "resource.k8s.io", "resourceslices", ""),
    ("patch", "resource.k8s.io", "resourceslices", ""),
    ("delete", "resource.k8s.io", "resourceslices", ""),
)


class DriverStartError(TesseraError, RuntimeError):
    """The driver cannot start; the message is one line saying what is missing and what to do."""


@dataclass
class DriverConfig:
    """Settings of one node driver (the ``tessera driver`` options)."""

    node_name: str
    kubelet_root: Path = Path("/var/lib/kubelet")
    cdi_dir: Path = Path("/var/run/cdi")
    state_dir: Path = Path("/var/lib/tessera/driver")
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

    def __init__(self, cfg: DriverConfig, client: KubeClient,
                 log: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.client = client
        self.log = log or (lambda m: print(f"tessera driver: {m}", flush=True))
        self.layout = Layout(
            state_dir=cfg.state_dir, cdi_dir=cfg.cdi_dir, dev_root=cfg.dev_root,
            library=cfg.library, driver=cfg.driver, driver_root=cfg.driver_root,
            cdi_hook=cfg.cdi_hook, nvidia_cdi_kind=cfg.nvidia_cdi_kind,
        )
        self.registry = GpuRegistry(cfg.state_dir / "gpus.json")
        self.checkpoint: Checkpoint | None = None
        self.publisher: Publisher | None = None
        self.servers: PluginServers | None = None
        self.backend = backends.BackendChoice(backends.LIBRARY, "not chosen yet")
        self.nvml: object | None = None
        self.stats = Stats()
        self.started_at = time.monotonic()
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._xid: XidWatcher | None = None
        self._status_q: queue.Queue[ClaimPlan | None] = queue.Queue()
        self._http: socketserver.ThreadingTCPServer | None = None
        self.ready = threading.Event()

    # ---- start / stop -----------------------------------------------------------------
    def start(self) -> None:
        """Start everything (see module doc). Raises :class:`DriverStartError`."""
        cfg = self.cfg
        if not cfg.kubelet_root.is_dir():
            raise DriverStartError(
                f"kubelet directory {cfg.kubelet_root} does not exist: run the driver on a node "
                "whose kubelet uses it, or pass the kubelet's --root-dir as --kubelet-root-dir")
        self._check_access()
        inv = self._discover()
        guard.check_node(self.client, cfg.node_name, guard.discovered_uuids(g.gpu for g in inv.gpus),
                         device_plugin_dir=cfg.device_plugin_dir, driver=cfg.driver, log=self.log)
        self.registry.update(inv.gpus, {})
        self.backend = backends.detect(
            cfg.enforcement_backend, self.nvml, inv.driver_version,
            [g.gpu.uuid for g in inv.gpus], backends.find_cdi_hook(cfg.cdi_hook), cfg.cgroup_root)
        self.layout = Layout(**{**self.layout.__dict__, "cdi_hook": backends.find_cdi_hook(cfg.cdi_hook)})
        self.log(f"{len(inv.gpus)} GPU(s) from {inv.source} (driver {inv.driver_version}); "
                 f"enforcement backend {self.backend.backend}: {self.backend.reason}")
        self.publisher = Publisher(self.client, cfg.node_name, cfg.driver, self.registry,
                                   self.backend.backend, xid_recovery=cfg.xid_recovery_seconds,
                                   log=self.log)
        try:
            self.publisher.sync()
        except ApiError as e:
            raise DriverStartError(f"publishing ResourceSlices of node {cfg.node_name}: {e}") from e
        self.stats.first_publish = time.monotonic() - self.started_at
        write_preload(self.layout)
        self.checkpoint = Checkpoint(cfg.state_dir / "checkpoint.json")
        self._reconcile_files()
        self.servers = PluginServers(cfg.kubelet_root, cfg.driver, self, log=self.log)
        try:
            self.servers.start()
        except OSError as e:
            raise DriverStartError(f"kubelet plugin sockets: {e}") from e
        self._spawn(self._rescan_loop, "tessera-rescan")
        if cfg.write_claim_status:
            self._spawn(self._status_loop, "tessera-status")
        if self.nvml is not None:
            self._xid = XidWatcher([r.gpu.uuid for r in self.registry.snapshot()], self._on_xid, self.log)
            self._xid.start()
        if cfg.health_address:
            self._start_http(cfg.health_address)
        self.ready.set()
        self.log(f"serving {self.servers.dra_path} (registration {self.servers.registration_path}); "
                 f"slices published {self.stats.first_publish:.3f} s after start")

    def stop(self) -> None:
        """Stop serving (sockets removed); prepared claims stay prepared (checkpoint)."""
        self._stop.set()
        self._wake.set()
        self._status_q.put(None)
        if self.servers is not None:
            self.servers.stop()
        if self._xid is not None:
            self._xid.stop()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        for t in self._threads:
            t.join(timeout=5)

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
        denied = [f"{verb} {resource}{'/' + sub if sub else ''}"
                  for (verb, _g, resource, sub), ok in zip(REQUIRED_ACCESS, answers, strict=True) if not ok]
        if denied:
            raise DriverStartError(
                f"the API server denies this identity: {', '.join(denied)} (group resource.k8s.io); "
                "grant the driver's ServiceAccount the ClusterRole in docs/driver.md")

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
                    "(install the NVIDIA driver, or pass --nvml-library PATH)") from smi_err

    # ---- files left by a crash -----------------------------------------------------------
    def _reconcile_files(self) -> None:
        assert self.checkpoint is not None
        known = set(self.checkpoint.uids())
        removed = []
        prefix = f"{self.cfg.driver}-claim_"
        if self.cfg.cdi_dir.is_dir():
            for p in self.cfg.cdi_dir.iterdir():
                if p.name.startswith(".tessera-cdi.") or (p.name.startswith(prefix) and p.name.endswith(".json")
                      and p.name[len(prefix):-5] not in known):
                    p.unlink(missing_ok=True)
                    removed.append(p.name)
        claims = self.cfg.state_dir / "claims"
        if claims.is_dir():
            for d in claims.iterdir():
                if d.name not in known:
                    remove_files(d.name, self.layout)
                    removed.append(f"claims/{d.name}")
                    continue
                for f in d.iterdir():
                    if f.name.startswith("."):
                        f.unlink(missing_ok=True)
        for f in self.cfg.state_dir.glob(".*"):
            if f.is_file() and f.name.split(".")[1] in ("checkpoint", "gpus", "preload"):
                f.unlink(missing_ok=True)
        if removed:
            self.log(f"removed leftovers not in the checkpoint: {', '.join(sorted(removed))}")
        repaired = []
        for uid in known:
            entry = self.checkpoint.get(uid)
            if entry is not None and materialize(ClaimPlan.from_json(entry["plan"]), self.layout):
                repaired.append(uid)
        if repaired:
            self.log(f"rewrote the files of recorded claims: {', '.join(sorted(repaired))}")

    # ---- kubelet calls ------------------------------------------------------------------
    def _lock_for(self, uid: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault(uid, threading.Lock())

    def read_claim(self, ref: ClaimRef) -> dict[str, Any]:
        """GET the ResourceClaim (the kubelet only sends namespace, name, uid)."""
        t0 = time.perf_counter()
        try:
            return self.client.get("resource.k8s.io/v1", "ResourceClaim", ref.name, ref.namespace)
        finally:
            self.stats.api_read.append(time.perf_counter() - t0)

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """NodePrepareResources for a batch of claims; one result per claim UID.

        Per claim: the recorded plan when the checkpoint has one, else a new plan from the
        ResourceClaim; its files are written, then new claims are recorded (one checkpoint
        write for the batch, shared with concurrent batches), then the answer is given.
        """
        assert self.checkpoint is not None
        out: dict[str, PrepareResult] = {}
        fetched: dict[str, dict[str, Any]] = {}
        for ref in claims:
            if self.checkpoint.get(ref.uid) is not None:
                continue  # prepared before: the recorded plan is used
            try:
                fetched[ref.uid] = self.read_claim(ref)
            except ApiError as e:
                out[ref.uid] = PrepareResult(error=f"ResourceClaim {ref.namespace}/{ref.name}: {e.reason or 'error'}: {e.message}")
        todo = [r for r in claims if r.uid not in out]
        locks = [self._lock_for(u) for u in sorted({r.uid for r in todo})]
        for lk in locks:
            lk.acquire()
        try:
            t0 = time.perf_counter()
            devices = self.registry.by_device()
            plans: dict[str, ClaimPlan] = {}
            new: dict[str, dict[str, Any]] = {}
            for ref in todo:
                entry = self.checkpoint.get(ref.uid)
                if entry is not None:
                    plans[ref.uid] = ClaimPlan.from_json(entry["plan"])
                    continue
                if ref.uid not in fetched:  # recorded when we looked, unprepared since
                    try:
                        fetched[ref.uid] = self.read_claim(ref)
                    except ApiError as e:
                        out[ref.uid] = PrepareResult(error=f"ResourceClaim {ref.namespace}/{ref.name}: {e.reason or 'error'}: {e.message}")
                        continue
                try:
                    plan = plan_claim(fetched[ref.uid], ref, self.cfg.node_name, devices,
                                      self.backend.backend, self.layout)
                except ClaimError as e:
                    out[ref.uid] = PrepareResult(error=str(e))
                    continue
                plans[ref.uid] = plan
                new[ref.uid] = {"state": PREPARED, "plan": plan.to_json()}
            for uid, plan in list(plans.items()):
                try:
                    materialize(plan, self.layout)
                except OSError as e:
                    out[uid] = PrepareResult(error=f"ResourceClaim {plan.ref.namespace}/{plan.ref.name}: writing its files: {e}")
                    new.pop(uid, None)
                    plans.pop(uid)
            t1 = time.perf_counter()
            if new:
                try:
                    self.checkpoint.update(put=new)
                except OSError as e:
                    for uid in new:
                        remove_files(uid, self.layout)
                        plans.pop(uid, None)
                        out[uid] = PrepareResult(error=f"ResourceClaim {fetched[uid]['metadata'].get('namespace')}/"
                                                       f"{fetched[uid]['metadata'].get('name')}: checkpoint: {e}")
            for uid, plan in plans.items():
                out[uid] = PrepareResult(devices=plan.devices)
            t2 = time.perf_counter()
            n = max(1, len(todo))
            self.stats.prepare.extend([(t2 - t0) / n] * len(todo))
            self.stats.prepare_work.extend([(t1 - t0) / n] * len(todo))
            self.stats.checkpoint_wait.extend([(t2 - t1) / n] * len(todo))
        finally:
            for lk in locks:
                lk.release()
        for uid in new:
            if uid in plans:
                self._status_q.put(plans[uid])
        return out

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """NodeUnprepareResources: remove each claim's files, then its checkpoint entry."""
        assert self.checkpoint is not None
        out: dict[str, str] = {}
        locks = [self._lock_for(u) for u in sorted({r.uid for r in claims})]
        for lk in locks:
            lk.acquire()
        try:
            gone = []
            for ref in claims:
                try:
                    remove_files(ref.uid, self.layout)
                except OSError as e:
                    out[ref.uid] = f"ResourceClaim {ref.namespace}/{ref.name}: removing its files: {e}"
                    continue
                gone.append(ref.uid)
                out[ref.uid] = ""
            if gone:
                self.checkpoint.update(drop=gone)
        finally:
            for lk in locks:
                lk.release()
        return out

    # ---- background work -----------------------------------------------------------------
    def _on_xid(self, uuid: str, xid: int) -> None:
        if self.registry.record_xid(uuid, xid):
            self.log(f"GPU {uuid}: XID {xid}")
            self._wake.set()

    def rescan(self) -> None:
        """One discovery + health pass, then publish if anything changed."""
        assert self.publisher is not None
        try:
            inv = discover_nvml(self.nvml) if self.nvml is not None else discover_smi(self.cfg.nvidia_smi)
        except DiscoveryError as e:
            self.log(f"rescan: {e}")
            return
        seen = {g.gpu.uuid for g in inv.gpus}
        health = {r.gpu.uuid: (probe(self.nvml, r.gpu.uuid) if self.nvml is not None else "missing")
                  for r in self.registry.snapshot() if r.gpu.uuid not in seen}
        self.registry.update(inv.gpus, health)
        try:
            self.publisher.sync()
        except ApiError as e:
            self.log(f"publishing: {e}")

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
            self.rescan()

    def _status_loop(self) -> None:
        while True:
            plan = self._status_q.get()
            if plan is None or self._stop.is_set():
                return
            if not plan.status:
                continue
            obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                   "metadata": {"name": plan.ref.name, "namespace": plan.ref.namespace, "uid": plan.ref.uid},
                   "status": {"devices": [dict(e, data=e["data"]) for e in plan.status]}}
            try:
                self.client.apply_status(obj, field_manager=f"{self.cfg.driver}-{self.cfg.node_name}")
            except ApiError as e:
                self.stats.status_errors += 1
                self.log(f"ResourceClaim {plan.ref.namespace}/{plan.ref.name}: status.devices not written: {e}")

    # ---- health endpoints -----------------------------------------------------------------
    def health(self) -> tuple[bool, bool, dict[str, Any]]:
        """``(live, ready, details)``: live while the gRPC servers and threads run; ready once
        started, slices published and (when a kubelet is there) registered."""
        alive = all(t.is_alive() for t in self._threads) and self.servers is not None
        ready = self.ready.is_set() and alive and self.publisher is not None and self.publisher.generation is not None
        details = {
            "node": self.cfg.node_name, "backend": self.backend.backend, "backendReason": self.backend.reason,
            "gpus": len(self.registry.records), "generation": self.publisher.generation if self.publisher else None,
            "registered": self.servers.registered.is_set() if self.servers else False,
            "registrationError": self.servers.registration_error if self.servers else "",
            "firstPublishSeconds": self.stats.first_publish,
            "preparedClaims": len(self.checkpoint.uids()) if self.checkpoint else 0,
            "statusErrors": self.stats.status_errors,
        }
        return alive, ready, details

    def _start_http(self, address: str) -> None:
        """``GET /healthz``, ``/livez``, ``/readyz`` over plain HTTP/1.0 (socketserver: the
        http.server module alone costs a node agent half a second of start-up)."""
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
                self.wfile.write(f"HTTP/1.0 {status}\r\nContent-Type: application/json\r\n"
                                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        try:
            self._http = Server((host or "127.0.0.1", int(port)), Handler)
        except OSError as e:
            raise DriverStartError(f"--health-address {address}: {e.strerror}") from e
        self._spawn(self._http.serve_forever, "tessera-health")

    @property
    def health_port(self) -> int | None:
        return self._http.server_address[1] if self._http is not None else None


def wait_forever(driver: NodeDriver) -> None:
    """Serve until SIGTERM/SIGINT."""
    import signal

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(3600):
        pass
    driver.stop()

