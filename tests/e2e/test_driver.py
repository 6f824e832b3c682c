"""``tessera driver`` against a live control plane: publishing, the kubelet plugin protocol
over real unix sockets (a fake kubelet client), prepare/unprepare, malformed claims, backends.

The node's GPUs are the 8x H100 80GB HBM3 of a corpus inventory, served by the fake NVML.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tessera.driver.access import NODE_AGENT_ACCESS
from tessera.driver.backend import DRIVER_NATIVE, LIBRARY
from tessera.driver.checkpoint import ClaimState
from tessera.driver.node import NodeDriver
from tessera.driver.publish import TAINT_KEY
from tessera.enforcement.layout import claims_dir
from tessera.enforcement.limits import read_limits
from tessera.enforcement.region import read_region
from tessera.inventory import build_resource_slices
from tessera.kube.workloads import (
    apply_objects,
    gpu_claim_template,
    gpu_pod,
    pod_claims,
    wait_for,
    wait_pod_scheduled,
)

from .conftest import LiveCluster
from .driverkit import *  # noqa: F403 (fixtures)
from .driverkit import (
    GIB,
    DriverEnv,
    DriverProcess,
    MonitorProcess,
    admin_result,
    allocated_claim,
    node_slices,
)
from .identity import identity_kubeconfig

pytestmark = pytest.mark.cluster


def _wait_slices(
    env: DriverEnv, check: Any, what: str, timeout: float = 30
) -> list[dict[str, Any]]:
    def ok() -> list[dict[str, Any]] | None:
        s = node_slices(env.client, env.node)
        return s if check(s) else None

    return wait_for(ok, timeout=timeout, what=what)


def _taints(slices: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {
        d["attributes"]["uuid"]["string"]: [
            f"{t['key']}={t['value']}:{t['effect']}" for t in d.get("taints", [])
        ]
        for s in slices
        for d in s["spec"]["devices"]
        if d.get("taints")
    }


# ---- registration ------------------------------------------------------------------------------


def test_registration_info_and_socket_paths(
    running_driver: tuple[DriverEnv, DriverProcess],
) -> None:
    env, d = running_driver
    kubelet = env.kubelet()
    info = kubelet.get_info()
    assert (info.type, info.name) == ("DRAPlugin", "gpu.tessera.dev")
    assert info.endpoint == str(env.kubelet_root / "plugins" / "gpu.tessera.dev" / "dra.sock")
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]
    assert (env.kubelet_root / "plugins_registry" / "gpu.tessera.dev-reg.sock").is_socket()
    assert Path(info.endpoint).is_socket()
    body = d.ready()
    # serving, but not ready until the kubelet confirmed the registration
    assert (body["ok"], body["serving"], body["registered"], body["gpus"]) == (
        False,
        True,
        False,
        8,
    )
    with urllib.request.urlopen(f"http://127.0.0.1:{d.port}/healthz", timeout=5) as r:
        assert json.loads(r.read())["ok"] is True
    kubelet.notify(True)
    assert (d.ready()["registered"], d.ready()["ok"]) == (True, True)
    kubelet.notify(False, "plugin name clash")
    body = d.ready()
    assert (body["ok"], body["registered"], body["registrationError"]) == (
        False,
        False,
        "plugin name clash",
    )
    kubelet.close()


# ---- publishing ----------------------------------------------------------------------------------


def test_publishes_the_inventory_slices(driver_env: DriverEnv, kube_cluster: LiveCluster) -> None:
    env = driver_env
    other = build_resource_slices("somebody-else", env.gpus[:1])[0]
    other["metadata"]["name"] = f"{env.node}-not-mine"
    kube_cluster.client.apply(other)
    stale = build_resource_slices(env.node, env.gpus[:2])[0]
    stale["metadata"]["name"] = f"{env.node}-stale"
    kube_cluster.client.apply(stale)
    d = DriverProcess(env).start()
    try:
        slices = node_slices(env.client, env.node)
        want = build_resource_slices(
            env.node, env.gpus, generation=2, attributes={"enforcementBackend": {"string": LIBRARY}}
        )
        assert [s["metadata"]["name"] for s in slices] == [f"{env.node}-gpu.tessera.dev"]
        assert slices[0]["spec"]["pool"] == {
            "name": env.node,
            "generation": 2,
            "resourceSliceCount": 1,
        }
        assert slices[0]["spec"]["devices"] == want[0]["spec"]["devices"]
        assert [dev["attributes"]["uuid"]["string"] for dev in slices[0]["spec"]["devices"]] == [
            g.uuid for g in env.gpus
        ]
        # The other node's slice is untouched.
        assert (
            kube_cluster.client.get("resource.k8s.io/v1", "ResourceSlice", f"{env.node}-not-mine")[
                "spec"
            ]["nodeName"]
            == "somebody-else"
        )
        assert 0 < d.ready()["firstPublishSeconds"] < 30
    finally:
        d.stop()
        kube_cluster.client.delete("resource.k8s.io/v1", "ResourceSlice", f"{env.node}-not-mine")
    # A restart with nothing changed does not bump the generation.
    d2 = DriverProcess(env).start()
    try:
        assert node_slices(env.client, env.node)[0]["spec"]["pool"]["generation"] == 2
    finally:
        d2.stop()


def test_lost_gpu_is_tainted_then_untainted(
    running_driver: tuple[DriverEnv, DriverProcess],
) -> None:
    env, _d = running_driver
    lost = env.gpus[3].uuid
    env.set_gpus(lost=[lost])
    slices = _wait_slices(env, lambda s: _taints(s), "a taint on the lost GPU")
    assert _taints(slices) == {lost: [f"{TAINT_KEY}=lost:NoSchedule"]}
    assert len(slices[0]["spec"]["devices"]) == 8  # still published, not vanished
    gen = slices[0]["spec"]["pool"]["generation"]
    assert gen == 2
    env.set_gpus()
    slices = _wait_slices(env, lambda s: not _taints(s), "the taint to go")
    assert slices[0]["spec"]["pool"]["generation"] == 3
    # A GPU that disappears from NVML stays published, tainted "missing".
    gone = env.gpus[7].uuid
    env.set_gpus(gone=[gone])
    slices = _wait_slices(env, lambda s: _taints(s), "a taint on the vanished GPU")
    assert _taints(slices) == {gone: [f"{TAINT_KEY}=missing:NoSchedule"]}
    assert [dev["name"] for dev in slices[0]["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]


def test_xid_taints_until_recovery(running_driver: tuple[DriverEnv, DriverProcess]) -> None:
    env, _d = running_driver
    u = env.gpus[1].uuid
    env.set_gpus(xids=[(1, env.gpus[0].uuid, 13), (2, u, 79)])  # 13: application error, ignored
    slices = _wait_slices(env, lambda s: _taints(s), "an XID taint")
    assert _taints(slices) == {u: [f"{TAINT_KEY}=xid-79:NoSchedule"]}
    # xid_recovery_seconds=2: the GPU answers, so the taint goes.
    _wait_slices(env, lambda s: not _taints(s), "the XID taint to expire", timeout=20)


# ---- prepare / unprepare -------------------------------------------------------------------------


def _scheduled_claim(
    client: Any, ns: str, env: DriverEnv, name: str, memory: str | None, cores: int | None
) -> dict[str, Any]:
    apply_objects(
        client,
        [
            gpu_claim_template(f"{name}-t", namespace=ns, memory=memory, cores=cores),
            gpu_pod(
                name,
                namespace=ns,
                template=f"{name}-t",
                node_selector={"kubernetes.io/hostname": env.node},
            ),
        ],
    )
    wait_pod_scheduled(client, name, ns)
    return wait_for(
        lambda: next(
            (
                c
                for c in pod_claims(client, name, ns).values()
                if (c.get("status") or {}).get("allocation")
            ),
            None,
        ),
        timeout=30,
        what=f"the claim of pod {name} to be allocated",
    )


def test_prepare_writes_limits_region_cdi_and_unprepare_removes(
    running_driver: tuple[DriverEnv, DriverProcess], kube_namespace: str
) -> None:
    env, _d = running_driver
    claim = _scheduled_claim(env.client, kube_namespace, env, "share", "8Gi", 20)
    meta = claim["metadata"]
    result = claim["status"]["allocation"]["devices"]["results"][0]
    uuid = env.gpus[int(result["device"].split("-")[1])].uuid
    kubelet = env.kubelet()
    ref = (meta["namespace"], meta["name"], meta["uid"])
    resp = kubelet.prepare([ref])
    entry = resp.claims[meta["uid"]]
    assert entry.error == ""
    [dev] = entry.devices
    assert (list(dev.request_names), dev.pool_name, dev.device_name) == (
        ["gpu"],
        env.node,
        result["device"],
    )
    assert dev.share_id == result["shareID"]
    assert list(dev.cdi_device_ids) == [f"gpu.tessera.dev/claim={meta['uid']}-0-{result['device']}"]

    limits = read_limits(str(env.state_dir / "claims" / meta["uid"] / "limits"))
    assert [(g.uuid, g.memory, g.cores) for g in limits.gpus] == [(uuid, 8 * GIB, 20)]
    assert (limits.claim, limits.claim_uid, limits.region) == (
        f"{kube_namespace}/{meta['name']}",
        meta["uid"],
        "/run/tessera/region",
    )
    assert (
        oct(os.stat(env.state_dir / "claims" / meta["uid"] / "limits").st_mode & 0o777) == "0o444"
    )
    region = read_region(str(env.state_dir / "claims" / meta["uid"] / "region"))
    assert [(g.uuid, g.memory_limit, g.cores, g.used) for g in region.gpus] == [
        (uuid, 8 * GIB, 20, 0)
    ]

    spec_path = env.cdi_dir / f"gpu.tessera.dev-claim_{meta['uid']}.json"
    spec = json.loads(spec_path.read_text())
    assert spec["kind"] == "gpu.tessera.dev/claim" and spec["cdiVersion"] == "0.6.0"
    minor = int(result["device"].split("-")[1])
    assert spec["devices"] == [
        {
            "name": f"{meta['uid']}-0-{result['device']}",
            "containerEdits": {
                "deviceNodes": [
                    {
                        "path": f"/dev/nvidia{minor}",
                        "hostPath": str(env.dev_root / "dev" / f"nvidia{minor}"),
                    }
                ]
            },
        }
    ]
    edits = spec["containerEdits"]
    assert edits["env"] == [
        f"NVIDIA_VISIBLE_DEVICES={uuid}",
        f"CUDA_VISIBLE_DEVICES={uuid}",
        "TESSERA_ENFORCEMENT_BACKEND=library",
    ]
    assert [m["containerPath"] for m in edits["mounts"]] == [
        "/etc/tessera/limits",
        "/run/tessera/region",
        "/run/tessera/driver",  # the driver's reconciliation (driver/usage), read-only
        "/run/tessera/shares",
        "/usr/lib/tessera/libtessera-enforce.so",
        "/etc/ld.so.preload",
    ]
    assert [m["options"][0] for m in edits["mounts"]] == ["ro", "rw", "ro", "ro", "ro", "ro"]
    assert (env.state_dir / "claims" / meta["uid"] / "driver").is_dir()
    # the node's shares file of the GPU: what its best-effort tenants are held to
    assert (env.state_dir / "shares" / uuid).read_text() == (
        "version 1\nguaranteed 20\nbest-effort 0\n"
    )
    assert (
        env.state_dir / "ld.so.preload"
    ).read_text() == "/usr/lib/tessera/libtessera-enforce.so\n"
    assert [n["path"] for n in edits["deviceNodes"]] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    cp = json.loads((env.state_dir / "checkpoint.json").read_text())
    assert cp["claims"][meta["uid"]]["state"] == ClaimState.PREPARED
    if os.environ.get("TESSERA_DRIVER_EXAMPLES"):  # docs/driver.md shows these files
        out = Path(os.environ["TESSERA_DRIVER_EXAMPLES"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "cdi.json").write_text(json.dumps(spec, indent=2) + "\n")
        (out / "limits").write_bytes(
            (env.state_dir / "claims" / meta["uid"] / "limits").read_bytes()
        )

    # The claim's device status names the backend (written by the driver, asynchronously).
    st = wait_for(
        lambda: (
            env.client.get("resource.k8s.io/v1", "ResourceClaim", meta["name"], kube_namespace)
            .get("status", {})
            .get("devices")
        ),
        timeout=20,
        what="status.devices",
    )
    assert [{k: v for k, v in e.items() if v is not None} for e in st] == [
        {
            "driver": "gpu.tessera.dev",
            "pool": env.node,
            "device": result["device"],
            "shareID": result["shareID"],
            "data": {
                "enforcementBackend": LIBRARY,
                "uuid": uuid,
                "memory": str(8 * GIB),
                "cores": 20,
                "limitsFile": "/etc/tessera/limits",
            },
        }
    ]

    # Idempotent: a second prepare (a second pod of a shared claim, a kubelet retry) answers the
    # same and rewrites nothing.
    mtime = spec_path.stat().st_mtime_ns
    again = kubelet.prepare([ref]).claims[meta["uid"]]
    assert again == entry and spec_path.stat().st_mtime_ns == mtime

    done = kubelet.unprepare([ref])
    assert done.claims[meta["uid"]].error == ""
    assert not spec_path.exists() and not (env.state_dir / "claims" / meta["uid"]).exists()
    assert json.loads((env.state_dir / "checkpoint.json").read_text())["claims"] == {}
    assert not (env.state_dir / "shares" / uuid).exists()
    assert kubelet.unprepare([ref]).claims[meta["uid"]].error == ""  # idempotent
    kubelet.close()


def test_concurrent_prepares_leave_every_claims_files_and_the_summed_shares(
    running_driver: tuple[DriverEnv, DriverProcess], kube_namespace: str
) -> None:
    """24 claims prepared at once (one call each, from 24 threads: the driver plans and writes
    them one at a time in its lane, records them in shared checkpoint writes and writes the
    shares files once per wave), then 12 unprepared at once: every claim has its own files and
    entry, and each GPU's shares file is the sum of the claims left on it, not a wave's."""
    import threading

    env, _d = running_driver
    # 1..7 cores each: at most 12 x 7 = 84 guaranteed per GPU
    shapes = [(f"gpu-{i % 2}", f"{1 + i % 3}Gi", 1 + i % 7) for i in range(24)]
    claims = [
        allocated_claim(
            env.client,
            kube_namespace,
            f"wave-{i}",
            [
                {
                    "request": "gpu",
                    "driver": "gpu.tessera.dev",
                    "pool": env.node,
                    "device": dev,
                    "shareID": f"0b0d3b4e-9f0c-4cf5-8c8e-{i:012x}",
                    "consumedCapacity": {"memory": mem, "cores": str(cores)},
                }
            ],
        )
        for i, (dev, mem, cores) in enumerate(shapes)
    ]
    refs = [
        (c["metadata"]["namespace"], c["metadata"]["name"], c["metadata"]["uid"]) for c in claims
    ]
    kubelet = env.kubelet()
    kubelet.prepare([])  # the channel, before the threads share it
    errors: dict[str, str] = {}

    def each(call: Any, batch: list[tuple[str, str, str]]) -> None:
        barrier = threading.Barrier(len(batch))

        def one(ref: tuple[str, str, str]) -> None:
            barrier.wait()
            errors[ref[2]] = call([ref]).claims[ref[2]].error

        threads = [threading.Thread(target=one, args=(r,)) for r in batch]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def shares(left: list[int]) -> dict[str, str]:
        return {
            env.gpus[g].uuid: "version 1\nguaranteed "
            f"{sum(shapes[i][2] for i in left if shapes[i][0] == f'gpu-{g}')}\nbest-effort 0\n"
            for g in (0, 1)
        }

    each(kubelet.prepare, refs)
    assert errors == {r[2]: "" for r in refs}
    recorded = json.loads((env.state_dir / "checkpoint.json").read_text())["claims"]
    assert sorted(recorded) == sorted(r[2] for r in refs)
    for (dev, mem, cores), (_, _, uid) in zip(shapes, refs, strict=True):
        limits = read_limits(str(env.state_dir / "claims" / uid / "limits"))
        want = (env.gpus[int(dev[-1])].uuid, int(mem[0]) * GIB, cores)
        assert [(g.uuid, g.memory, g.cores) for g in limits.gpus] == [want]
        region = read_region(str(env.state_dir / "claims" / uid / "region"))
        assert [(g.uuid, g.memory_limit, g.cores) for g in region.gpus] == [want]
        assert (env.cdi_dir / f"gpu.tessera.dev-claim_{uid}.json").is_file()
    on_disk = {u: (env.state_dir / "shares" / u).read_text() for u in shares([])}
    assert on_disk == shares(list(range(24)))
    each(kubelet.unprepare, refs[:12])
    assert all(errors[r[2]] == "" for r in refs[:12])
    on_disk = {u: (env.state_dir / "shares" / u).read_text() for u in shares([])}
    assert on_disk == shares(list(range(12, 24)))
    assert sorted(json.loads((env.state_dir / "checkpoint.json").read_text())["claims"]) == sorted(
        r[2] for r in refs[12:]
    )
    kubelet.unprepare(refs[12:])
    kubelet.close()


def test_claims_are_planned_and_written_one_at_a_time_in_the_lane(
    driver_env: DriverEnv, kube_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 calls at once reach the driver's 8 handlers, but its claims' files are written one
    claim at a time (the prepare lane; the real ``materialize``, slowed by 5 ms so that
    interleaved handlers would overlap); each claim's wait for the lane is counted apart from
    its driver-side time."""
    import threading

    import tessera.driver.claims as claims_mod

    env = driver_env
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(env.nvml_config))
    real = claims_mod.materialize
    inside: list[int] = []
    most = [0]
    guard = threading.Lock()

    def slow(plan: Any, layout: Any) -> bool:
        with guard:
            inside.append(1)
            most[0] = max(most[0], len(inside))
        try:
            time.sleep(0.005)
            return real(plan, layout)
        finally:
            with guard:
                inside.pop()

    monkeypatch.setattr(claims_mod, "materialize", slow)
    refs = []
    for i in range(16):
        c = allocated_claim(
            env.client,
            kube_namespace,
            f"lane-{i}",
            [
                {
                    "request": "gpu",
                    "driver": "gpu.tessera.dev",
                    "pool": env.node,
                    "device": f"gpu-{i % 8}",
                    "shareID": f"1b0d3b4e-9f0c-4cf5-8c8e-{i:012x}",
                    "consumedCapacity": {"memory": "1Gi", "cores": "5"},
                }
            ],
        )
        refs.append((kube_namespace, c["metadata"]["name"], c["metadata"]["uid"]))
    d = NodeDriver(env.config(prepare_lanes=1), env.client)
    d.start()
    try:
        kubelet = env.kubelet()
        kubelet.prepare([])
        barrier = threading.Barrier(len(refs))
        errors: dict[str, str] = {}

        def one(ref: tuple[str, str, str]) -> None:
            barrier.wait()
            errors[ref[2]] = kubelet.prepare([ref]).claims[ref[2]].error

        threads = [threading.Thread(target=one, args=(r,)) for r in refs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == {r[2]: "" for r in refs}
        assert most[0] == 1
        assert len(d.stats.lane_wait) == len(d.stats.prepare) == 16
        kubelet.unprepare(refs)
        kubelet.close()
    finally:
        d.stop()


def test_monitor_reads_the_claim_files_the_driver_writes(
    running_driver: tuple[DriverEnv, DriverProcess], kube_namespace: str
) -> None:
    """The pair: the real driver prepares a share, the real monitor, pointed at the driver's
    ``<state-dir>/claims`` (the contract of tessera.enforcement.layout), exports its limit
    under Tessera's and HAMi's names; a claim directory with no region is named in its log;
    after unprepare the share's series are gone."""
    env, _d = running_driver
    claim = _scheduled_claim(env.client, kube_namespace, env, "watched", "8Gi", 20)
    meta = claim["metadata"]
    result = claim["status"]["allocation"]["devices"]["results"][0]
    uuid = env.gpus[int(result["device"].split("-")[1])].uuid
    kubelet = env.kubelet()
    ref = (meta["namespace"], meta["name"], meta["uid"])
    assert kubelet.prepare([ref]).claims[meta["uid"]].error == ""
    # A directory the driver did not finish (no region), old enough to be reported.
    stray = claims_dir(env.state_dir) / "0000-no-region"
    stray.mkdir()
    os.utime(stray, (time.time() - 60, time.time() - 60))
    mon = MonitorProcess(
        "--node-name",
        env.node,
        "--kubeconfig",
        str(env.kubeconfig),
        "--no-nvml",
        "--region-dir",
        str(claims_dir(env.state_dir)),
        "--api-interval",
        "1",
    )
    try:

        def share(name: str) -> list[tuple[dict[str, str], float]]:
            fams = {f.name: f for f in text_string_to_metric_families(mon.scrape())}
            return [(x.labels, x.value) for x in fams[name].samples] if name in fams else []

        limit = wait_for(
            lambda: (
                [
                    (lab["dra_claim_name"], lab["UUID"], v)
                    for lab, v in share("tessera_share_memory_limit_bytes")
                    if lab.get("dra_claim_name") == meta["name"]
                ]
                or None
            ),
            timeout=30,
            what="the share's limit series",
            last=lambda: "\n".join(
                [ln for ln in mon.scrape().splitlines() if "share_memory_limit" in ln] + mon.log
            )[-3000:],
        )
        assert limit == [(meta["name"], uuid, float(8 * GIB))]
        hami = [
            (lab["device_uuid"], v)
            for lab, v in share("hami_vgpu_memory_limit_bytes")
            if lab.get("pod") == "watched"
        ]
        assert hami == [(uuid, float(8 * GIB))]
        used = [
            v
            for lab, v in share("tessera_share_memory_used_bytes")
            if lab["dra_claim_name"] == meta["name"]
        ]
        assert used == [0.0]
        wait_for(
            lambda: any("0000-no-region: no usage region (region)" in x for x in mon.log) or None,
            timeout=10,
            what="the monitor's log line for a claim directory without a region",
        )

        assert kubelet.unprepare([ref]).claims[meta["uid"]].error == ""
        wait_for(
            lambda: (
                None
                if any(
                    lab.get("dra_claim_name") == meta["name"]
                    for lab, _ in share("tessera_share_memory_limit_bytes")
                )
                else True
            ),
            timeout=10,
            what="the share's series to go with the claim",
        )
    finally:
        assert mon.stop() == 0, "\n".join(mon.log)
        kubelet.close()


def test_whole_gpu_and_admin_access_get_no_limits(
    running_driver: tuple[DriverEnv, DriverProcess], kube_namespace: str
) -> None:
    env, _d = running_driver
    whole = _scheduled_claim(env.client, kube_namespace, env, "whole", None, None)
    dev = whole["status"]["allocation"]["devices"]["results"][0]["device"]
    env.client.request(
        "PATCH",
        f"/api/v1/namespaces/{kube_namespace}",
        content_type="application/merge-patch+json",
        body={"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}},
    )
    admin = allocated_claim(
        env.client,
        kube_namespace,
        "admin",
        [admin_result(env.node, "gpu-5")],
        env.node,
    )
    kubelet = env.kubelet()
    refs = [
        (c["metadata"]["namespace"], c["metadata"]["name"], c["metadata"]["uid"])
        for c in (whole, admin)
    ]
    resp = kubelet.prepare(refs)
    for (_, _, uid), device in zip(refs, (dev, "gpu-5"), strict=True):
        assert resp.claims[uid].error == ""
        assert [d_.device_name for d_ in resp.claims[uid].devices] == [device]
        assert not (env.state_dir / "claims" / uid).exists()  # no limits file, no region
        spec = json.loads((env.cdi_dir / f"gpu.tessera.dev-claim_{uid}.json").read_text())
        assert "mounts" not in spec["containerEdits"]
        assert spec["containerEdits"]["env"][0].startswith("NVIDIA_VISIBLE_DEVICES=GPU-")
    kubelet.unprepare(refs)
    kubelet.close()


def test_malformed_claims_get_per_claim_errors(
    running_driver: tuple[DriverEnv, DriverProcess], kube_namespace: str
) -> None:
    env, _d = running_driver
    ns = kube_namespace
    good = _scheduled_claim(env.client, ns, env, "good", "1Gi", 10)
    share = "0b0d3b4e-9f0c-4cf5-8c8e-0123456789ab"
    other_node = allocated_claim(
        env.client,
        ns,
        "elsewhere",
        [
            {
                "request": "gpu",
                "driver": "gpu.tessera.dev",
                "pool": "another-node",
                "device": "gpu-0",
            }
        ],
        "another-node",
    )
    other_driver = allocated_claim(
        env.client,
        ns,
        "foreign",
        [{"request": "gpu", "driver": "nic.example.com", "pool": env.node, "device": "nic-0"}],
        env.node,
    )
    bad_capacity = allocated_claim(
        env.client,
        ns,
        "badcap",
        [
            {
                "request": "gpu",
                "driver": "gpu.tessera.dev",
                "pool": env.node,
                "device": "gpu-1",
                "shareID": share,
                "consumedCapacity": {"memory": "1Gi", "cores": "10", "bandwidth": "5"},
            }
        ],
        env.node,
    )
    too_big = allocated_claim(
        env.client,
        ns,
        "toobig",
        [
            {
                "request": "gpu",
                "driver": "gpu.tessera.dev",
                "pool": env.node,
                "device": "gpu-2",
                "shareID": share,
                "consumedCapacity": {"memory": "100Gi", "cores": "10"},
            }
        ],
        env.node,
    )
    no_device = allocated_claim(
        env.client,
        ns,
        "nodevice",
        [{"request": "gpu", "driver": "gpu.tessera.dev", "pool": env.node, "device": "gpu-42"}],
        env.node,
    )
    unallocated = env.client.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "pending", "namespace": ns},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}]
                }
            },
        }
    )
    claims = [good, other_node, other_driver, bad_capacity, too_big, no_device, unallocated]
    refs = [(ns, c["metadata"]["name"], c["metadata"]["uid"]) for c in claims]
    refs.append((ns, "no-such-claim", "00000000-0000-0000-0000-000000000001"))
    refs.append(
        (ns, good["metadata"]["name"], "11111111-2222-3333-4444-555555555555")
    )  # replaced: another uid
    kubelet = env.kubelet()
    resp = kubelet.prepare(refs)
    errors = {name: resp.claims[uid].error for _, name, uid in refs[1:-1]}
    assert set(resp.claims) == {uid for _, _, uid in refs}
    assert resp.claims[good["metadata"]["uid"]].error == ""
    assert len(resp.claims[good["metadata"]["uid"]].devices) == 1
    assert "allocated to pool(s) another-node, not to this node" in errors["elsewhere"]
    assert "has no result of driver gpu.tessera.dev (drivers: nic.example.com)" in errors["foreign"]
    assert "'bandwidth' is not a capacity of GPU" in errors["badcap"]
    assert "consumedCapacity.memory: 100Gi is outside 1..84943044608 bytes" in errors["toobig"]
    assert "'gpu-42' is not a device of node" in errors["nodevice"]
    assert "status.allocation is empty: the claim is not allocated" in errors["pending"]
    assert "NotFound" in errors["no-such-claim"]
    assert "the claim was replaced" in resp.claims["11111111-2222-3333-4444-555555555555"].error
    # Only the good claim left files; the driver still serves.
    assert sorted(p.name for p in env.cdi_dir.iterdir()) == [
        f"gpu.tessera.dev-claim_{good['metadata']['uid']}.json"
    ]
    # A request with a claim missing its uid: an error entry, no crash.
    bad = kubelet.prepare([(ns, "x", "")])
    assert "uid missing" in bad.claims[f"{ns}/x"].error
    assert kubelet.get_info().name == "gpu.tessera.dev"
    kubelet.unprepare([r for r in refs])
    assert list(env.cdi_dir.iterdir()) == []
    kubelet.close()


# ---- backends ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "driver_version,memory_limits,want",
    [
        ("615.20.01", True, DRIVER_NATIVE),
        ("615.20.01", False, LIBRARY),  # an r615 build without nvmlDeviceGetMemoryLimits_v1
        ("550.54.15", True, LIBRARY),  # older driver
    ],
)
def test_enforcement_backend_detected_from_nvml(
    driver_env: DriverEnv,
    kube_namespace: str,
    tmp_path: Path,
    driver_version: str,
    memory_limits: bool,
    want: str,
) -> None:
    env = driver_env
    env.set_gpus(driver_version=driver_version, memory_limits=memory_limits)
    cgroup = tmp_path / "cgroup2"
    cgroup.mkdir()
    (cgroup / "cgroup.controllers").write_text("cpuset cpu io memory pids dmem\n")
    hook = tmp_path / "nvidia-cdi-hook"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    d = DriverProcess(env, "--cgroup-root", str(cgroup), "--nvidia-cdi-hook", str(hook)).start()
    try:
        assert d.ready()["backend"] == want
        slices = node_slices(env.client, env.node)
        assert {
            dev["attributes"]["enforcementBackend"]["string"]
            for dev in slices[0]["spec"]["devices"]
        } == {want}
        claim = _scheduled_claim(env.client, kube_namespace, env, "b", "8Gi", 20)
        m = claim["metadata"]
        kubelet = env.kubelet()
        assert kubelet.prepare([(m["namespace"], m["name"], m["uid"])]).claims[m["uid"]].error == ""
        edits = json.loads((env.cdi_dir / f"gpu.tessera.dev-claim_{m['uid']}.json").read_text())[
            "containerEdits"
        ]
        uuid = read_limits(str(env.state_dir / "claims" / m["uid"] / "limits")).gpus[0].uuid
        if want == DRIVER_NATIVE:
            assert edits["hooks"] == [
                {
                    "hookName": "createRuntime",
                    "path": str(hook),
                    "args": [
                        "nvidia-cdi-hook",
                        "apply-cuda-memory-limits",
                        "--driver-root",
                        "/",
                        "--gpu-id",
                        uuid,
                    ],
                }
            ]
            assert (
                "NVIDIA_GPU_MEMORY_LIMIT=8192" in edits["env"]
                and "NVIDIA_GPU_MEMORY_REQUEST=8192" in edits["env"]
            )
        else:
            assert "hooks" not in edits and not any(
                e.startswith("NVIDIA_GPU_MEMORY") for e in edits["env"]
            )
        assert f"TESSERA_ENFORCEMENT_BACKEND={want}" in edits["env"]
        kubelet.unprepare([(m["namespace"], m["name"], m["uid"])])
        kubelet.close()
    finally:
        d.stop()


def test_backend_flag_overrides_detection(driver_env: DriverEnv) -> None:
    env = driver_env
    d = DriverProcess(env, "--enforcement-backend", DRIVER_NATIVE).start()
    try:
        r = d.ready()
        assert (r["backend"], r["backendReason"]) == (
            DRIVER_NATIVE,
            "--enforcement-backend driver-native",
        )
    finally:
        d.stop()


def test_start_errors_are_one_line(driver_env: DriverEnv, tmp_path: Path) -> None:
    from tessera.driver.node import DriverStartError

    env = driver_env
    with pytest.raises(DriverStartError, match=r"kubelet directory .*/nope does not exist"):
        NodeDriver(env.config(kubelet_root=tmp_path / "nope"), env.client).start()
    with pytest.raises(
        DriverStartError,
        match=r"no GPU inventory: NVML: .*cannot load.*nvidia-smi fallback: nvidia-smi-missing not found",
    ):
        NodeDriver(
            env.config(
                nvml_library=str(tmp_path / "libnvidia-ml.so.1"), nvidia_smi="nvidia-smi-missing"
            ),
            env.client,
        ).start()
    # A health port that is taken refuses the start before anything is published or written.
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(
            DriverStartError, match=rf"^--health-address 127.0.0.1:{port}: Address already in use$"
        ):
            NodeDriver(env.config(health_address=f"127.0.0.1:{port}"), env.client).start()
    assert (
        node_slices(env.client, env.node) == [] and not (env.state_dir / "checkpoint.json").exists()
    )
    time.sleep(0)


def test_cli_start_errors_are_one_line_exit_2(
    driver_env: DriverEnv, kube_namespace: str, tmp_path: Path
) -> None:
    """``tessera driver`` refuses to start, in one line with exit 2: missing kubelet directory,
    no NVML and no nvidia-smi, and an identity the API server denies (a ServiceAccount token
    without RBAC, through the client's bearer-token authentication)."""
    import subprocess
    import sys

    env = driver_env
    base = [
        sys.executable,
        "-m",
        "tessera",
        "driver",
        "--node-name",
        env.node,
        "--kubelet-root-dir",
        str(env.kubelet_root),
        "--cdi-dir",
        str(env.cdi_dir),
        "--state-dir",
        str(env.state_dir),
        "--dev-root",
        str(env.dev_root),
        "--health-address",
        "",
    ]

    def run(*extra: str, kubeconfig: Path = env.kubeconfig) -> tuple[int, list[str]]:
        p = subprocess.run(
            [*base, "--kubeconfig", str(kubeconfig), *extra],
            env=env.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        return p.returncode, p.stderr.strip().splitlines()

    rc, err = run(
        "--nvml-library", str(env.nvml_lib), "--kubelet-root-dir", str(tmp_path / "missing")
    )
    assert rc == 2 and err == [
        f"tessera: error: kubelet directory {tmp_path / 'missing'} does not exist: run the driver "
        "on a node whose kubelet uses it, or pass the kubelet's --root-dir as --kubelet-root-dir"
    ]
    rc, err = run(
        "--nvml-library", str(tmp_path / "libnvidia-ml.so.1"), "--nvidia-smi", "no-nvidia-smi"
    )
    assert rc == 2 and len(err) == 1
    assert err[0].startswith(
        f"tessera: error: no GPU inventory: NVML: NVML library {tmp_path / 'libnvidia-ml.so.1'}: cannot load"
    )
    assert err[0].endswith(
        "nvidia-smi fallback: no-nvidia-smi not found on PATH (install the NVIDIA driver, or pass --nvml-library PATH)"
    )

    def identity(name: str, rules: list[dict[str, Any]] | None) -> Path:
        """A kubeconfig for a new ServiceAccount ``name``, bound to a ClusterRole of ``rules``."""
        return identity_kubeconfig(
            env.client,
            env.kubeconfig,
            kube_namespace,
            name,
            tmp_path / f"{name}.kubeconfig",
            rules=rules,
        )

    # A ServiceAccount with no RBAC at all: every required row of the access table is named.
    rc, err = run("--nvml-library", str(env.nvml_lib), kubeconfig=identity("noperm", None))
    assert rc == 2 and err == [
        "tessera: error: the API server denies this identity: get resourceclaims.resource.k8s.io, "
        "list resourceslices.resource.k8s.io, create resourceslices.resource.k8s.io, "
        "patch resourceslices.resource.k8s.io, delete resourceslices.resource.k8s.io, get nodes; "
        "grant the driver's ServiceAccount the ClusterRole in docs/driver.md"
    ]
    # Everything the table names but get nodes (the guard's read): refused before anything
    # is written, not later at the guard.
    rules = [
        {
            "apiGroups": [a.group],
            "resources": [a.resource + (f"/{a.subresource}" if a.subresource else "")],
            "verbs": [a.verb],
            **({"resourceNames": [a.name]} if a.name else {}),
        }
        for a in NODE_AGENT_ACCESS
        if (a.verb, a.resource) != ("get", "nodes")
    ]
    rc, err = run("--nvml-library", str(env.nvml_lib), kubeconfig=identity("nonodes", rules))
    assert rc == 2 and err == [
        "tessera: error: the API server denies this identity: get nodes; grant the driver's "
        "ServiceAccount the ClusterRole in docs/driver.md"
    ]
    assert not (env.state_dir / "checkpoint.json").exists()
    assert node_slices(env.client, env.node) == []
