"""The real node's network: a bridge, two routes, a guard table and kube-proxy (nftables).

``tessera cluster up --kubelet`` gives pods what a real cluster gives them without any
packet for the cluster's ranges leaving this machine:

* the bridge :data:`BRIDGE` with the gateway address :data:`BRIDGE_ADDRESS` (on
  :data:`POD_SUBNET`), made by :func:`setup` before any component starts; the CNI bridge
  plugin attaches the pods to it (``isGateway: false``: the address is already there, and
  the plugin would otherwise switch on ``net.ipv4.ip_forward`` for every interface);
* routes, also before anything starts: the service range (:data:`SERVICE_RANGE`) onto the
  bridge with the bridge address as source (kube-proxy's DNAT in the output hook re-routes
  the addresses it handles; any other address in the range is resolved by ARP on the bridge,
  where nothing answers), and an ``unreachable`` route for the rest of :data:`POD_RANGE`
  (a connect() there fails at once with ``EHOSTUNREACH``);
* forwarding on the bridge alone (``net.ipv4.conf.tessera0.forwarding=1``; the global
  ``net.ipv4.ip_forward`` stays as it is): a pod's connection to a Service whose endpoint is
  another pod is DNATed by the host and leaves by the bridge it came in by;
* the guard table :data:`GUARD_TABLE` (:func:`guard_ruleset`): counts and drops every packet
  for the service and pod ranges that would leave by an interface other than the bridge and
  ``lo`` (output, postrouting, also by its destination before DNAT), every packet that the
  host would forward from the bridge to another interface, and every packet arriving from
  another interface for those ranges or for the API server's port (which listens on all
  addresses: host clients use 127.0.0.1, pods reach it at the bridge address through the
  ``kubernetes`` Service); :func:`guard_counters` reads the counters;
* kube-proxy in nftables mode (:func:`kube_proxy_config`), which makes the tables
  :data:`KUBE_PROXY_TABLES`; it sets no sysctl (conntrack settings all 0: skipped) and
  serves NodePorts on the bridge address only.

:func:`conflicts` says what on the host stands in the way (checked before anything is
changed); :func:`teardown` removes what :func:`setup` made, and kube-proxy's tables. The
commands are ``ip`` (iproute2) and ``nft`` (nftables); both run as root.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tessera.localcluster.pki import SERVICE_CIDR

#: The pod bridge and its (gateway) address; the pods' subnet on it.
BRIDGE = "tessera0"
BRIDGE_ADDRESS = "10.213.0.1"
POD_SUBNET = "10.213.0.0/24"
#: The whole pod range: what is not on the bridge is unreachable.
POD_RANGE = "10.213.0.0/16"
#: The API server's ``--service-cluster-ip-range``: routed onto the bridge.
SERVICE_RANGE = SERVICE_CIDR
#: Both ranges: nothing for them may leave the host.
LOCAL_RANGES = (SERVICE_RANGE, POD_RANGE)

#: (family, name) of the guard table this module makes.
GUARD_TABLE = ("inet", "tessera-guard")
#: (family, name) of the tables kube-proxy's nftables mode makes (it does not remove them).
KUBE_PROXY_TABLES = (("ip", "kube-proxy"), ("ip6", "kube-proxy"))
#: kube-proxy's fixed local ports (healthz, metrics), bound on 127.0.0.1.
KUBE_PROXY_HEALTHZ_PORT = 10256
KUBE_PROXY_METRICS_PORT = 10249
#: The sysctl :func:`setup` sets on the bridge (it goes with the bridge).
BRIDGE_FORWARDING = f"net/ipv4/conf/{BRIDGE}/forwarding"

_SBIN = "/usr/sbin:/sbin:/usr/bin:/bin"


class NetworkError(RuntimeError):
    """The node's network could not be set up; the message names the command and its error."""


def ip_binary() -> str | None:
    """The ``ip`` command (iproute2), or None."""
    return shutil.which("ip") or shutil.which("ip", path=_SBIN)


def nft_binary() -> str | None:
    """The ``nft`` command (nftables), or None."""
    return shutil.which("nft") or shutil.which("nft", path=_SBIN)


def _run(argv: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            list(argv), input=stdin, capture_output=True, text=True, check=False, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(list(argv), 127, "", str(e))


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return _run([ip_binary() or "ip", *args])


def _nft(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return _run([nft_binary() or "nft", *args], stdin)


def _must(proc: subprocess.CompletedProcess[str]) -> None:
    if proc.returncode != 0:
        raise NetworkError(
            f"`{' '.join(proc.args)}` failed: {proc.stderr.strip() or proc.stdout.strip()}"
        )


def link_exists(name: str = BRIDGE) -> bool:
    return Path("/sys/class/net", name).exists()


def nft_tables() -> set[tuple[str, str]]:
    """Every nftables table on the host as (family, name); empty when ``nft`` is missing."""
    proc = _nft("-j", "list", "tables")
    if proc.returncode != 0:
        return set()
    out = set()
    for item in json.loads(proc.stdout or "{}").get("nftables", []):
        t = item.get("table")
        if t:
            out.add((str(t["family"]), str(t["name"])))
    return out


def our_tables() -> tuple[tuple[str, str], ...]:
    """The tables this node makes: the guard's and kube-proxy's."""
    return (GUARD_TABLE, *KUBE_PROXY_TABLES)


def _json(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    if proc.returncode != 0 or not proc.stdout.strip():
        return []
    data = json.loads(proc.stdout)
    return data if isinstance(data, list) else []


def conflicts() -> list[str]:
    """What on this host keeps :func:`setup` from working, one line each (empty when free):
    an existing :data:`BRIDGE`, an address or a route inside the service or pod range (a
    route as specific as ours would take their traffic), one of :func:`our_tables`."""
    problems = []
    if ip_binary() is None:
        problems.append("ip not found: apt-get install iproute2 (tools/kube/node-deps.sh)")
    if nft_binary() is None:
        problems.append(
            "nft not found (kube-proxy's nftables mode and the egress guard use it): "
            "apt-get install nftables (tools/kube/node-deps.sh)"
        )
    if problems:
        return problems
    if link_exists(BRIDGE):
        problems.append(
            f"a network interface {BRIDGE} already exists (left by a node that was not stopped? "
            f"check `ip addr show {BRIDGE}`, then `ip link delete {BRIDGE}`)"
        )
    ranges = [ipaddress.ip_network(r) for r in LOCAL_RANGES]
    for a in _json(_ip("-j", "-4", "addr", "show")):
        for info in a.get("addr_info") or []:
            addr = ipaddress.ip_address(info.get("local", "0.0.0.0"))
            for r in ranges:
                if addr in r:
                    problems.append(
                        f"{a.get('ifname')} has the address {addr}, inside the node's range {r}"
                    )
    for route in _json(_ip("-j", "-4", "route", "show", "table", "all")):
        dst = route.get("dst")
        if not dst or dst == "default" or route.get("table") == "local":
            continue
        net = ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False)
        for r in ranges:
            if net.subnet_of(r):  # type: ignore[arg-type]
                where = route.get("dev") or route.get("type") or "?"
                problems.append(
                    f"the host already routes {dst} ({where}), inside the node's range {r}"
                )
    present = nft_tables()
    for family, name in our_tables():
        if (family, name) in present:
            problems.append(
                f"the nftables table {family} {name} already exists (another kube-proxy or node "
                f"on this machine? if it is a leftover: `nft delete table {family} {name}`)"
            )
    return problems


def guard_ruleset(local_only_ports: Sequence[int] = ()) -> str:
    """The guard table (``nft -f`` input). Rules carry a comment (``egress-*``: packets that
    would have left the host; ``ingress-*``: packets that came from another interface) and a
    counter. Priorities put the output and postrouting chains after every NAT hook (DNAT at
    -100, SNAT at 100), so they see the final destination and interface."""
    family, name = GUARD_TABLE
    local = f'{{ "lo", "{BRIDGE}" }}'
    ports = ", ".join(str(p) for p in local_only_ports)
    elements = f"\n    elements = {{ {ports} }}" if ports else ""
    ranges = ", ".join(LOCAL_RANGES)
    return f"""table {family} {name} {{
  comment "tessera cluster up --kubelet: nothing for the cluster's ranges leaves this host"
  set ranges {{
    type ipv4_addr
    flags interval
    elements = {{ {ranges} }}
  }}
  set local-only-ports {{
    type inet_service{elements}
  }}
  chain output {{
    type filter hook output priority 300; policy accept;
    oifname != {local} ip daddr @ranges counter drop comment "egress-output"
  }}
  chain postrouting {{
    type filter hook postrouting priority 300; policy accept;
    oifname != {local} ip daddr @ranges counter drop comment "egress-postrouting"
    oifname != {local} ct original ip daddr @ranges counter drop comment "egress-postrouting-dnat"
  }}
  chain forward {{
    type filter hook forward priority 0; policy accept;
    iifname "{BRIDGE}" oifname != "{BRIDGE}" counter drop comment "egress-forward"
    oifname "{BRIDGE}" iifname != "{BRIDGE}" counter drop comment "ingress-forward"
  }}
  chain input {{
    type filter hook input priority 0; policy accept;
    iifname != {local} ip daddr @ranges counter drop comment "ingress-ranges"
    iifname != {local} tcp dport @local-only-ports counter drop comment "ingress-local-only-ports"
  }}
}}
"""


def guard_local_only_port(port: int) -> None:
    """Drop TCP connections to ``port`` arriving from any interface but ``lo`` and the
    bridge (the API server listens on all addresses). Raises NetworkError."""
    family, name = GUARD_TABLE
    _must(_nft("add", "element", family, name, "local-only-ports", f"{{ {port} }}"))


def guard_counters() -> dict[str, int]:
    """Packets each guard rule dropped, by its comment (``egress-output``, ...); empty when
    the table does not exist."""
    family, name = GUARD_TABLE
    proc = _nft("-j", "list", "table", family, name)
    if proc.returncode != 0:
        return {}
    out: dict[str, int] = {}
    for item in json.loads(proc.stdout).get("nftables", []):
        rule = item.get("rule")
        if not rule or not rule.get("comment"):
            continue
        for e in rule.get("expr") or []:
            if "counter" in e:
                out[str(rule["comment"])] = int(e["counter"]["packets"])
    return out


def routes() -> list[list[str]]:
    """The routes :func:`setup` adds, as ``ip route add`` arguments."""
    return [
        ["unreachable", POD_RANGE],
        [SERVICE_RANGE, "dev", BRIDGE, "src", BRIDGE_ADDRESS],
    ]


def setup(
    record: Callable[[Mapping[str, Any]], None], local_only_ports: Sequence[int] = ()
) -> None:
    """Make the guard table, the bridge with its address and forwarding, and the routes, in
    that order (the guard first: it drops whatever a half-made network would send out).
    ``record`` is called with what is about to be made, before it is made, so that a
    teardown after a failure (or a killed process) removes it. Raises NetworkError naming
    the failing command; :func:`conflicts` should have been checked first."""
    made: dict[str, Any] = {"guardTable": list(GUARD_TABLE), "routes": []}
    record(made)
    _must(_nft("-f", "-", stdin=guard_ruleset(local_only_ports)))
    made["bridge"] = BRIDGE
    record(made)
    _must(_ip("link", "add", BRIDGE, "type", "bridge"))
    _must(_ip("addr", "add", f"{BRIDGE_ADDRESS}/{POD_SUBNET.split('/')[1]}", "dev", BRIDGE))
    try:
        Path("/proc/sys", BRIDGE_FORWARDING).write_text("1\n")
    except OSError as e:
        raise NetworkError(
            f"cannot set {BRIDGE_FORWARDING.replace('/', '.')}=1: {e.strerror}"
        ) from e
    _must(_ip("link", "set", BRIDGE, "up"))
    for r in routes():
        made["routes"].append(r)
        record(made)
        _must(_ip("route", "add", *r))


def route_present(r: Sequence[str]) -> bool:
    """True when the main table has the route ``r`` (:func:`routes` form) to its prefix."""
    prefix = r[1] if r[0] == "unreachable" else r[0]
    for route in _json(_ip("-j", "-4", "route", "show", "exact", prefix)):
        if (r[0] == "unreachable") == (route.get("type") == "unreachable"):
            return True
    return False


def teardown(
    made: Mapping[str, Any],
    *,
    bridge_absent: bool,
    tables_present: Sequence[Sequence[str]],
) -> list[str]:
    """Remove what :func:`setup` recorded in ``made`` and kube-proxy's tables: the routes,
    the bridge (only when ``bridge_absent``: it did not exist before), then kube-proxy's
    tables and the guard table (last, so that it drops what a half-removed network would
    send out), except tables in ``tables_present`` (they existed before). Returns what could
    not be removed, one line each."""
    problems: list[str] = []
    for r in reversed(made.get("routes") or []):
        if route_present(r):
            proc = _ip("route", "del", *r)
            if proc.returncode != 0 and route_present(r):
                problems.append(f"ip route del {' '.join(r)}: {proc.stderr.strip()}")
    if bridge_absent and link_exists(BRIDGE):
        proc = _ip("link", "delete", BRIDGE)
        if proc.returncode != 0:
            problems.append(f"ip link delete {BRIDGE}: {proc.stderr.strip()}")
    keep = {(str(t[0]), str(t[1])) for t in tables_present}
    present = nft_tables()
    drop = [t for t in KUBE_PROXY_TABLES if t not in keep]
    guard = made.get("guardTable")
    if guard:
        drop.append((str(guard[0]), str(guard[1])))
    for family, name in drop:
        if (family, name) in present and (family, name) not in keep:
            proc = _nft("delete", "table", family, name)
            if proc.returncode != 0:
                problems.append(f"nft delete table {family} {name}: {proc.stderr.strip()}")
    return problems


def process_path_with_nft(bin_dir: Path, path: str) -> str:
    """``path`` with ``bin_dir`` in front, holding a link to ``nft`` only: kube-proxy's
    nftables mode runs ``nft``, which Debian installs beside iptables (kept off the PATH of
    the node's components). Raises NetworkError when ``nft`` is missing."""
    nft = nft_binary()
    if nft is None:
        raise NetworkError("nft not found: apt-get install nftables (tools/kube/node-deps.sh)")
    bin_dir.mkdir(parents=True, exist_ok=True)
    link = bin_dir / "nft"
    with contextlib.suppress(FileNotFoundError):
        link.unlink()
    os.symlink(nft, link)
    return f"{bin_dir}:{path}"


def kube_proxy_config(*, kubeconfig: Path, node_name: str) -> dict[str, Any]:
    """The ``KubeProxyConfiguration`` (kubeproxy.config.k8s.io/v1alpha1): nftables mode,
    the node's primary address and NodePorts on the bridge address only, health and metrics
    on 127.0.0.1, the pod subnet as cluster CIDR, every Service connection masqueraded (the
    reply of a pod behind a Service then always comes back through the host, whatever
    ``net.bridge.bridge-nf-call-iptables`` says), no conntrack sysctl touched (all 0), no
    OOM score lowered."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node_name,
        "bindAddress": BRIDGE_ADDRESS,
        "healthzBindAddress": f"127.0.0.1:{KUBE_PROXY_HEALTHZ_PORT}",
        "metricsBindAddress": f"127.0.0.1:{KUBE_PROXY_METRICS_PORT}",
        "clusterCIDR": POD_SUBNET,
        "detectLocalMode": "ClusterCIDR",
        "nodePortAddresses": [f"{BRIDGE_ADDRESS}/32"],
        "nftables": {"masqueradeAll": True},
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
            "tcpBeLiberal": False,
            "udpTimeout": "0s",
            "udpStreamTimeout": "0s",
        },
        "oomScoreAdj": 0,
        "enableProfiling": False,
    }
