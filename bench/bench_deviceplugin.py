"""Benchmark legacy mode's device plugin: ``Allocate`` latency as the kubelet sees it.

A real control plane (``tessera.localcluster.cluster``, binaries from ``$TESSERA_KUBE_BIN`` or
``tools/kube/bin``) holds ``--pods`` pods bound to one node of 8x H100 80GB (the corpus gpud
inventory, served by the fake NVML of ``native/fake``), each with the annotations HAMi's
scheduler extender writes (``hami.io/vgpu-devices-to-allocate``, ``bind-phase: allocating``,
``bind-time``), shapes drawn with a fixed seed (1000..6000 MiB, 0/5/10 % cores, each on a GPU it fits). The node has no
kubelet, so the pods stay ``Pending``, as a pod does between its bind and its admission. The
device plugin runs in this process (``tessera.deviceplugin.plugin.DevicePlugin``: socket,
annotation, reconcile as ``tessera device-plugin`` does); ``Allocate`` is called over gRPC on its
unix socket, one container at a time (the kubelet admits one pod at a time), oldest bind first,
on one channel connected before the first call (the kubelet's is: it registered the plugin and
called ``ListAndWatch`` first). Each call chooses its pod from the plugin's watch of the node's
pods, plans the share (``driver.prepare.plan_claim``), patches the pod while it records the
share and writes its limits file, region, CDI spec and ``claim.json``, and rewrites the shares
files. Prints p50/p99/max and the first call's time (ms).

    .venv/bin/python bench/bench_deviceplugin.py --pods 100 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from corpus_paths import corpus_path  # noqa: E402
from tessera import DRIVER_NAME  # noqa: E402
from tessera.convert.hami import (  # noqa: E402
    BIND_PHASE,
    BIND_TIME,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    VGPU_NODE,
    ContainerDevice,
    encode_pod_devices,
)
from tessera.deviceplugin.plugin import DevicePlugin, DevicePluginConfig  # noqa: E402
from tessera.driver.guard import MODE_LABEL, MODE_LEGACY  # noqa: E402
from tessera.driver.kubelet import deviceplugin_stubs  # noqa: E402
from tessera.enforcement import library_path  # noqa: E402
from tessera.inventory import load_inventory  # noqa: E402
from tessera.localcluster.cluster import Cluster, Inventory, register_inventory  # noqa: E402
from tessera.localcluster.fake_nvml import nvml_config  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
from bench_driver import build_fake_nvml, ms  # noqa: E402

H100 = (
    corpus_path()
    / "inventories"
    / "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-dp-"))
    cluster = Cluster(tmp / "cluster")
    out: dict[str, Any] = {"pods": args.pods, "gpus": 8}
    try:
        gpus = load_inventory(H100)
        nvml = build_fake_nvml(tmp / "build")
        node = "bench-node"
        cluster.up(Inventory(), build_binaries=False, die_with_parent=True)
        client = cluster.client()
        inv = Inventory()
        inv.add_node(node, labels={MODE_LABEL: MODE_LEGACY})  # the guard's legacy mode
        register_inventory(client, inv)
        client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}})
        rng = random.Random(args.seed)
        free = {g.uuid: [(g.usable_memory_bytes or 0) >> 20, 100] for g in gpus}
        for i in range(args.pods):
            # what an extender could decide: each share fits its GPU's memory and cores left
            mem, cores = rng.randint(1000, 6000), rng.choice([0, 5, 10])
            fits = [u for u, (m, c) in free.items() if m >= mem and c >= cores]
            if not fits:
                raise SystemExit(f"--pods {args.pods}: pod {i} fits no GPU; use fewer pods")
            u = rng.choice(fits)
            free[u][0] -= mem
            free[u][1] -= cores
            decision = encode_pod_devices([[ContainerDevice(u, "NVIDIA", mem, cores)]])
            client.create(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"p{i:04d}",
                        "namespace": "bench",
                        "annotations": {
                            VGPU_NODE: node,
                            DEVICES_TO_ALLOCATE: decision,
                            DEVICES_ALLOCATED: decision,
                            BIND_PHASE: "allocating",
                            BIND_TIME: str(1_000_000 + i),
                        },
                    },
                    "spec": {
                        "nodeName": node,
                        "containers": [{"name": "c", "image": "busybox"}],
                    },
                }
            )
        root = tmp / "node"
        dev = root / "devroot" / "dev"
        dev.mkdir(parents=True)
        for name in [f"nvidia{g.index}" for g in gpus] + ["nvidiactl", "nvidia-uvm"]:
            os.mknod(dev / name, 0o666 | 0o020000, os.makedev(1, 3))
        (root / "nvml.cfg").write_text(nvml_config(gpus))
        os.environ["FAKE_NVML_CONFIG"] = str(root / "nvml.cfg")
        lib = library_path()
        plugin = DevicePlugin(
            DevicePluginConfig(
                node_name=node,
                device_plugin_dir=root / "device-plugins",
                state_dir=root / "state",
                cdi_dir=root / "cdi",
                dev_root=root / "devroot",
                library=Path(lib) if lib else None,
                driver=DRIVER_NAME,
                nvml_library=str(nvml),
            ),
            client,
            log=lambda _: None,
        )
        plugin.start()
        pb2, pb2_grpc = deviceplugin_stubs()
        times: list[float] = []
        with grpc.insecure_channel(f"unix://{plugin.socket_path}") as ch:
            # Connected before the first call, as the kubelet's channel is (it calls
            # GetDevicePluginOptions and ListAndWatch on it before any Allocate).
            grpc.channel_ready_future(ch).result(timeout=30)
            stub = pb2_grpc.DevicePluginStub(ch)
            for _ in range(args.pods):
                req = pb2.AllocateRequest(
                    container_requests=[pb2.ContainerAllocateRequest(devices_ids=["x"])]
                )
                t0 = time.perf_counter()
                resp = stub.Allocate(req, timeout=30)
                times.append(time.perf_counter() - t0)
                assert len(resp.container_responses[0].cdi_devices) == 1
        plugin.stop()
        left = [
            p["metadata"]["name"]
            for p in client.list("v1", "Pod", "bench")
            if p["metadata"]["annotations"].get(BIND_PHASE) != "success"
        ]
        assert not left, f"not allocated: {left}"
        out["allocate_ms"] = ms(times)
        out["allocate_ms"]["first"] = round(times[0] * 1000, 2)
        print(json.dumps(out, indent=1))
        if args.json:
            args.json.write_text(json.dumps(out, indent=1) + "\n")
    finally:
        cluster.down()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
