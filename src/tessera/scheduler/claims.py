"""Which ResourceClaim a pod's claim entry names: the resourceclaim controller's decision.

A pod's ``spec.resourceClaims[]`` entry names a claim directly (``resourceClaimName``) or a
template (``resourceClaimTemplateName``) from which the resourceclaim controller makes one
claim per pod, recording its name in ``status.resourceClaimStatuses`` (KEP-3063, DRA's pod
claim status). The simulation, ``explain``, the monitor and the test helpers resolve entries
here, so they agree on it:

- :func:`pod_claim_name`: the claim an entry refers to;
- :func:`generated_claim_name`: the one the controller recorded for a template entry;
- :func:`template_claim_name`: the name the simulation gives a claim it makes from a template
  when no controller has recorded one (``<pod>-<entry>``; the real controller uses
  ``generateName`` and so a random suffix, which a reproducible simulation cannot).

The claim kube-scheduler makes for extended resources is named in
:mod:`tessera.scheduler.extended`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.api.pods import PodClaim


def generated_claim_name(pod: Mapping[str, Any], entry_name: str) -> str | None:
    """The ResourceClaim the resource-claim controller made from a template for the pod's
    claim entry ``entry_name`` (its ``status.resourceClaimStatuses`` item), or None when the
    pod carries none (not made yet, or files written by hand)."""
    for st in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if isinstance(st, Mapping) and st.get("name") == entry_name and st.get("resourceClaimName"):
            return str(st["resourceClaimName"])
    return None


def template_claim_name(pod_name: str, entry_name: str) -> str:
    """The simulation's name for the claim made from a template for the pod's claim entry
    ``entry_name`` when no ``status.resourceClaimStatuses`` names one: ``<pod>-<entry>``."""
    return f"{pod_name}-{entry_name}"


def pod_claim_name(
    pod: Mapping[str, Any], entry: PodClaim, *, simulated: bool = False
) -> str | None:
    """The name of the ResourceClaim (in the pod's namespace) that the pod's
    ``spec.resourceClaims[]`` item ``entry`` (:func:`tessera.api.pods.pod_claims`) refers
    to: its ``resourceClaimName``; for a
    ``resourceClaimTemplateName`` the claim the controller made (:func:`generated_claim_name`),
    else, when ``simulated``, :func:`template_claim_name`, else None (a live cluster's
    controller has not made it yet). None for an entry naming neither."""
    if entry.claim_name:
        return entry.claim_name
    if not entry.template_name:
        return None
    name = entry.name
    made = generated_claim_name(pod, name)
    if made is not None or not simulated:
        return made
    md = pod.get("metadata") or {}
    return template_claim_name(str(md.get("name") or md.get("generateName") or ""), name)
