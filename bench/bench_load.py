"""Benchmark: how fast Tessera reads big inputs, through the real command line.

Each case runs ``tessera`` in a fresh process and reports wall time, CPU time (user + system)
and the peak resident memory of that process (``wait4`` rusage). Inputs are generated into a
temporary folder (or ``--workdir``) with a fixed layout:

* ``lint-100mb``: ``tessera lint`` on one ~100 MB multi-document manifest (ResourceClaimTemplates,
  Pods, Deployments and DeviceClasses in the shapes of the bundled examples);
* ``lint-json-list``: ``tessera lint`` on a ~65 MB ``kubectl get pods -o json``-style List;
* ``simulate-100k``: ``tessera simulate -o json`` of 100,000 small pods (one 1Gi/1-core claim
  each, from two ResourceClaimTemplates) on 160 nodes of 8x H100 80GB (a cluster file with
  ``count: 160``; ``--explicit-nodes`` lists them one by one instead), output to /dev/null.

    .venv/bin/python bench/bench_load.py                 # every case
    .venv/bin/python bench/bench_load.py --case simulate-100k --json out.json

Results and targets are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "src" / "tessera" / "examples"
H100 = (
    EXAMPLES
    / "inventories"
    / "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
)
TESSERA = [sys.executable, "-m", "tessera"]
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _template(name: str, memory: str, cores: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "gpu.tessera.dev",
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": (
                                                'device.attributes["gpu.tessera.dev"]'
                                                '.productName.startsWith("NVIDIA")'
                                            )
                                        }
                                    }
                                ],
                                "capacity": {"requests": {"memory": memory, "cores": cores}},
                            },
                        }
                    ]
                }
            }
        },
    }


def _pod(name: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "bench"}},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example/app:1.0",
                    "command": ["python", "-m", "serve"],
                    "resources": {
                        "claims": [{"name": "gpu"}],
                        "requests": {"cpu": "1", "memory": "2Gi"},
                    },
                }
            ],
        },
    }


def _hami_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {"nvidia.com/use-gputype": "H100"},
        },
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "ubuntu:22.04",
                    "command": ["bash", "-c", "sleep 86400"],
                    "resources": {
                        "limits": {
                            "nvidia.com/gpu": 1,
                            "nvidia.com/gpumem": 3000,
                            "nvidia.com/gpucores": 30,
                        }
                    },
                }
            ]
        },
    }


def _deployment(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "small"}],
                    "containers": [
                        {
                            "name": "srv",
                            "image": "srv:2",
                            "resources": {"claims": [{"name": "gpu"}]},
                        }
                    ],
                },
            },
        },
    }


def write_big_manifest(path: Path, target_bytes: int) -> int:
    """A multi-document YAML file of about ``target_bytes``; returns the object count."""
    n = 0
    with path.open("w") as f:
        i = 0
        while f.tell() < target_bytes:
            docs = [
                _template(f"claim-{i}", "4Gi", "10"),
                _pod(f"pod-{i}", f"claim-{i}"),
                _hami_pod(f"hami-{i}"),
                _deployment(f"web-{i}"),
            ]
            f.write(yaml.dump_all(docs, Dumper=_DUMPER, sort_keys=False, explicit_start=True))
            n += len(docs)
            i += 1
    return n


def write_json_list(path: Path, target_bytes: int) -> int:
    items = []
    size = 0
    i = 0
    while size < target_bytes:
        p = _pod(f"pod-{i}", "small")
        size += len(json.dumps(p, indent=4)) + 6
        items.append(p)
        i += 1
    path.write_text(
        json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": [_template("small", "1Gi", "1"), *items]},
            indent=4,
        )
    )
    return len(items) + 1


def write_simulation(folder: Path, pods: int, nodes: int, explicit: bool) -> Path:
    shutil.copy(H100, folder / "h100.txt")
    if explicit:
        entries = [{"name": f"node-{i:05d}", "inventory": "h100.txt"} for i in range(nodes)]
    else:
        entries = [{"name": "node", "count": nodes, "inventory": "h100.txt"}]
    (folder / "cluster.yaml").write_text(
        yaml.safe_dump(
            {"apiVersion": "tessera.dev/v1alpha1", "kind": "Cluster", "nodes": entries},
            sort_keys=False,
        )
    )
    with (folder / "pods.yaml").open("w") as f:
        docs = [_template("small-a", "1Gi", "1"), _template("small-b", "1Gi", "1")]
        docs += [_pod(f"p-{i:06d}", "small-a" if i % 2 else "small-b") for i in range(pods)]
        f.write(yaml.dump_all(docs, Dumper=_DUMPER, explicit_start=True, sort_keys=False))
    return folder


def measure(args: list[str], cwd: Path) -> dict[str, Any]:
    """Run ``tessera ARGS`` once: wall and CPU seconds, peak RSS, exit status, stderr tail."""
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as out:
        proc = subprocess.Popen([*TESSERA, *args], cwd=cwd, stdout=out, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        err = proc.stderr.read()
        _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    return {
        "exit": os.waitstatus_to_exitcode(status),
        "wall_s": round(wall, 1),
        "cpu_s": round(ru.ru_utime + ru.ru_stime, 1),
        "max_rss_mib": round(ru.ru_maxrss / 1024),
        "stderr": err.decode(errors="replace")[-300:],
    }


CASES = ("lint-100mb", "lint-json-list", "simulate-100k")


def run_case(case: str, work: Path, explicit_nodes: bool) -> dict[str, Any]:
    if case == "lint-100mb":
        f = work / "big.yaml"
        if not f.exists():
            write_big_manifest(f, 100 * 10**6)
        r = measure(["lint", str(f)], work)
        r["input_mb"] = round(f.stat().st_size / 10**6, 1)
    elif case == "lint-json-list":
        f = work / "pods.json"
        if not f.exists():
            write_json_list(f, 50 * 10**6)
        r = measure(["lint", str(f)], work)
        r["input_mb"] = round(f.stat().st_size / 10**6, 1)
    else:
        d = work / ("sim-explicit" if explicit_nodes else "sim")
        d.mkdir(exist_ok=True)
        if not (d / "pods.yaml").exists():
            write_simulation(d, 100_000, 160, explicit_nodes)
        r = measure(["simulate", "--cluster", "cluster.yaml", "pods.yaml", "-o", "json"], d)
        r["input_mb"] = round((d / "pods.yaml").stat().st_size / 10**6, 1)
    r["case"] = case
    return r


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--case", choices=CASES, action="append", help="run only this case (repeatable)"
    )
    ap.add_argument(
        "--workdir", type=Path, help="keep generated inputs here (reused by later runs)"
    )
    ap.add_argument(
        "--explicit-nodes", action="store_true", help="simulate-100k: list the 160 nodes one by one"
    )
    ap.add_argument("--json", type=Path, help="also write the results here")
    a = ap.parse_args()
    tmp = None
    if a.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="tessera-bench-load-")
        work = Path(tmp.name)
    else:
        work = a.workdir
        work.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for case in a.case or CASES:
            r = run_case(case, work, a.explicit_nodes)
            results.append(r)
            print(json.dumps(r), flush=True)
    finally:
        if tmp is not None:
            tmp.cleanup()
    if a.json:
        a.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
