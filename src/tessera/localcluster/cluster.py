"""A real Kubernetes control plane on loopback, for tests and local use.

``up`` starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler (built from
Go modules by ``tools/kube/build.sh``) as background processes, each in its own process
group, with locally generated TLS (see :mod:`tessera.localcluster.pki`) and the DRA feature gates
Tessera relies on. It then registers simulated GPU nodes: a ``Node`` (Ready, with
cpu/memory/pods capacity) for every distinct ``spec.nodeName`` of the given ResourceSlices,
the slices themselves, and the DeviceClass ``gpu.tessera.dev``. Without a kubelet, pods
are scheduled (``spec.nodeName`` set, claims allocated) but never run.

``up(kubelet=True)`` (``tessera cluster up --kubelet``) also starts a real node on this
machine: containerd 2.x and a kubelet v1.37 that registers the machine (by its hostname) as
a Ready, untainted Node whose pods really run. One per machine; ``down`` restores what the
kubelet changed on the host. See :mod:`tessera.localcluster.node`.

State directory layout (default ``~/.cache/tessera/cluster``)::

    kubeconfig            admin kubeconfig (embedded certificates) - export KUBECONFIG=...
    state.json            ports, pids, binaries, URLs of the running cluster
    pki/                  CA, certificates, keys, service-account key pair
    kubeconfigs/          per-component kubeconfigs (scheduler, controller-manager)
    etcd/                 etcd data
    logs/<component>.log  component output
    run/<component>.pid   process (and process-group) ids
    (with a kubelet, see tessera.localcluster.node.NodePaths)
    kubelet/              the kubelet's --root-dir (plugins/<driver>, plugins_registry/)
    cdi/                  CDI spec dir (containerd's cdi_spec_dirs): a DRA driver writes here
    containerd/           containerd's config, root, state, sockets and runc root
    cni/                  the CNI network config and IPAM state
    pod-logs/  images/    pod logs; OCI archives of the images imported into containerd

Every ``up`` starts a fresh cluster: the state directory's previous contents are replaced.
Linux only (process checks read ``/proc``).
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import datetime as _dt
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tessera.api.deviceclass import device_class
from tessera.api.errors import TesseraError
from tessera.kube.client import ApiError, KubeClient, describe
from tessera.localcluster import build, images, nodenet
from tessera.localcluster import node as realnode
from tessera.localcluster.pki import (
    FRONT_PROXY_CLIENT,
    KUBE_PROXY_USER,
    SERVICE_CIDR,
    Pki,
    issue_node_certs,
    make_pki,
)

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
#: Started after the control plane by ``up(kubelet=True)``, stopped before it.
NODE_COMPONENTS = ("containerd", "kubelet", "kube-proxy")

#: DRA feature gates passed to every component. All exist in Kubernetes 1.37 and are not
#: locked there. Gates Tessera needs that 1.37 locks to true (passing them only earns a
#: deprecation warning) are left out: DRAAdminAccess, DRAPrioritizedList,
#: DRAResourceClaimDeviceStatus, DRAExtendedResource and DynamicResourceAllocation.
FEATURE_GATES: Mapping[str, bool] = {
    "DRAConsumableCapacity": True,
    "DRAPartitionableDevices": True,
    "DRADeviceTaints": True,
    "DRADeviceTaintRules": True,
    "DRADeviceBindingConditions": True,
}
RUNTIME_CONFIG = "resource.k8s.io/v1=true"
#: ``up(resource_api=False)``: the API server serves no ``resource.k8s.io`` (as a cluster
#: without DRA). Kubernetes 1.37 locks the ``DynamicResourceAllocation`` gate on, so its
#: users of that API stay: the Node authorizer's graph watches ResourceSlices from the API
#: server's own informers, which never sync against a group not served, and ``/readyz``
#: then fails ``informer-sync`` forever (seen with ``--authorization-mode=Node,RBAC``). So
#: that cluster authorizes with RBAC alone (kubelets through the ``system:node``
#: ClusterRole, :data:`NODE_RBAC_BINDING`), and its kube-scheduler runs with
#: :data:`NO_RESOURCE_API_SCHEDULER_FLAGS`.
NO_RESOURCE_API_RUNTIME_CONFIG = "resource.k8s.io/v1=false"
NO_RESOURCE_API_AUTHORIZATION = "RBAC"
#: kube-scheduler builds its DRA manager (informers of ResourceClaims, ResourceSlices,
#: DeviceClasses) whenever ``DynamicResourceAllocation`` is on, whatever the profile's
#: plugins, and schedules nothing before every informer synced. 1.37 locks the gate on; at
#: the emulated version 1.34 (the oldest a 1.37 binary emulates) it is GA but may be turned
#: off, as on a 1.34 cluster run without DRA. The chart's legacy scheduler needs the same
#: flags on such a cluster (``legacy.scheduler.extraArgs``).
NO_RESOURCE_API_SCHEDULER_FLAGS = (
    "--emulated-version=1.34",
    # with the beta DRA gates that depend on it (on by default at 1.34)
    "--feature-gates=DynamicResourceAllocation=false,DRAAdminAccess=false,"
    "DRAPrioritizedList=false,DRASchedulerFilterTimeout=false",
)
NODE_RBAC_BINDING: Mapping[str, Any] = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRoleBinding",
    "metadata": {"name": "tessera-cluster:nodes"},
    "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "system:node",
    },
    "subjects": [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}
    ],
}
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

#: The DeviceClass every Tessera claim names (one definition: tessera.api.deviceclass).
DEVICE_CLASS: Mapping[str, Any] = device_class()

#: Capacity and allocatable of each simulated node (enough for any test's pods).
DEFAULT_NODE_CAPACITY: Mapping[str, str] = {"cpu": "128", "memory": "1Ti", "pods": "250"}
SIMULATED_LABEL = "tessera.dev/simulated-node"
FIELD_MANAGER = "tessera-cluster"


def default_state_dir() -> Path:
    """``$XDG_CACHE_HOME/tessera/cluster`` (``~/.cache/tessera/cluster``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tessera" / "cluster"


class ClusterError(RuntimeError):
    """The control plane could not be started, stopped or reached. Exit status 1 in the CLI."""


class _PortTaken(ClusterError):
    """A control-plane component found its (just picked) port taken; ``up`` retries."""


class ClusterInputError(TesseraError, ValueError):
    """A ``--slices``/``--cluster`` input is invalid. Names file, document and field; exit 2."""


# ---- node and slice inputs ------------------------------------------------------------


@dataclass
class NodeSpec:
    """A simulated node: ``name`` (Node name) and extra ``labels``."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)


@dataclass
class Inventory:
    """What ``up`` registers: nodes (in order) and ResourceSlice dicts (resource.k8s.io/v1)."""

    nodes: list[NodeSpec] = field(default_factory=list)
    slices: list[dict[str, Any]] = field(default_factory=list)

    def add_node(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] = (),
    ) -> None:
        for n in self.nodes:
            if n.name == name:
                n.labels.update(labels or {})
                n.taints.extend(dict(t) for t in taints)
                return
        self.nodes.append(NodeSpec(name, dict(labels or {}), [dict(t) for t in taints]))

    def add_slice(self, obj: Mapping[str, Any], where: str) -> None:
        """Validate the shape ``up`` relies on and record the slice (and its node)."""
        s = _check_slice(obj, where)
        self.slices.append(s)
        node_name = s["spec"].get("nodeName")
        if node_name:
            self.add_node(node_name)


def _check_slice(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ClusterInputError(
            f"{where}: expected a ResourceSlice mapping, got {type(obj).__name__}"
        )
    if obj.get("apiVersion") != "resource.k8s.io/v1" or obj.get("kind") != "ResourceSlice":
        raise ClusterInputError(
            f"{where}: apiVersion/kind is {obj.get('apiVersion')!r}/{obj.get('kind')!r}; "
            "slices inputs hold resource.k8s.io/v1 ResourceSlice objects (convert older "
            "versions with `kubectl convert` or rewrite them in the v1 shape)"
        )
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise ClusterInputError(f"{where}: {describe(obj)}: spec is missing")
    if not spec.get("driver"):
        raise ClusterInputError(f"{where}: {describe(obj)}: spec.driver is missing")
    pool = spec.get("pool")
    if not isinstance(pool, dict) or not pool.get("name"):
        raise ClusterInputError(f"{where}: {describe(obj)}: spec.pool.name is missing")
    node_name = spec.get("nodeName")
    if node_name is not None and not isinstance(node_name, str):
        raise ClusterInputError(f"{where}: {describe(obj)}: spec.nodeName must be a string")
    out = json.loads(json.dumps(obj))  # deep copy, JSON types only
    meta = out.setdefault("metadata", {})
    for server_field in (
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "managedFields",
        "generation",
    ):
        meta.pop(server_field, None)
    out.pop("status", None)
    return out


def load_slice_files(paths: Iterable[Path], inventory: Inventory | None = None) -> Inventory:
    """Read ResourceSlices from YAML files into an :class:`Inventory`.

    Each file may hold several YAML documents; a document is a ResourceSlice, a ``List``
    (or ``ResourceSliceList``) with ``items``, or a YAML sequence of slices. Nodes are the
    distinct ``spec.nodeName`` values in order of appearance. Raises
    :class:`ClusterInputError` naming file, document and field.
    """
    inv = inventory if inventory is not None else Inventory()
    from tessera.api.documents import documents
    from tessera.api.loader import read_text

    for path in paths:
        try:
            docs = list(documents(read_text(path), str(path)))
        except TesseraError as e:
            raise ClusterInputError(f"--slices {e}") from e
        for i, doc in enumerate(docs, start=1):
            where = f"{path}: document {i}"
            if doc is None:
                continue
            if isinstance(doc, list):
                items: list[Any] = doc
            elif isinstance(doc, dict) and doc.get("kind") in ("List", "ResourceSliceList"):
                items = doc.get("items") or []
            else:
                items = [doc]
            for j, item in enumerate(items):
                inv.add_slice(
                    item, where if len(items) == 1 and items[0] is doc else f"{where}, item {j}"
                )
    return inv


def node_object(
    spec: NodeSpec, capacity: Mapping[str, str] = DEFAULT_NODE_CAPACITY
) -> dict[str, Any]:
    """The ``v1`` Node registered for a simulated node: Ready, no taints, given capacity."""
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        SIMULATED_LABEL: "true",
        **spec.labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels},
        "spec": {"taints": [dict(t) for t in spec.taints]} if spec.taints else {},
        "status": {
            "capacity": dict(capacity),
            "allocatable": dict(capacity),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "TesseraSimulatedNode",
                    "message": "simulated node registered by `tessera cluster up`; no kubelet runs here",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "osImage": "tessera simulated node",
                "kernelVersion": "",
                "containerRuntimeVersion": "",
                "kubeletVersion": "",
                "kubeProxyVersion": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        },
    }


def _slice_name(s: Mapping[str, Any], index: int) -> str:
    spec = s["spec"]
    base = spec.get("nodeName") or spec["pool"]["name"].replace("/", "-")
    return f"{base}-{spec['driver']}-{index}".lower()[:253]


def register_inventory(
    client: KubeClient,
    inv: Inventory,
    capacity: Mapping[str, str] = DEFAULT_NODE_CAPACITY,
    *,
    device_classes: bool = True,
) -> None:
    """Register ``inv`` on a running API server: the DeviceClass ``gpu.tessera.dev`` (unless
    ``device_classes`` is False: a Helm release of the chart creates it and refuses an
    object it does not own), a Ready, untainted Node per node, and every ResourceSlice
    (server-side apply; slices without a name get ``<node>-<driver>-<index>``).

    Raises :class:`ClusterError` naming the object when the API server rejects it (its
    message names the field), e.g. a requestPolicy on a device without
    allowMultipleAllocations.
    """
    if device_classes:
        client.apply(DEVICE_CLASS, field_manager=FIELD_MANAGER)
    for spec in inv.nodes:
        node = node_object(spec, capacity)
        try:
            created = client.create(node)
        except ApiError as e:
            raise ClusterError(f"registering simulated node: {e}") from e
        # The TaintNodesByCondition admission plugin adds node.kubernetes.io/not-ready on
        # create; the (disabled) node lifecycle controller would remove it once the node is
        # Ready. Do it here, keeping the taints the cluster description gives.
        if created.get("spec", {}).get("taints") != (spec.taints or None):
            client.request(
                "PATCH",
                f"/api/v1/nodes/{spec.name}",
                body={"spec": {"taints": [dict(t) for t in spec.taints] or None}},
                content_type="application/merge-patch+json",
                what=f"Node {spec.name}",
            )
    for i, s in enumerate(inv.slices):
        obj = json.loads(json.dumps(s))
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            meta["name"] = _slice_name(obj, i)
        try:
            client.apply(obj, field_manager=FIELD_MANAGER)
        except ApiError as e:
            raise ClusterError(f"the API server rejected {describe(obj)}: {e.message}") from e


# ---- process handling -----------------------------------------------------------------

_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _reap(pid: int) -> None:
    proc = _CHILDREN.get(pid)
    if proc is not None:
        if proc.poll() is not None:
            _CHILDREN.pop(pid, None)
        return
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def pid_alive(pid: int, binary: str | None = None) -> bool:
    """True if ``pid`` runs (not a zombie) and, when given, its argv[0] is ``binary``."""
    _reap(pid)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    if binary is not None:
        argv = _cmdline(pid)
        return bool(argv) and argv[0] == binary
    return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Members may all be zombies waiting to be reaped by us.
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
        if int(fields[2]) == pgid:
            _reap(int(entry.name))
    return False


def _stop_group(pid: int, binary: str | None, grace: float = 10.0) -> bool:
    """SIGTERM the process group led by ``pid``, SIGKILL after ``grace`` seconds.

    Returns True if something was running. Only signals the group when ``pid`` still runs
    ``binary`` and leads its own group (guards against reused pids).
    """
    if not pid_alive(pid, binary):
        return False
    try:
        if os.getpgid(pid) != pid:
            os.kill(pid, signal.SIGTERM)
            pgid = None
        else:
            pgid = pid
            os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not pid_alive(pid) and (pgid is None or not _group_alive(pgid)):
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        if pgid is not None:
            os.killpg(pgid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (
        pid_alive(pid) or (pgid is not None and _group_alive(pgid))
    ):
        time.sleep(0.05)
    return True


_PR_SET_PDEATHSIG = 1


def _set_parent_death_signal() -> None:
    """In the child before exec: ask Linux to SIGKILL it when its parent thread exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file renamed over it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.strip().splitlines()[-lines:])


# ---- the cluster ----------------------------------------------------------------------


@dataclass(frozen=True)
class ComponentStatus:
    """One component: ``pid`` (None if never started), ``running``, ``healthy``, ``detail``."""

    name: str
    pid: int | None
    running: bool
    healthy: bool
    detail: str


@dataclass(frozen=True)
class ClusterStatus:
    """``state``: ``running`` (all healthy), ``degraded`` or ``stopped``."""

    state_dir: Path
    state: str
    server: str | None
    kubeconfig: Path | None
    components: tuple[ComponentStatus, ...]


class Cluster:
    """Handle on the control plane whose state lives in ``state_dir``.

    Methods: :meth:`up`, :meth:`down`, :meth:`status`, :meth:`client`. Attributes after
    ``up`` (or for a running cluster, read from ``state.json``): ``server`` (https URL),
    ``kubeconfig`` (path).
    """

    def __init__(self, state_dir: Path | None = None) -> None:
        self.state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.state_file = self.state_dir / "state.json"
        self.log_dir = self.state_dir / "logs"
        self.run_dir = self.state_dir / "run"

    # ---- state ----------------------------------------------------------------------
    def _read_state(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, json.JSONDecodeError):
            return None

    def _write_state(self, state: Mapping[str, Any]) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.state_file)

    @property
    def server(self) -> str | None:
        st = self._read_state()
        return None if st is None else st.get("server")

    def running_components(self) -> list[str]:
        """Names of components whose recorded pid still runs their binary."""
        st = self._read_state() or {}
        out = []
        for name, comp in (st.get("components") or {}).items():
            if pid_alive(int(comp["pid"]), comp.get("binary")):
                out.append(name)
        return out

    def client(self, timeout: float = 30.0) -> KubeClient:
        """A :class:`KubeClient` authenticated as the admin user of this cluster."""
        if not self.kubeconfig.is_file():
            raise ClusterError(
                f"{self.kubeconfig} does not exist; start the cluster with `tessera cluster up`"
            )
        return KubeClient.from_kubeconfig(self.kubeconfig, timeout=timeout)

    # ---- up -------------------------------------------------------------------------
    def up(
        self,
        inventory: Inventory | None = None,
        *,
        build_binaries: bool = True,
        node_capacity: Mapping[str, str] = DEFAULT_NODE_CAPACITY,
        timeout: float = 180.0,
        progress: Callable[[str], None] | None = None,
        die_with_parent: bool = False,
        extra_args: Mapping[str, Sequence[str]] | None = None,
        scheduler_config: Mapping[str, Any] | None = None,
        kubelet: bool = False,
        node_lock_wait: float = 0.0,
        device_classes: bool | None = None,
        resource_api: bool = True,
    ) -> None:
        """Start a fresh control plane and register ``inventory``'s nodes and slices.

        ``resource_api=False``: the API server serves no ``resource.k8s.io`` (a cluster
        without DRA, for legacy mode): authorization is RBAC alone, kubelets bound to the
        ``system:node`` ClusterRole (:data:`NO_RESOURCE_API_RUNTIME_CONFIG` says why), and
        kube-scheduler emulates 1.34 with DRA's gates off
        (:data:`NO_RESOURCE_API_SCHEDULER_FLAGS`). No DeviceClass is registered; an
        inventory with ResourceSlices raises :class:`ClusterError`.

        ``device_classes``: register the DeviceClass ``gpu.tessera.dev`` (True) or not
        (False: e.g. for ``helm install`` of the chart, which creates its DeviceClasses and
        refuses objects it does not own). None (the default) registers it unless the only
        node is the real one (``kubelet`` and no simulated node): simulated nodes' slices are
        registered here and need the class; a real node's driver comes with the chart.

        ``extra_args`` maps a component (``kube-apiserver``, ``kube-scheduler``...) to flags
        appended to its command line. ``scheduler_config`` is a ``KubeSchedulerConfiguration``
        (``kubescheduler.config.k8s.io/v1``; e.g. ``extenders``, ``profiles``) that
        kube-scheduler is started with (``--config``); its ``clientConnection.kubeconfig`` and
        ``leaderElection`` are filled in here.

        ``kubelet`` also starts a real node (containerd, a kubelet and kube-proxy, see
        :mod:`tessera.localcluster.node`; its network, :mod:`tessera.localcluster.nodenet`, is made
        before the control plane starts) once the control plane runs, and waits until its Node is
        Ready and untainted; :attr:`node` then describes it. The API server then listens on all
        addresses (the guard table drops what reaches its port from other interfaces) and advertises
        the bridge address, the endpoint of the ``kubernetes`` Service. The machine's node lock is
        taken first: when another node holds it, ``up`` waits up to ``node_lock_wait`` seconds, then
        raises :class:`ClusterError` naming the holder. Needs root.

        ``build_binaries`` runs ``tools/kube/build.sh`` first (a no-op when up to date).
        ``timeout`` bounds the wait for each component to become healthy, in seconds.
        ``die_with_parent`` makes the kernel SIGKILL the components when the calling
        thread exits (``PR_SET_PDEATHSIG``), so a test session killed outright leaves
        nothing behind; the CLI leaves it off, as its components must outlive it.
        On any failure every started process is stopped again and :class:`ClusterError`
        is raised with the failing component's log tail; API rejections of a slice name the
        slice and field. Raises :class:`ClusterError` if a cluster already runs here.
        """
        say = progress or (lambda _msg: None)
        inv = inventory or Inventory()
        if not resource_api:
            if inv.slices or device_classes:
                raise ClusterError(
                    "resource_api=False: this cluster serves no resource.k8s.io, so it takes no "
                    "ResourceSlices and no DeviceClass: give an inventory without slices and "
                    "device_classes=False (or None)"
                )
            device_classes = False
        if device_classes is None:
            device_classes = not (kubelet and not inv.nodes)
        running = self.running_components()
        if running:
            raise ClusterError(
                f"a cluster is already running from {self.state_dir} ({', '.join(running)}); "
                f"stop it with `tessera cluster down --state-dir {self.state_dir}` first"
            )
        if kubelet:
            problems = realnode.check_host()
            if problems:
                raise ClusterError(f"cannot run a real node on this machine: {'; '.join(problems)}")
        try:
            bins = build.ensure_built(node=kubelet) if build_binaries else build.bin_dir()
        except build.BuildError as e:
            raise ClusterError(str(e)) from e
        missing = build.missing_binaries(
            build.BINARIES if kubelet else build.CONTROL_PLANE_BINARIES
        )
        if missing:
            raise ClusterError(
                f"missing binaries in {bins}: {', '.join(missing)}; run tools/kube/build.sh"
            )
        paths = realnode.NodePaths(self.state_dir)
        try:
            name = realnode.node_name() if kubelet else ""
            address = realnode.node_address(name) if kubelet else ""
            # A node of this state dir that was not stopped (its processes are gone, or
            # the running check above would have refused): restore the host first.
            problems = realnode.release_host(self.state_dir, None, say)
            if problems:
                raise ClusterError(
                    f"could not restore the host after this state dir's earlier node: {'; '.join(problems)}"
                )
            if kubelet:
                realnode.process_path(bins)  # raises early when the kubelet would find iptables
                realnode.claim_host(self.state_dir, paths, bins, wait=node_lock_wait, progress=say)
        except realnode.NodeError as e:
            raise ClusterError(str(e)) from e
        try:
            self._up(
                inv,
                bins,
                paths,
                name,
                address,
                node_capacity,
                timeout,
                say,
                die_with_parent,
                kubelet,
                extra_args,
                scheduler_config,
                device_classes,
                resource_api,
            )
        except BaseException:
            with contextlib.suppress(ClusterError):
                self.down()
            raise

    def _up(
        self,
        inv: Inventory,
        bins: Path,
        paths: realnode.NodePaths,
        name: str,
        address: str,
        node_capacity: Mapping[str, str],
        timeout: float,
        say: Callable[[str], None],
        die_with_parent: bool,
        kubelet: bool,
        extra_args: Mapping[str, Sequence[str]] | None = None,
        scheduler_config: Mapping[str, Any] | None = None,
        device_classes: bool = True,
        resource_api: bool = True,
    ) -> None:
        if kubelet:
            # Before anything can send a packet to the service or pod range: otherwise it
            # would follow the default route off this machine.
            say(f"making the node's network (bridge {nodenet.BRIDGE}, routes, guard table)")
            try:
                realnode.setup_network(self.state_dir)
            except realnode.NodeError as e:
                raise ClusterError(str(e)) from e
        # Fresh state directory (keep nothing from an earlier cluster).
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for sub in ("pki", "etcd", "logs", "run", "kubeconfigs", "certs-generated"):
            shutil.rmtree(self.state_dir / sub, ignore_errors=True)
        for d in paths.fresh_dirs():
            realnode.safe_rmtree(d)
        for f in (self.kubeconfig, self.state_file):
            f.unlink(missing_ok=True)
        for sub in ("logs", "run", "kubeconfigs"):
            (self.state_dir / sub).mkdir()
        (self.state_dir / "etcd").mkdir(mode=0o700)

        say("generating certificates")
        pki = make_pki(
            self.state_dir / "pki", apiserver_ips=(nodenet.BRIDGE_ADDRESS,) if kubelet else ()
        )
        for attempt in range(1, 4):
            try:
                state, server = self._start_control_plane(
                    inv,
                    bins,
                    pki,
                    timeout,
                    say,
                    die_with_parent,
                    extra_args,
                    scheduler_config,
                    kubelet,
                    resource_api,
                )
                break
            except _PortTaken as e:
                # Ports are picked free, then bound by the component a moment later: on a
                # machine shared with other clusters one may be taken in between.
                if attempt == 3:
                    raise
                say(f"{e}; starting the control plane again on other ports")
                self._stop_control_plane()
                shutil.rmtree(self.state_dir / "etcd", ignore_errors=True)
                (self.state_dir / "etcd").mkdir(mode=0o700)
        say(
            "registering DeviceClass, nodes and ResourceSlices"
            if device_classes
            else "registering nodes and ResourceSlices (no DeviceClass)"
        )
        self._register(inv, node_capacity, timeout, device_classes)
        if not resource_api:
            self.client().apply(NODE_RBAC_BINDING, field_manager=FIELD_MANAGER)
        if kubelet:
            self._start_node(
                state, pki, server, bins, paths, name, address, timeout, say, die_with_parent
            )

    def _start_control_plane(
        self,
        inv: Inventory,
        bins: Path,
        pki: Pki,
        timeout: float,
        say: Callable[[str], None],
        die_with_parent: bool,
        extra_args: Mapping[str, Sequence[str]] | None,
        scheduler_config: Mapping[str, Any] | None,
        kubelet: bool = False,
        resource_api: bool = True,
    ) -> tuple[dict[str, Any], str]:
        """etcd, kube-apiserver, kube-controller-manager, kube-scheduler on free loopback
        ports, each healthy before the next; returns the state (written to state.json) and
        the API server URL. Raises :class:`_PortTaken` when a port was taken meanwhile.

        With ``kubelet`` the API server listens on all addresses (clients on this host still
        use 127.0.0.1) and advertises the bridge address, which its lease reconciler writes
        as the ``kubernetes`` Service's endpoint; the guard table drops connections to its
        port from other interfaces. Without, it listens on 127.0.0.1 and writes no endpoint
        (a loopback endpoint is invalid)."""
        etcd_port, etcd_peer, api_port, kcm_port, sched_port = _free_ports(5)
        server = f"https://127.0.0.1:{api_port}"
        self._write_kubeconfig(
            self.kubeconfig, server, pki, pki.admin.cert, pki.admin.key, "tessera-admin", embed=True
        )
        kc_dir = self.state_dir / "kubeconfigs"
        sched_kc = kc_dir / "kube-scheduler.kubeconfig"
        kcm_kc = kc_dir / "kube-controller-manager.kubeconfig"
        self._write_kubeconfig(
            sched_kc, server, pki, pki.scheduler.cert, pki.scheduler.key, "system:kube-scheduler"
        )
        self._write_kubeconfig(
            kcm_kc,
            server,
            pki,
            pki.controller_manager.cert,
            pki.controller_manager.key,
            "system:kube-controller-manager",
        )

        gates = ",".join(f"{k}={str(v).lower()}" for k, v in FEATURE_GATES.items())
        gen_dir = self.state_dir / "certs-generated"
        argv: dict[str, list[str]] = {
            "etcd": [
                str(bins / "etcd"),
                "--name=tessera",
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls=https://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=https://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=tessera=http://127.0.0.1:{etcd_peer}",
                f"--cert-file={pki.etcd_server.cert}",
                f"--key-file={pki.etcd_server.key}",
                f"--trusted-ca-file={pki.ca.cert}",
                "--client-cert-auth=true",
                "--unsafe-no-fsync=true",  # throwaway test data: skip fsync
                "--log-level=warn",
            ],
            "kube-apiserver": [
                str(bins / "kube-apiserver"),
                f"--etcd-servers=https://127.0.0.1:{etcd_port}",
                f"--etcd-cafile={pki.ca.cert}",
                f"--etcd-certfile={pki.etcd_client.cert}",
                f"--etcd-keyfile={pki.etcd_client.key}",
                # --kubelet: pods reach it through the kubernetes Service at the bridge address.
                f"--bind-address={'0.0.0.0' if kubelet else '127.0.0.1'}",
                f"--advertise-address={nodenet.BRIDGE_ADDRESS if kubelet else '127.0.0.1'}",
                f"--secure-port={api_port}",
                f"--tls-cert-file={pki.apiserver.cert}",
                f"--tls-private-key-file={pki.apiserver.key}",
                f"--client-ca-file={pki.ca.cert}",
                f"--requestheader-client-ca-file={pki.front_proxy_ca.cert}",
                f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki.front_proxy_client.cert}",
                f"--proxy-client-key-file={pki.front_proxy_client.key}",
                # Towards kubelets (exec, logs, port-forward, node proxy): a client
                # certificate, and their serving certificates are checked against the CA.
                f"--kubelet-client-certificate={pki.apiserver_kubelet_client.cert}",
                f"--kubelet-client-key={pki.apiserver_kubelet_client.key}",
                f"--kubelet-certificate-authority={pki.ca.cert}",
                f"--cert-dir={gen_dir}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode="
                + ("Node,RBAC" if resource_api else NO_RESOURCE_API_AUTHORIZATION),
                f"--endpoint-reconciler-type={'lease' if kubelet else 'none'}",
                "--allow-privileged=true",
                "--profiling=false",
                f"--feature-gates={gates}",
                "--runtime-config="
                + (RUNTIME_CONFIG if resource_api else NO_RESOURCE_API_RUNTIME_CONFIG),
            ],
            "kube-controller-manager": [
                str(bins / "kube-controller-manager"),
                f"--kubeconfig={kcm_kc}",
                f"--authentication-kubeconfig={kcm_kc}",
                f"--authorization-kubeconfig={kcm_kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={kcm_port}",
                f"--tls-cert-file={pki.controller_manager_serving.cert}",
                f"--tls-private-key-file={pki.controller_manager_serving.key}",
                f"--client-ca-file={pki.ca.cert}",
                f"--cert-dir={gen_dir}",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca.cert}",
                f"--cluster-signing-cert-file={pki.ca.cert}",
                f"--cluster-signing-key-file={pki.ca.key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # Each controller acts as its own ServiceAccount (kube-system/<controller>),
                # as with kubeadm: the bootstrap RBAC roles are written for that.
                "--use-service-account-credentials=true",
                # No kubelet heartbeats: the node lifecycle controller would mark the
                # simulated nodes NotReady and taint them. Everything else runs, including
                # resourceclaim-controller (ResourceClaimTemplate -> ResourceClaim).
                "--controllers=*,-node-lifecycle-controller",
                "--leader-elect=false",
                "--profiling=false",
                f"--feature-gates={gates}",
            ],
            "kube-scheduler": [
                str(bins / "kube-scheduler"),
                f"--kubeconfig={sched_kc}",
                f"--authentication-kubeconfig={sched_kc}",
                f"--authorization-kubeconfig={sched_kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={sched_port}",
                f"--tls-cert-file={pki.scheduler_serving.cert}",
                f"--tls-private-key-file={pki.scheduler_serving.key}",
                f"--client-ca-file={pki.ca.cert}",
                "--leader-elect=false",
                "--profiling=false",
                *(
                    (f"--feature-gates={gates}",)
                    if resource_api
                    else NO_RESOURCE_API_SCHEDULER_FLAGS
                ),
            ],
        }
        if scheduler_config is not None:
            sched_cfg = json.loads(json.dumps(scheduler_config))
            sched_cfg.setdefault("apiVersion", "kubescheduler.config.k8s.io/v1")
            sched_cfg.setdefault("kind", "KubeSchedulerConfiguration")
            sched_cfg.setdefault("clientConnection", {})["kubeconfig"] = str(sched_kc)
            sched_cfg["leaderElection"] = {"leaderElect": False}
            cfg_path = kc_dir / "kube-scheduler-config.yaml"
            cfg_path.write_text(yaml.safe_dump(sched_cfg, sort_keys=False))
            argv["kube-scheduler"].append(f"--config={cfg_path}")
        for component, flags in (extra_args or {}).items():
            if component not in argv:
                raise ClusterError(
                    f"extra_args: unknown component {component!r} (one of {', '.join(argv)})"
                )
            argv[component].extend(flags)
        health = {
            "etcd": f"https://127.0.0.1:{etcd_port}/health",
            "kube-apiserver": f"{server}/readyz",
            "kube-controller-manager": f"https://127.0.0.1:{kcm_port}/healthz",
            "kube-scheduler": f"https://127.0.0.1:{sched_port}/healthz",
        }
        state: dict[str, Any] = {
            "version": 1,
            "server": server,
            "kubeconfig": str(self.kubeconfig),
            "startedAt": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "featureGates": dict(FEATURE_GATES),
            "ports": {
                "etcd": etcd_port,
                "etcdPeer": etcd_peer,
                "kube-apiserver": api_port,
                "kube-controller-manager": kcm_port,
                "kube-scheduler": sched_port,
            },
            "pki": {
                "ca": str(pki.ca.cert),
                "clientCert": str(pki.admin.cert),
                "clientKey": str(pki.admin.key),
                "etcdClientCert": str(pki.etcd_client.cert),
                "etcdClientKey": str(pki.etcd_client.key),
            },
            "components": {},
            "nodes": [n.name for n in inv.nodes],
        }
        if kubelet:
            try:
                nodenet.guard_local_only_port(api_port)
            except nodenet.NetworkError as e:
                raise ClusterError(str(e)) from e
        for comp in COMPONENTS:
            say(f"starting {comp}")
            self._start_component(state, comp, argv[comp], health[comp], timeout, die_with_parent)
        return state, server

    def _stop_control_plane(self) -> None:
        """Stop the control-plane components recorded in state.json (a failed start's)."""
        st = self._read_state() or {}
        for name in reversed(COMPONENTS):
            comp = (st.get("components") or {}).get(name)
            if comp is not None:
                _stop_group(int(comp["pid"]), comp.get("binary"))
                _CHILDREN.pop(int(comp["pid"]), None)

    def _start_component(
        self,
        state: dict[str, Any],
        name: str,
        argv: Sequence[str],
        health: str,
        timeout: float,
        die_with_parent: bool,
        env: Mapping[str, str] | None = None,
    ) -> int:
        pid = self._spawn(name, argv, die_with_parent, env)
        state["components"][name] = {
            "pid": pid,
            "binary": argv[0],
            "log": str(self.log_dir / f"{name}.log"),
            "health": health,
            # what restart_component needs to start it again in place
            "argv": list(argv),
            "env": dict(env or {}),
            "dieWithParent": die_with_parent,
        }
        self._write_state(state)
        if name in NODE_COMPONENTS:
            realnode.record_process(self.state_dir, name, pid)
        self._wait_healthy(name, pid, health, timeout)
        return pid

    # ---- one component again (fault tests) --------------------------------------------
    def _component(self, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        st = self._read_state()
        comp = ((st or {}).get("components") or {}).get(name)
        if st is None or comp is None:
            raise ClusterError(
                f"{self.state_file}: no component {name!r} recorded (known: "
                f"{', '.join((st or {}).get('components') or {}) or 'none'}); start the cluster "
                "with `tessera cluster up` (--kubelet for the node's components)"
            )
        if "argv" not in comp:
            raise ClusterError(
                f"{self.state_file}: components.{name} has no argv (started by an older "
                "tessera): restart the whole cluster with `tessera cluster down` and `up`"
            )
        return st, comp

    def stop_component(self, name: str, *, kill: bool = False) -> None:
        """Stop one running component (a name of ``COMPONENTS`` or ``NODE_COMPONENTS``) and
        leave everything else as it is: its state (etcd's data, the kubelet's root dir and
        checkpoints) and, for the kubelet, the pods' containers, which run under containerd's
        shims, not under the kubelet. ``kill``: SIGKILL at once (a crash, or a power loss),
        else SIGTERM and SIGKILL after 10 s. Start it again with :meth:`start_component`.
        Raises :class:`ClusterError` when the component was never started from this state
        dir (or by a tessera that did not record its command line)."""
        _, comp = self._component(name)
        pid = int(comp["pid"])
        if kill:
            if pid_alive(pid, comp.get("binary")):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                deadline = time.monotonic() + 10
                while (pid_alive(pid) or _group_alive(pid)) and time.monotonic() < deadline:
                    time.sleep(0.05)
        else:
            _stop_group(pid, comp.get("binary"))
        _CHILDREN.pop(pid, None)

    def start_component(self, name: str, *, timeout: float = 120.0) -> int:
        """Start a stopped component again with the command line, environment and parent-death
        setting it was first started with (``state.json``), wait until its health endpoint
        answers (for the kubelet, also until its Node is Ready again), and return its new pid.
        A component still running is stopped first (SIGTERM): this is then a restart in place.
        Raises :class:`ClusterError` as :meth:`up` does for a component that exits or is not
        healthy within ``timeout`` seconds (its log's last lines)."""
        st, comp = self._component(name)
        if pid_alive(int(comp["pid"]), comp.get("binary")):
            self.stop_component(name)
        pid = self._start_component(
            st,
            name,
            comp["argv"],
            comp["health"],
            timeout,
            bool(comp.get("dieWithParent")),
            comp.get("env") or None,
        )
        if name == "kubelet":
            node = self.node
            if node is not None:
                self._wait_node_ready(node.name, timeout)
        return pid

    def restart_component(self, name: str, *, timeout: float = 120.0, kill: bool = False) -> int:
        """Restart one component in place, as a crash-and-restart or a systemd restart of it
        would: :meth:`stop_component` (``kill``: SIGKILL, else SIGTERM) and
        :meth:`start_component` with the same flags and state. ``kube-apiserver``: etcd keeps
        every object, clients see refused connections until it serves again (same port and
        certificates); ``kubelet``: the pods keep running and the new kubelet takes them over
        from its root dir and its DRA checkpoint (``dra_manager_state``), calling
        NodePrepareResources again for their claims. Returns the new pid."""
        self.stop_component(name, kill=kill)
        return self.start_component(name, timeout=timeout)

    def _start_node(
        self,
        state: dict[str, Any],
        pki: Pki,
        server: str,
        bins: Path,
        paths: realnode.NodePaths,
        name: str,
        address: str,
        timeout: float,
        say: Callable[[str], None],
        die_with_parent: bool,
    ) -> None:
        """containerd, the pause image, the kubelet; then wait for a Ready Node and untaint it."""
        runc, cni_bin = realnode.runc_binary(), realnode.cni_bin_dir()
        assert runc is not None and cni_bin is not None  # realnode.check_host() passed
        for d in (
            paths.plugins_dir,
            paths.plugins_registry_dir,
            paths.cdi_spec_dir,
            paths.containerd_dir,
            paths.cni_conf_dir,
            paths.cni_ipam_dir,
            paths.pod_logs_dir,
            paths.images_dir,
        ):
            d.mkdir(parents=True, exist_ok=True)
        certs = issue_node_certs(pki.dir, name, tuple(dict.fromkeys((address, "127.0.0.1"))))
        self._write_kubeconfig(
            paths.kubelet_kubeconfig,
            server,
            pki,
            certs.client.cert,
            certs.client.key,
            f"system:node:{name}",
        )
        self._write_kubeconfig(
            paths.kube_proxy_kubeconfig,
            server,
            pki,
            certs.proxy.cert,
            certs.proxy.key,
            KUBE_PROXY_USER,
        )
        _write_text(
            paths.kube_proxy_config,
            yaml.safe_dump(
                nodenet.kube_proxy_config(kubeconfig=paths.kube_proxy_kubeconfig, node_name=name),
                sort_keys=False,
            ),
        )
        _write_text(paths.containerd_config, realnode.containerd_config(paths, bins, runc, cni_bin))
        (paths.registry_config_dir / "_default").mkdir(parents=True, exist_ok=True)
        _write_text(
            paths.registry_config_dir / "_default" / "hosts.toml", realnode.registry_hosts_toml()
        )
        _write_text(
            paths.cni_conf_dir / f"10-{realnode.CNI_NETWORK}.conflist",
            json.dumps(realnode.cni_config(paths), indent=2) + "\n",
        )
        kcfg = realnode.kubelet_config(
            paths,
            address=address,
            ca_file=pki.ca.cert,
            serving_cert=certs.serving.cert,
            serving_key=certs.serving.key,
            feature_gates=FEATURE_GATES,
        )
        _write_text(paths.kubelet_config, yaml.safe_dump(kcfg, sort_keys=False))
        pause = images.pause_image(paths.images_dir)

        say("starting containerd")
        env = {"PATH": realnode.process_path(bins)}
        self._start_component(
            state,
            "containerd",
            [str(bins / "containerd"), f"--config={paths.containerd_config}"],
            f"unix://{paths.containerd_socket}",
            timeout,
            die_with_parent,
            env,
        )
        images.import_image(bins / "ctr", paths.containerd_socket, pause)
        info = realnode.NodeInfo(
            name=name,
            kubelet_root_dir=paths.kubelet_root_dir,
            plugins_dir=paths.plugins_dir,
            plugins_registry_dir=paths.plugins_registry_dir,
            cdi_spec_dir=paths.cdi_spec_dir,
            containerd_socket=paths.containerd_socket,
            ctr=bins / "ctr",
            images_dir=paths.images_dir,
            pod_logs_dir=paths.pod_logs_dir,
            sandbox_image=pause.ref,
            kubelet_url=f"https://{address}:{realnode.KUBELET_PORT}",
        )
        state["node"] = info.to_json()

        say(f"starting kubelet (node {name})")
        self._start_component(
            state,
            "kubelet",
            [
                str(bins / "kubelet"),
                f"--config={paths.kubelet_config}",
                f"--kubeconfig={paths.kubelet_kubeconfig}",
                f"--root-dir={paths.kubelet_root_dir}",
                f"--cert-dir={paths.kubelet_root_dir / 'pki'}",
                f"--hostname-override={name}",
                # The Node's InternalIP (and hostNetwork pods' IP): the bridge address, not
                # the address of the interface with the default route.
                f"--node-ip={nodenet.BRIDGE_ADDRESS}",
            ],
            f"http://127.0.0.1:{realnode.KUBELET_HEALTHZ_PORT}/healthz",
            timeout,
            die_with_parent,
            env,
        )
        say(f"waiting for node {name} to be Ready")
        self._wait_node_ready(name, timeout)
        # Healthy = its rules for every Service are in place: before pods can be scheduled.
        say("starting kube-proxy (nftables)")
        try:
            proxy_path = nodenet.process_path_with_nft(paths.tools_dir, env["PATH"])
        except nodenet.NetworkError as e:
            raise ClusterError(str(e)) from e
        self._start_component(
            state,
            "kube-proxy",
            [str(bins / "kube-proxy"), f"--config={paths.kube_proxy_config}"],
            f"http://127.0.0.1:{nodenet.KUBE_PROXY_HEALTHZ_PORT}/healthz",
            timeout,
            die_with_parent,
            {"PATH": proxy_path},
        )
        self._untaint(name)

    def _untaint(self, name: str) -> None:
        """The node-lifecycle controller is off (simulated nodes send no heartbeats): remove
        the not-ready taint that admission added on registration."""
        client = self.client()
        obj = client.get("v1", "Node", name)
        if obj["spec"].get("taints"):
            client.request(
                "PATCH",
                f"/api/v1/nodes/{name}",
                body={"spec": {"taints": None}},
                content_type="application/merge-patch+json",
                what=f"Node {name}",
            )

    def _wait_node_ready(self, name: str, timeout: float) -> None:
        client = self.client()
        deadline = time.monotonic() + timeout
        last = "not registered"
        while True:
            try:
                obj = client.get("v1", "Node", name)
            except ApiError as e:
                if e.status != 404:
                    raise ClusterError(f"reading Node {name}: {e}") from e
                obj = None
            if obj is not None:
                ready = next(
                    (c for c in obj["status"].get("conditions") or [] if c.get("type") == "Ready"),
                    None,
                )
                last = (
                    f"Ready={ready.get('status')} ({ready.get('reason')}: {ready.get('message')})"
                    if ready
                    else "no Ready condition"
                )
                if ready and ready.get("status") == "True":
                    return
            kubelet_pid = int((self._read_state() or {})["components"]["kubelet"]["pid"])
            if not pid_alive(kubelet_pid):
                raise ClusterError(
                    "kubelet exited; last lines of "
                    f"{self.log_dir / 'kubelet.log'}:\n{_tail(self.log_dir / 'kubelet.log')}"
                )
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"Node {name} not Ready after {timeout:.0f}s ({last}); last lines of "
                    f"{self.log_dir / 'kubelet.log'}:\n{_tail(self.log_dir / 'kubelet.log')}"
                )
            time.sleep(0.25)

    def _write_kubeconfig(
        self,
        path: Path,
        server: str,
        pki: Pki,
        cert: Path,
        key: Path,
        user: str,
        *,
        embed: bool = False,
    ) -> None:
        if embed:
            cluster = {
                "server": server,
                "certificate-authority-data": base64.b64encode(pki.ca.cert.read_bytes()).decode(),
            }
            creds = {
                "client-certificate-data": base64.b64encode(cert.read_bytes()).decode(),
                "client-key-data": base64.b64encode(key.read_bytes()).decode(),
            }
        else:
            cluster = {"server": server, "certificate-authority": str(pki.ca.cert)}
            creds = {"client-certificate": str(cert), "client-key": str(key)}
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "tessera", "cluster": cluster}],
            "users": [{"name": user, "user": creds}],
            "contexts": [{"name": "tessera", "context": {"cluster": "tessera", "user": user}}],
            "current-context": "tessera",
            "preferences": {},
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(cfg, f, sort_keys=False)

    def _spawn(
        self,
        name: str,
        argv: Sequence[str],
        die_with_parent: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> int:
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                start_new_session=True,
                close_fds=True,
                env=None if env is None else {**os.environ, **env},
                preexec_fn=_set_parent_death_signal if die_with_parent else None,
            )
        _CHILDREN[proc.pid] = proc
        (self.run_dir / f"{name}.pid").write_text(f"{proc.pid}\n")
        return proc.pid

    def _probe(self, url: str, timeout: float = 5.0) -> tuple[bool, str]:
        if url.startswith("unix://"):  # containerd: its gRPC socket accepts connections
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                try:
                    sock.connect(url.removeprefix("unix://"))
                except OSError as e:
                    return False, f"{url}: {e.strerror or e}"
            return True, "accepting connections"
        if url.startswith("http://"):  # kubelet and kube-proxy healthz (plain HTTP on loopback)
            try:
                with urllib.request.urlopen(url, timeout=timeout) as resp:
                    body = resp.read().decode(errors="replace").strip()
            except (OSError, ValueError) as e:  # HTTPError (not 2xx) is an OSError
                return False, str(e)
            return True, body[:200]
        st = self._read_state() or {}
        p = st.get("pki") or {}
        is_etcd = url.endswith("/health")
        cert = Path(p["etcdClientCert"] if is_etcd else p["clientCert"])
        key = Path(p["etcdClientKey"] if is_etcd else p["clientKey"])
        base, _, path = url.partition("://")[2].partition("/")
        try:
            c = KubeClient(
                f"https://{base}",
                ca_file=Path(p["ca"]),
                cert_file=cert,
                key_file=key,
                timeout=timeout,
            )
            body = c.raw_get("/" + path)
        except ApiError as e:
            return False, e.message.strip() or e.reason
        except (OSError, ValueError, KeyError) as e:
            return False, str(e)
        if is_etcd:
            ok = isinstance(body, dict) and body.get("health") == "true"
            return ok, json.dumps(body)
        return str(body).strip() == "ok", str(body).strip()

    def _wait_healthy(self, name: str, pid: int, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        detail = ""
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                tail = _tail(self.log_dir / (name + ".log"))
                if name in COMPONENTS and "address already in use" in tail:
                    raise _PortTaken(
                        f"{name} could not bind its port (taken by another process meanwhile)"
                    )
                raise ClusterError(
                    f"{name} exited during startup; last lines of {self.log_dir / (name + '.log')}:\n{tail}"
                )
            ok, detail = self._probe(url)
            if ok:
                return
            time.sleep(0.25)
        raise ClusterError(
            f"{name} not healthy after {timeout:.0f}s ({url}: {detail}); last lines of "
            f"{self.log_dir / (name + '.log')}:\n{_tail(self.log_dir / (name + '.log'))}"
        )

    def _register(
        self,
        inv: Inventory,
        capacity: Mapping[str, str],
        timeout: float,
        device_classes: bool = True,
    ) -> None:
        client = self.client()
        register_inventory(client, inv, capacity, device_classes=device_classes)
        # Pods need the namespace's default ServiceAccount (made by kube-controller-manager).
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.get("v1", "ServiceAccount", "default", "default")
                break
            except ApiError as e:
                if e.status != 404 or time.monotonic() > deadline:
                    raise ClusterError(
                        f"ServiceAccount default/default not created by kube-controller-manager: {e}"
                    ) from e
                time.sleep(0.25)

    # ---- down / status --------------------------------------------------------------
    def down(self, progress: Callable[[str], None] | None = None) -> list[str]:
        """Stop every component of this state dir; return the names of those stopped.

        A real node goes first (:func:`tessera.localcluster.node.release_host`: pods, tasks,
        kubelet, containerd, shims, then the host is restored), then the control plane in
        reverse start order: each process group gets SIGTERM, then SIGKILL after 10 s. Pids
        are taken from ``state.json`` and ``run/*.pid`` and are only signalled while they
        still run the recorded binary. Safe to call when nothing runs. Raises
        :class:`ClusterError` (after stopping everything) when the host could not be
        restored, naming what is left.
        """
        st = self._read_state() or {}
        comps: dict[str, tuple[int, str | None]] = {}
        for name, comp in (st.get("components") or {}).items():
            comps[name] = (int(comp["pid"]), comp.get("binary"))
        for pid_file in sorted(self.run_dir.glob("*.pid")) if self.run_dir.is_dir() else []:
            name = pid_file.stem
            if name in comps:
                continue
            with contextlib.suppress(ValueError, OSError):
                comps[name] = (int(pid_file.read_text().strip()), None)
        stopped = []
        problems: list[str] = []
        if realnode.holder_of(self.state_dir) is not None:
            was_running = [
                n for n in NODE_COMPONENTS if n in comps and pid_alive(comps[n][0], comps[n][1])
            ]
            client = None
            api = comps.get("kube-apiserver")
            if api is not None and pid_alive(*api) and self.kubeconfig.is_file():
                client = self.client(timeout=10.0)
            try:
                problems = realnode.release_host(self.state_dir, client, progress)
            except OSError as e:
                problems = [f"restoring the host: {e}"]
            stopped += [
                n
                for n in reversed(NODE_COMPONENTS)
                if n in was_running and not pid_alive(comps[n][0], comps[n][1])
            ]
        for name in reversed(COMPONENTS + NODE_COMPONENTS):
            if name not in comps:
                continue
            pid, binary = comps[name]
            if binary is None:
                # Without the recorded binary, only accept one of ours by name.
                argv = _cmdline(pid)
                if not argv or Path(argv[0]).name != name:
                    continue
                binary = argv[0]
            if _stop_group(pid, binary):
                stopped.append(name)
            (self.run_dir / f"{name}.pid").unlink(missing_ok=True)
            _CHILDREN.pop(pid, None)
        if problems:
            raise ClusterError(
                f"stopped {', '.join(stopped) or 'nothing'}, but the host is not restored: {'; '.join(problems)}"
            )
        return stopped

    def kubelet_client(self, timeout: float = 30.0) -> KubeClient:
        """A :class:`KubeClient` of the real node's kubelet (port 10250, its serving
        certificate checked against the cluster CA), authenticated as the admin user: for
        ``/metrics``, ``/pods``, ``/healthz``. Raises :class:`ClusterError` without a node."""
        st = self._read_state() or {}
        info = self.node
        if info is None:
            raise ClusterError(
                f"no real node runs from {self.state_dir}; start one with `tessera cluster up --kubelet`"
            )
        p = st["pki"]
        return KubeClient(
            info.kubelet_url,
            ca_file=Path(p["ca"]),
            cert_file=Path(p["clientCert"]),
            key_file=Path(p["clientKey"]),
            timeout=timeout,
        )

    @property
    def node(self) -> realnode.NodeInfo | None:
        """The real node started by ``up(kubelet=True)`` (paths for DRA plugins and tests), or None."""
        st = self._read_state() or {}
        return realnode.NodeInfo.from_json(st["node"]) if st.get("node") else None

    def status(self) -> ClusterStatus:
        """Per component: process running and health endpoint answer; overall state."""
        st = self._read_state()
        if st is None:
            return ClusterStatus(
                self.state_dir,
                "stopped",
                None,
                None,
                tuple(ComponentStatus(n, None, False, False, "not started") for n in COMPONENTS),
            )
        names = COMPONENTS + (
            NODE_COMPONENTS if st.get("node") or "kubelet" in (st.get("components") or {}) else ()
        )
        comps = []
        for name in names:
            comp = (st.get("components") or {}).get(name)
            if comp is None:
                comps.append(ComponentStatus(name, None, False, False, "not started"))
                continue
            pid = int(comp["pid"])
            running = pid_alive(pid, comp.get("binary"))
            if not running:
                comps.append(ComponentStatus(name, pid, False, False, "not running"))
                continue
            ok, detail = self._probe(comp["health"])
            comps.append(ComponentStatus(name, pid, True, ok, f"{comp['health']}: {detail}"))
        if all(c.healthy for c in comps):
            state = "running"
        elif not any(c.running for c in comps):
            state = "stopped"
        else:
            state = "degraded"
        return ClusterStatus(self.state_dir, state, st.get("server"), self.kubeconfig, tuple(comps))
