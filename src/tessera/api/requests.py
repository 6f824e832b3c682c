"""Read-only views of a claim spec's device requests (``resource.k8s.io/v1``
``DeviceClaim.requests``): the one place that walks ``exactly`` and ``firstAvailable``.

A request (``DeviceRequest``) holds either one ``exactly`` (``ExactDeviceRequest``) or a
``firstAvailable`` list of subrequests (``DeviceSubRequest``, KEP-4816 prioritized list);
both are :class:`Alternative` here, with the name DRA's results and constraints use for them
(``gpu``, or ``gpu/nvlink`` for a subrequest) and their field path::

    for req in device_requests(claim["spec"]):
        for alt in req.alternatives:
            alt.name, alt.field, alt.device_class_name, alt.count, alt.capacity_requests

The views read the dicts as they are (validated or not: a malformed part is skipped, never
raised on); :attr:`Alternative.body` is the dict itself, for the few writers (class mapping,
whole-GPU rewriting) that change a copy. :mod:`tessera.convert` writes requests and does not
use these views.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Alternative:
    """One ``exactly`` request or one ``firstAvailable`` subrequest of a claim spec.

    ``name``: the request's name, ``<request>/<subrequest>`` for a subrequest (as
    ``status.allocation.devices.results[].request`` names it); ``field``: its path below the
    claim spec (``devices.requests[0].exactly``, ``devices.requests[0].firstAvailable[1]``);
    ``position``: its index in ``firstAvailable`` (None for ``exactly``); ``body``: the dict.
    """

    name: str
    field: str
    position: int | None
    body: dict[str, Any]

    @property
    def device_class_name(self) -> str:
        """``deviceClassName`` ("" when missing)."""
        return str(self.body.get("deviceClassName") or "")

    @property
    def selectors(self) -> list[Any]:
        """``selectors`` (``[{cel: {expression}}]``), [] when missing."""
        sels = self.body.get("selectors")
        return sels if isinstance(sels, list) else []

    @property
    def capacity_requests(self) -> Mapping[str, Any] | None:
        """``capacity.requests`` (capacity name -> quantity, KEP-5075), None when the request
        has no ``capacity``."""
        cap = self.body.get("capacity")
        if not isinstance(cap, Mapping):
            return None
        req = cap.get("requests")
        return req if isinstance(req, Mapping) else {}

    @property
    def allocation_mode(self) -> str:
        """``allocationMode``: ``ExactCount`` (the default) or ``All``."""
        return str(self.body.get("allocationMode") or "ExactCount")

    @property
    def count(self) -> int:
        """``count``, devices asked for (1 when missing, and for allocationMode All)."""
        try:
            return int(self.body.get("count") or 1)
        except (TypeError, ValueError):
            return 1

    @property
    def tolerations(self) -> list[Any]:
        """``tolerations`` of device taints (KEP-5055), [] when missing."""
        tols = self.body.get("tolerations")
        return tols if isinstance(tols, list) else []

    @property
    def admin_access(self) -> bool:
        """``adminAccess`` (KEP-5018; only on ``exactly``)."""
        return self.body.get("adminAccess") is True


@dataclass(frozen=True, slots=True)
class Request:
    """One ``spec.devices.requests[]`` item: ``name``, ``index`` in the list, its
    ``exactly`` or its ``first_available`` subrequests (in preference order); ``body``: the
    item's dict."""

    name: str
    index: int
    exactly: Alternative | None
    first_available: tuple[Alternative, ...]
    body: dict[str, Any]

    @property
    def alternatives(self) -> tuple[Alternative, ...]:
        """What may satisfy the request: its ``exactly``, else its subrequests in order."""
        return (self.exactly,) if self.exactly is not None else self.first_available


def device_requests(spec: Mapping[str, Any] | None) -> list[Request]:
    """The requests of a claim spec (a ResourceClaim's ``spec``, a template's ``spec.spec``),
    in order; items that are not objects are skipped, as are subrequests that are not."""
    devices = (spec or {}).get("devices") if isinstance(spec, Mapping) else None
    items = devices.get("requests") if isinstance(devices, Mapping) else None
    out: list[Request] = []
    for i, r in enumerate(items if isinstance(items, list) else ()):
        if not isinstance(r, dict):
            continue
        name = str(r.get("name") or "")
        path = f"devices.requests[{i}]"
        ex = r.get("exactly")
        exactly = Alternative(name, f"{path}.exactly", None, ex) if isinstance(ex, dict) else None
        subs: list[Alternative] = []
        fa = r.get("firstAvailable")
        if exactly is None and isinstance(fa, list):
            for j, s in enumerate(fa):
                if isinstance(s, dict):
                    sub = f"{name}/{s.get('name') or ''}"
                    subs.append(Alternative(sub, f"{path}.firstAvailable[{j}]", j, s))
        out.append(Request(name, i, exactly, tuple(subs), r))
    return out


def claim_requests(claim: Mapping[str, Any]) -> list[Request]:
    """:func:`device_requests` of a ResourceClaim (``spec``) or a ResourceClaimTemplate
    (``spec.spec``), told apart by ``kind`` (a dict without ``kind`` is a claim)."""
    spec = claim.get("spec")
    if claim.get("kind") == "ResourceClaimTemplate":
        spec = spec.get("spec") if isinstance(spec, Mapping) else None
    return device_requests(spec if isinstance(spec, Mapping) else None)
