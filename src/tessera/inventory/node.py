"""A ``v1`` Node's GPUs as HAMi registered them: the ``hami.io/node-nvidia-register``
annotation (:mod:`tessera.inventory.hami`'s wire format) as the node's ResourceSlices, the
GPUs ``hami.io/device-cordon`` lists tainted. Read by ``simulate`` (a cluster's Nodes) and by
``lint`` (a bad annotation is a finding), so both judge the annotation alike.
"""

from __future__ import annotations

from typing import Any

from tessera.api.errors import ManifestError, TesseraError
from tessera.api.loader import Manifest

from .errors import InventoryError
from .parse import parse_inventory
from .slices import build_resource_slices

#: Node annotation: the node's GPUs in HAMi's register format.
HAMI_REGISTER = "hami.io/node-nvidia-register"
#: Node annotation, comma UUIDs: HAMi places nothing new on these GPUs (v2.10).
HAMI_CORDON = "hami.io/device-cordon"


def node_register_slices(m: Manifest) -> list[dict[str, Any]]:
    """The ResourceSlices (``resource.k8s.io/v1`` dicts) of the Node ``m``'s HAMi register
    annotation, [] without one; a GPU that ``hami.io/device-cordon`` lists keeps what it holds
    and takes nothing new (a ``hami.io/device-cordon:NoSchedule`` device taint). Raises
    :class:`ManifestError` naming the annotation when it is not a readable inventory."""
    md = m.obj.get("metadata") or {}
    name = str(md.get("name") or "")
    annotations = md.get("annotations") or {}
    register = annotations.get(HAMI_REGISTER)
    if not register:
        return []
    cordon = {
        u.strip(): [{"key": HAMI_CORDON, "effect": "NoSchedule"}]
        for u in str(annotations.get(HAMI_CORDON) or "").split(",")
        if u.strip()
    }
    where = f"{m.source}: {m.ref()}: metadata.annotations[{HAMI_REGISTER}]"
    try:
        gpus = parse_inventory(str(register), where)
        return build_resource_slices(name, gpus, taints=cordon)
    except TesseraError as e:
        # The annotation's own location is this field: keep only the problem.
        problem = e.problem if isinstance(e, InventoryError) else str(e)
        raise ManifestError(
            problem.removeprefix(f"{where}: "),
            file=m.source.file,
            doc=m.source.doc,
            obj=m.ref(),
            field=f"metadata.annotations[{HAMI_REGISTER}]",
        ) from None
