"""``tessera device-plugin``: legacy mode's node agent, a kubelet device plugin (``v1beta1``).

What it does, in order (:meth:`DevicePlugin.start`):

1. discovers the node's GPUs with the node driver's NVML discovery
   (:func:`tessera.driver.discovery.discover_nvml`) and their health (:func:`~tessera.driver.discovery.probe`);
2. asks the API server whether this identity may do all it does
   (:data:`tessera.driver.access.DEVICE_PLUGIN_ACCESS`, :meth:`DevicePlugin.check_access`: one
   line naming every denied row, before anything is written);
3. runs the start-up guard in legacy mode (:meth:`DevicePlugin.check_node`: the Node
   labelled ``gpu.tessera.dev/mode=legacy``, no DRA driver publishing its GPUs);
4. writes the node's ``hami.io/node-nvidia-register`` and ``hami.io/node-handshake``
   annotations (:mod:`.register`; merge patch of the Node);
5. removes the files of allocations whose pod is gone (:meth:`DevicePlugin.reconcile`);
6. starts the cache of the node's pods ``Allocate`` chooses from (:class:`.pods.NodePods`: a
   watch of the pods with ``spec.nodeName`` = this node);
7. serves the ``v1beta1.DevicePlugin`` service on ``<device-plugin-dir>/<socket>`` (default
   ``/var/lib/kubelet/device-plugins/tessera-gpu.sock``) and registers resource
   ``nvidia.com/gpu`` with the kubelet's ``v1beta1.Registration`` on
   ``<device-plugin-dir>/kubelet.sock``.

Then three loops: every ``watch_seconds`` (1 s) whether the kubelet restarted (its
``kubelet.sock`` re-created, or this plugin's socket removed: a starting kubelet empties the
directory), and if so the socket is served anew and registered again; every
``rescan_seconds`` the GPUs' health (a change is streamed to ``ListAndWatch`` and written to
the annotation); every ``reconcile_seconds`` the allocations against the pods on the node.

``ListAndWatch`` streams every slot (:func:`.register.slots`) with its health and NUMA node;
``Allocate`` (:mod:`.allocate`) chooses its pod from the pod cache (:mod:`.pods`: no API read
when the cache has it), records its plan, then writes a DRA share's files while it erases the
container's entry on the pod (the one API write it waits for: in a second thread, both done
before the answer) and answers the container's CDI device IDs
(``ContainerAllocateResponse.cdi_devices``: the runtime, containerd with CDI on, applies the
spec the node driver's code wrote); HAMi's node lock is released right after the answer, by a
worker thread, in the order the pods were allocated. ``GetPreferredAllocation`` and
``PreStartContainer`` are not used (options say so).

Each allocation is recorded in ``<state-dir>/deviceplugin/<uid>.json`` (its plan, JSON of
:class:`~tessera.driver.prepare.ClaimPlan`) before its files are written, so a restart knows
whose files they are; the node's per-GPU shares files are rewritten from the recorded plans.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.api.errors import TesseraError
from tessera.convert.hami import BIND_PHASE, DEVICES_TO_ALLOCATE
from tessera.driver.access import DEVICE_PLUGIN_ACCESS
from tessera.driver.backend import LIBRARY
from tessera.driver.discovery import DiscoveryError, discover_nvml, load_nvml, probe
from tessera.driver.guard import MODE_LEGACY, SecondManagerError, check_node
from tessera.driver.kubelet import deviceplugin_stubs
from tessera.driver.prepare import (
    ClaimError,
    ClaimPlan,
    Layout,
    NodeDevice,
    check_library_reads,
    materialize,
    remove_files,
    write_node_shares,
    write_preload,
)
from tessera.driver.publish import GpuRecord
from tessera.enforcement.limits import DEFAULT_CONTEXT_OVERHEAD
from tessera.kube.access import denied_access
from tessera.kube.client import ApiError, KubeClient, Obj

from .allocate import (
    NODE_LOCK,
    PHASE_FAILED,
    PHASE_SUCCESS,
    AllocateError,
    Pending,
    choose_pod,
    claim_meta,
    claim_meta_path,
    lock_holder,
    next_entry,
    node_devices,
    plan_allocation,
    pod_of_uid,
)
from .pods import DEFAULT_WAIT_SECONDS, NodePods
from .register import (
    DEFAULT_SPLIT,
    HANDSHAKE_ANNOTATION,
    REGISTER_ANNOTATION,
    RESOURCE,
    register_value,
    slots,
)

#: The device plugin API version registered (``k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1``).
API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_SOCKET = "tessera-gpu.sock"
#: Subdirectory of the state dir with one record per allocation.
RECORDS_SUBDIR = "deviceplugin"
#: Tries of an ``Allocate`` whose pod changed between read and patch (HTTP 409).
CONFLICT_TRIES = 3
#: Seconds the start waits for the pod cache's first list (until then ``Allocate`` lists).
CACHE_SYNC_SECONDS = 30.0


class DevicePluginError(TesseraError, RuntimeError):
    """The device plugin cannot start (no GPUs, no stubs); the message says why."""


@dataclass
class DevicePluginConfig:
    """``tessera device-plugin``'s settings: ``node_name``; ``device_plugin_dir`` (the kubelet's
    ``device-plugins`` directory); ``socket`` (this plugin's socket name there); the claim
    files' ``state_dir``, ``cdi_dir``, ``dev_root``, ``library`` and ``context_overhead``
    (bytes), as ``tessera driver`` takes them; ``nvml_library``; ``split`` (slots per GPU);
    ``driver`` (the CDI vendor: the DRA driver's name, so a share's CDI kind is the same in
    both modes); loop periods in seconds; ``pod_wait_seconds``: how long ``Allocate`` waits for
    the pod cache to show a pod bound a moment ago before it lists the node's pods
    (:mod:`.pods`)."""

    node_name: str
    device_plugin_dir: Path
    state_dir: Path
    cdi_dir: Path
    dev_root: Path
    library: Path | None
    driver: str
    socket: str = DEFAULT_SOCKET
    nvml_library: str | None = None
    split: int = DEFAULT_SPLIT
    context_overhead: int = DEFAULT_CONTEXT_OVERHEAD
    rescan_seconds: float = 10.0
    reconcile_seconds: float = 30.0
    watch_seconds: float = 1.0
    pod_wait_seconds: float = DEFAULT_WAIT_SECONDS
    layout: Layout = field(init=False)

    def __post_init__(self) -> None:
        self.layout = Layout(
            state_dir=self.state_dir,
            cdi_dir=self.cdi_dir,
            dev_root=self.dev_root,
            library=self.library,
            driver=self.driver,
            context_overhead=self.context_overhead,
        )


def _sock_id(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


class DevicePlugin:
    """The node agent (module doc). ``client``: the API server; ``log``: one line per call."""

    def __init__(
        self, cfg: DevicePluginConfig, client: KubeClient, log: Callable[[str], None] = print
    ) -> None:
        self.cfg = cfg
        self.client = client
        self.log = log
        self.pb2, self.pb2_grpc = deviceplugin_stubs()
        self.records: list[GpuRecord] = []
        self.health: dict[str, bool] = {}
        self.plans: dict[str, ClaimPlan] = {}
        #: The cache of the node's pods (:mod:`.pods`), from :meth:`start`; None: list them.
        self.pods: NodePods | None = None
        self._devices: tuple[list[GpuRecord], dict[str, NodeDevice]] | None = None
        #: Releases HAMi's node lock after ``Allocate`` answered, one at a time, in order.
        self._releases = ThreadPoolExecutor(1, thread_name_prefix="deviceplugin-lock")
        #: Sends ``Allocate``'s pod patch while the files are written.
        self._writes = ThreadPoolExecutor(1, thread_name_prefix="deviceplugin-patch")
        self.nvml: Any = None
        self._lock = threading.Lock()  # Allocate, reconcile, plans, shares files
        self._changed = threading.Condition()
        self._version = 0
        self._stop = threading.Event()
        self._server: Any = None
        self._kubelet_id: tuple[int, int] | None = None
        self._threads: list[threading.Thread] = []
        self.registered = 0

    # ---- paths -----------------------------------------------------------------------------
    @property
    def socket_path(self) -> Path:
        return self.cfg.device_plugin_dir / self.cfg.socket

    @property
    def kubelet_socket(self) -> Path:
        return self.cfg.device_plugin_dir / KUBELET_SOCKET

    @property
    def records_dir(self) -> Path:
        return self.cfg.state_dir / RECORDS_SUBDIR

    # ---- start / stop ----------------------------------------------------------------------
    def discover(self) -> None:
        """Read the GPUs and their health from NVML. Raises :class:`DevicePluginError`."""
        try:
            if self.nvml is None:
                self.nvml = load_nvml(self.cfg.nvml_library)
            inv = discover_nvml(self.nvml)
        except DiscoveryError as e:
            raise DevicePluginError(
                f"no GPU inventory from NVML: {e} (install the NVIDIA driver, or pass "
                "--nvml-library PATH)"
            ) from e
        if not inv.gpus:
            raise DevicePluginError(f"node {self.cfg.node_name}: NVML lists no GPU")
        self.records = [GpuRecord(gpu=ng.gpu, minor=ng.minor) for ng in inv.gpus]
        self.health = self._probe()

    def check_access(self) -> None:
        """Every row of :data:`tessera.driver.access.DEVICE_PLUGIN_ACCESS` asked at once
        (:func:`tessera.kube.access.denied_access`, as the node driver asks its table). Raises
        :class:`DevicePluginError` naming every denied row."""
        try:
            denied = denied_access(self.client, DEVICE_PLUGIN_ACCESS)
        except ApiError as e:
            raise DevicePluginError(f"API server {self.client.server}: {e}") from e
        if denied:
            raise DevicePluginError(
                "the API server denies this identity: "
                f"{', '.join(a.describe() for a in denied)}; grant the device plugin's "
                "ServiceAccount the ClusterRole in docs/install.md ('Identities')"
            )

    def check_node(self) -> None:
        """The start-up guard of Tessera's legacy mode (:func:`tessera.driver.guard.check_node`
        with ``mode="legacy"``): the Node must be labelled ``gpu.tessera.dev/mode=legacy``, and
        no DRA driver (Tessera's included) may publish its GPUs, nor another NVIDIA device
        plugin serve beside this one. Raises :class:`DevicePluginError` (one line)."""
        uuids = [r.gpu.uuid for r in self.records]
        try:
            check_node(
                self.client,
                self.cfg.node_name,
                uuids,
                device_plugin_dir=self.cfg.device_plugin_dir,
                driver=self.cfg.driver,
                log=self.log,
                mode=MODE_LEGACY,
                own_socket=self.cfg.socket,
            )
        except SecondManagerError as e:
            raise DevicePluginError(str(e)) from e

    def _probe(self) -> dict[str, bool]:
        """Each GPU's NVML health now (``probe``: ok, lost, missing), kept on its record (prepare
        refuses a missing GPU); ``{UUID: healthy}``."""
        for r in self.records:
            r.health = probe(self.nvml, r.gpu.uuid)
        return {r.gpu.uuid: r.health == "ok" for r in self.records}

    def start(self) -> None:
        """Discover, annotate, reconcile, serve and register (module doc), then run the loops.
        Raises :class:`DevicePluginError`, or ``ApiError`` when the Node cannot be annotated."""
        self.discover()
        self.check_access()
        self.check_node()
        write_preload(self.cfg.layout)
        self._load_records()
        self.write_annotation()
        self.reconcile()
        self.pods = NodePods(
            self.client, self.cfg.node_name, wait_seconds=self.cfg.pod_wait_seconds
        )
        if not self.pods.start(CACHE_SYNC_SECONDS):
            self.log(
                f"warning: no list of the pods on node {self.cfg.node_name} after "
                f"{CACHE_SYNC_SECONDS:g} s: Allocate lists them until the cache has them"
            )
        self._serve()
        for name, period, step in (
            ("watch", self.cfg.watch_seconds, self._watch_kubelet),
            ("rescan", self.cfg.rescan_seconds, self.rescan),
            ("reconcile", self.cfg.reconcile_seconds, self.reconcile),
        ):
            t = threading.Thread(
                target=self._loop,
                args=(name, period, step),
                name=f"deviceplugin-{name}",
                daemon=True,
            )
            t.start()
            self._threads.append(t)
        self.log(
            f"serving {RESOURCE} ({len(self.records)} GPU(s) x {self.cfg.split} slots) on "
            f"{self.socket_path}"
        )

    def stop(self) -> None:
        """Stop the loops and the server and remove this plugin's socket."""
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        for t in self._threads:
            t.join(timeout=5)
        if self._server is not None:
            self._server.stop(grace=2).wait()
        self._releases.shutdown(wait=True)
        self._writes.shutdown(wait=True)
        if self.pods is not None:
            self.pods.stop()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def _loop(self, name: str, period: float, step: Callable[[], object]) -> None:
        while not self._stop.wait(period):
            try:
                step()
            except (ApiError, OSError, TesseraError) as e:
                self.log(f"warning: {name}: {e}")

    # ---- kubelet: serve and register -------------------------------------------------------
    def _serve(self) -> None:
        import grpc

        if self._server is not None:
            self._server.stop(grace=1).wait()
        self.cfg.device_plugin_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.pb2_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server
        self._kubelet_id = None  # registered by the next watch step
        self._watch_kubelet()

    def _register(self) -> None:
        import grpc

        pb2 = self.pb2
        with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as ch:
            self.pb2_grpc.RegistrationStub(ch).Register(
                pb2.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.cfg.socket,
                    resource_name=RESOURCE,
                    options=pb2.DevicePluginOptions(
                        pre_start_required=False, get_preferred_allocation_available=False
                    ),
                ),
                timeout=10,
            )
        self.registered += 1

    def _watch_kubelet(self) -> None:
        """Serve again when this plugin's socket is gone, register when the kubelet's socket
        is new (a kubelet (re)start)."""
        import grpc

        if not self.socket_path.exists() and self._server is not None:
            self.log(f"{self.socket_path} was removed (the kubelet restarted): serving it again")
            self._serve()
            return
        now = _sock_id(self.kubelet_socket)
        if now is None or now == self._kubelet_id:
            return
        try:
            self._register()
        except grpc.RpcError as e:
            self.log(
                f"warning: registering with the kubelet on {self.kubelet_socket}: {e.details()}"
            )
            return
        self._kubelet_id = now
        self.log(f"registered {RESOURCE} with the kubelet ({self.kubelet_socket})")

    # ---- health and the annotation ---------------------------------------------------------
    def rescan(self) -> bool:
        """Probe each GPU; on a change, stream it and write the annotation. True on a change."""
        with self._lock:  # Allocate reads the records' health
            now = self._probe()
        if now == self.health:
            return False
        self.health = now
        self.log(f"GPU health changed: {now}")
        with self._changed:
            self._version += 1
            self._changed.notify_all()
        self.write_annotation()
        return True

    def write_annotation(self) -> None:
        """Merge-patch the Node's register and handshake annotations. Raises ``ApiError``."""
        value = register_value([r.gpu for r in self.records], self.health, self.cfg.split)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        self.client.request(
            "PATCH",
            f"/api/v1/nodes/{self.cfg.node_name}",
            body={
                "metadata": {
                    "annotations": {
                        REGISTER_ANNOTATION: value,
                        HANDSHAKE_ANNOTATION: f"Reported {stamp}",
                    }
                }
            },
            content_type="application/merge-patch+json",
            what=f"Node {self.cfg.node_name}",
        )

    def list_and_watch(self, active: Callable[[], bool] = lambda: True) -> Iterator[Any]:
        """``ListAndWatch``'s stream: the slots now, then again after each health change, until
        the plugin stops or ``active()`` is false (checked each second: a kubelet that went away
        does not keep a server thread)."""
        pb2 = self.pb2
        seen = -1
        while not self._stop.is_set() and active():
            with self._changed:
                if seen == self._version:
                    self._changed.wait(timeout=1.0)
                    continue
                seen = self._version
            yield pb2.ListAndWatchResponse(
                devices=[
                    pb2.Device(
                        ID=s.id,
                        health="Healthy" if s.healthy else "Unhealthy",
                        **(
                            {"topology": pb2.TopologyInfo(nodes=[pb2.NUMANode(ID=s.numa)])}
                            if s.numa is not None
                            else {}
                        ),
                    )
                    for s in slots([r.gpu for r in self.records], self.health, self.cfg.split)
                ]
            )

    # ---- Allocate --------------------------------------------------------------------------
    def allocate(self, requested: Sequence[int]) -> list[list[str]]:
        """Allocate one container per entry of ``requested`` (the device IDs the kubelet asks
        for, per container): the CDI device IDs each gets. Raises :class:`AllocateError`."""
        with self._lock:
            return [self._allocate_one(n) for n in requested]

    def _pods(self, phase: str | None = None) -> list[dict[str, Any]]:
        """The pods on this node (in ``phase`` only, when given: the API server filters)."""
        selector = f"spec.nodeName={self.cfg.node_name}"
        if phase:
            selector += f",status.phase={phase}"
        return self.client.list("v1", "Pod", None, field_selector=selector)

    def devices(self) -> dict[str, NodeDevice]:
        """The node's GPUs as prepare resolves them (:func:`.allocate.node_devices`), made once
        per discovery: they hold the records, whose health :meth:`rescan` updates in place."""
        if self._devices is None or self._devices[0] is not self.records:
            found = node_devices(self.cfg.node_name, self.cfg.driver, self.records)
            self._devices = (self.records, found)
        return self._devices[1]

    def _choose(self, fresh: bool) -> tuple[list[Obj], Mapping[str, Any], bool]:
        """The node's pods, the pod this ``Allocate`` serves (:func:`.allocate.choose_pod`) and
        whether they were listed from the API server: from the pod cache unless ``fresh``; when
        the cache has no candidate, after waiting up to ``pod_wait_seconds`` for it to show one,
        listed (:mod:`.pods`). Raises :class:`AllocateError`."""
        node = self.cfg.node_name
        if not fresh and self.pods is not None:
            deadline = time.monotonic() + self.pods.wait_seconds
            while (seen := self.pods.cached()) is not None:
                pods, generation = seen
                try:
                    return pods, choose_pod(pods, node), False
                except AllocateError:
                    if not self.pods.wait(generation, deadline):
                        break
        try:
            pods = self._pods()
        except ApiError as e:
            raise AllocateError(f"node {node}: listing its pods: {e}") from e
        return pods, choose_pod(pods, node), True

    def _allocate_one(self, requested: int) -> list[str]:
        node = self.cfg.node_name
        fresh = False
        for attempt in range(CONFLICT_TRIES):
            pods, pod, fresh = self._choose(fresh)
            # Shares of pods gone since the last reconcile would still count on their GPUs.
            self._drop_gone(pods)
            pending: Pending | None = None
            uid = ""
            try:
                pending = next_entry(pod, requested)
                if not fresh and pending.uid in self.plans:
                    # This plugin allocated the entry already and the cache has not seen the
                    # write (a reply without a version to keep): read the pods afresh.
                    fresh = True
                    continue
                uid = pending.uid
                devices = self.devices()
                plan = plan_allocation(pending, node, devices, LIBRARY, self.cfg.layout)
                try:
                    check_library_reads(plan, self.cfg.layout)
                except ClaimError as e:
                    raise AllocateError(f"pod {pending.name}: {e}") from None
                # The pod's patch travels while the record and the files are written; both
                # end before the answer (a failure of either is the Allocate's, after the
                # patch has ended, so that the failure's own patch comes after it).
                patched = self._writes.submit(self._patch, pending)
                try:
                    self._record(plan)  # durable first: a restart knows whose files they are
                    materialize(plan, self.cfg.layout)
                    self._write_meta(pending, plan, devices)
                    write_node_shares(self.cfg.layout, self.plans.values())
                except BaseException:
                    futures.wait([patched])
                    raise
                patched.result()
            except ApiError as e:
                if uid:
                    self._forget(uid)
                if e.status == 409 and attempt + 1 < CONFLICT_TRIES:
                    fresh = True
                    continue  # the pod changed since it was read: read it again
                self._fail(pod)
                raise AllocateError(
                    f"pod {_name(pod)}: recording the allocation on the pod: {e}"
                ) from e
            except (AllocateError, OSError, ValueError) as e:
                if uid:
                    self._forget(uid)
                self._fail(pod)
                if isinstance(e, AllocateError):
                    raise
                raise AllocateError(f"pod {_name(pod)}: writing its files: {e}") from e
            assert pending is not None
            if pending.done:
                self._releases.submit(self._release_lock, pod)
            self.log(
                f"allocated pod {pending.name} container {pending.container or pending.index}: "
                f"{', '.join(f'{d.uuid} {d.memory_mib}MiB {d.cores}%' for d in pending.devices)}"
            )
            return [i for d in plan.devices for i in d.cdi_device_ids]
        raise AllocateError(f"node {node}: no pod to allocate after {CONFLICT_TRIES} reads")

    def _patch(self, pending: Pending) -> None:
        meta = pending.pod.get("metadata") or {}
        annotations: dict[str, str] = {DEVICES_TO_ALLOCATE: pending.remaining}
        if pending.done:
            annotations[BIND_PHASE] = PHASE_SUCCESS
        stored = self.client.request(
            "PATCH",
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
            body={
                "metadata": {"resourceVersion": meta["resourceVersion"], "annotations": annotations}
            },
            content_type="application/merge-patch+json",
            what=f"Pod {pending.name}",
            kept=True,  # the kubelet waits on it: no TLS handshake (sent once all the same)
        )
        self._wrote(stored)

    def _wrote(self, stored: Any) -> None:
        """Hand the reply of a write to a pod to the pod cache (:meth:`.pods.NodePods.wrote`)."""
        if self.pods is not None and isinstance(stored, dict):
            self.pods.wrote(stored)

    def _fail(self, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        try:
            stored = self.client.request(
                "PATCH",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                body={"metadata": {"annotations": {BIND_PHASE: PHASE_FAILED}}},
                content_type="application/merge-patch+json",
                what=f"Pod {_name(pod)}",
            )
            self._wrote(stored)
        except ApiError as e:
            self.log(f"warning: pod {_name(pod)}: setting {BIND_PHASE}={PHASE_FAILED}: {e}")
        self._release_lock(pod)

    def _release_lock(self, pod: Mapping[str, Any]) -> None:
        """Remove HAMi's node lock when it names ``pod`` (resourceVersion precondition: a lock
        taken anew meanwhile stays)."""
        meta = pod.get("metadata") or {}
        try:
            node = self.client.get("v1", "Node", self.cfg.node_name)
            nmeta = node.get("metadata") or {}
            value = (nmeta.get("annotations") or {}).get(NODE_LOCK)
            if lock_holder(value) != (meta.get("namespace"), meta.get("name")):
                return
            self.client.request(
                "PATCH",
                f"/api/v1/nodes/{self.cfg.node_name}",
                body={
                    "metadata": {
                        "resourceVersion": nmeta["resourceVersion"],
                        "annotations": {NODE_LOCK: None},
                    }
                },
                content_type="application/merge-patch+json",
                what=f"Node {self.cfg.node_name}",
            )
        except ApiError as e:
            self.log(f"warning: releasing {NODE_LOCK} of pod {_name(pod)}: {e}")

    # ---- records and clean-up ----------------------------------------------------------------
    def _record(self, plan: ClaimPlan) -> None:
        from tessera.enforcement._files import write_atomic

        self.records_dir.mkdir(parents=True, exist_ok=True)
        data = json.dumps(plan.to_json(), sort_keys=True).encode()
        write_atomic(str(self.records_dir / f"{plan.ref.uid}.json"), data, 0o600, ".record.")
        self.plans[plan.ref.uid] = plan

    def _write_meta(
        self, pending: Pending, plan: ClaimPlan, devices: Mapping[str, NodeDevice]
    ) -> None:
        from tessera.enforcement._files import write_atomic

        doc = claim_meta(pending, plan, self.cfg.node_name, devices, self.cfg.layout)
        if doc is not None:
            data = json.dumps(doc, sort_keys=True).encode()
            write_atomic(claim_meta_path(plan, self.cfg.layout), data, 0o444, ".meta.")

    def _forget(self, uid: str) -> None:
        """Remove what a failed allocation left (its files, its record, its share). Called
        while its failure is being reported: a removal that fails too (a read-only or vanished
        directory) is logged, not raised, so that the pod is still marked failed and the node
        lock released; the next start's reconciliation removes what stayed."""
        try:
            remove_files(uid, self.cfg.layout)
            with contextlib.suppress(FileNotFoundError):
                (self.records_dir / f"{uid}.json").unlink()
        except OSError as e:
            self.log(f"warning: allocation {uid}: removing what its failed Allocate left: {e}")
        if self.plans.pop(uid, None) is not None:
            try:
                write_node_shares(self.cfg.layout, self.plans.values())
            except (OSError, ValueError) as e:
                self.log(
                    f"warning: writing the GPU shares files in {self.cfg.layout.shares_dir}: {e}"
                )

    def _load_records(self) -> None:
        if not self.records_dir.is_dir():
            return
        for p in sorted(self.records_dir.glob("*.json")):
            try:
                plan = ClaimPlan.from_json(json.loads(p.read_text()))
            except (OSError, ValueError, KeyError, TypeError) as e:
                self.log(f"warning: {p}: unreadable allocation record ({e}); its files are removed")
                uid = p.name.removesuffix(".json")
                remove_files(uid, self.cfg.layout)
                p.unlink(missing_ok=True)
                continue
            self.plans[plan.ref.uid] = plan

    def reconcile(self) -> list[str]:
        """Remove the files and records of allocations whose pod is gone from the node or
        finished (``Succeeded``/``Failed``); return their UIDs. The pods are the pod cache's
        (:mod:`.pods`: every pod this plugin allocated is in it or in its own writes, until a
        later change removes it), listed when the cache cannot answer. Raises ``ApiError``."""
        with self._lock:  # an Allocate after the read would record a pod the read lacks
            seen = self.pods.cached() if self.pods is not None else None
            return self._drop_gone(seen[0] if seen is not None else self._pods())

    def _drop_gone(self, pods: Sequence[Mapping[str, Any]]) -> list[str]:
        """Forget the allocations whose pod is not among ``pods`` (the node's, listed under
        ``_lock``) or finished; their UIDs."""
        live = {str(p["metadata"]["uid"]) for p in pods if _phase(p) not in ("Succeeded", "Failed")}
        gone = [uid for uid in self.plans if pod_of_uid(uid) not in live]
        for uid in gone:
            plan = self.plans[uid]
            self._forget(uid)
            self.log(f"removed the files of pod {plan.ref.namespace}/{plan.ref.name} ({uid})")
        return gone


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def _name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class _Servicer:
    """``v1beta1.DevicePlugin`` over :class:`DevicePlugin`."""

    def __init__(self, plugin: DevicePlugin) -> None:
        self.p = plugin
        self.pb2 = plugin.pb2

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return self.pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=False
        )

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        yield from self.p.list_and_watch(context.is_active)

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        return self.pb2.PreferredAllocationResponse()

    def Allocate(self, request: Any, context: Any) -> Any:
        import grpc

        try:
            ids = self.p.allocate([len(c.devices_ids) for c in request.container_requests])
        except AllocateError as e:
            self.p.log(f"Allocate: {e}")
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return self.pb2.AllocateResponse(
            container_responses=[
                self.pb2.ContainerAllocateResponse(
                    cdi_devices=[self.pb2.CDIDevice(name=i) for i in c]
                )
                for c in ids
            ]
        )

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        return self.pb2.PreStartContainerResponse()


__all__ = ["DevicePlugin", "DevicePluginConfig", "DevicePluginError"]
