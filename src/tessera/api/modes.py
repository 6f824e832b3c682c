"""Which of Tessera's two modes serves a node's GPUs: one judgement, read by every component.

A Node's label :data:`MODE_LABEL` (``gpu.tessera.dev/mode``) says it: ``dra`` (the node driver
publishes the GPUs as ResourceSlices; the default when the label is absent) or ``legacy`` (the
device plugin registers them in HAMi's ``hami.io/node-nvidia-register`` annotation and the
scheduler extender places pods on them: docs/legacy.md). The chart's DaemonSets select on the
label, the start-up guard (:mod:`tessera.driver.guard`) refuses the other mode's agent on a
node, and ``tessera simulate`` plans each node in its mode (a cluster file's node ``labels`` or
a live Node's). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.api.errors import TesseraError

#: Node label choosing which of Tessera's two modes manages the node's GPUs; on a Namespace,
#: the chart's webhook entry for legacy mode selects its pods by the same label and value.
MODE_LABEL = "gpu.tessera.dev/mode"
MODE_DRA = "dra"
MODE_LEGACY = "legacy"
MODES: tuple[str, ...] = (MODE_DRA, MODE_LEGACY)


class NodeModeError(TesseraError, ValueError):
    """A Node's :data:`MODE_LABEL` holds no mode; the message names the Node and the label."""


def labels_mode(name: str, labels: Mapping[str, Any] | None) -> str:
    """The mode the labels ``labels`` of the Node ``name`` give its GPUs: ``dra`` or ``legacy``
    (``dra`` when :data:`MODE_LABEL` is absent). Raises :class:`NodeModeError` naming the Node
    and the label for any other value."""
    value = str((labels or {}).get(MODE_LABEL, MODE_DRA))
    if value not in MODES:
        raise NodeModeError(
            f"Node {name} label {MODE_LABEL}={value!r}: must be one of "
            f"{', '.join(MODES)} (absent: {MODE_DRA}); fix the label"
        )
    return value


def node_mode(node: Mapping[str, Any] | None) -> str:
    """:func:`labels_mode` of a ``v1`` Node dict (``dra`` for None: no Node object)."""
    md = (node or {}).get("metadata") or {}
    return labels_mode(str(md.get("name", "")), md.get("labels"))
