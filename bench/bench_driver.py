"""Benchmark the node driver: NodePrepareResources latency, RSS, time to first ResourceSlices.

A real control plane (``tessera.localcluster.cluster``, binaries from ``$TESSERA_KUBE_BIN`` or
``tools/kube/bin``) holds ``--claims`` ResourceClaims allocated on one node of 8x H100 80GB
(the corpus gpud inventory, served by the fake NVML of ``native/fake``); shapes are drawn with
a fixed seed (4Gi/10 .. 40Gi/50, memory / cores). Three measurements:

1. **Prepare latency** (driver in this process, so its own clock is read): all claims are
   prepared concurrently, one gRPC NodePrepareResources call per claim from ``--claims``
   threads over one channel on the real unix socket (as the kubelet: one connection per
   plugin). Reported per claim: the driver-side time (plan, checkpoint,
   limits file, region, CDI spec; it excludes the API read), the API read (GET ResourceClaim)
   and the whole call as the kubelet sees it. Then all are unprepared the same way, and
   ``--alone`` claims are prepared one at a time (what a pod started alone pays).
2. **RSS** of a ``tessera driver`` process after it prepared all claims (``VmRSS`` and
   ``VmHWM`` from ``/proc``).
3. **Time to slices**: from spawning ``tessera driver`` to its ResourceSlice being readable in
   the API server (median of ``--starts`` runs).

    .venv/bin/python bench/bench_driver.py --claims 100 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from corpus_paths import corpus_path  # noqa: E402
from tessera.driver.kubelet import stubs  # noqa: E402
from tessera.driver.node import DriverConfig, NodeDriver  # noqa: E402
from tessera.enforcement import library_path  # noqa: E402
from tessera.inventory import load_inventory  # noqa: E402
from tessera.kube.client import KubeClient  # noqa: E402
from tessera.localcluster.cluster import Cluster, Inventory, register_inventory  # noqa: E402

H100 = (
    corpus_path()
    / "inventories"
    / "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
)
SHAPES = [("4Gi", "10"), ("8Gi", "20"), ("16Gi", "25"), ("20Gi", "30"), ("40Gi", "50")]


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def ms(xs: list[float]) -> dict[str, float]:
    return {
        "p50": round(pct(xs, 50) * 1000, 2),
        "p99": round(pct(xs, 99) * 1000, 2),
        "max": round(max(xs) * 1000, 2),
    }


def build_fake_nvml(tmp: Path) -> Path:
    subprocess.run(
        ["make", "-s", "-C", str(REPO / "native"), f"BUILD={tmp}", "fake"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return tmp / "fake" / "libnvidia-ml.so.1"


def node_files(root: Path, gpus: list[Any]) -> tuple[Path, Path]:
    (root / "kubelet" / "plugins_registry").mkdir(parents=True)
    dev = root / "devroot" / "dev"
    dev.mkdir(parents=True)
    for name in [f"nvidia{g.index}" for g in gpus] + [
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
    ]:
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(1, 3))
    cfg = root / "nvml.cfg"
    cfg.write_text(
        "driver-version 535.161.08\ncuda-version 12020\n"
        + "".join(
            f'gpu {g.uuid} name="{g.product_name}" memory={g.memory_bytes} pci={g.pcie_bus_id} '
            f"cc={g.cuda_compute_capability} minor={g.index}\n"
            for g in gpus
        )
    )
    return cfg, root / "devroot"


def make_claims(client: KubeClient, node: str, n: int, seed: int) -> list[tuple[str, str, str]]:
    rng = random.Random(seed)
    client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}})
    refs = []
    for i in range(n):
        mem, cores = rng.choice(SHAPES)
        c = client.create(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"c{i:04d}", "namespace": "bench"},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {
                                    "deviceClassName": "gpu.tessera.dev",
                                    "capacity": {"requests": {"memory": mem, "cores": cores}},
                                },
                            }
                        ]
                    }
                },
            }
        )
        c["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": "gpu.tessera.dev",
                            "pool": node,
                            "device": f"gpu-{i % 8}",
                            "shareID": f"0b0d3b4e-9f0c-4cf5-8c8e-{i:012x}",
                            "consumedCapacity": {"memory": mem, "cores": cores},
                        }
                    ]
                }
            }
        }
        client.update_status(c)
        refs.append(("bench", c["metadata"]["name"], c["metadata"]["uid"]))
    return refs


def concurrently(sock: Path, refs: list[tuple[str, str, str]], unprepare: bool) -> list[float]:
    """One call per claim, all at once from ``len(refs)`` threads over one channel (the
    kubelet holds one gRPC connection per plugin); seconds per call as the caller sees it."""
    _, _, pb2, pb2_grpc = stubs()
    lat: list[float] = [0.0] * len(refs)
    errors: list[str] = []
    barrier = threading.Barrier(len(refs))
    with grpc.insecure_channel(f"unix://{sock}") as ch:
        grpc.channel_ready_future(ch).result(timeout=30)
        stub = pb2_grpc.DRAPluginStub(ch)

        def one(i: int) -> None:
            ns, name, uid = refs[i]
            claim = [pb2.Claim(namespace=ns, name=name, uid=uid)]
            barrier.wait()
            t0 = time.perf_counter()
            if unprepare:
                r = stub.NodeUnprepareResources(
                    pb2.NodeUnprepareResourcesRequest(claims=claim), timeout=120
                )
            else:
                r = stub.NodePrepareResources(
                    pb2.NodePrepareResourcesRequest(claims=claim), timeout=120
                )
            lat[i] = time.perf_counter() - t0
            if r.claims[uid].error:
                errors.append(r.claims[uid].error)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(refs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise SystemExit(f"{len(errors)} claims failed: {errors[0]}")
    return lat


def driver_argv(node: str, kubeconfig: Path, root: Path, nvml: Path, devroot: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tessera",
        "driver",
        "--node-name",
        node,
        "--kubeconfig",
        str(kubeconfig),
        "--kubelet-root-dir",
        str(root / "kubelet"),
        "--cdi-dir",
        str(root / "cdi"),
        "--state-dir",
        str(root / "state"),
        "--dev-root",
        str(devroot),
        "--nvml-library",
        str(nvml),
        "--health-address",
        "",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--claims", type=int, default=100)
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--alone",
        type=int,
        default=20,
        help="then prepare this many claims one at a time (a pod started alone)",
    )
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--state-on",
        type=Path,
        default=None,
        help="put the in-process driver's state dir (checkpoint, limits, regions) on this "
        "directory's file system, e.g. /dev/shm to take the disk's fsync out",
    )
    ap.add_argument(
        "--lanes",
        type=int,
        default=None,
        help="the in-process driver's prepare lanes (DriverConfig.prepare_lanes; default: the "
        "driver's)",
    )
    args = ap.parse_args()
    out: dict[str, Any] = {"claims": args.claims, "gpus": 8}
    tmp = Path(tempfile.mkdtemp(prefix="bench-driver-"))
    cluster = Cluster(tmp / "cluster")
    try:
        gpus = load_inventory(H100)
        nvml = build_fake_nvml(tmp / "build")
        node = "bench-node"
        cluster.up(Inventory(), build_binaries=False, die_with_parent=True)
        client = cluster.client()
        inv = Inventory()
        inv.add_node(node)
        register_inventory(client, inv)
        refs = make_claims(client, node, args.claims, args.seed)

        # 1. Prepare latency, driver in this process.
        root = tmp / "inproc"
        cfg_file, devroot = node_files(root, gpus)
        os.environ["FAKE_NVML_CONFIG"] = str(cfg_file)
        state_dir = Path(tempfile.mkdtemp(dir=args.state_on)) if args.state_on else root / "state"
        out["state_dir_fs"] = subprocess.run(
            ["stat", "-f", "-c", "%T", str(state_dir if state_dir.exists() else root)],
            capture_output=True,
            text=True,
        ).stdout.strip()
        d = NodeDriver(
            DriverConfig(
                node_name=node,
                kubelet_root=root / "kubelet",
                cdi_dir=root / "cdi",
                state_dir=state_dir,
                dev_root=devroot,
                library=Path(library_path() or "/nonexistent"),
                nvml_library=str(nvml),
                health_address=None,
                write_claim_status=False,
                **({"prepare_lanes": args.lanes} if args.lanes is not None else {}),
            ),
            client,
            log=lambda m: None,
        )
        d.start()
        sock = root / "kubelet" / "plugins" / "gpu.tessera.dev" / "dra.sock"
        call = concurrently(sock, refs, unprepare=False)
        out["prepare_driver_ms"] = ms(d.stats.prepare)
        out["prepare_work_ms"] = ms(d.stats.prepare_work)
        out["prepare_checkpoint_wait_ms"] = ms(d.stats.checkpoint_wait)
        # (a driver before the prepare lane has no lane_wait: measured as 0)
        out["prepare_lane_wait_ms"] = ms(getattr(d.stats, "lane_wait", None) or [0.0])
        out["prepare_api_read_ms"] = ms(d.stats.api_read)
        out["prepare_call_ms"] = ms(call)
        out["prepare_wall_s"] = round(max(call), 3)
        out["unprepare_call_ms"] = ms(concurrently(sock, refs, unprepare=True))
        # A pod started alone: its claim prepared with no other call in flight.
        alone = refs[: args.alone]
        n0, a0 = len(d.stats.prepare), len(d.stats.api_read)
        call = [concurrently(sock, [r], unprepare=False)[0] for r in alone]
        out["alone_claims"] = len(alone)
        out["alone_driver_ms"] = ms(d.stats.prepare[n0:])
        out["alone_api_read_ms"] = ms(d.stats.api_read[a0:])
        out["alone_call_ms"] = ms(call)
        concurrently(sock, alone, unprepare=True)
        d.stop()
        shutil.rmtree(root)
        shutil.rmtree(state_dir, ignore_errors=True)

        # 2 + 3. A driver process: time to slices, then RSS after preparing everything.
        starts: list[float] = []
        inside: list[float] = []
        proc = None
        for k in range(args.starts):
            root = tmp / f"proc{k}"
            cfg_file, devroot = node_files(root, gpus)
            for s in client.list(
                "resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.nodeName={node}"
            ):
                client.delete("resource.k8s.io/v1", "ResourceSlice", s["metadata"]["name"])
            env = {**os.environ, "FAKE_NVML_CONFIG": str(cfg_file)}
            t0 = time.perf_counter()
            log = open(root / "driver.log", "wb")  # noqa: SIM115 (closed with the process)
            proc = subprocess.Popen(
                driver_argv(node, cluster.kubeconfig, root, nvml, devroot),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            while not client.list(
                "resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.nodeName={node}"
            ):
                if proc.poll() is not None:
                    raise SystemExit("tessera driver exited")
                time.sleep(0.005)
            starts.append(time.perf_counter() - t0)
            sock_k = root / "kubelet" / "plugins" / "gpu.tessera.dev" / "dra.sock"
            while not sock_k.exists():
                time.sleep(0.01)
            time.sleep(0.05)
            for line in (root / "driver.log").read_text().splitlines():
                if "slices published" in line:
                    inside.append(float(line.rsplit("published ", 1)[1].split()[0]))
            if k < args.starts - 1:
                proc.terminate()
                proc.wait()
        out["time_to_slices_s"] = {
            "median": round(statistics.median(starts), 3),
            "max": round(max(starts), 3),
            "after_imports_median": round(statistics.median(inside), 3) if inside else None,
        }
        assert proc is not None
        sock = (
            tmp / f"proc{args.starts - 1}" / "kubelet" / "plugins" / "gpu.tessera.dev" / "dra.sock"
        )
        while not sock.exists():
            time.sleep(0.01)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        rss_idle = int(
            next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))
        )
        concurrently(sock, refs, unprepare=False)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        kb = {
            k: int(v.split()[0])
            for k, v in (line.split(":", 1) for line in status.splitlines())
            if k in ("VmRSS", "VmHWM")
        }
        out["rss_mib"] = {
            "idle": round(rss_idle / 1024, 1),
            "after_prepare": round(kb["VmRSS"] / 1024, 1),
            "peak": round(kb["VmHWM"] / 1024, 1),
        }
        proc.terminate()
        proc.wait()
    finally:
        cluster.down()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
