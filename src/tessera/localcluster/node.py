"""A real node beside the local control plane: containerd 2.x and a kubelet v1.37.

``tessera cluster up --kubelet`` (``Cluster.up(kubelet=True)``) starts, after the control
plane, containerd (built by ``tools/kube/build.sh``, with Debian's ``runc`` and CNI plugins)
and a kubelet that registers this machine as a Node. This module holds everything about that
node that is not the control plane:

* the host lock and record (:func:`claim_host`): one node per machine, because the kubelet
  uses fixed ports (10250, 10248), fixed cgroup paths (``kubepods``) and fixed host paths.
  ``/run/tessera-node/holder.json`` names the holder and records what the host looked like
  before (sysctls, absent paths and cgroups, the CNI bridge); a lock file serialises claims;
* the configuration files (containerd config version 3, the CNI network, the kubelet's
  ``KubeletConfiguration``), all pointing into the state directory; the network itself
  (bridge, routes, guard table, kube-proxy's configuration) is :mod:`tessera.localcluster.nodenet`;
* :func:`teardown`: stop pods, tasks, kubelet, containerd and shims in that order, then undo
  what they changed on the host (:func:`teardown` docstring lists every step);
* :class:`NodeInfo`: the paths a DRA kubelet plugin and a test need (CDI spec dir, kubelet
  root dir, ``plugins/<driver>`` and ``plugins_registry``), read from ``state.json``.

Linux, root, cgroup v1 or v2. The facts behind each setting are in docs/cluster.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as _dt
import errno
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.kube.client import ApiError, KubeClient
from tessera.localcluster import images, nodenet
from tessera.localcluster.nodenet import BRIDGE, BRIDGE_ADDRESS, POD_SUBNET, SERVICE_RANGE

#: Machine-wide directory of the holder record and the shim sockets; removed with the node.
HOST_DIR = Path("/run/tessera-node")
HOLDER_FILE = HOST_DIR / "holder.json"
#: The machine-wide lock (an empty file in the FHS lock directory; it stays).
LOCK_FILE = Path("/run/lock/tessera-node.lock")
#: containerd's shim sockets (``plugins."io.containerd.shim.v1.manager".socket_dir``): at
#: most 42 characters (unix socket path limit), so not under the state directory.
SHIM_SOCKET_DIR = HOST_DIR / "s"

#: sysctls the kubelet sets at start (``setupKernelTunables``), the CNI bridge plugin may
#: touch (``ip_forward`` with ``isGateway``) and kube-proxy would set if configured to
#: (conntrack, ``route_localnet``; it is configured not to); saved before and restored after.
SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
    "net.netfilter.nf_conntrack_tcp_be_liberal",
    "net.netfilter.nf_conntrack_udp_timeout",
    "net.netfilter.nf_conntrack_udp_timeout_stream",
)
#: Host paths the kubelet or containerd write to whatever their root and state dirs are
#: (device-manager socket and checkpoint, container log links, libcni's result cache, ctr's
#: FIFOs). For each, the shallowest component that did not exist before is recorded and
#: removed by :func:`teardown` (``/var/lib/kubelet`` on a machine without one).
FIXED_HOST_PATHS = (
    "/var/lib/kubelet/device-plugins",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni/results",
    "/run/containerd",
    "/etc/cni/net.d",
    "/opt/cni/bin",
    "/opt/containerd",
)
#: The cgroup the kubelet makes (``cgroupsPerQOS``, cgroupfs driver) in every hierarchy.
KUBEPODS = "kubepods"
#: The CNI network on :data:`BRIDGE` (made by ``up``, see :mod:`tessera.localcluster.nodenet`).
CNI_NETWORK = "tessera"
KUBELET_PORT = 10250
KUBELET_HEALTHZ_PORT = 10248

#: Kept off the PATH of containerd and the kubelet (see :func:`process_path`).
IPTABLES = ("iptables", "ip6tables")
#: Directories :func:`process_path` starts from.
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")


class NodeError(RuntimeError):
    """The node could not be started, stopped or its host restored; the message says why."""


class NodeBusyError(NodeError):
    """Another node holds this machine (one kubelet per machine); the message names it."""


# ---- processes ------------------------------------------------------------------------


def _proc_start(pid: int) -> int | None:
    """Start time of ``pid`` (clock ticks since boot, /proc/PID/stat field 22), None if gone
    or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _proc_exe(pid: int) -> str | None:
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    return exe.removesuffix(" (deleted)")


def _proc_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


@dataclass(frozen=True)
class ProcessId:
    """A process identified beyond its pid: ``start`` (boot-relative start time) and
    ``exe`` (resolved executable path) guard against a reused pid."""

    pid: int
    start: int
    exe: str

    @classmethod
    def of(cls, pid: int) -> ProcessId | None:
        start, exe = _proc_start(pid), _proc_exe(pid)
        if start is None or exe is None:
            return None
        return cls(pid, start, exe)

    def alive(self) -> bool:
        """True while this very process runs (same pid, start time and executable)."""
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(self.pid, os.WNOHANG)  # reap it if it is our exited child
        return _proc_start(self.pid) == self.start and _proc_exe(self.pid) == self.exe

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "start": self.start, "exe": self.exe}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ProcessId:
        return cls(int(d["pid"]), int(d["start"]), str(d["exe"]))


def stop_process(p: ProcessId, grace: float = 10.0) -> bool:
    """SIGTERM ``p`` (only while :meth:`ProcessId.alive`), SIGKILL after ``grace`` seconds.
    Returns True if it was running."""
    if not p.alive():
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not p.alive():
            return True
        time.sleep(0.05)
    if p.alive():
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and p.alive():
            time.sleep(0.05)
    return True


def find_shims(shim_binary: Path, containerd_socket: Path) -> list[ProcessId]:
    """Running ``containerd-shim-runc-v2`` processes of the containerd listening on
    ``containerd_socket``: executable is ``shim_binary`` and argv has ``-address SOCKET``."""
    want = str(Path(shim_binary).resolve())
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if _proc_exe(pid) != want:
            continue
        argv = _proc_cmdline(pid)
        if any(
            a == "-address" and i + 1 < len(argv) and argv[i + 1] == str(containerd_socket)
            for i, a in enumerate(argv)
        ):
            p = ProcessId.of(pid)
            if p is not None:
                out.append(p)
    return out


# ---- host facts -----------------------------------------------------------------------


def node_name() -> str:
    """The Node's name: this machine's hostname, lower-cased (the kubelet's own default).

    The API server reaches a kubelet at the node's ``Hostname`` address first, i.e. by this
    name; the machine's own hostname resolves locally (``/etc/hosts``), a made-up name does
    not, and ``kubectl exec``/``logs`` would then fail.
    """
    return socket.gethostname().lower()


def node_address(name: str) -> str:
    """The IPv4 address ``name`` resolves to (the kubelet listens there). Raises NodeError."""
    try:
        return socket.gethostbyname(name)
    except OSError as e:
        raise NodeError(
            f"the hostname {name!r} does not resolve ({e}); the API server reaches the kubelet by it: "
            f"add '127.0.1.1 {name}' to /etc/hosts"
        ) from e


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctls(names: Sequence[str] = SYSCTLS) -> dict[str, str]:
    """Current values of ``names`` (those that exist), as the kernel prints them."""
    out = {}
    for n in names:
        with contextlib.suppress(OSError):
            out[n] = _sysctl_path(n).read_text().strip()
    return out


def cgroup_roots() -> list[Path]:
    """Mount points of every cgroup (v1) and cgroup2 hierarchy, from /proc/self/mountinfo."""
    roots = []
    for m in _mountinfo():
        if m.fstype in ("cgroup", "cgroup2"):
            roots.append(Path(m.mount_point))
    return roots


@dataclass(frozen=True)
class _Mount:
    mount_point: str
    fstype: str


def _unescape(field: str) -> str:
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mountinfo() -> list[_Mount]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        out.append(_Mount(_unescape(fields[4]), right.split()[0] if right else ""))
    return out


def mounts_under(roots: Sequence[Path]) -> list[str]:
    """Mount points at or below any of ``roots``, deepest first."""
    prefixes = [str(Path(r)) for r in roots]
    found = {
        m.mount_point
        for m in _mountinfo()
        if any(m.mount_point == p or m.mount_point.startswith(p + "/") for p in prefixes)
    }
    return sorted(found, key=lambda p: (-p.count("/"), p))


_MNT_DETACH = 2


def unmount_lazy(path: str) -> None:
    """``umount2(path, MNT_DETACH)``; a path that is no longer a mount point is fine."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(path.encode(), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):
            raise OSError(err, f"umount2({path}, MNT_DETACH): {os.strerror(err)}")


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _first_absent(path: str) -> str | None:
    """The shallowest component of ``path`` that does not exist (None if it all exists)."""
    p = Path(path)
    if p.exists():
        return None
    for parent in reversed(p.parents):
        if not parent.exists():
            return str(parent)
    return str(p)


@dataclass(frozen=True)
class HostSnapshot:
    """What :func:`teardown` must restore: ``sysctls`` (name -> value before), ``absent_paths``
    (fixed host paths, or their shallowest missing parent, that did not exist),
    ``absent_cgroups`` (``<hierarchy>/kubepods`` that did not exist), ``bridge_absent``,
    ``nft_tables`` (those of :func:`nodenet.our_tables` that existed: never removed)."""

    sysctls: dict[str, str]
    absent_paths: tuple[str, ...]
    absent_cgroups: tuple[str, ...]
    bridge_absent: bool
    nft_tables: tuple[tuple[str, str], ...] = ()

    @classmethod
    def take(cls) -> HostSnapshot:
        absent = {a for p in FIXED_HOST_PATHS if (a := _first_absent(p)) is not None}
        cgroups = tuple(str(r / KUBEPODS) for r in cgroup_roots() if not (r / KUBEPODS).exists())
        present = nodenet.nft_tables()
        tables = tuple(t for t in nodenet.our_tables() if t in present)
        return cls(read_sysctls(), tuple(sorted(absent)), cgroups, not _link_exists(BRIDGE), tables)

    def to_json(self) -> dict[str, Any]:
        return {
            "sysctls": self.sysctls,
            "absentPaths": list(self.absent_paths),
            "absentCgroups": list(self.absent_cgroups),
            "bridgeAbsent": self.bridge_absent,
            "nftTables": [list(t) for t in self.nft_tables],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> HostSnapshot:
        return cls(
            dict(d.get("sysctls") or {}),
            tuple(d.get("absentPaths") or ()),
            tuple(d.get("absentCgroups") or ()),
            bool(d.get("bridgeAbsent")),
            tuple((str(t[0]), str(t[1])) for t in d.get("nftTables") or ()),
        )


def check_host() -> list[str]:
    """What this machine lacks for a real node, one line each (empty when ready): root,
    cgroups, runc, the CNI plugins, a static busybox, gcc with a static libc."""
    problems = []
    if os.geteuid() != 0:
        problems.append("a real node needs root (the kubelet manages cgroups, mounts and sysctls)")
    if not cgroup_roots():
        problems.append("no cgroup hierarchy is mounted (/sys/fs/cgroup)")
    if runc_binary() is None:
        problems.append("runc not found: apt-get install runc (tools/kube/node-deps.sh)")
    if cni_bin_dir() is None:
        problems.append(
            "CNI plugins (bridge, host-local, loopback) not found in /usr/lib/cni or /opt/cni/bin: "
            "apt-get install containernetworking-plugins (tools/kube/node-deps.sh)"
        )
    try:
        images.find_busybox()
    except images.ImageError as e:
        problems.append(str(e))
    if shutil.which("gcc") is None:
        problems.append(
            "gcc not found (it compiles the static pause program): apt-get install gcc libc6-dev"
        )
    if nodenet.ip_binary() is None:
        problems.append(
            "ip not found (up makes the pod bridge and routes with it): apt-get install iproute2 "
            "(tools/kube/node-deps.sh)"
        )
    if nodenet.nft_binary() is None:
        problems.append(
            "nft not found (kube-proxy's nftables mode and the egress guard run it): "
            "apt-get install nftables (tools/kube/node-deps.sh)"
        )
    return problems


def process_path(bins: Path) -> str:
    """``PATH`` for containerd and the kubelet: ``bins`` plus the system directories, except
    those holding ``iptables``/``ip6tables``. A kubelet that finds iptables creates chains in
    six tables (``KUBE-IPTABLES-HINT``, ``KUBE-KUBELET-CANARY``, ``KUBE-FIREWALL`` with a
    DROP rule for non-loopback traffic to 127.0.0.0/8) "for the benefit of other
    components" (kube-proxy, which does not run here), and never removes them. Everything
    the node calls by name (``mount``, ``umount``, ``du``, ``find``) must stay reachable:
    raises NodeError when ``mount`` lives beside iptables."""
    keep = [
        d
        for d in SYSTEM_PATH
        if Path(d).is_dir() and not any(os.access(Path(d, t), os.X_OK) for t in IPTABLES)
    ]
    path = ":".join([str(bins), *keep])
    for tool in ("mount", "umount"):
        if shutil.which(tool, path=path) is None:
            raise NodeError(
                f"{tool} is in the same directory as iptables ({shutil.which('iptables')}); the kubelet would add "
                "iptables rules it never removes: run the node on a system with iptables in sbin (Debian), or "
                "without iptables"
            )
    return path


def runc_binary() -> Path | None:
    found = shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/usr/bin:/sbin:/bin")
    return Path(found) if found else None


def cni_bin_dir() -> Path | None:
    for d in CNI_BIN_DIRS:
        if all(os.access(Path(d) / p, os.X_OK) for p in ("bridge", "host-local", "loopback")):
            return Path(d)
    return None


# ---- paths ----------------------------------------------------------------------------


@dataclass(frozen=True)
class NodePaths:
    """Where a node's files live inside the cluster's state directory."""

    state_dir: Path

    @property
    def kubelet_root_dir(self) -> Path:
        return self.state_dir / "kubelet"

    @property
    def plugins_dir(self) -> Path:
        return self.kubelet_root_dir / "plugins"

    @property
    def plugins_registry_dir(self) -> Path:
        return self.kubelet_root_dir / "plugins_registry"

    @property
    def cdi_spec_dir(self) -> Path:
        return self.state_dir / "cdi"

    @property
    def containerd_dir(self) -> Path:
        return self.state_dir / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd_dir / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.containerd_dir / "config.toml"

    @property
    def registry_config_dir(self) -> Path:
        """containerd's registry ``config_path``; ``_default/hosts.toml`` applies to all."""
        return self.containerd_dir / "certs.d"

    @property
    def runc_root(self) -> Path:
        return self.containerd_dir / "runc"

    @property
    def cni_conf_dir(self) -> Path:
        return self.state_dir / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.state_dir / "cni" / "ipam"

    @property
    def pod_logs_dir(self) -> Path:
        return self.state_dir / "pod-logs"

    @property
    def images_dir(self) -> Path:
        return self.state_dir / "images"

    @property
    def kubelet_config(self) -> Path:
        return self.state_dir / "kubelet-config.yaml"

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfigs" / "kubelet.kubeconfig"

    @property
    def kube_proxy_config(self) -> Path:
        return self.state_dir / "kube-proxy-config.yaml"

    @property
    def kube_proxy_kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfigs" / "kube-proxy.kubeconfig"

    @property
    def tools_dir(self) -> Path:
        """A link to ``nft`` for kube-proxy's PATH (see :func:`nodenet.process_path_with_nft`)."""
        return self.state_dir / "node-tools"

    def fresh_dirs(self) -> tuple[Path, ...]:
        """Directories emptied by every ``up`` (after unmounting anything below them)."""
        return (
            self.kubelet_root_dir,
            self.cdi_spec_dir,
            self.containerd_dir,
            self.state_dir / "cni",
            self.pod_logs_dir,
            self.images_dir,
            self.tools_dir,
        )


def safe_rmtree(path: Path) -> None:
    """Remove ``path`` after lazily unmounting every mount below it (deepest first), so that
    no bind-mounted host directory is ever emptied. Raises NodeError if a mount remains."""
    for m in mounts_under([path]):
        unmount_lazy(m)
    left = mounts_under([path])
    if left:
        raise NodeError(f"cannot remove {path}: still mounted below it: {', '.join(left[:5])}")
    shutil.rmtree(path, ignore_errors=True)


# ---- configuration --------------------------------------------------------------------


def containerd_config(paths: NodePaths, bins: Path, runc: Path, cni_bin: Path) -> str:
    """containerd's config (version 3; containerd 2.4 migrates it to its version 4 on load).

    Root, state, sockets, runc root, CNI config and IPAM state and the CDI spec dir are all
    under the state dir; shim sockets under :data:`SHIM_SOCKET_DIR`. CDI is always on in
    containerd 2.x (``cdi_spec_dirs``). ``restrict_oom_score_adj``: a VM without
    CAP_SYS_RESOURCE cannot lower ``oom_score_adj``, and runc fails every sandbox
    otherwise. ``SystemdCgroup = false``: the kubelet's cgroupfs driver. NRI is disabled
    (it would open /var/run/nri). The sandbox image is pinned (never pulled, never
    garbage-collected). Registry hosts come from :data:`registry_hosts_toml` in the state dir
    only (not ``/etc/containerd/certs.d``): every registry's server is a closed local port,
    so a pull of an image that was not imported fails at once, with no DNS lookup and no
    connection off this machine.
    """
    d = paths.containerd_dir

    def q(v: object) -> str:
        return json.dumps(str(v))

    return f"""# Written by tessera cluster up --kubelet; see docs/cluster.md.
version = 3
root = {q(d / "root")}
state = {q(d / "state")}
disabled_plugins = ["io.containerd.nri.v1.nri"]
imports = []

[grpc]
  address = {q(paths.containerd_socket)}

[ttrpc]
  address = {q(str(paths.containerd_socket) + ".ttrpc")}

[plugins."io.containerd.internal.v1.opt"]
  path = {q(d / "opt")}

[plugins."io.containerd.image-verifier.v1.bindir"]
  bin_dir = {q(d / "image-verifier")}

[plugins."io.containerd.shim.v1.manager"]
  socket_dir = {q(SHIM_SOCKET_DIR)}

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = {q(images.PAUSE_IMAGE)}
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = {q(paths.registry_config_dir)}

[plugins."io.containerd.cri.v1.runtime"]
  cdi_spec_dirs = [{q(paths.cdi_spec_dir)}]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = {q(bins / "containerd-shim-runc-v2")}
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = {q(runc)}
        Root = {q(paths.runc_root)}
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [{q(cni_bin)}]
    conf_dir = {q(paths.cni_conf_dir)}
"""


#: Where a pull goes: a port nothing listens on (the discard port) on loopback.
NO_REGISTRY = "http://127.0.0.1:9"


def registry_hosts_toml() -> str:
    """``certs.d/_default/hosts.toml``: the server of every registry is :data:`NO_REGISTRY`
    (images are imported, never pulled)."""
    return (
        "# Written by tessera cluster up --kubelet: images are imported into containerd, never\n"
        "# pulled; a pull of any registry goes to a closed port on loopback and fails there.\n"
        f'server = "{NO_REGISTRY}"\n'
    )


def cni_config(paths: NodePaths) -> dict[str, Any]:
    """The pod network: the bridge :data:`BRIDGE` that ``up`` made with the gateway address
    :data:`BRIDGE_ADDRESS` (so ``isGateway: false``: the plugin would otherwise set that
    address itself and switch on ``net.ipv4.ip_forward``), no IP masquerading, host-local
    IPAM on :data:`POD_SUBNET` with its state under the state dir. A pod's only route
    beyond its subnet is the service range via the gateway: no default route, so a pod
    reaches nothing outside this host."""
    return {
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": False,
                "ipMasq": False,
                "hairpinMode": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": BRIDGE_ADDRESS}]],
                    "routes": [{"dst": SERVICE_RANGE, "gw": BRIDGE_ADDRESS}],
                    "dataDir": str(paths.cni_ipam_dir),
                },
            }
        ],
    }


def kubelet_config(
    paths: NodePaths,
    *,
    address: str,
    ca_file: Path,
    serving_cert: Path,
    serving_key: Path,
    feature_gates: Mapping[str, bool],
) -> dict[str, Any]:
    """The ``KubeletConfiguration`` (kubelet.config.k8s.io/v1beta1).

    Serving on ``address``:10250 with a certificate from the cluster CA (the API server
    checks it), client certificates and webhook authentication, webhook authorization.
    ``failCgroupV1: false`` (1.35+ refuses cgroup v1 otherwise), cgroupfs driver, no swap
    check, image GC off (imported images cannot be pulled again), no hard eviction, no
    local-storage isolation, pod logs under the state dir, the cluster's DRA gates.
    """
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": KUBELET_HEALTHZ_PORT,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(serving_cert),
        "tlsPrivateKeyFile": str(serving_key),
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {},
        "localStorageCapacityIsolation": False,
        "podLogsDir": str(paths.pod_logs_dir),
        "resolvConf": "/etc/resolv.conf",
        "featureGates": dict(feature_gates),
        "serializeImagePulls": False,
    }


# ---- the host lock and record ---------------------------------------------------------


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def node_lock() -> contextlib.AbstractContextManager[None]:
    """The machine's node lock (:data:`LOCK_FILE`, flock): while it is held no node is
    claimed or released; e.g. to look at the host between two sessions' nodes."""
    return _locked()


def _read_holder() -> dict[str, Any] | None:
    try:
        return json.loads(HOLDER_FILE.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _write_holder(record: Mapping[str, Any]) -> None:
    HOST_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = HOLDER_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(HOLDER_FILE)


def _holder_processes(record: Mapping[str, Any]) -> dict[str, ProcessId]:
    out = {}
    for name, d in (record.get("processes") or {}).items():
        with contextlib.suppress(KeyError, ValueError, TypeError):
            out[name] = ProcessId.from_json(d)
    return out


def holder_alive(record: Mapping[str, Any]) -> list[str]:
    """Names of the holder's recorded processes (``owner``, ``containerd``, ``kubelet``) that run."""
    return [name for name, p in _holder_processes(record).items() if p.alive()]


def describe_holder(record: Mapping[str, Any], alive: Sequence[str]) -> str:
    procs = _holder_processes(record)
    who = ", ".join(f"{n} pid {procs[n].pid}" for n in alive)
    return (
        f"this machine's node is held by {record.get('stateDir')} ({who}; started {record.get('startedAt')}); "
        f"one kubelet per machine: stop it with `tessera cluster down --state-dir {record.get('stateDir')}`"
    )


def claim_host(
    state_dir: Path,
    paths: NodePaths,
    bins: Path,
    *,
    wait: float = 0.0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Take this machine's node for ``state_dir``; return the holder record.

    Under the lock file: when ``holder.json`` names a holder whose processes still run, wait
    up to ``wait`` seconds for it to go, then raise :class:`NodeBusyError` naming it. A holder
    whose processes are all gone (a killed session) is torn down first (:func:`teardown`,
    restoring what it recorded). Then the host is snapshotted (:class:`HostSnapshot`) and
    the new record written, naming this process as ``owner``.
    """
    say = progress or (lambda _m: None)
    deadline = time.monotonic() + wait
    while True:
        with _locked():
            record = _read_holder()
            if record is not None:
                alive = holder_alive(record)
                if not alive:
                    say(
                        f"restoring the host after a node that was not stopped ({record.get('stateDir')})"
                    )
                    problems = teardown(record, client=None, progress=say)
                    if problems:
                        raise NodeError(
                            f"could not restore the host after the node of {record.get('stateDir')}: "
                            f"{'; '.join(problems)}"
                        )
                    record = None
            if record is None:
                owner = ProcessId.of(os.getpid())
                assert owner is not None
                new: dict[str, Any] = {
                    "version": 1,
                    "stateDir": str(state_dir),
                    "startedAt": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                    "processes": {"owner": owner.to_json()},
                    "containerdSocket": str(paths.containerd_socket),
                    "shimBinary": str((bins / "containerd-shim-runc-v2").resolve()),
                    "ctr": str(bins / "ctr"),
                    "mountRoots": [str(state_dir), str(HOST_DIR)],
                    "host": HostSnapshot.take().to_json(),
                }
                _write_holder(new)
                return new
        if time.monotonic() >= deadline:
            raise NodeBusyError(describe_holder(record, alive))
        time.sleep(1.0)


def _update_holder(state_dir: Path, update: Callable[[dict[str, Any]], None]) -> None:
    with _locked():
        record = _read_holder()
        if record is None or record.get("stateDir") != str(state_dir):
            raise NodeError(
                f"{HOLDER_FILE} does not name {state_dir} any more; was the node torn down meanwhile?"
            )
        update(record)
        _write_holder(record)


def record_process(state_dir: Path, name: str, pid: int) -> None:
    """Add ``name`` (``containerd``, ``kubelet``, ``kube-proxy``) with ``pid`` to the holder
    record of ``state_dir``."""
    p = ProcessId.of(pid)
    if p is None:
        return
    _update_holder(
        state_dir, lambda r: r.setdefault("processes", {}).__setitem__(name, p.to_json())
    )


def setup_network(state_dir: Path, local_only_ports: Sequence[int] = ()) -> None:
    """Make the node's network (:func:`nodenet.setup`: guard table, bridge, routes), each
    part written to the holder record of ``state_dir`` before it is made, so that
    :func:`teardown` removes it even after a failure. Raises NodeError naming what on the
    host is in the way (:func:`nodenet.conflicts`) or the command that failed."""
    problems = nodenet.conflicts()
    if problems:
        raise NodeError("the node's network cannot be set up: " + "; ".join(problems))

    def record(made: Mapping[str, Any]) -> None:
        _update_holder(state_dir, lambda r: r.__setitem__("network", json.loads(json.dumps(made))))

    try:
        nodenet.setup(record, local_only_ports)
    except nodenet.NetworkError as e:
        raise NodeError(str(e)) from e


def current_holder() -> dict[str, Any] | None:
    """The machine's holder record (``/run/tessera-node/holder.json``), or None when no node
    holds the machine; :func:`holder_alive` says whether its processes still run."""
    return _read_holder()


def holder_of(state_dir: Path) -> dict[str, Any] | None:
    """The holder record if it names ``state_dir``, else None."""
    record = _read_holder()
    if record is not None and record.get("stateDir") == str(state_dir):
        return record
    return None


def release_host(
    state_dir: Path, client: KubeClient | None, progress: Callable[[str], None] | None = None
) -> list[str]:
    """:func:`teardown` the node of ``state_dir`` (if it holds the machine) and drop the
    record; return the problems (empty when the host is as it was)."""
    if holder_of(state_dir) is None:  # also when /run/tessera-node is not readable (not root)
        return []
    with _locked():
        record = _read_holder()
        if record is None or record.get("stateDir") != str(state_dir):
            return []
        return teardown(record, client=client, progress=progress)


# ---- teardown -------------------------------------------------------------------------


def _ctr(
    record: Mapping[str, Any], *args: str, timeout: float = 20.0
) -> subprocess.CompletedProcess[str] | None:
    sock = Path(record["containerdSocket"])
    if not sock.exists():
        return None
    cmd = [record["ctr"], "--address", str(sock), "--namespace", images.K8S_NAMESPACE, *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _task_ids(record: Mapping[str, Any]) -> list[str] | None:
    proc = _ctr(record, "tasks", "ls", "--quiet")
    if proc is None or proc.returncode != 0:
        return None
    return [t for t in proc.stdout.split() if t]


def delete_all_pods(client: KubeClient, *, timeout: float = 60.0) -> list[str]:
    """Delete every pod of the cluster (grace period 1 s) and wait until the kubelet has
    confirmed each (the API object is gone); pods still there after ``timeout`` are
    force-deleted. Returns the pods force-deleted (``namespace/name``)."""
    pods = client.list("v1", "Pod")
    for pod in pods:
        meta = pod["metadata"]
        with contextlib.suppress(ApiError):
            client.request(
                "DELETE",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                body={"gracePeriodSeconds": 1},
                what=f"Pod {meta['namespace']}/{meta['name']}",
            )
    deadline = time.monotonic() + timeout
    left = pods
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = client.list("v1", "Pod")
    forced = []
    for pod in left:
        meta = pod["metadata"]
        with contextlib.suppress(ApiError):
            client.request(
                "DELETE",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                body={"gracePeriodSeconds": 0},
                what=f"Pod {meta['namespace']}/{meta['name']}",
            )
            forced.append(f"{meta['namespace']}/{meta['name']}")
    return forced


def _kill_cgroup_tree(root: Path) -> None:
    """SIGKILL every process in the cgroup tree ``root`` (a few rounds, for forks)."""
    for _ in range(10):
        pids: set[int] = set()
        for dirpath, _dirs, files in os.walk(root):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError):
                    pids.update(
                        int(x) for x in (Path(dirpath) / "cgroup.procs").read_text().split()
                    )
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def _remove_cgroup_tree(root: Path) -> list[str]:
    problems: list[str] = []
    if not root.is_dir():
        return problems
    _kill_cgroup_tree(root)
    for dirpath, _dirs, _files in os.walk(root, topdown=False):
        for attempt in range(50):
            try:
                os.rmdir(dirpath)
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno != errno.EBUSY or attempt == 49:
                    problems.append(f"cannot remove cgroup {dirpath}: {e.strerror}")
                    break
                time.sleep(0.1)
    return problems


def _log_link_into_state_dir(path: Path, state_dir: Path) -> bool:
    try:
        target = os.readlink(path)
    except OSError:
        return False
    return Path(target).is_relative_to(state_dir)


def _cni_result_of_state_dir(path: Path, state_dir: Path) -> bool:
    """A libcni cached result whose network namespace is under ``state_dir`` (containerd
    keeps its netns mounts there: ``netns_mounts_under_state_dir``); the node's networks are
    ``tessera`` and containerd's ``cni-loopback``."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        netns = json.loads(path.read_text()).get("netns")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(netns, str) and Path(netns).is_relative_to(state_dir)


#: What this node's kubelet and containerd make below the fixed host paths, by directory:
#: a predicate of (file, state dir). Everything else found there was made by something else.
NODE_MADE: dict[str, Callable[[Path, Path], bool]] = {
    # The device manager's socket and checkpoint (constants in the kubelet).
    "/var/lib/kubelet/device-plugins": lambda f, _s: (
        f.name in ("kubelet.sock", "kubelet_internal_checkpoint", "DEPRECATION")
    ),
    # The kubelet's container log links, into the node's pod-log directory.
    "/var/log/containers": _log_link_into_state_dir,
    # libcni's cached results (<network>-<container id>-<interface>) of the node's pods.
    "/var/lib/cni/results": _cni_result_of_state_dir,
}


def _made_by_node(path: Path, state_dir: Path) -> bool:
    """True for a file that this node's kubelet or containerd made (:data:`NODE_MADE`)."""
    rule = NODE_MADE.get(str(path.parent))
    return rule is not None and rule(path, state_dir)


def remove_node_made(root: Path, state_dir: Path) -> tuple[list[str], list[str]]:
    """Remove from ``root`` (a directory that did not exist before the node started) what
    the node made: the files :func:`_made_by_node` names, then every directory left empty,
    deepest first (``rmdir``: a directory that still holds anything stays). Mounts below
    ``root`` are lazily unmounted first. Returns ``(kept, problems)``: the files left
    because something else made them, and what could not be removed."""
    kept: list[str] = []
    problems: list[str] = []
    for m in mounts_under([root]):
        try:
            unmount_lazy(m)
        except OSError as e:
            problems.append(str(e))
    if mounts_under([root]):
        return kept, [*problems, f"cannot clean {root}: still mounted below it"]
    if root.is_symlink() or not root.is_dir():
        if root.exists() or root.is_symlink():
            if _made_by_node(root, state_dir):
                root.unlink()
            else:
                kept.append(str(root))
        return kept, problems
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        d = Path(dirpath)
        for name in filenames + [n for n in dirnames if (d / n).is_symlink()]:
            f = d / name
            if _made_by_node(f, state_dir):
                try:
                    f.unlink()
                except FileNotFoundError:
                    pass
                except OSError as e:
                    problems.append(f"cannot remove {f}: {e.strerror}")
            else:
                kept.append(str(f))
        try:
            d.rmdir()
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                problems.append(f"cannot remove {d}: {e.strerror}")
    return sorted(kept), problems


def teardown(
    record: Mapping[str, Any],
    *,
    client: KubeClient | None,
    progress: Callable[[str], None] | None = None,
) -> list[str]:
    """Stop a node and restore the host from its holder ``record``; return what could not be
    restored (one line each; empty when the host is as it was, and then the holder record is
    removed; otherwise it stays, so that the next ``down`` or ``up`` retries). Every step
    runs even when an earlier one failed:

    1. with ``client`` (the API server still runs): delete every pod and wait until the
       kubelet confirmed it (containers stopped, DRA claims unprepared);
    2. wait until containerd has no task left (``ctr -n k8s.io tasks ls``), else kill them;
    3. note the shims of this containerd (executable and ``-address``), then stop
       kube-proxy, the kubelet, containerd and those shims (and any shim of this containerd
       that started meanwhile), each by its recorded pid, start time and executable
       (SIGTERM, SIGKILL after 10 s);
    4. SIGKILL anything left in the ``kubepods`` cgroups this node created;
    5. unmount (lazily, deepest first) everything under the state dir and /run/tessera-node;
    6. remove those ``kubepods`` cgroups depth-first in every hierarchy;
    7. restore the sysctls that differ from the saved values;
    8. the network (:func:`nodenet.teardown`): the routes ``up`` added, the bridge if it did
       not exist before, kube-proxy's nftables tables, then the guard table;
    9. remove the files the node made in the fixed host paths (:data:`NODE_MADE`), and below
       each one that did not exist before, every directory left empty
       (:func:`remove_node_made`); anything else stays, named in a progress line;
    10. remove the shim socket dir, the holder record and /run/tessera-node.
    """
    say = progress or (lambda _m: None)
    problems: list[str] = []
    host = HostSnapshot.from_json(record.get("host") or {})
    procs = _holder_processes(record)

    if client is not None:
        say("deleting pods")
        try:
            forced = delete_all_pods(client)
            if forced:
                say(
                    f"pods not confirmed by the kubelet within 60 s, force-deleted: {', '.join(forced)}"
                )
        except ApiError as e:
            say(f"could not delete pods: {e}")
    containerd = procs.get("containerd")
    if containerd is not None and containerd.alive():
        deadline = time.monotonic() + 30
        tasks = _task_ids(record)
        while tasks and time.monotonic() < deadline:
            time.sleep(0.5)
            tasks = _task_ids(record)
        for task in tasks or []:
            _ctr(record, "tasks", "kill", "--signal", "SIGKILL", task)
        for task in tasks or []:
            for _ in range(20):
                done = _ctr(record, "tasks", "delete", task)
                if done is None or done.returncode == 0 or "not found" in done.stderr:
                    break
                time.sleep(0.25)
    shims = (
        find_shims(Path(record["shimBinary"]), Path(record["containerdSocket"]))
        if record.get("shimBinary")
        else []
    )

    for name in ("kube-proxy", "kubelet", "containerd"):
        p = procs.get(name)
        if p is not None and stop_process(p):
            say(f"stopped {name}")
    if record.get("shimBinary"):
        # A sandbox the kubelet asked for just before it stopped (a Deployment's new pod
        # after step 1) can start its shim while containerd shuts down: look again.
        known = {s.pid for s in shims}
        shims += [
            s
            for s in find_shims(Path(record["shimBinary"]), Path(record["containerdSocket"]))
            if s.pid not in known
        ]
    for shim in shims:
        stop_process(shim, grace=5.0)
    left = [s.pid for s in shims if s.alive()]
    if left:
        problems.append(f"containerd shims still running: pids {left}")

    for cg in host.absent_cgroups:
        _kill_cgroup_tree(Path(cg))

    roots = [Path(r) for r in record.get("mountRoots") or ()]
    for m in mounts_under(roots):
        try:
            unmount_lazy(m)
        except OSError as e:
            problems.append(str(e))
    left_mounts = mounts_under(roots)
    if left_mounts:
        problems.append(f"still mounted: {', '.join(left_mounts[:5])}")

    for cg in host.absent_cgroups:
        problems += _remove_cgroup_tree(Path(cg))

    for name, before in host.sysctls.items():
        now = read_sysctls([name]).get(name)
        if now is not None and now != before:
            try:
                _sysctl_path(name).write_text(before + "\n")
            except OSError as e:
                problems.append(f"cannot restore sysctl {name}={before} (now {now}): {e.strerror}")

    problems += nodenet.teardown(
        record.get("network") or {},
        bridge_absent=host.bridge_absent,
        tables_present=host.nft_tables,
    )

    state_dir = Path(str(record.get("stateDir") or "/nonexistent"))
    for d in NODE_MADE:  # also where the directory was there before (files left by a crash)
        with contextlib.suppress(OSError):
            for f in Path(d).iterdir():
                if _made_by_node(f, state_dir):
                    with contextlib.suppress(FileNotFoundError):
                        f.unlink()
    for path in host.absent_paths:
        if Path(path).exists() or Path(path).is_symlink():
            kept, trouble = remove_node_made(Path(path), state_dir)
            problems += trouble
            if kept:
                say(
                    f"kept {len(kept)} file(s) below {path} that the node did not make: "
                    + ", ".join(kept[:10])
                    + (" ..." if len(kept) > 10 else "")
                )

    shutil.rmtree(SHIM_SOCKET_DIR, ignore_errors=True)
    if not problems:
        # Kept otherwise: the next claim_host (or down) retries from the same record.
        current = _read_holder()
        if current is not None and current.get("stateDir") == record.get("stateDir"):
            HOLDER_FILE.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                HOST_DIR.rmdir()
    return problems


# ---- what tests and DRA plugins use ---------------------------------------------------


@dataclass(frozen=True)
class NodeInfo:
    """A running real node, as recorded in ``state.json`` (``node``).

    ``name``: the Node (this machine's hostname). ``kubelet_root_dir``: the kubelet's
    ``--root-dir``. A DRA kubelet plugin for driver ``D`` serves its DRA socket in
    :meth:`plugin_dir` (``<root>/plugins/D``) and its registration socket in
    ``plugins_registry_dir`` (``<root>/plugins_registry``). ``cdi_spec_dir``: where the
    plugin writes CDI specs (containerd's ``cdi_spec_dirs``). ``containerd_socket`` and
    ``ctr`` reach containerd (namespace ``k8s.io``); ``images_dir`` holds image archives;
    ``kubelet_url`` is the kubelet's own HTTPS endpoint (port 10250; the API server's node
    proxy refuses loopback addresses, so metrics are read there).
    """

    name: str
    kubelet_root_dir: Path
    plugins_dir: Path
    plugins_registry_dir: Path
    cdi_spec_dir: Path
    containerd_socket: Path
    ctr: Path
    images_dir: Path
    pod_logs_dir: Path
    sandbox_image: str
    kubelet_url: str

    def plugin_dir(self, driver: str) -> Path:
        """``<kubelet root>/plugins/<driver>``: the DRA plugin's socket directory."""
        return self.plugins_dir / driver

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kubeletRootDir": str(self.kubelet_root_dir),
            "pluginsDir": str(self.plugins_dir),
            "pluginsRegistryDir": str(self.plugins_registry_dir),
            "cdiSpecDir": str(self.cdi_spec_dir),
            "containerdSocket": str(self.containerd_socket),
            "containerdNamespace": images.K8S_NAMESPACE,
            "ctr": str(self.ctr),
            "imagesDir": str(self.images_dir),
            "podLogsDir": str(self.pod_logs_dir),
            "sandboxImage": self.sandbox_image,
            "kubeletURL": self.kubelet_url,
            "hostRecord": str(HOLDER_FILE),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NodeInfo:
        return cls(
            d["name"],
            Path(d["kubeletRootDir"]),
            Path(d["pluginsDir"]),
            Path(d["pluginsRegistryDir"]),
            Path(d["cdiSpecDir"]),
            Path(d["containerdSocket"]),
            Path(d["ctr"]),
            Path(d["imagesDir"]),
            Path(d["podLogsDir"]),
            d["sandboxImage"],
            d["kubeletURL"],
        )

    def build_image(
        self,
        name: str,
        files: Mapping[str, images.FileLike],
        *,
        tag: str = "latest",
        **kwargs: Any,
    ) -> images.Image:
        """Build ``tessera.local/<name>:<tag>`` from ``files`` (see :func:`images.build_image`
        for the files and keyword arguments) and import it into this node's containerd.
        Pods use the returned ``ref`` with ``imagePullPolicy: Never``."""
        image = images.build_image(images.image_ref(name, tag), files, self.images_dir, **kwargs)
        images.import_image(self.ctr, self.containerd_socket, image)
        return image


def kubelet_metric_lines(kubelet: KubeClient, metric: str) -> list[str]:
    """Lines of the kubelet's ``/metrics`` for ``metric`` (``kubelet``: a client of
    :attr:`NodeInfo.kubelet_url`, e.g. ``Cluster.kubelet_client()``)."""
    text = kubelet.raw_get("/metrics")
    return [
        ln
        for ln in str(text).splitlines()
        if ln.startswith(metric + "{") or ln.startswith(metric + " ")
    ]


def plugin_registered(kubelet: KubeClient, info: NodeInfo, driver: str) -> bool:
    """True once the kubelet's plugin manager has registered a plugin whose registration
    socket is in ``plugins_registry`` and named after ``driver`` (``<driver>-reg.sock``, as
    the DRA kubelet-plugin library names it): the kubelet metric
    ``plugin_manager_total_plugins{socket_path=...,state="actual_state_of_world"}``."""
    label = f'socket_path="{info.plugins_registry_dir}/{driver}-reg.sock"'
    for ln in kubelet_metric_lines(kubelet, "plugin_manager_total_plugins"):
        if label in ln and 'state="actual_state_of_world"' in ln and not ln.endswith(" 0"):
            return True
    return False
