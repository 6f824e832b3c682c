"""The start-up guard: never manage a node's NVIDIA GPUs beside another manager of them.

Two managers of the same GPUs hand the same device to two containers without knowing of each
other: each books the whole GPU (or a share of it) against its own accounting, so limits, the
scheduler's capacity and the monitor's figures are all wrong. HAMi's own rule is the same (its
device-plugin mode and its DRA mode never run on one node). Before the node driver writes
anything, :func:`check_node` looks for the four signs of another manager:

=========================  ==================================================================
kind                       sign
=========================  ==================================================================
``device-plugin``          the Node's ``status.allocatable`` has a device plugin's NVIDIA
                           resource with a quantity above 0: ``nvidia.com/gpu`` (NVIDIA's and
                           HAMi's device plugin), HAMi's ``nvidia.com/gpumem``,
                           ``nvidia.com/gpucores``, ``nvidia.com/gpumem-percentage``, the
                           time-slicing rename ``nvidia.com/gpu.shared``, MIG resources
                           ``nvidia.com/mig-*``, and Volcano's ``volcano.sh/vgpu-*``
``device-plugin-socket``   a device plugin serving on a socket ``nvidia-*.sock`` in the
                           kubelet's device-plugin directory (NVIDIA's plugin and HAMi's fork of
                           it name their sockets ``nvidia-<resource>.sock``); a socket file that
                           no process listens on is a leftover and does not count
``hami``                   HAMi's node annotations ``hami.io/node-nvidia-register`` (its
                           inventory of the node's GPUs), ``hami.io/node-handshake-nvidia``,
                           ``hami.io/node-handshake``
``dra-driver``             another DRA driver's ResourceSlice for this node publishes a device
                           whose ``uuid`` or ``parentUUID`` attribute is one of this node's GPU
                           (or MIG) UUIDs
``tessera-mode``           the Node's label :data:`MODE_LABEL` gives its GPUs to Tessera's
                           other mode (``legacy``: the device plugin and extender; ``dra``, or
                           no label: the node driver)
=========================  ==================================================================

Tessera's own two modes are two managers too: the device plugin runs the same guard with
``mode="legacy"`` (Tessera's own ResourceSlices for the node are then a sign, its own node
annotation and resources are not).

A node where any sign is found is refused with one line (:class:`SecondManagerError`, exit 2
in ``tessera driver``) naming every sign and what to do, unless the Node carries the label
:data:`OVERRIDE_LABEL` ``=true``: the documented override for a migration, node by node
(``docs/install.md``); the signs are then logged and the driver starts.

Needs ``get`` on ``nodes`` and ``list`` on ``resourceslices`` (the chart's node ClusterRole).
Pure functions (:func:`node_signs`, :func:`slice_signs`) hold the judgement; :func:`socket_signs`
and :func:`check_node` do the I/O.
"""

from __future__ import annotations

import errno
import socket
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera import DRIVER_NAME
from tessera.api import modes
from tessera.api.errors import TesseraError
from tessera.api.modes import MODE_DRA, MODE_LABEL, MODE_LEGACY, MODES
from tessera.api.quantity import Quantity, QuantityError
from tessera.kube.client import ApiError, KubeClient

#: Node label that lets the driver start beside another manager (value ``true``): migrations.
OVERRIDE_LABEL = "gpu.tessera.dev/allow-other-gpu-managers"
#: Where the kubelet's device manager and device plugins keep their sockets (a constant in
#: the kubelet: ``k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1.DevicePluginPath``).
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
#: Extended resources through which a device plugin hands out NVIDIA GPUs (exact names).
DEVICE_PLUGIN_RESOURCES: tuple[str, ...] = (
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "nvidia.com/gpumem",
    "nvidia.com/gpucores",
    "nvidia.com/gpumem-percentage",
    "volcano.sh/vgpu-number",
    "volcano.sh/vgpu-memory",
    "volcano.sh/vgpu-cores",
)
#: ... and name prefixes (MIG strategy ``mixed``: ``nvidia.com/mig-1g.10gb``).
DEVICE_PLUGIN_RESOURCE_PREFIXES: tuple[str, ...] = ("nvidia.com/mig-",)
#: HAMi's node annotations in device-plugin mode (``hami.io/...`` in HAMi's pkg/device).
HAMI_ANNOTATIONS: tuple[str, ...] = (
    "hami.io/node-nvidia-register",
    "hami.io/node-handshake-nvidia",
    "hami.io/node-handshake",
)
#: Device attributes that name a GPU by UUID (the NVIDIA DRA driver, HAMi's DRA driver, Tessera).
UUID_ATTRIBUTES: tuple[str, ...] = ("uuid", "parentUUID")
# MODE_LABEL, MODE_DRA, MODE_LEGACY, MODES: the Node label choosing which of Tessera's two
# modes manages the node's GPUs, and its values; one judgement, in tessera.api.modes.


class SecondManagerError(TesseraError, RuntimeError):
    """Another manager of this node's NVIDIA GPUs was found; the message is one line."""


@dataclass(frozen=True)
class Sign:
    """One sign of another GPU manager: ``kind`` (see the module table) and ``detail`` (what
    was seen, naming the object and field)."""

    kind: str
    detail: str


def _is_plugin_resource(name: str) -> bool:
    return name in DEVICE_PLUGIN_RESOURCES or name.startswith(DEVICE_PLUGIN_RESOURCE_PREFIXES)


def node_signs(node: Mapping[str, Any]) -> list[Sign]:
    """Signs on a Node object (a dict as the API server returns it): device plugin resources
    in ``status.allocatable`` with a quantity above 0, and HAMi's annotations."""
    name = str((node.get("metadata") or {}).get("name") or "")
    out: list[Sign] = []
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    for res in sorted(allocatable):
        if not _is_plugin_resource(res):
            continue
        raw = str(allocatable[res])
        try:
            positive = Quantity.parse(raw).value > 0
        except QuantityError:
            positive = True  # the API server stores only valid quantities; be safe
        if positive:
            out.append(Sign("device-plugin", f"Node {name} status.allocatable {res}: {raw}"))
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    for key in HAMI_ANNOTATIONS:
        if key in annotations:
            out.append(Sign("hami", f"Node {name} annotation {key}"))
    return out


def node_mode(node: Mapping[str, Any] | None) -> str:
    """The Tessera mode a Node's label :data:`MODE_LABEL` gives its GPUs: ``dra`` or
    ``legacy``; ``dra`` when the label is absent (or there is no Node object)
    (:func:`tessera.api.modes.node_mode`). Raises :class:`SecondManagerError` naming the Node
    and the label for any other value."""
    try:
        return modes.node_mode(node)
    except modes.NodeModeError as e:
        raise SecondManagerError(str(e)) from None


def mode_signs(node: Mapping[str, Any] | None, mode: str) -> list[Sign]:
    """A sign when the Node's :data:`MODE_LABEL` gives its GPUs to Tessera's other mode than
    ``mode`` (the component asking: ``dra`` for the node driver, ``legacy`` for the device
    plugin). Raises :class:`SecondManagerError` for a label value that is no mode."""
    label = node_mode(node)
    if label == mode:
        return []
    name = str(((node or {}).get("metadata") or {}).get("name") or "")
    owner = (
        "Tessera's device plugin and scheduler extender"
        if label == MODE_LEGACY
        else "Tessera's DRA node driver"
    )
    shown = (
        label
        if MODE_LABEL in (((node or {}).get("metadata") or {}).get("labels") or {})
        else f"{label} (unset)"
    )
    return [
        Sign(
            "tessera-mode",
            f"Node {name} label {MODE_LABEL}={shown} gives its GPUs to {owner}; drain the node and "
            f"set the label to {mode} to move it (docs/legacy.md, 'Moving a node')",
        )
    ]


def _uuid_values(device: Mapping[str, Any]) -> list[str]:
    values = []
    for key, attr in (device.get("attributes") or {}).items():
        if str(key).rsplit("/", 1)[-1] in UUID_ATTRIBUTES and isinstance(attr, Mapping):
            v = attr.get("string")
            if isinstance(v, str) and v:
                values.append(v)
    return values


def slice_signs(
    slices: Iterable[Mapping[str, Any]], uuids: Iterable[str], driver: str = DRIVER_NAME
) -> list[Sign]:
    """Signs in ResourceSlices (dicts, ``resource.k8s.io/v1``): a device of another driver
    than ``driver`` whose ``uuid``/``parentUUID`` attribute (plain or domain-qualified) is one
    of ``uuids`` (compared without case). One sign per slice, listing the UUIDs."""
    mine = {u.lower() for u in uuids if u}
    out: list[Sign] = []
    for s in slices:
        spec = s.get("spec") or {}
        other = str(spec.get("driver") or "")
        if other == driver:
            continue
        hits = sorted(
            {v for d in spec.get("devices") or [] for v in _uuid_values(d) if v.lower() in mine}
        )
        if hits:
            name = str((s.get("metadata") or {}).get("name") or "")
            out.append(
                Sign(
                    "dra-driver",
                    f"DRA driver {other} publishes {', '.join(hits)} (ResourceSlice {name})",
                )
            )
    return out


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(str(path))
        except OSError as e:
            # ECONNREFUSED: a socket file nobody listens on (a stopped plugin's leftover).
            return e.errno not in (errno.ECONNREFUSED, errno.ENOENT)
        return True


def socket_signs(device_plugin_dir: Path = DEVICE_PLUGIN_DIR, own: str = "") -> list[Sign]:
    """Device plugins serving NVIDIA GPUs on this host: sockets ``nvidia-*.sock`` in
    ``device_plugin_dir`` that accept a connection, but the socket named ``own`` (the asking
    device plugin's). A missing directory has none."""
    out: list[Sign] = []
    try:
        entries = sorted(device_plugin_dir.iterdir())
    except FileNotFoundError:
        return out
    except OSError as e:
        raise SecondManagerError(
            f"cannot read the device plugin directory {device_plugin_dir}: {e.strerror}; mount the "
            "host's /var/lib/kubelet/device-plugins there, or pass --device-plugin-dir"
        ) from e
    for p in entries:
        if not (p.name.startswith("nvidia-") and p.name.endswith(".sock")) or p.name == own:
            continue
        try:
            if not stat.S_ISSOCK(p.lstat().st_mode):
                continue
        except OSError:
            continue
        if _listening(p):
            out.append(Sign("device-plugin-socket", f"device plugin socket {p} is served"))
    return out


def _override(node: Mapping[str, Any] | None) -> bool:
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    return str(labels.get(OVERRIDE_LABEL, "")).lower() == "true"


def refusal(node_name: str, signs: Sequence[Sign]) -> str:
    """The one-line refusal for ``signs`` on node ``node_name``."""
    return (
        f"node {node_name} already has another manager of its NVIDIA GPUs: "
        + "; ".join(s.detail for s in signs)
        + ". Two managers hand the same GPU out twice: remove the other one from this node "
        "(its DaemonSet's node selector, e.g. HAMi's label gpu=on) and restart this pod, or, to "
        f"migrate this node while both run, label it {OVERRIDE_LABEL}=true (docs/install.md, "
        "'Migrating a node')"
    )


def check_node(
    client: KubeClient,
    node_name: str,
    uuids: Sequence[str],
    *,
    device_plugin_dir: Path = DEVICE_PLUGIN_DIR,
    driver: str = DRIVER_NAME,
    log: Callable[[str], None] | None = None,
    mode: str = MODE_DRA,
    own_socket: str = "",
) -> list[Sign]:
    """Look for another manager of this node's GPUs (``uuids``: GPU and MIG UUIDs discovered).

    Reads the Node ``node_name`` and the ResourceSlices with ``spec.nodeName=node_name``, and
    the device plugin sockets in ``device_plugin_dir``. ``mode`` is the asking component's
    Tessera mode: ``dra`` (the node driver: every sign of the module table, and the Node's
    :data:`MODE_LABEL` saying ``legacy``) or ``legacy`` (the device plugin, serving on
    ``own_socket`` in ``device_plugin_dir``: every DRA driver's slices with this node's GPUs,
    Tessera's own included, other device plugins' sockets, and the label not saying
    ``legacy``; the Node's device-plugin resources and HAMi annotations are its own). Returns
    the signs found (empty: none). Raises :class:`SecondManagerError` when there are signs and
    the Node is not labelled :data:`OVERRIDE_LABEL` ``=true``, or when the API server refuses
    the reads (in mode ``legacy``, ResourceSlices not served at all, HTTP 404, mean none).
    A Node that does not exist (no kubelet registered it) is not read; the other
    checks still run.
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: must be one of {', '.join(MODES)}")
    say = log or (lambda _m: None)
    node: dict[str, Any] | None
    try:
        node = client.get("v1", "Node", node_name)
    except ApiError as e:
        if e.status != 404:
            raise SecondManagerError(
                f"checking node {node_name} for another GPU manager: get Node {node_name}: {e}; "
                "grant the driver's ServiceAccount get on nodes (the chart's node ClusterRole)"
            ) from e
        node = None
        say(
            f"Node {node_name} does not exist: its allocatable and annotations were not checked for another GPU manager"
        )
    try:
        slices = client.list(
            "resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.nodeName={node_name}"
        )
    except ApiError as e:
        if e.status == 404 and mode == MODE_LEGACY:
            # resource.k8s.io/v1 not served (a cluster without DRA): no DRA driver can publish
            # this node's GPUs; the DRA node driver needs the API and still refuses.
            slices = []
            say("resource.k8s.io/v1 is not served: no DRA driver can publish this node's GPUs")
        else:
            raise SecondManagerError(
                f"checking node {node_name} for another GPU manager: list ResourceSlices: {e}; "
                "grant the driver's ServiceAccount list on resourceslices"
            ) from e
    legacy = mode == MODE_LEGACY
    signs = (
        (node_signs(node) if node is not None and not legacy else [])
        + (mode_signs(node, mode) if node is not None else [])
        + socket_signs(device_plugin_dir, own_socket)
        + slice_signs(slices, uuids, "" if legacy else driver)
    )
    if signs and _override(node):
        say(
            f"another manager of this node's GPUs is present, started anyway (label {OVERRIDE_LABEL}=true): "
            + "; ".join(s.detail for s in signs)
        )
    elif signs:
        raise SecondManagerError(refusal(node_name, signs))
    return signs


def discovered_uuids(gpus: Iterable[Any]) -> list[str]:
    """GPU and MIG UUIDs of discovered GPUs (``tessera.inventory.GPU`` values)."""
    out: list[str] = []
    for g in gpus:
        out.append(g.uuid)
        out.extend(m.uuid for m in getattr(g, "mig_devices", ()) if getattr(m, "uuid", None))
    return out
