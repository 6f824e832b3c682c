"""This machine as a real node: containerd 2.x and a kubelet v1.37 run pods from locally built
images; ``tessera cluster down`` leaves the host as it was.

Needs root (marker ``node``); one kubelet per machine (the fixtures wait for the machine's
node lock).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tessera.kube.client import KubeClient
from tessera.kube.workloads import delete_pod, wait_pod_running
from tessera.localcluster import build
from tessera.localcluster.cluster import Cluster
from tessera.localcluster.node import (
    BRIDGE,
    current_holder,
    describe_holder,
    holder_alive,
    kubelet_metric_lines,
    node_lock,
    plugin_registered,
)
from tessera.localcluster.nodenet import BRIDGE_ADDRESS, GUARD_TABLE, KUBE_PROXY_TABLES

from .conftest import NODE_LOCK_WAIT, LiveNode, node_prerequisites

pytestmark = [pytest.mark.cluster, pytest.mark.node]

#: What the kubelet sets at start (``setupKernelTunables``), read straight from /proc/sys.
KUBELET_SYSCTLS = {"vm/overcommit_memory": "1", "kernel/panic": "10", "kernel/panic_on_oops": "1"}
#: What the network must leave alone while the node runs: forwarding (on for the bridge
#: only), kube-proxy's conntrack and localnet settings, the bridge netfilter switch.
NETWORK_SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/forwarding",
    "net/ipv4/conf/eth0/forwarding",
    "net/ipv4/conf/all/route_localnet",
    "net/ipv6/conf/all/forwarding",
    "net/netfilter/nf_conntrack_max",
    "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
    "net/netfilter/nf_conntrack_tcp_be_liberal",
    "net/netfilter/nf_conntrack_udp_timeout",
    "net/netfilter/nf_conntrack_udp_timeout_stream",
    "net/bridge/bridge-nf-call-iptables",
)
#: Host paths the kubelet or containerd create whatever their root and state dirs are.
FIXED_PATHS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/lib/cni",
    "/run/containerd",
    "/run/tessera-node/s",
)


def sysctls() -> dict[str, str]:
    return {k: Path("/proc/sys", k).read_text().strip() for k in KUBELET_SYSCTLS}


def network_sysctls() -> dict[str, str]:
    return {
        k: Path("/proc/sys", k).read_text().strip()
        for k in NETWORK_SYSCTLS
        if Path("/proc/sys", k).exists()
    }


def _tool(name: str) -> str:
    exe = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    assert exe is not None, f"{name} not found"
    return exe


def nft_ruleset() -> list[str]:
    """``nft -s list ruleset`` (stateless: without counter values)."""
    proc = subprocess.run(
        [_tool("nft"), "-s", "list", "ruleset"], capture_output=True, text=True, check=True
    )
    return proc.stdout.splitlines()


def routes() -> dict[str, list[str]]:
    """Every IPv4 and IPv6 route of every table, and the policy rules (timers left out)."""
    out = {}
    for name, args in (
        ("ip -4 route", ["-4", "route", "show", "table", "all"]),
        ("ip -6 route", ["-6", "route", "show", "table", "all"]),
        ("ip rule", ["rule", "show"]),
    ):
        text = subprocess.run(
            [_tool("ip"), *args], capture_output=True, text=True, check=True
        ).stdout
        out[name] = [re.sub(r" expires \d+sec", "", ln).rstrip() for ln in text.splitlines()]
    return out


def mounts_below(root: Path) -> list[str]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == str(root) or point.startswith(f"{root}/"):
            out.append(point)
    return out


def kubepods_cgroups() -> list[str]:
    base = Path("/sys/fs/cgroup")
    found = [str(d) for d in base.glob("*/kubepods")]
    if (base / "kubepods").is_dir():
        found.append(str(base / "kubepods"))
    return sorted(found)


def our_processes(bins: Path) -> list[tuple[int, str]]:
    """Running processes whose executable is one of our kubelet/containerd/shim binaries."""
    wanted = {
        str((bins / b).resolve())
        for b in ("kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2")
    }
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                exe = os.readlink(entry / "exe").removesuffix(" (deleted)")
            except OSError:
                continue
            if exe in wanted:
                out.append((int(entry.name), exe))
    return out


def firewall() -> dict[str, list[str]]:
    """``iptables-save``/``ip6tables-save`` without comments (empty where not installed)."""
    out = {}
    for tool in ("iptables-save", "ip6tables-save"):
        exe = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")
        if exe is not None:
            text = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
            out[tool] = [ln for ln in text.splitlines() if not ln.startswith("#")]
    return out


def host_state(state_dir: Path, bins: Path) -> dict[str, object]:
    return {
        "firewall": firewall(),
        "nft ruleset": nft_ruleset(),
        "routes": routes(),
        "network sysctls": network_sysctls(),
        "sysctls": sysctls(),
        "fixed paths that exist": [p for p in FIXED_PATHS if Path(p).exists()],
        "kubepods cgroups": kubepods_cgroups(),
        f"bridge {BRIDGE}": Path("/sys/class/net", BRIDGE).exists(),
        "mounts under the state dir": mounts_below(state_dir),
        "kubelet/containerd/shim processes": our_processes(bins),
        # Another session's node may claim the machine the moment ours is down: only ours counts.
        "node holder record of this state dir": (current_holder() or {}).get("stateDir")
        == str(state_dir),
    }


def sleeper_pod(
    name: str, namespace: str, image: str, command: list[str], env: dict[str, str] | None = None
) -> dict:
    container: dict = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": command,
    }
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [container]},
    }


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tessera", "cluster", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def up_when_the_machine_is_free(
    state: Path, bins: Path
) -> tuple[dict[str, object], subprocess.CompletedProcess[str]]:
    """Wait (up to NODE_LOCK_WAIT) until no other session's node holds this machine, stop a
    node left behind by a killed session, take the host's state, then `up --kubelet`; again
    if another session took the machine in between. Returns the state before and the result."""
    deadline = time.monotonic() + NODE_LOCK_WAIT
    while True:
        record = current_holder()
        if record is not None and not holder_alive(record):
            cli("down", "--state-dir", str(record["stateDir"]))
            continue
        if record is not None:
            if time.monotonic() > deadline:
                pytest.fail(
                    f"this machine's node stayed busy for {NODE_LOCK_WAIT:.0f} s: "
                    f"{describe_holder(record, holder_alive(record))}"
                )
            time.sleep(2)
            continue
        before = host_state(state, bins)
        assert before["kubelet/containerd/shim processes"] == [], (
            "a node of this checkout is already running"
        )
        up = cli("up", "--kubelet", "--no-build", "--state-dir", str(state))
        if up.returncode == 0 or "is held by" not in up.stderr:
            return before, up


def host_state_when_the_machine_is_free(state: Path, bins: Path) -> dict[str, object]:
    """The host's state, taken under the node lock while no node holds this machine: another
    session's node may claim it the moment ours is down (its bridge, routes and tables are
    not ours); then wait (up to NODE_LOCK_WAIT) until that one is down too."""
    deadline = time.monotonic() + NODE_LOCK_WAIT
    while True:
        with node_lock():
            if current_holder() is None:
                return host_state(state, bins)
        if time.monotonic() > deadline:
            pytest.fail(f"this machine's node stayed busy for {NODE_LOCK_WAIT:.0f} s after down")
        time.sleep(2)


@pytest.mark.host_restore
def test_down_restores_the_host(tmp_path: Path) -> None:
    """`tessera cluster up --kubelet` changes the host (sysctls, kubepods cgroups, mounts,
    shims, bridge, fixed paths) while a pod runs; a second `up --kubelet` is refused naming
    the holder; `tessera cluster down` puts every one of those back as it was."""
    problems = node_prerequisites()
    if problems:
        pytest.fail("cannot run a real node (deselect with -m 'not node'): " + "; ".join(problems))
    bins = build.bin_dir()
    state = tmp_path / "node"
    before, up = up_when_the_machine_is_free(state, bins)
    #: A directory the node creates (absent before) and what it makes there.
    created = {"/var/lib/kubelet": "device-plugins", "/var/lib/cni": "results"}
    other_root = next((d for d in created if d not in before["fixed paths that exist"]), None)  # type: ignore[operator]
    other = Path(str(other_root), "other-package", "data")
    other_made = False
    try:
        assert up.returncode == 0, up.stderr
        c = Cluster(state)
        info = c.node
        assert info is not None and info.name == socket.gethostname().lower()

        second = cli(
            "up", "--kubelet", "--no-build", "--state-dir", str(tmp_path / "second"), timeout=60
        )
        assert second.returncode == 1
        message = second.stderr.strip()
        assert len(message.splitlines()) == 1, message
        assert (
            f"held by {state}" in message and f"tessera cluster down --state-dir {state}" in message
        )
        assert not (tmp_path / "second" / "state.json").exists()

        client: KubeClient = c.client()
        image = info.build_image("restore-check", {"/etc/marker": b"x\n"})
        client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "restore"}})
        client.create(sleeper_pod("sleeper", "restore", image.ref, ["sleep", "3600"]))
        wait_pod_running(client, "sleeper", "restore")
        during = host_state(state, bins)
        assert during["sysctls"] == KUBELET_SYSCTLS
        assert during["kubepods cgroups"], "the kubelet made no kubepods cgroup"
        mounts: list[str] = during["mounts under the state dir"]  # type: ignore[assignment]
        assert any("/rootfs" in m for m in mounts), mounts
        exes = {Path(exe).name for _pid, exe in during["kubelet/containerd/shim processes"]}  # type: ignore[attr-defined]
        assert exes == {"kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2"}
        assert during[f"bridge {BRIDGE}"] is True
        assert during["node holder record of this state dir"] is True
        assert "/run/tessera-node/s" in during["fixed paths that exist"]  # type: ignore[operator]
        assert (
            during["firewall"] == before["firewall"]
        )  # neither kubelet nor kube-proxy saw iptables
        # The network: forwarding on the bridge only, no sysctl of kube-proxy's touched.
        assert during["network sysctls"] == before["network sysctls"]
        assert Path(f"/proc/sys/net/ipv4/conf/{BRIDGE}/forwarding").read_text().strip() == "1"
        ruleset = "\n".join(during["nft ruleset"])  # type: ignore[arg-type]
        for family, table in (GUARD_TABLE, *KUBE_PROXY_TABLES):
            assert f"table {family} {table} {{" in ruleset
        v4 = during["routes"]["ip -4 route"]  # type: ignore[index]
        assert "unreachable 10.213.0.0/16" in v4
        assert f"10.96.0.0/16 dev {BRIDGE} scope link src {BRIDGE_ADDRESS}" in v4
        # Another package fills a directory the node created meanwhile: down keeps its file.
        other_made = other_root is not None and Path(other_root, created[other_root]).exists()
        if other_made:
            other.parent.mkdir(parents=True, exist_ok=True)
            other.write_text("not the node's\n")
    finally:
        down = cli("down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr
    assert "kubelet" in down.stdout and "containerd" in down.stdout and "kube-proxy" in down.stdout
    if other_made:
        assert other.read_text() == "not the node's\n"
        assert f"that the node did not make: {other}" in down.stderr, down.stderr
        assert other_root is not None
        assert not Path(other_root, created[other_root]).exists()  # the node's part is gone
        shutil.rmtree(other_root)  # the "other package's" part, which the test made
    after = host_state_when_the_machine_is_free(state, bins)
    assert after == before


def test_node_registered_ready_untainted(kube_node: LiveNode) -> None:
    node = kube_node.client.get("v1", "Node", kube_node.name)
    assert kube_node.name == socket.gethostname().lower()
    assert node["spec"].get("taints") is None
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["reason"] == "KubeletReady"
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.37.2"
    assert info["containerRuntimeVersion"] == "containerd://2.4.2"  # CRI drops the "v" of v2.4.2
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["Hostname"] == kube_node.name
    assert kube_node.cdi_spec_dir.is_dir() and kube_node.plugins_registry_dir.is_dir()
    assert (
        kube_node.plugin_dir("gpu.tessera.dev")
        == kube_node.kubelet_root_dir / "plugins" / "gpu.tessera.dev"
    )
    # The kubelet's own endpoint (client certificate, serving certificate from the cluster CA).
    kubelet = kube_node.cluster.kubelet_client()
    assert kubelet_metric_lines(kubelet, "kubelet_node_name") == [
        f'kubelet_node_name{{node="{kube_node.name}"}} 1'
    ]
    assert (
        plugin_registered(kubelet, kube_node.node, "gpu.tessera.dev") is False
    )  # no DRA plugin runs here


def test_pod_runs_from_a_local_image(kube_node: LiveNode, node_namespace: str) -> None:
    """A pod from an image built here (busybox plus a file and an env var) runs on the real
    node; exec reads the file and both env vars inside the container; logs come back; the
    pod is deleted once the kubelet has stopped it."""
    greeting = b"hello from a locally built image\n"
    image = kube_node.image(
        "e2e-hello", {"/etc/tessera/greeting": greeting}, env={"FROM_IMAGE": "baked-in"}
    )
    script = "echo started with FROM_IMAGE=$FROM_IMAGE; cat /etc/tessera/greeting; exec sleep 3600"
    pod = sleeper_pod(
        "hello",
        node_namespace,
        image.ref,
        ["sh", "-c", script],
        env={"FROM_POD": "from-the-pod-spec"},
    )
    kube_node.client.create(pod)
    running = wait_pod_running(kube_node.client, "hello", node_namespace)
    assert running["spec"]["nodeName"] == kube_node.name
    status = running["status"]["containerStatuses"][0]
    assert status["image"] == image.ref
    assert status["imageID"].endswith(image.digest) or status["imageID"].endswith(
        image.config_digest
    ), status["imageID"]

    assert (
        kube_node.exec("hello", node_namespace, "cat", "/etc/tessera/greeting").encode() == greeting
    )
    env = kube_node.exec("hello", node_namespace, "sh", "-c", 'echo "$FROM_IMAGE $FROM_POD"')
    assert env == "baked-in from-the-pod-spec\n"
    assert (
        kube_node.logs("hello", node_namespace)
        == "started with FROM_IMAGE=baked-in\n" + greeting.decode()
    )

    delete_pod(kube_node.client, "hello", node_namespace, grace_period=2, wait=60)
    tasks = subprocess.run(
        [
            str(kube_node.node.ctr),
            "--address",
            str(kube_node.node.containerd_socket),
            "-n",
            "k8s.io",
            "tasks",
            "ls",
            "-q",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert status["containerID"].removeprefix("containerd://") not in tasks
