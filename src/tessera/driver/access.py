"""What the node agents may do in the API server: DRA mode's node agent, :data:`NODE_AGENT_ACCESS`,
and legacy mode's device plugin, :data:`DEVICE_PLUGIN_ACCESS` (below).

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

from tessera import DRIVER_NAME
from tessera.kube.access import Access

__all__ = ["DEVICE_PLUGIN_ACCESS", "NODE_AGENT_ACCESS", "RESOURCE_GROUP", "Access"]

RESOURCE_GROUP = "resource.k8s.io"


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


#: Everything ``tessera device-plugin`` (:class:`tessera.deviceplugin.plugin.DevicePlugin`)
#: does in the API server; it asks for every row at start
#: (:meth:`tessera.deviceplugin.plugin.DevicePlugin.check_access`), and the chart's
#: device-plugin ClusterRole grants exactly these rows (``tests/e2e/test_helm_legacy.py``):
#:
#: * ``get nodes``: the guard (:func:`tessera.driver.guard.check_node`, mode ``legacy``: the
#:   Node's mode label) and the node lock's holder before it is released;
#: * ``patch nodes``: the ``hami.io/node-nvidia-register`` and ``hami.io/node-handshake``
#:   annotations, and releasing the node lock (merge patches of its own Node);
#: * ``list pods``, ``watch pods``: the pods on its node (``fieldSelector=spec.nodeName=<node>``):
#:   the cache ``Allocate`` chooses from (:class:`tessera.deviceplugin.pods.NodePods`, an
#:   informer: a list, then a watch), and the list ``Allocate`` and reconcile read when the
#:   cache cannot answer or lags (RBAC cannot hold a list or a watch to a field selector, so the
#:   grant is cluster-wide, the reads are not);
#: * ``patch pods``: HAMi's bind phase (``hami.io/bind-phase``) on the pod it allocated;
#: * ``list resourceslices``: the guard's slices of this node (no DRA driver may publish its
#:   GPUs).
DEVICE_PLUGIN_ACCESS: tuple[Access, ...] = (
    Access("get", "", "nodes"),
    Access("patch", "", "nodes"),
    Access("list", "", "pods"),
    Access("watch", "", "pods"),
    Access("patch", "", "pods"),
    Access("list", RESOURCE_GROUP, "resourceslices"),
)
