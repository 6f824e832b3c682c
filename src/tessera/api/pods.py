"""Typed read-only views of the parts of a Pod that DRA reads: its claim entries and its containers.

A pod (or a workload's pod template) names its claims in ``spec.resourceClaims[]`` (each entry a
``name`` and one of ``resourceClaimName`` / ``resourceClaimTemplateName``: KEP-4381, core/v1
``PodResourceClaim``), and each container lists the entries it uses in
``resources.claims[]`` (``name``, optional ``request``: core/v1 ``ResourceClaim``). Every package
that walks them (the simulation, ``explain``, ``lint``, the webhook's template collector, the
monitor's claim names, kube-scheduler's extended-resource claim) reads them here.

The views skip what is not an object (a ``dict``, as every loader and the API client give
them: an entry that is a string, a container that is a number): judging the raw shape is
:mod:`tessera.api.validation`'s job, and a view never raises. (``isinstance`` against the
``Mapping`` ABC costs more than the rest of a view: the simulation reads every pod's. For the
same reason the views are plain dataclasses, read-only by contract: mypyc builds a frozen one
as a Python class, five times slower to make.)
``field`` gives each part's path for messages (``spec.resourceClaims[1]``,
``spec.initContainers[0]``). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def _str(v: Any) -> str | None:
    return str(v) if isinstance(v, str) and v else None


@dataclass(slots=True)
class PodClaim:
    """One ``spec.resourceClaims[index]`` entry.

    ``name``: the entry's name ("" when missing or not a string; containers refer to it);
    ``claim_name``: its ``resourceClaimName`` (a claim in the pod's namespace), or
    ``template_name``: its ``resourceClaimTemplateName`` (the resourceclaim controller makes one
    claim per pod from it); both None when it names neither. ``body``: the entry as written.
    """

    name: str
    claim_name: str | None
    template_name: str | None
    index: int
    body: Mapping[str, Any]

    @property
    def field(self) -> str:
        return f"spec.resourceClaims[{self.index}]"


def spec_claims(spec: Mapping[str, Any] | None) -> list[PodClaim]:
    """The claim entries of a pod spec (a Pod's or a pod template's ``spec``), in order."""
    out: list[PodClaim] = []
    raw = (spec or {}).get("resourceClaims") if isinstance(spec, dict) else None
    for i, pc in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(pc, dict):
            continue
        name = pc.get("name")
        out.append(
            PodClaim(
                name if isinstance(name, str) else "",
                _str(pc.get("resourceClaimName")),
                _str(pc.get("resourceClaimTemplateName")),
                i,
                pc,
            )
        )
    return out


def pod_claims(pod: Mapping[str, Any]) -> list[PodClaim]:
    """The claim entries of a Pod (its ``spec.resourceClaims``), in order."""
    return spec_claims(pod.get("spec"))


@dataclass(slots=True)
class ContainerClaim:
    """One ``resources.claims[]`` item of a container: the pod claim entry it uses (``name``)
    and, when set, the one ``request`` of that claim it is limited to (None: all of them)."""

    name: str
    request: str | None


@dataclass(slots=True)
class Container:
    """One container of a pod: ``init`` for ``spec.initContainers[index]``, else
    ``spec.containers[index]``. ``name`` ("" when missing); ``body``: the container as
    written; :attr:`claims`: its ``resources.claims``."""

    name: str
    init: bool
    index: int
    body: Mapping[str, Any]

    @property
    def claims(self) -> tuple[ContainerClaim, ...]:
        """Its ``resources.claims`` items (read when asked: the simulation walks every pod's
        containers, few of them for their claims)."""
        return _container_claims(self.body)

    @property
    def field(self) -> str:
        return f"spec.{'initContainers' if self.init else 'containers'}[{self.index}]"


def _container_claims(c: Mapping[str, Any]) -> tuple[ContainerClaim, ...]:
    res = c.get("resources")
    raw = res.get("claims") if isinstance(res, dict) else None
    out = []
    for rc in raw if isinstance(raw, list) else []:
        if isinstance(rc, dict):
            name = rc.get("name")
            out.append(
                ContainerClaim(name if isinstance(name, str) else "", _str(rc.get("request")))
            )
    return tuple(out)


def pod_containers(pod: Mapping[str, Any]) -> list[Container]:
    """The pod's containers: its init containers first, then the regular ones (the order the
    kubelet starts them, and the one kube-scheduler's extended-resource mapping walks)."""
    return spec_containers(pod.get("spec"))


def spec_containers(spec: Mapping[str, Any] | None) -> list[Container]:
    """The containers of a pod spec (a Pod's or a pod template's), as :func:`pod_containers`."""
    out: list[Container] = []
    if not isinstance(spec, dict):
        return out
    for key, init in (("initContainers", True), ("containers", False)):
        raw = spec.get(key)
        for i, c in enumerate(raw if isinstance(raw, list) else []):
            if isinstance(c, dict):
                name = c.get("name")
                out.append(Container(name if isinstance(name, str) else "", init, i, c))
    return out
