"""The real node's configuration files and host bookkeeping (tessera.kube.node), without a node."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from tessera.kube import node
from tessera.kube.cluster import FEATURE_GATES


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


def test_cni_network_has_no_gateway_and_keeps_ipam_state_in_the_state_dir(tmp_path: Path) -> None:
    (bridge,) = node.cni_config(node.NodePaths(tmp_path))["plugins"]
    assert bridge["type"] == "bridge" and bridge["bridge"] == node.BRIDGE
    assert bridge["isGateway"] is False and bridge["ipMasq"] is False
    assert bridge["ipam"]["dataDir"] == str(tmp_path / "cni" / "ipam")


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
        {"kernel.panic": "1"}, ("/var/lib/kubelet",), ("/sys/fs/cgroup/cpu/kubepods",), True
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
