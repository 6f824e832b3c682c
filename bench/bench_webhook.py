"""Admission latency of ``tessera webhook`` under a constant request rate, measured from the client,
and the CPU time one admission costs.

Load test (default): starts a real control plane (``tessera.localcluster.cluster``, the e2e
nodes: 8x H100 with topology and 2x A5000), a ``tessera webhook`` process against it, and attacks
``POST /mutate-pods`` over TLS on loopback with **vegeta** (an open-loop load tool: requests leave
at the given rate whatever the latency, so slow answers are not hidden; connections are kept
alive, as kube-apiserver keeps its connections to webhooks) for a fixed duration, after which it
stops by itself. The bodies are AdmissionReviews of corpus HAMi pods (five shapes: a share, a
fraction of 2 GPUs, exclusive GPUs, a card type, a UUID list), each with its own uid. Before the
attack each shape is admitted once (a running webhook has seen its shapes: the first admission
of a shape lints its template). Prints vegeta's latency percentiles and status codes, the
webhook process's CPU time per request (``/proc/<pid>/stat``, user + system, all threads) and the
time its threads were runnable but waited for a core (``schedstat``), the CPU time of the control
plane's processes during the attack, the machine's core count
and its load average before and after (the machine may be shared).

    .venv/bin/python bench/bench_webhook.py --rate 500 --duration 60

Decision only (``--decision``, no cluster, no HTTP): the CPU time (``time.process_time``) of
:func:`tessera.webhook.admission.decide` plus the answer's encoding, per pod shape, against the
same nodes' ResourceSlices; ``--profile`` adds cProfile's top functions.

    .venv/bin/python bench/bench_webhook.py --decision [--profile]

vegeta is built from the Go module proxy into bench/.bin/ on first use (``go install``).
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import ctypes
import http.client
import itertools
import json
import os
import pstats
import resource
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

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
        subprocess.run(
            ["go", "install", VEGETA], check=True, env={**os.environ, "GOBIN": str(bin_dir)}
        )
    return exe


def _pdeathsig() -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)


def corpus_pods() -> list[dict[str, Any]]:
    from corpus_paths import corpus_path

    hami = corpus_path().resolve() / "hami-pods"
    return [next(d for d in yaml.safe_load_all((hami / f).read_text()) if d) for f in PODS]


def review(pod: dict[str, Any], uid: str) -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": "default",
                "object": pod,
            },
        }
    ).encode()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def runqueue_wait(pid: int) -> float:
    """Seconds the threads of process ``pid`` have spent runnable but waiting for a core
    (``/proc/<pid>/task/*/schedstat``, second field; threads that exited are not counted)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def slow_per_window(exe: Path, results: Path, window: int) -> list[int]:
    """How many answers took over 10 ms (or never came), per ``window`` seconds of the attack:
    whether slow answers cluster (start-up, a neighbour taking the cores) or spread."""
    rows = subprocess.run(
        [str(exe), "encode", "--to", "csv", str(results)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    sent = [(int(r.split(",")[0]), int(r.split(",")[1]), int(r.split(",")[2])) for r in rows if r]
    start = min(t for t, _, _ in sent)
    counts = [0] * (max((t - start) // (window * 10**9) for t, _, _ in sent) + 1)
    for t, code, latency in sent:
        if code == 0 or latency > 10 * 10**6:
            counts[(t - start) // (window * 10**9)] += 1
    return counts


def bench_decision(rounds: int, profile: bool) -> int:
    """CPU time per decision, per corpus pod shape (no HTTP, no cluster)."""
    from e2e.conftest import A5000_INVENTORY, H100_INVENTORY, H100_TOPOLOGY
    from tessera.inventory import build_resource_slices, load_inventory, load_topology
    from tessera.webhook.admission import ClusterView, decide

    slices = build_resource_slices(
        "h100-node", load_inventory(str(H100_INVENTORY)), load_topology(str(H100_TOPOLOGY))
    )
    slices += build_resource_slices("a5000-node", load_inventory(str(A5000_INVENTORY)))
    view = ClusterView.static(slices)
    bodies = [review(p, f"u-{i}") for i, p in enumerate(corpus_pods())]
    for b in bodies:  # first admission of each shape: lints its template
        d = decide(b, view)
        assert d.allowed and d.patch, d.message
        d.review()
    print(f"load average before: {loadavg()}")
    total = 0.0
    for name, body in zip(PODS, bodies, strict=True):
        t0 = time.process_time()
        for _ in range(rounds):
            decide(body, view).review()
        cpu = (time.process_time() - t0) / rounds
        total += cpu
        print(f"{name}: {cpu * 1e3:.3f} ms CPU per decision")
    print(
        f"mean of the five shapes: {total / len(bodies) * 1e3:.3f} ms CPU per decision ({rounds} rounds each)"
    )
    print(f"load average after: {loadavg()}")
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        for i in range(rounds * len(bodies)):
            decide(bodies[i % len(bodies)], view).review()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    return 0


def bench_load(rate: int, duration: int) -> int:
    from e2e.conftest import (
        A5000_INVENTORY,
        H100_INVENTORY,
        H100_TOPOLOGY,
        corpus_node,
        inventory_of,
    )
    from tessera.localcluster.cluster import Cluster
    from tessera.localcluster.pki import make_serving_certificate

    exe = vegeta()
    work = Path(tempfile.mkdtemp(prefix="tessera-bench-webhook-"))
    cluster = Cluster(work / "cluster")
    proc = None
    try:
        nodes = [
            corpus_node("h100-node", H100_INVENTORY, H100_TOPOLOGY),
            corpus_node("a5000-node", A5000_INVENTORY),
        ]
        cluster.up(inventory_of(nodes), build_binaries=False, die_with_parent=True)
        ca, serving = make_serving_certificate(work, "webhook")
        port_file = work / "port"
        log = open(work / "webhook.log", "wb")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tessera",
                "webhook",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                "--port=0",
                f"--port-file={port_file}",
                f"--kubeconfig={cluster.kubeconfig}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_pdeathsig,
        )
        deadline = time.monotonic() + 60
        while not port_file.is_file():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"webhook did not start: {(work / 'webhook.log').read_text()}")
            time.sleep(0.1)
        port = int(port_file.read_text())
        url = f"https://127.0.0.1:{port}/mutate-pods"
        pods = corpus_pods()
        conn = http.client.HTTPSConnection(
            "127.0.0.1", port, context=ssl.create_default_context(cafile=str(ca.cert))
        )
        while True:  # ready: the slices are watched
            conn.request("GET", "/readyz")
            resp = conn.getresponse()
            if resp.read() == b"ok":
                break
            if time.monotonic() > deadline:
                raise SystemExit("webhook not ready after 60 s")
            time.sleep(0.2)
        for i, pod in enumerate(pods):  # each shape once: its template is created and linted
            conn.request(
                "POST",
                "/mutate-pods",
                body=review(pod, f"warm-{i}"),
                headers={"Content-Type": "application/json"},
            )
            answer = json.loads(conn.getresponse().read())["response"]
            if not (answer["allowed"] and answer.get("patch")):
                raise SystemExit(f"{PODS[i]} was not converted: {answer}")
        conn.close()
        targets = work / "targets.jsonl"
        with open(targets, "w") as out:
            for i in range(rate * duration):
                body = base64.b64encode(review(pods[i % len(pods)], f"bench-{i:08d}")).decode()
                out.write(
                    json.dumps(
                        {
                            "method": "POST",
                            "url": url,
                            "body": body,
                            "header": {"Content-Type": ["application/json"]},
                        }
                    )
                    + "\n"
                )
        results = work / "results.bin"
        plane = {
            f.stem: int(f.read_text()) for f in cluster.run_dir.glob("*.pid")
        }  # etcd, API server...
        plane_before = {name: cpu_seconds(pid) for name, pid in plane.items()}
        load_before, cpu_before, wait_before = (
            loadavg(),
            cpu_seconds(proc.pid),
            runqueue_wait(proc.pid),
        )
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        samples: list[tuple[float, float]] = []  # (control plane, webhook) CPU seconds, every 5 s
        done = threading.Event()

        def sample() -> None:
            while True:
                samples.append(
                    (sum(cpu_seconds(pid) for pid in plane.values()), cpu_seconds(proc.pid))
                )
                if done.wait(5):
                    return

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        with open(targets) as t, open(results, "wb") as r:
            subprocess.run(
                [
                    str(exe),
                    "attack",
                    "-format=json",
                    f"-rate={rate}/s",
                    f"-duration={duration}s",
                    f"-root-certs={ca.cert}",
                    "-timeout=10s",
                ],
                stdin=t,
                stdout=r,
                check=True,
            )
        done.set()
        sampler.join()
        cpu_after, wait_after, load_after = (
            cpu_seconds(proc.pid),
            runqueue_wait(proc.pid),
            loadavg(),
        )
        plane_cpu = {name: cpu_seconds(pid) - plane_before[name] for name, pid in plane.items()}
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        vegeta_cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
        report = subprocess.run(
            [str(exe), "report", "-type=json", str(results)],
            capture_output=True,
            text=True,
            check=True,
        )
        rep = json.loads(report.stdout)
        lat = {k: v / 1e6 for k, v in rep["latencies"].items()}  # ns -> ms
        print(
            f"cores: {os.cpu_count()}  rate: {rate}/s  duration: {duration}s  requests: {rep['requests']}"
        )
        print(f"load average (1, 5, 15 min): before {load_before}, after {load_after}")
        print(
            f"latency ms: mean {lat['mean']:.2f}  p50 {lat['50th']:.2f}  p90 {lat['90th']:.2f}  p95 {lat['95th']:.2f}  "
            f"p99 {lat['99th']:.2f}  max {lat['max']:.2f}"
        )
        print(
            f"throughput: {rep['throughput']:.1f}/s  success: {rep['success']:.4f}  status codes: {rep['status_codes']}"
        )
        answered = sum(
            n for code, n in rep["status_codes"].items() if code != "0"
        )  # "0": no answer in 10 s
        print(
            f"webhook CPU: {cpu_after - cpu_before:.2f} s, {(cpu_after - cpu_before) / max(answered, 1) * 1e3:.3f} ms "
            f"per answered request (TLS, HTTP, decision; {answered} answered)"
        )
        wait = wait_after - wait_before
        print(
            f"webhook waiting for a core (runnable, not running): {wait:.2f} s, {wait / max(answered, 1) * 1e3:.3f} ms "
            "per answered request"
        )
        print(
            f"control plane CPU: {sum(plane_cpu.values()):.2f} s ("
            + ", ".join(f"{n} {c:.2f}" for n, c in sorted(plane_cpu.items(), key=lambda x: -x[1]))
            + ")"
        )
        print(f"vegeta CPU: {vegeta_cpu:.2f} s ({vegeta_cpu / duration:.2f} of a core)")
        print(f"answers over 10 ms, per 5 s of the run: {slow_per_window(exe, results, 5)}")
        steps = list(itertools.pairwise(samples))
        print(f"control plane CPU, per 5 s: {[round(b[0] - a[0], 2) for a, b in steps]}")
        print(f"webhook CPU, per 5 s: {[round(b[1] - a[1], 2) for a, b in steps]}")
        if rep.get("errors"):
            print(f"errors: {rep['errors'][:5]}")
        return 0
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        cluster.down()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rate", type=int, default=500, help="requests per second (default 500)")
    ap.add_argument("--duration", type=int, default=60, help="seconds (default 60)")
    ap.add_argument(
        "--decision",
        action="store_true",
        help="CPU time of the decision alone (no cluster, no HTTP)",
    )
    ap.add_argument(
        "--rounds", type=int, default=2000, help="--decision: decisions per shape (default 2000)"
    )
    ap.add_argument(
        "--profile", action="store_true", help="--decision: print cProfile's top functions"
    )
    args = ap.parse_args()
    if args.decision:
        return bench_decision(args.rounds, args.profile)
    return bench_load(args.rate, args.duration)


if __name__ == "__main__":
    sys.exit(main())
