"""Legacy mode's conversion of a HAMi pod: its requests stay as they are, its scheduler changes.

In legacy mode (no DRA: docs/legacy.md) Tessera's scheduler extender and device plugin read
HAMi's own resources (``nvidia.com/gpu``, ``gpumem``, ``gpumem-percentage``, ``gpucores``) and
annotations unchanged, so the one change a HAMi pod needs is the scheduler that decides its
GPUs: ``spec.schedulerName`` becomes the legacy kube-scheduler's profile (``tessera-legacy`` in
``deploy/legacy/scheduler-config.yaml``), as HAMi's webhook writes ``hami-scheduler``.

:func:`legacy_pod` checks the requests with the DRA conversion (:func:`~.convert.convert_pod`:
the same values are refused with the same one-line messages, the same warnings are given),
then throws its claims away. The webhook (``--mode legacy|both``) and ``tessera convert
--mode legacy`` both call it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .convert import Conversion, convert_pod, mentions_hami

#: The legacy kube-scheduler's profile name (``deploy/legacy/scheduler-config.yaml``).
LEGACY_SCHEDULER = "tessera-legacy"
#: The ``spec.schedulerName`` values legacy mode replaces, as HAMi's webhook does (none, the
#: default scheduler, HAMi's own); a pod naming any other scheduler keeps it, with a warning.
REPLACED_SCHEDULERS = ("", "default-scheduler", "hami-scheduler")
#: The GPU memory size the check resolves ``gpumem-percentage`` against when the caller knows
#: none (a legacy cluster publishes no ResourceSlices): the extender resolves the percentage
#: against each GPU it places the pod on; the claims made with it are thrown away.
_NOMINAL_MEMORY = 80 * 2**30


def legacy_pod(
    pod: dict[str, Any],
    scheduler_name: str = LEGACY_SCHEDULER,
    *,
    memory_sizes: Sequence[int] = (),
    source: str = "",
) -> Conversion:
    """Legacy mode's conversion of ``pod`` (a Pod dict, never mutated).

    Returns a :class:`~.convert.Conversion` whose ``pod`` is a copy of ``pod`` with
    ``spec.schedulerName`` set to ``scheduler_name`` when at least one container asks for an
    NVIDIA GPU with HAMi's ``nvidia.com/`` resources and the pod's scheduler is one of
    :data:`REPLACED_SCHEDULERS`; its resources, annotations and everything else are unchanged.
    ``templates`` is always empty; ``requests`` are the containers' requests in HAMi's terms
    (as :func:`~.convert.convert_pod` reads them); ``warnings`` are the DRA conversion's, plus
    one for a pod that keeps another scheduler, and one per container asking through
    ``volcano.sh/`` names (Volcano's device plugin and scheduler serve those, not legacy mode).

    ``memory_sizes`` (bytes) and ``source`` are passed to the check. Raises
    :class:`~.convert.ConversionError` for what :func:`~.convert.convert_pod` refuses.
    """
    out = dict(pod)
    if not mentions_hami(pod):
        return Conversion(pod=out)
    check = convert_pod(pod, memory_sizes=memory_sizes or (_NOMINAL_MEMORY,), source=source)
    warnings = list(check.warnings)
    nvidia = [r for r in check.requests if r.family == "nvidia"]
    meta = pod.get("metadata") or {}
    name = (
        f"{meta.get('namespace') or 'default'}/{meta.get('name') or meta.get('generateName') or ''}"
    )
    prefix = f"{source}: " if source else ""
    for r in check.requests:
        if r.family == "volcano":
            warnings.append(
                f"{prefix}pod {name}, container {r.container}: volcano.sh/ GPU resources are left "
                "for Volcano's device plugin and scheduler; legacy mode serves HAMi's nvidia.com/ names"
            )
    if not nvidia:
        return Conversion(pod=out, warnings=warnings, requests=list(check.requests))
    spec = dict(pod.get("spec") or {})
    current = str(spec.get("schedulerName") or "")
    if current not in REPLACED_SCHEDULERS and current != scheduler_name:
        warnings.append(
            f"{prefix}pod {name}: spec.schedulerName {current!r} is kept, so Tessera's legacy "
            f"scheduler {scheduler_name!r} does not place its GPUs; remove spec.schedulerName "
            "to have them placed by Tessera"
        )
    else:
        spec["schedulerName"] = scheduler_name
    out["spec"] = spec
    return Conversion(
        pod=out,
        warnings=warnings,
        requests=list(check.requests),
        node_scheduler_policy=check.node_scheduler_policy,
        gpu_scheduler_policy=check.gpu_scheduler_policy,
    )
