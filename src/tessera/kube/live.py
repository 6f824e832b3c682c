"""Read a live cluster for ``tessera simulate --kubeconfig`` and ``tessera explain --kubeconfig``.

What is read (read-only: ``list`` on each, paginated with the API's ``limit``/``continue``):
Nodes, DeviceClasses, ResourceSlices, DeviceTaintRules (their taints are merged into the
devices they select, as kube-scheduler merges them; a cluster that does not serve the kind,
DRADeviceTaintRules off, has none), ResourceClaimTemplates (for pending pods whose claims
the claim controller has not made yet), ResourceClaims (with their ``status.allocation`` and
``status.reservedFor``) and Pods. The objects become :class:`~tessera.api.loader.Manifest`\\ s
through :func:`tessera.api.loader.load_objects`, so they are validated and simulated exactly
as the same objects in a file would be (``kubectl get ... -o yaml`` fed to ``tessera
simulate`` gives the same answer).

Which pods take part (:func:`select_objects`):

* pods that finished (``Succeeded``/``Failed``) do not: their claims are released;
* bound pods (``spec.nodeName`` set) that use ResourceClaims (their own, or the one
  kube-scheduler synthesised for extended resources a DeviceClass serves, named in
  ``status.extendedResourceClaimStatus``) keep their node, and their claims keep their
  allocation: the simulation starts from them;
* pending pods that use ResourceClaims or ask for extended resources (HAMi-style requests),
  oldest first (``creationTimestamp``), as the scheduler's queue has them;
* other pods hold no GPU and are left out.

The RBAC this needs is ``deploy/rbac/tessera-reader.yaml`` (``get``/``list`` only).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tessera.api.errors import TesseraError
from tessera.api.loader import Manifest, load_objects
from tessera.kube.client import ApiError, KubeClient, Obj, api_problem
from tessera.scheduler.extended import requested_extended

RESOURCE_API = "resource.k8s.io/v1"
#: What is read, in this order (the order of the simulation's input).
LIVE_KINDS: tuple[tuple[str, str], ...] = (
    ("v1", "Node"),
    (RESOURCE_API, "DeviceClass"),
    (RESOURCE_API, "ResourceSlice"),
    (RESOURCE_API, "DeviceTaintRule"),
    (RESOURCE_API, "ResourceClaimTemplate"),
    (RESOURCE_API, "ResourceClaim"),
    ("v1", "Pod"),
)
#: Kinds a cluster may not serve (a feature gate off): not served means none exist.
OPTIONAL_KINDS = frozenset({"DeviceTaintRule"})
#: ``Manifest.extra`` key saying what a pod was in the cluster: ``bound`` or ``pending``.
LIVE_STATE = "live"

OnPage = Callable[[str, int], None]


class LiveClusterError(TesseraError):
    """The cluster could not be read (unreachable, permission missing, unexpected reply)."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _strip(obj: Obj) -> Obj:
    """Drop server bookkeeping no simulation reads (managedFields can be most of a pod)."""
    md = obj.get("metadata")
    if isinstance(md, dict):
        md.pop("managedFields", None)
    return obj


def select_objects(objects: Iterable[Obj]) -> tuple[list[Obj], dict[int, str]]:
    """The objects a simulation of the cluster reads, in input order, and for each pod kept
    (by position in the returned list) whether it was ``bound`` or ``pending``. See the
    module docstring for which pods are kept and in which order."""
    by_kind: dict[str, list[Obj]] = {}
    for o in objects:
        by_kind.setdefault(str(o.get("kind")), []).append(_strip(o))
    out: list[Obj] = []
    for _, kind in LIVE_KINDS[:-1]:
        out.extend(by_kind.get(kind, []))
    bound: list[Obj] = []
    pending: list[Obj] = []
    for p in by_kind.get("Pod", []):
        spec = p.get("spec") or {}
        if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        # A claim kube-scheduler synthesised for served extended resources (KEP-5004) counts.
        claims = bool(spec.get("resourceClaims")) or bool(
            (p.get("status") or {}).get("extendedResourceClaimStatus")
        )
        if spec.get("nodeName"):
            if claims:
                bound.append(p)
        elif claims or requested_extended(p):
            pending.append(p)
    pending.sort(
        key=lambda p: (
            str(_meta(p).get("creationTimestamp") or ""),
            str(_meta(p).get("namespace") or ""),
            str(_meta(p).get("name") or ""),
        )
    )
    states: dict[int, str] = {}
    for state, pods in (("bound", bound), ("pending", pending)):
        for p in pods:
            states[len(out)] = state
            out.append(p)
    return out, states


def read_objects(
    client: KubeClient, *, page_size: int = 500, on_page: OnPage | None = None
) -> list[Obj]:
    """Every object of :data:`LIVE_KINDS`, all namespaces, page by page (``on_page(kind,
    items)`` after each page). Raises :class:`LiveClusterError` with one line."""
    out: list[Obj] = []
    for api_version, kind in LIVE_KINDS:
        try:
            for page in client.list_pages(api_version, kind, limit=page_size):
                out.extend(page)
                if on_page is not None:
                    on_page(kind, len(page))
        except ApiError as e:
            if kind in OPTIONAL_KINDS and e.reason == "NotFound":
                continue
            raise LiveClusterError(api_problem(e, client.server)) from e
    return out


def live_manifests(
    client: KubeClient, *, page_size: int = 500, on_page: OnPage | None = None
) -> list[Manifest]:
    """The cluster's objects as Manifests (origin ``API server <url>``); pods carry
    ``extra["live"]`` = ``bound`` or ``pending``."""
    objects, states = select_objects(read_objects(client, page_size=page_size, on_page=on_page))
    manifests = load_objects(objects, f"API server {client.server}")
    for i, state in states.items():
        manifests[i].extra[LIVE_STATE] = state
    return manifests


def read_cluster(kubeconfig: str | Path, *, progress: bool = False) -> list[Manifest]:
    """:func:`live_manifests` for the current context of ``kubeconfig``. With ``progress``
    and a terminal on stderr, a progress bar appears once reading has taken a second.
    Raises :class:`~tessera.kube.client.KubeconfigError` or :class:`LiveClusterError`."""
    client = KubeClient.from_kubeconfig(Path(kubeconfig))
    if not progress:
        return live_manifests(client)
    bar = _DelayedProgress()
    try:
        return live_manifests(client, on_page=bar.page)
    finally:
        bar.close()


class _DelayedProgress:
    """A rich progress line on stderr, shown only on a terminal and only after ``delay``
    seconds (a small cluster reads in well under that)."""

    def __init__(self, delay: float = 1.0) -> None:
        import sys

        self._tty = sys.stderr.isatty()
        self._start = time.monotonic()
        self._delay = delay
        self._counts: dict[str, int] = {}
        self._progress: Any = None
        self._task: Any = None

    def page(self, kind: str, items: int) -> None:
        self._counts[kind] = self._counts.get(kind, 0) + items
        if not self._tty:
            return
        if self._progress is None:
            if time.monotonic() - self._start < self._delay:
                return
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task("reading the cluster")
        done = ", ".join(f"{n} {k}s" for k, n in self._counts.items())
        self._progress.update(self._task, description=f"reading the cluster: {done}")

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def pending_outcome(
    manifests: Sequence[Manifest], objects: Sequence[Mapping[str, Any]], added_nodes: Sequence[str]
) -> list[str]:
    """What became of the pods that were pending in the cluster, after a simulation whose
    output objects are ``objects``: one line per pod (``ns/name: node`` or ``stays
    pending``) after a summary line naming ``added_nodes`` (the ``--add-node`` ones).
    Without a live cluster (no pod marked ``extra["live"]``): the pods placed on the added
    nodes."""
    node_of: dict[str, str] = {}
    for o in objects:
        if o.get("kind") == "Pod" and (o.get("spec") or {}).get("nodeName"):
            node_of[f"{_meta(o).get('namespace') or 'default'}/{_meta(o).get('name')}"] = str(
                o["spec"]["nodeName"]
            )
    added = set(added_nodes)
    if not any(
        LIVE_STATE in m.extra for m in manifests
    ):  # no live cluster: who landed on the added nodes
        there = [p for p, n in node_of.items() if n in added]
        return [f"with {', '.join(added_nodes)} added: {len(there)} pod(s) scheduled there"] + [
            f"  {p}: scheduled on {node_of[p]} (added)" for p in there
        ]
    pending = [
        f"{m.namespace}/{m.name}"
        for m in manifests
        if m.kind == "Pod" and m.extra.get(LIVE_STATE) == "pending"
    ]
    if not pending:
        return ["no pod is pending in the cluster"]
    on_added = [p for p in pending if node_of.get(p) in added]
    elsewhere = [p for p in pending if p in node_of and node_of[p] not in added]
    stays = [p for p in pending if p not in node_of]
    head = f"{len(pending)} pod(s) pending in the cluster"
    if added:
        head += f"; with {', '.join(added_nodes)} added: {len(on_added)} would be scheduled there"
    if elsewhere:
        head += f", {len(elsewhere)} on existing nodes"
    head += f", {len(stays)} would stay pending"
    lines = [head]
    lines += [
        f"  {p}: scheduled on {node_of[p]}{' (added)' if node_of[p] in added else ''}"
        for p in pending
        if p in node_of
    ]
    lines += [f"  {p}: stays pending" for p in stays]
    return lines
