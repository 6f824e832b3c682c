"""Admission latency of ``tessera webhook`` under a constant request rate, measured from the client.

Starts a real control plane (``tessera.kube.cluster``, the e2e nodes: 8x H100 with topology and
2x A5000), a ``tessera webhook`` process against it, and attacks ``POST /mutate-pods`` over TLS on
loopback with **vegeta** (an open-loop load tool: requests leave at the given rate whatever the
latency, so slow answers are not hidden) for a fixed duration. The bodies are AdmissionReviews of
corpus HAMi pods (five shapes: a share, a fraction of 2 GPUs, exclusive GPUs, a card type, a
UUID list), each with its own uid. Prints vegeta's report (latency percentiles, status codes)
and the machine's core count; the results table lives in docs/benchmarks.md.

    .venv/bin/python bench/bench_webhook.py --rate 500 --duration 60

vegeta is built from the Go module proxy into bench/.bin/ on first use (``go install``).
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

VEGETA = "github.com/tsenart/vegeta/v12@v12.12.0"
PODS = [
    "HAMi__examples_nvidia__default_use.yaml",
    "HAMi__examples_nvidia__use_memory_fraction.yaml",
    "HAMi__examples_nvidia__use_exclusive_card.yaml",
    "HAMi__examples_nvidia__specify_card_type_to_use.yaml",
    "HAMi__examples_nvidia__specify_uuid_to_use.yaml",
]


def vegeta() -> Path:
    bin_dir = REPO / "bench" / ".bin"
    exe = bin_dir / "vegeta"
    if not exe.is_file():
        bin_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["go", "install", VEGETA], check=True, env={**os.environ, "GOBIN": str(bin_dir)})
    return exe


def _pdeathsig() -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=500, help="requests per second (default 500)")
    ap.add_argument("--duration", type=int, default=60, help="seconds (default 60)")
    args = ap.parse_args()

    from corpus_paths import corpus_path
    from e2e.conftest import (
        A5000_INVENTORY,
        H100_INVENTORY,
        H100_TOPOLOGY,
        corpus_node,
        inventory_of,
    )
    from tessera.kube.cluster import Cluster
    from tessera.kube.pki import make_serving_certificate

    exe = vegeta()
    hami = corpus_path().resolve() / "hami-pods"
    work = Path(tempfile.mkdtemp(prefix="tessera-bench-webhook-"))
    cluster = Cluster(work / "cluster")
    proc = None
    try:
        nodes = [corpus_node("h100-node", H100_INVENTORY, H100_TOPOLOGY), corpus_node("a5000-node", A5000_INVENTORY)]
        cluster.up(inventory_of(nodes), build_binaries=False, die_with_parent=True)
        ca, serving = make_serving_certificate(work, "webhook")
        port_file = work / "port"
        log = open(work / "webhook.log", "wb")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "tessera", "webhook", f"--tls-cert-file={serving.cert}",
             f"--tls-private-key-file={serving.key}", "--port=0", f"--port-file={port_file}",
             f"--kubeconfig={cluster.kubeconfig}"],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=_pdeathsig,
        )
        deadline = time.monotonic() + 60
        while not port_file.is_file():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"webhook did not start: {(work / 'webhook.log').read_text()}")
            time.sleep(0.1)
        url = f"https://127.0.0.1:{int(port_file.read_text())}/mutate-pods"
        pods = [next(d for d in yaml.safe_load_all((hami / f).read_text()) if d) for f in PODS]
        targets = work / "targets.jsonl"
        with open(targets, "w") as out:
            for i in range(args.rate * args.duration):
                pod = pods[i % len(pods)]
                review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
                    "uid": f"bench-{i:08d}", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
                    "namespace": "default", "object": pod}}
                body = base64.b64encode(json.dumps(review).encode()).decode()
                out.write(json.dumps({"method": "POST", "url": url, "body": body,
                                      "header": {"Content-Type": ["application/json"]}}) + "\n")
        results = work / "results.bin"
        with open(targets) as t, open(results, "wb") as r:
            subprocess.run([str(exe), "attack", "-format=json", f"-rate={args.rate}/s", f"-duration={args.duration}s",
                            f"-root-certs={ca.cert}", "-timeout=10s"], stdin=t, stdout=r, check=True)
        report = subprocess.run([str(exe), "report", "-type=json", str(results)], capture_output=True, text=True, check=True)
        rep = json.loads(report.stdout)
        lat = {k: v / 1e6 for k, v in rep["latencies"].items()}  # ns -> ms
        print(f"cores: {os.cpu_count()}  rate: {args.rate}/s  duration: {args.duration}s  requests: {rep['requests']}")
        print(f"latency ms: mean {lat['mean']:.2f}  p50 {lat['50th']:.2f}  p90 {lat['90th']:.2f}  p95 {lat['95th']:.2f}  "
              f"p99 {lat['99th']:.2f}  max {lat['max']:.2f}")
        print(f"throughput: {rep['throughput']:.1f}/s  success: {rep['success']:.4f}  status codes: {rep['status_codes']}")
        if rep.get("errors"):
            print(f"errors: {rep['errors'][:5]}")
        return 0
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        cluster.down()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
