"""What an identity may do in the API server: :class:`Access`, one RBAC permission;
:func:`denied_access`, the rows of a table the API server denies (the node agents' start-up
check); the table of legacy mode's scheduler extender, :data:`LEGACY_EXTENDER_ACCESS`, and the
webhook's, :data:`WEBHOOK_ACCESS` (DRA mode) and :data:`WEBHOOK_LEGACY_ACCESS` (legacy mode alone).

Each component's table is every request it makes; the chart's ClusterRole for that component
grants exactly its rows (``tests/e2e/test_helm_legacy.py`` renders the chart and compares).
The node agents' tables are in :mod:`tessera.driver.access`.

``LEGACY_EXTENDER_ACCESS`` (``tessera extender --legacy``, :mod:`tessera.cli.extender` and
:class:`tessera.extender.legacy.LegacyExtender`):

=====================================  ===========================================================
row                                    used by
=====================================  ===========================================================
``list``/``watch nodes``               the Node informer (each node's registered GPUs,
                                       ``hami.io/node-nvidia-register``)
``get nodes``                          bind reads the chosen Node again
``list``/``watch pods``                the informer of booked pods (label ``hami.io/vgpu-node``);
                                       bind lists the node's booked pods again
``get pods``                           bind reads the pod again (deleted, rebound, replaced?)
``patch pods``                         bind records its decision on the pod (merge patch with
                                       the pod's ``resourceVersion``), and takes it off when the
                                       Binding fails
``create pods/binding``                the Binding
=====================================  ===========================================================

``WEBHOOK_ACCESS`` (``tessera webhook --mode dra|both``, :mod:`tessera.cli.webhook`):

=====================================  ===========================================================
row                                    used by
=====================================  ===========================================================
``create``/``patch``/``list``/         the hashed ResourceClaimTemplates' life cycle
``delete resourceclaimtemplates``      (:class:`tessera.webhook.templates.TemplateStore` creates
                                       and stamps them, the ``Collector`` lists and deletes them)
``list``/``watch resourceslices``      GPU memory sizes (the ResourceSlice informer)
``list``/``watch deviceclasses``       who serves ``nvidia.com/gpu``; which other vendors' DRA
                                       drivers are installed (the DeviceClass informer)
``list pods``                          the collector: is a template still used?
=====================================  ===========================================================

``WEBHOOK_LEGACY_ACCESS`` (``tessera webhook --mode legacy``) is empty: it sets
``spec.schedulerName`` from the admission request alone and reads nothing, so the chart binds
the webhook's ServiceAccount to no role in ``mode: legacy``.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tessera.kube.client import KubeClient


@dataclass(frozen=True)
class Access:
    """One permission: ``verb`` on ``resource`` (``subresource``) of API ``group`` (``""``:
    the core group), limited to the object ``name`` when set (RBAC ``resourceNames``);
    ``required``: the component refuses to start without it (else it warns)."""

    verb: str
    group: str
    resource: str
    subresource: str = ""
    name: str = ""
    required: bool = True

    def describe(self) -> str:
        """``verb resource[.group][/subresource][ name]`` (as ``kubectl auth can-i`` names it)."""
        what = f"{self.resource}.{self.group}" if self.group else self.resource
        if self.subresource:
            what += f"/{self.subresource}"
        return f"{self.verb} {what}" + (f" {self.name}" if self.name else "")

    def row(self) -> tuple[str, str, str, str, str]:
        """``(verb, group, resource, subresource, name)``: the row as an RBAC rule grants it."""
        return (self.verb, self.group, self.resource, self.subresource, self.name)


def denied_access(client: KubeClient, rows: Sequence[Access]) -> list[Access]:
    """The rows of ``rows`` the API server denies ``client``'s identity, in ``rows``' order:
    one SelfSubjectAccessReview per row (``resourceNames`` as the row's ``name``), all asked at
    once. Every authenticated identity may ask (``system:basic-user``). Raises
    :class:`~tessera.kube.client.ApiError` when the server does not answer."""
    if not rows:
        return []

    def ask(a: Access) -> bool:
        return client.allowed(
            a.verb, a.resource, group=a.group, subresource=a.subresource, name=a.name
        )[0]

    with ThreadPoolExecutor(len(rows)) as pool:
        answers = list(pool.map(ask, rows))
    return [a for a, ok in zip(rows, answers, strict=True) if not ok]


#: Everything ``tessera extender --legacy`` does in the API server (see the module doc).
LEGACY_EXTENDER_ACCESS: tuple[Access, ...] = (
    Access("list", "", "nodes"),
    Access("watch", "", "nodes"),
    Access("get", "", "nodes"),
    Access("list", "", "pods"),
    Access("watch", "", "pods"),
    Access("get", "", "pods"),
    Access("patch", "", "pods"),
    Access("create", "", "pods", "binding"),
)


#: Everything ``tessera webhook`` does in the API server in DRA mode (``--mode dra|both``; see
#: the module doc); the chart's webhook ClusterRole grants exactly these rows.
WEBHOOK_ACCESS: tuple[Access, ...] = (
    Access("create", "resource.k8s.io", "resourceclaimtemplates"),
    Access("patch", "resource.k8s.io", "resourceclaimtemplates"),
    Access("list", "resource.k8s.io", "resourceclaimtemplates"),
    Access("delete", "resource.k8s.io", "resourceclaimtemplates"),
    Access("list", "resource.k8s.io", "resourceslices"),
    Access("watch", "resource.k8s.io", "resourceslices"),
    Access("list", "resource.k8s.io", "deviceclasses"),
    Access("watch", "resource.k8s.io", "deviceclasses"),
    Access("list", "", "pods"),
)

#: What ``tessera webhook --mode legacy`` does in the API server: nothing (the module doc).
WEBHOOK_LEGACY_ACCESS: tuple[Access, ...] = ()
