"""How long one scrape of `tessera monitor` takes with N shares on a node.

Builds the enforcement library and the fake libcuda/NVML (``make -C native test-programs``
into a temporary directory), prepares N claims in a region directory as the driver lays them
out (``<uid>/usage``, ``limits``, ``claim.json``), starts P processes per claim that hold GPU
memory through the library (real regions, real liveness locks), then measures:

* **HTTP**: ``GET /metrics`` against a ``tessera monitor`` process (fake NVML, ``--no-api``),
  what Prometheus sees;
* **in process**: ``collect()`` plus the text exposition, with NVML and an allocation view of
  N claims allocated by the simulation on the node (what the API refresher caches), so the
  API join is included.

    .venv/bin/python bench/bench_monitor.py --shares 100 --procs 1 --scrapes 200
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tessera.enforcement.layout import REGION_FILE

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20
GPUS = [f"GPU-{i:08x}-1111-2222-3333-444444444444" for i in range(8)]
PHYS = 80 << 30


def build(root: Path) -> Path:
    subprocess.run(
        ["make", "-s", "-C", str(REPO / "native"), f"BUILD={root}", "test-programs"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return root


def prepare(
    tmp: Path, build_dir: Path, shares: int, procs: int
) -> tuple[Path, list[subprocess.Popen[bytes]], dict[str, str]]:
    from tessera.enforcement.limits import GpuLimit, Limits, write_limits

    regions = tmp / "claims"
    regions.mkdir()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "TESSERA_", "LD_PRELOAD"))
    }
    env.update(
        LD_LIBRARY_PATH=str(build_dir / "fake"),
        FAKE_GPU_STATE=str(tmp / "gpu-state"),
        FAKE_GPUS=",".join(f"{u}={PHYS}" for u in GPUS),
    )
    ps: list[subprocess.Popen[bytes]] = []
    for i in range(shares):
        uid = f"00000000-0000-4000-8000-{i:012d}"
        d = regions / uid
        d.mkdir()
        gpu = i % len(GPUS)
        write_limits(
            str(d / "limits"),
            Limits(
                region=str(d / REGION_FILE),
                gpus=(GpuLimit(GPUS[gpu], 512 * MiB, 10),),
                claim=f"bench/claim-{i}",
                claim_uid=uid,
            ),
        )
        (d / "claim.json").write_text(
            json.dumps(
                {
                    "version": 1,
                    "uid": uid,
                    "namespace": "bench",
                    "name": f"claim-{i}",
                    "pool": "bench-node",
                    "devices": [{"uuid": GPUS[gpu], "device": f"gpu-{gpu}"}],
                    "pods": [{"namespace": "bench", "name": f"pod-{i}", "containers": ["main"]}],
                }
            )
        )
        penv = dict(
            env,
            TESSERA_LIMITS_FILE=str(d / "limits"),
            LD_PRELOAD=str(build_dir / "libtessera-enforce.so"),
        )
        for _ in range(procs):
            ps.append(
                subprocess.Popen(
                    [
                        str(build_dir / "bin" / "tp_cuda"),
                        "link",
                        "init",
                        "dev",
                        str(gpu),
                        "alloc",
                        str(16 * MiB),
                        "ready",
                        "hold",
                    ],
                    env=penv,
                    stdout=subprocess.PIPE,
                )
            )
    for p in ps:
        assert p.stdout is not None
        for line in p.stdout:
            if line.strip() == b"holding":
                break
    return regions, ps, env


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def http_scrapes(regions: Path, env: dict[str, str], n: int) -> tuple[list[float], int, float]:
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tessera",
            "monitor",
            "--port",
            "0",
            "--address",
            "127.0.0.1",
            "--region-dir",
            str(regions),
            "--node-name",
            "bench-node",
            "--no-api",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stderr is not None
        url = ""
        for line in p.stderr:
            m = re.search(r"serving (http://\S+)", line)
            if m:
                url = m.group(1)
                break
        assert url, "exporter did not start"
        with urllib.request.urlopen(url, timeout=10) as r:  # warm-up: label strings get cached
            r.read()
        times = []
        size = 0
        cpu0 = cpu_seconds(p.pid)
        for _ in range(n):
            t0 = time.perf_counter()
            with urllib.request.urlopen(url, timeout=10) as r:
                body = r.read()
            times.append(time.perf_counter() - t0)
            size = len(body)
        return times, size, (cpu_seconds(p.pid) - cpu0) / n
    finally:
        p.terminate()
        p.wait()


def in_process(regions: Path, shares: int, n: int) -> tuple[list[float], float]:
    """collect() + exposition with NVML (fake) and an allocation view of ``shares`` claims:
    wall time per scrape, and CPU time per scrape."""
    from tessera.api.loader import Manifest, Source
    from tessera.inventory import build_resource_slices, load_inventory
    from tessera.monitor.allocation import AllocationView, allocation_view
    from tessera.monitor.collector import TesseraCollector
    from tessera.monitor.exposition import Exposition
    from tessera.monitor.nvml import Nvml
    from tessera.monitor.regions import RegionDir
    from tessera.sim.cluster import Cluster, SimNode
    from tessera.sim.simulate import Simulation

    inv = (
        REPO
        / "src"
        / "tessera"
        / "examples"
        / "inventories"
        / "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
    )
    slices = build_resource_slices("bench-node", load_inventory(inv))
    tmpl = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "bench"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "gpu.tessera.dev",
                                "capacity": {"requests": {"memory": "512Mi", "cores": "1"}},
                            },
                        }
                    ]
                }
            }
        },
    }
    objs = [tmpl] + [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"pod-{i}", "namespace": "bench"},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
                "containers": [
                    {"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        }
        for i in range(shares)
    ]
    res = Simulation(
        Cluster([SimNode("bench-node", {}, slices)]),
        [Manifest(o, Source("bench", i)) for i, o in enumerate(objs)],
    ).run()
    assert not res.pending
    view = allocation_view(
        "bench-node",
        slices,
        [o for o in res.objects if o["kind"] == "ResourceClaim"],
        [o for o in res.objects if o["kind"] == "Pod"],
        fetched_at=time.time(),
    )

    class Api:
        def snapshot(self) -> tuple[AllocationView | None, bool, float]:
            return view, True, view.fetched_at

    nvml = Nvml()
    col = TesseraCollector("bench-node", RegionDir(str(regions)), nvml.sample, Api())
    expo = Exposition()
    expo.render(col.collect())
    times = []
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        expo.render(col.collect())
        times.append(time.perf_counter() - t0)
    cpu = (time.process_time() - cpu0) / n
    nvml.close()
    return times, cpu


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shares", type=int, default=100)
    ap.add_argument("--procs", type=int, default=1, help="live processes per share")
    ap.add_argument("--scrapes", type=int, default=200)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tessera-bench-monitor-") as t:
        tmp = Path(t)
        b = build(tmp / "native")
        regions, ps, env = prepare(tmp, b, a.shares, a.procs)
        try:
            http, size, http_cpu = http_scrapes(regions, env, a.scrapes)
            # In process, NVML must be the fake one: run this part in a child with the fake on the path.
            here = str(Path(__file__).parent)
            code = (
                f"import sys, json; sys.path.insert(0, {here!r}); import bench_monitor as B; from pathlib import Path; "
                f"print(json.dumps(B.in_process(Path({str(regions)!r}), {a.shares}, {a.scrapes})))"
            )
            out = subprocess.run(
                [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
            ).stdout
            inproc, inproc_cpu = json.loads(out.strip().splitlines()[-1])
        finally:
            for p in ps:
                p.kill()
                p.wait()
    ms = 1000.0
    print(
        f"shares {a.shares}, live processes {a.shares * a.procs}, scrapes {a.scrapes}, exposition {size} bytes"
    )
    print(f"load average (1 min): {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(
        f"HTTP GET /metrics (NVML, no API):      median {statistics.median(http) * ms:.1f} ms, "
        f"p95 {pct(http, 0.95) * ms:.1f} ms, max {max(http) * ms:.1f} ms, exporter CPU {http_cpu * ms:.1f} ms/scrape"
    )
    print(
        f"in process (NVML + API view of {a.shares}): median {statistics.median(inproc) * ms:.1f} ms, "
        f"p95 {pct(inproc, 0.95) * ms:.1f} ms, max {max(inproc) * ms:.1f} ms, CPU {inproc_cpu * ms:.1f} ms/scrape"
    )


if __name__ == "__main__":
    main()
