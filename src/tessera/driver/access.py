"""What the node agent may do in the API server: one table, :data:`NODE_AGENT_ACCESS`.

Every request the node agent (``tessera driver``) makes to the API server is one of these rows;
the start-up check (:meth:`tessera.driver.node.NodeDriver.start`, step 2) asks a
SelfSubjectAccessReview for each row, and the chart's node ClusterRole
(``deploy/helm/tessera/templates/node-rbac.yaml``) grants exactly these rows, no more
(``tests/e2e/test_helm.py::test_node_role_is_exactly_the_access_table`` renders the chart and
compares). Discovery (``GET /api/v1``, ``/apis/resource.k8s.io/v1``: non-resource URLs every
authenticated identity may read through ``system:discovery``) is not a row.

=====================================  ===========================================================
row                                    used by
=====================================  ===========================================================
``get resourceclaims``                 prepare reads the claim the kubelet names
                                       (``claims.ClaimPreparer.read_claim``); an interrupted
                                       dynamic-MIG prepare's claim is read again
                                       (``instances.MigInstances.claim_gone``)
``list resourceslices``                the publisher's own slices (``publish.Publisher``,
                                       ``fieldSelector=spec.nodeName=<node>,spec.driver=<driver>``)
                                       and the guard's slices of this node (``guard.check_node``,
                                       ``fieldSelector=spec.nodeName=<node>``). RBAC cannot hold
                                       a list to a field selector: the grant is cluster-wide, the
                                       reads are not
``create``/``patch resourceslices``    server-side apply of its slices (a PATCH; the API server
                                       also checks ``create`` when the slice does not exist yet)
``delete resourceslices``              its stale slices (a pool that shrank)
``get nodes``                          the guard: its Node's allocatable, annotations, the
                                       override label
``patch resourceclaims/status``        device status of prepared claims
                                       (``claims.ClaimStatusWriter``, server-side apply)
``associated-node:patch                the same, under ``DRAResourceClaimGranularStatusAuthorization``
resourceclaims/driver``                (resource name: the driver's name)
=====================================  ===========================================================

A row that is ``required`` refuses the start when denied (one line naming every denied row);
the status rows only warn: without them claims are still prepared and the failed writes are
counted (``/readyz`` ``statusErrors``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera import DRIVER_NAME

RESOURCE_GROUP = "resource.k8s.io"


@dataclass(frozen=True)
class Access:
    """One permission: ``verb`` on ``resource`` (``subresource``) of API ``group`` (``""``:
    the core group), limited to the object ``name`` when set (RBAC ``resourceNames``);
    ``required``: the driver refuses to start without it (else it warns)."""

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


#: Everything the node agent does in the API server (see the module doc).
NODE_AGENT_ACCESS: tuple[Access, ...] = (
    Access("get", RESOURCE_GROUP, "resourceclaims"),
    Access("list", RESOURCE_GROUP, "resourceslices"),
    Access("create", RESOURCE_GROUP, "resourceslices"),
    Access("patch", RESOURCE_GROUP, "resourceslices"),
    Access("delete", RESOURCE_GROUP, "resourceslices"),
    Access("get", "", "nodes"),
    Access("patch", RESOURCE_GROUP, "resourceclaims", "status", required=False),
    Access(
        "associated-node:patch",
        RESOURCE_GROUP,
        "resourceclaims",
        "driver",
        name=DRIVER_NAME,
        required=False,
    ),
)
