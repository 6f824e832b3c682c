"""Run the upstream structured allocator on a scenario (``tools/kube/cmd/allocator-harness``).

The harness is a Go program linked against ``k8s.io/dynamic-resource-allocation/structured``
(the allocator inside kube-scheduler) at the pinned Kubernetes version. Scenario and output
formats are documented in ``tools/kube/README.md``; in short::

    run_scenario({"name": ..., "features": [...], "node": {...}, "classes": [...],
                  "slices": [...], "allocated": [...], "claims": [...]})
    -> {"name": ..., "error": "" | "<allocator error>", "results": [AllocationResult | None, ...]}

    run_scenario({... "nodes": [...]}, mode="place")
    -> {"name", "error", "results", "placements": [{"claim", "node", "result", "error",
        "nodesTried", "seconds"}], "placed", "totalSeconds"}
"""

from __future__ import annotations

import datetime as _dt
import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from tessera.localcluster import build

Mode = Literal["allocate", "place"]


class HarnessError(RuntimeError):
    """The harness rejected the scenario (exit 2; the message names the field) or failed."""


def _json_default(value: Any) -> Any:
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.UTC)
        return value.astimezone(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, _dt.date):
        return value.isoformat()
    raise TypeError(
        f"scenario value {value!r} of type {type(value).__name__} is not JSON-serialisable"
    )


def run_scenario(
    scenario: Mapping[str, Any] | Path,
    *,
    mode: Mode = "allocate",
    binary: Path | None = None,
    build_if_missing: bool = True,
    defaults: bool = True,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Run the harness on ``scenario`` (a dict in the documented format, or a YAML file).

    Returns the parsed JSON output. ``results`` is index-aligned with ``claims``: an
    AllocationResult dict (resource.k8s.io/v1 JSON, quantities as canonical strings,
    random ``shareID`` values) or None. An allocator error is *returned* in ``error``
    (results then all None); an invalid scenario raises :class:`HarnessError`.
    ``binary`` defaults to ``tools/kube/bin/allocator-harness``, built on first use unless
    ``build_if_missing`` is False. ``defaults`` applies the API server's resource.k8s.io/v1
    defaulting to claims and slices first (allocationMode ExactCount, count 1, toleration
    operator Equal), as kube-scheduler only sees defaulted objects. ``timeout``: seconds.
    """
    exe = binary or build.binary("allocator-harness")
    if binary is None and not exe.is_file():
        if not build_if_missing:
            raise HarnessError(f"{exe} is missing; run tools/kube/build.sh")
        build.ensure_built()
    if isinstance(scenario, Path):
        args, stdin = (
            [str(exe), "-mode", mode, f"-defaults={str(defaults).lower()}", str(scenario)],
            None,
        )
    else:
        args = [str(exe), "-mode", mode, f"-defaults={str(defaults).lower()}", "-"]
        stdin = json.dumps(scenario, default=_json_default)
    try:
        proc = subprocess.run(
            args, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise HarnessError(f"allocator-harness did not finish within {timeout:.0f}s") from e
    if proc.returncode != 0:
        raise HarnessError(
            proc.stderr.strip() or f"allocator-harness exited with status {proc.returncode}"
        )
    try:
        out: dict[str, Any] = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        raise HarnessError(
            f"allocator-harness printed invalid JSON: {e}: {proc.stdout[:500]!r}"
        ) from e
    return out
