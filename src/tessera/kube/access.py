"""What an identity may do in the API server: :class:`Access`, one RBAC permission, and the
table of legacy mode's scheduler extender, :data:`LEGACY_EXTENDER_ACCESS`.

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
"""

from __future__ import annotations

from dataclasses import dataclass


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
