"""The real node's configuration files and host bookkeeping (tessera.localcluster.node),
without a node."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from tessera.localcluster import node, nodenet
from tessera.localcluster.cluster import FEATURE_GATES


def test_containerd_config_points_everything_into_the_state_dir(tmp_path: Path) -> None:
    paths = node.NodePaths(tmp_path)
    cfg = tomllib.loads(
        node.containerd_config(
            paths, Path("/opt/bin"), Path("/usr/sbin/runc"), Path("/usr/lib/cni")
        )
    )
    assert cfg["version"] == 3
    assert cfg["root"] == str(tmp_path / "containerd" / "root") and cfg["state"] == str(
        tmp_path / "containerd" / "state"
    )
    assert cfg["grpc"]["address"] == str(paths.containerd_socket)
    assert cfg["imports"] == [] and cfg["disabled_plugins"] == ["io.containerd.nri.v1.nri"]
    plugins = cfg["plugins"]
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert runtime["cdi_spec_dirs"] == [str(tmp_path / "cdi")]
    assert (
        runtime["restrict_oom_score_adj"] is True
        and runtime["netns_mounts_under_state_dir"] is True
    )
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["runtime_path"] == "/opt/bin/containerd-shim-runc-v2"
    assert runc["options"] == {
        "BinaryName": "/usr/sbin/runc",
        "Root": str(tmp_path / "containerd" / "runc"),
        "SystemdCgroup": False,
    }
    assert runtime["cni"] == {
        "bin_dirs": ["/usr/lib/cni"],
        "conf_dir": str(tmp_path / "cni" / "net.d"),
    }
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"] == {
        "sandbox": "tessera.local/pause:1"
    }
    # Registries: the state dir's hosts only, all pointing at a closed loopback port.
    assert plugins["io.containerd.cri.v1.images"]["registry"] == {
        "config_path": str(tmp_path / "containerd" / "certs.d")
    }
    assert tomllib.loads(node.registry_hosts_toml()) == {"server": "http://127.0.0.1:9"}
    socket_dir = plugins["io.containerd.shim.v1.manager"]["socket_dir"]
    assert (
        len(socket_dir) <= 42
    )  # containerd's limit: the socket path is socket_dir + "/" + 64 hex digits


def test_kubelet_config(tmp_path: Path) -> None:
    paths = node.NodePaths(tmp_path)
    cfg = node.kubelet_config(
        paths,
        address="127.0.1.1",
        ca_file=Path("/pki/ca.crt"),
        serving_cert=Path("/pki/s.crt"),
        serving_key=Path("/pki/s.key"),
        feature_gates=FEATURE_GATES,
    )
    assert cfg["kind"] == "KubeletConfiguration" and cfg["address"] == "127.0.1.1"
    assert cfg["containerRuntimeEndpoint"] == f"unix://{paths.containerd_socket}"
    assert cfg["failCgroupV1"] is False and cfg["cgroupDriver"] == "cgroupfs"
    assert cfg["authentication"]["anonymous"] == {"enabled": False}
    assert cfg["authentication"]["x509"] == {"clientCAFile": "/pki/ca.crt"}
    assert cfg["imageGCHighThresholdPercent"] == 100 and cfg["evictionHard"] == {}
    assert cfg["featureGates"]["DRAConsumableCapacity"] is True
    assert cfg["podLogsDir"] == str(tmp_path / "pod-logs")


def test_cni_network_routes_only_the_service_range_and_keeps_ipam_state_in_the_state_dir(
    tmp_path: Path,
) -> None:
    (bridge,) = node.cni_config(node.NodePaths(tmp_path))["plugins"]
    assert bridge["type"] == "bridge" and bridge["bridge"] == node.BRIDGE
    # The bridge address is up's; isGateway would also switch on net.ipv4.ip_forward.
    assert bridge["isGateway"] is False and bridge["ipMasq"] is False
    assert "isDefaultGateway" not in bridge
    ipam = bridge["ipam"]
    assert ipam["dataDir"] == str(tmp_path / "cni" / "ipam")
    assert ipam["ranges"] == [[{"subnet": "10.213.0.0/24", "gateway": nodenet.BRIDGE_ADDRESS}]]
    # No default route: a pod reaches the service range through the host, nothing else.
    assert ipam["routes"] == [{"dst": "10.96.0.0/16", "gw": nodenet.BRIDGE_ADDRESS}]


def test_kube_proxy_sets_no_sysctl_and_serves_node_ports_on_the_bridge_only() -> None:
    cfg = nodenet.kube_proxy_config(kubeconfig=Path("/k/kp.kubeconfig"), node_name="vm")
    assert cfg["mode"] == "nftables" and cfg["hostnameOverride"] == "vm"
    assert all(
        v in (0, "0s", False) for v in cfg["conntrack"].values()
    )  # 0 = leave the sysctl alone
    assert cfg["nodePortAddresses"] == ["10.213.0.1/32"]
    assert cfg["healthzBindAddress"].startswith("127.0.0.1:")
    assert cfg["metricsBindAddress"].startswith("127.0.0.1:")
    assert cfg["clientConnection"] == {"kubeconfig": "/k/kp.kubeconfig"}


def test_guard_ruleset_counts_and_drops_what_would_leave() -> None:
    rules = nodenet.guard_ruleset([6443])
    assert "table inet tessera-guard {" in rules
    assert "elements = { 10.96.0.0/16, 10.213.0.0/16 }" in rules
    assert "elements = { 6443 }" in rules
    for comment in (
        "egress-output",
        "egress-postrouting",
        "egress-postrouting-dnat",
        "egress-forward",
        "ingress-ranges",
        "ingress-local-only-ports",
    ):
        (line,) = [ln for ln in rules.splitlines() if f'comment "{comment}"' in ln]
        assert "counter drop" in line
    nft = nodenet.nft_binary()
    if nft is not None and os.geteuid() == 0:
        # `nft -c`: parsed and checked by the kernel, not applied.
        proc = subprocess.run([nft, "-c", "-f", "-"], input=rules, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def test_routes_go_to_the_bridge_or_nowhere() -> None:
    assert nodenet.routes() == [
        ["unreachable", "10.213.0.0/16"],
        ["10.96.0.0/16", "dev", "tessera0", "src", "10.213.0.1"],
    ]


def test_conflicts_name_what_is_in_the_way(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_ip(*args: str) -> subprocess.CompletedProcess[str]:
        if "addr" in args:
            out = [{"ifname": "eth1", "addr_info": [{"local": "10.213.4.2"}]}]
        else:
            out = [
                {"dst": "default", "dev": "eth0"},
                {"dst": "10.0.0.0/8", "dev": "eth0"},  # broader: ours are more specific
                {"dst": "10.96.12.0/24", "dev": "eth1"},
                {"dst": "10.213.0.1", "table": "local", "type": "local"},
            ]
        return subprocess.CompletedProcess(args, 0, json.dumps(out), "")

    monkeypatch.setattr(nodenet, "_ip", fake_ip)
    monkeypatch.setattr(nodenet, "ip_binary", lambda: "/sbin/ip")
    monkeypatch.setattr(nodenet, "nft_binary", lambda: "/sbin/nft")
    monkeypatch.setattr(nodenet, "link_exists", lambda name=nodenet.BRIDGE: False)
    monkeypatch.setattr(nodenet, "nft_tables", lambda: {("ip", "kube-proxy"), ("ip", "filter")})
    problems = nodenet.conflicts()
    assert problems == [
        "eth1 has the address 10.213.4.2, inside the node's range 10.213.0.0/16",
        "the host already routes 10.96.12.0/24 (eth1), inside the node's range 10.96.0.0/16",
        "the nftables table ip kube-proxy already exists (another kube-proxy or node on this "
        "machine? if it is a leftover: `nft delete table ip kube-proxy`)",
    ]


def test_down_removes_only_what_the_node_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, state = tmp_path / "lib", tmp_path / "state"
    plugins, results, logs = (
        root / "kubelet" / "device-plugins",
        root / "cni" / "results",
        root / "log",
    )
    for d in (plugins, results, logs, state / "pod-logs"):
        d.mkdir(parents=True)
    (plugins / "kubelet_internal_checkpoint").write_text("{}")
    (plugins / "other-vendor.sock").write_text("")  # another device plugin's
    netns = state / "containerd" / "state" / "netns" / "cni-1"
    (results / f"{node.CNI_NETWORK}-abc-eth0").write_text(json.dumps({"netns": str(netns)}))
    (results / "cni-loopback-abc-lo").write_text(json.dumps({"netns": str(netns)}))
    # Another CNI user's (podman's), even with the same network name.
    (results / "other-net-def-eth0").write_text(json.dumps({"netns": "/run/netns/x"}))
    (results / f"{node.CNI_NETWORK}-def-eth0").write_text("not json")
    os.symlink(state / "pod-logs" / "x.log", logs / "x.log")
    os.symlink("/var/log/elsewhere.log", logs / "y.log")
    (root / "empty" / "deeper").mkdir(parents=True)
    monkeypatch.setattr(
        node,
        "NODE_MADE",
        {
            str(plugins): node.NODE_MADE["/var/lib/kubelet/device-plugins"],
            str(results): node.NODE_MADE["/var/lib/cni/results"],
            str(logs): node.NODE_MADE["/var/log/containers"],
        },
    )
    kept, problems = node.remove_node_made(root, state)
    assert problems == []
    assert kept == sorted(
        [
            str(plugins / "other-vendor.sock"),
            str(results / "other-net-def-eth0"),
            str(results / f"{node.CNI_NETWORK}-def-eth0"),
            str(logs / "y.log"),
        ]
    )
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert left == [
        "cni",
        "cni/results",
        "cni/results/other-net-def-eth0",
        f"cni/results/{node.CNI_NETWORK}-def-eth0",
        "kubelet",
        "kubelet/device-plugins",
        "kubelet/device-plugins/other-vendor.sock",
        "log",
        "log/y.log",
    ]
    # Nothing else there: the whole tree goes.
    for f in kept:
        os.unlink(f)
    assert node.remove_node_made(root, state) == ([], [])
    assert not root.exists()


def test_process_path_leaves_out_directories_with_iptables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sbin, bin_ = tmp_path / "sbin", tmp_path / "bin"
    for d, tools in ((sbin, ("iptables", "mount2")), (bin_, ("mount", "umount"))):
        d.mkdir()
        for t in tools:
            (d / t).write_text("#!/bin/sh\n")
            os.chmod(d / t, 0o755)
    monkeypatch.setattr(node, "SYSTEM_PATH", (str(sbin), str(bin_)))
    assert node.process_path(Path("/opt/kube")) == f"/opt/kube:{bin_}"
    (bin_ / "ip6tables").write_text("")
    os.chmod(bin_ / "ip6tables", 0o755)
    with pytest.raises(node.NodeError, match="mount is in the same directory as iptables"):
        node.process_path(Path("/opt/kube"))


def test_first_absent_component(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    assert node._first_absent(str(tmp_path / "a" / "b" / "c")) == str(tmp_path / "a" / "b")
    assert node._first_absent(str(tmp_path / "a")) is None


def test_host_snapshot_round_trips_through_json() -> None:
    snap = node.HostSnapshot(
        {"kernel.panic": "1"},
        ("/var/lib/kubelet",),
        ("/sys/fs/cgroup/cpu/kubepods",),
        True,
        (("ip", "kube-proxy"),),
    )
    assert node.HostSnapshot.from_json(snap.to_json()) == snap


def test_mount_points_below_a_directory_deepest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    info = [
        node._Mount("/state", "ext4"),
        node._Mount("/state/kubelet/pods/x/volumes/tok", "tmpfs"),
        node._Mount("/state/containerd/state/rootfs", "overlay"),
        node._Mount("/statefoo", "ext4"),
        node._Mount("/other", "ext4"),
    ]
    monkeypatch.setattr(node, "_mountinfo", lambda: info)
    assert node.mounts_under([Path("/state")]) == [
        "/state/kubelet/pods/x/volumes/tok",
        "/state/containerd/state/rootfs",
        "/state",
    ]


def test_mountinfo_escapes_are_decoded() -> None:
    assert node._unescape("/a\\040b") == "/a b"
