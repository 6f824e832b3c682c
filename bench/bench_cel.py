"""Benchmark: CEL engines on device selectors — Tessera's (``tessera.cel``) against the
candidates it was chosen over (docs/cel.md), where they are installed.

Selectors: every distinct expression of the conformance scenarios (tests/conformance/scenarios)
plus typical Tessera selectors; devices: the bundled cluster's (src/tessera/examples). Each
engine compiles every selector it can express and evaluates it on every device; reported:
selectors it runs, compile µs per selector, evaluation µs per (selector, device).

    .venv/bin/python bench/bench_cel.py
    # candidates, in a scratch venv: pip install cel-python==0.5.0 cel-expr-python common-expression-language
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tessera.cel import compile_selector
from tessera.sim.cluster import load_cluster

ROOT = Path(__file__).resolve().parents[1]
EXTRA = [
    'device.driver == "gpu.tessera.dev" && device.allowMultipleAllocations',
    'device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("40Gi")) >= 0',
    'has(device.attributes["gpu.tessera.dev"].productName) && '
    'device.attributes["gpu.tessera.dev"].productName.lowerAscii().contains("h100")',
    'device.attributes["gpu.tessera.dev"].?numaNode.orValue(-1) == 0',
    'cel.bind(g, device.attributes["gpu.tessera.dev"], g.type == "gpu" && g.?index.orValue(-1) >= 0)',
    'device.attributes["gpu.tessera.dev"].productName in ["NVIDIA H100 80GB HBM3", "Tesla V100S-PCIE-32GB"]',
]


def selectors() -> list[str]:
    found: set[str] = set()
    for f in sorted((ROOT / "tests" / "conformance" / "scenarios").glob("*.yaml")):
        text = f.read_text()
        for doc in yaml.safe_load_all(text):

            def walk(x: Any) -> None:
                if isinstance(x, dict):
                    cel = x.get("cel")
                    if isinstance(cel, dict) and isinstance(cel.get("expression"), str):
                        found.add(cel["expression"])
                    for v in x.values():
                        walk(v)
                elif isinstance(x, list):
                    for v in x:
                        walk(v)

            walk(doc)
    return sorted(found) + EXTRA


def devices() -> list[Any]:
    from tessera.allocator import SliceIndex

    slices = [
        s
        for n in load_cluster(ROOT / "src" / "tessera" / "examples" / "cluster.yaml").nodes
        for s in n.slices
    ]
    return list(SliceIndex(slices).devices())


def plain(d: Any) -> dict[str, Any]:
    """A device as plain maps (what a generic CEL engine gets): quantities as strings."""
    attrs: dict[str, dict[str, Any]] = {}
    for k, v in d.attributes.items():
        dom, _, name = k.rpartition("/")
        attrs.setdefault(dom, {})[name] = (
            v if isinstance(v, bool | int | str) else str(getattr(v, "text", v))
        )
    caps: dict[str, dict[str, Any]] = {}
    for k, c in d.capacity.items():
        dom, _, name = (k if "/" in k else f"{d.driver}/{k}").rpartition("/")
        caps.setdefault(dom, {})[name] = c.value.canonical()
    return {
        "driver": d.driver,
        "allowMultipleAllocations": d.allow_multiple,
        "attributes": attrs,
        "capacity": caps,
    }


Engine = tuple[str, Callable[[str], Any], Callable[[Any, Any], Any], Callable[[Any], Any]]


def engines() -> list[Engine]:
    out: list[Engine] = [
        ("tessera.cel", compile_selector, lambda p, a: p.evaluate(a), lambda d: d.activation())
    ]
    try:
        import celpy
        from celpy.adapter import json_to_cel

        env = celpy.Environment()
        out.append(
            (
                "cel-python 0.5 (celpy)",
                lambda e: env.program(env.compile(e)),
                lambda p, a: p.evaluate(a),
                lambda d: {"device": json_to_cel(plain(d))},
            )
        )
    except ImportError:
        pass
    try:
        from cel_expr_python import cel
        from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings

        cenv = cel.NewEnv(
            variables={"device": cel.Type.Map(cel.Type.STRING, cel.Type.DYN)},
            extensions=[
                ext_optional.ExtOptional(),
                ext_strings.ExtStrings(),
                ext_bindings.ExtBindings(),
            ],
        )
        out.append(
            (
                "cel-expr-python 0.1.3 (cel-cpp)",
                cenv.compile,
                lambda p, a: p.eval(data=a).value(),
                lambda d: {"device": plain(d)},
            )
        )
    except ImportError:
        pass
    try:
        import cel as rcel

        if hasattr(rcel, "compile"):
            out.append(
                (
                    "common-expression-language (Rust)",
                    rcel.compile,
                    lambda p, a: p.execute(a),
                    lambda d: {"device": plain(d)},
                )
            )
    except ImportError:
        pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sels, devs = selectors(), devices()
    print(f"{len(sels)} selectors, {len(devs)} devices")
    print("| engine | selectors it runs | compile µs/selector | evaluate µs/(selector, device) |")
    print("|---|---|---|---|")
    for name, comp, ev, act in engines():
        acts = [act(d) for d in devs]
        with contextlib.suppress(Exception):
            comp("1 == 1 && [1].all(x, x > 0)")  # one-time set-up (grammar tables) not counted
        t0 = time.perf_counter()
        progs = []
        for s in sels:
            try:
                progs.append(comp(s))
            except Exception:
                continue
        t_comp = (time.perf_counter() - t0) / max(len(sels), 1)
        runnable = []
        for p in progs:
            try:
                for a in acts[:3]:
                    try:
                        ev(p, a)
                    except Exception as e:
                        if "no such key" not in str(e) and "No such key" not in str(e):
                            raise
                runnable.append(p)
            except Exception:
                continue
        n = 0
        t0 = time.perf_counter()
        for _ in range(args.rounds):
            for p in runnable:
                for a in acts:
                    with contextlib.suppress(Exception):
                        ev(p, a)
                    n += 1
        t_eval = (time.perf_counter() - t0) / max(n, 1)
        print(
            f"| {name} | {len(runnable)} of {len(sels)} | {t_comp * 1e6:.0f} | {t_eval * 1e6:.1f} |"
        )


if __name__ == "__main__":
    main()
