"""ResourceClaimTemplates named by a hash of their spec, and the collector that removes unused ones.

Why: HAMi-DRA's webhook creates a ResourceClaim per pod at admission, which is left behind when
the pod never comes (a later admission plugin rejects it, a dry run, a controller that gives
up). Tessera's webhook creates no claim. It ensures a **ResourceClaimTemplate** whose name is a
hash of its spec, ``tessera-gpu-<16 hex>``: every pod of the same shape in a namespace shares
it, so their number is bounded by the distinct shapes, and the resource-claim controller makes
each pod's claim (owned by the pod, deleted with it).

Life cycle (``docs/webhook.md``):

* At admission (not for ``dryRun``), :meth:`TemplateStore.ensure` creates the template, or, if
  it exists, refreshes its annotation ``gpu.tessera.dev/last-admitted`` (RFC 3339, UTC); each
  replica does that at most once per ``refresh`` seconds per template, so a busy shape costs
  one write every few minutes. :meth:`TemplateStore.state` says whether an admission must wait
  for that write: not while this process's stamp is younger than ``refresh`` (nothing to do),
  nor while it is younger than ``trusted`` (the template exists and cannot be collected for at
  least ``grace - trusted`` seconds, so the write goes on in the background); only a template
  this process never stamped, or stamped longer than ``trusted`` ago, is written before the
  answer. The server runs one write per template at a time, however many admissions ask.
* :meth:`Collector.collect` deletes a template of the webhook (label
  ``gpu.tessera.dev/template-hash``) when no pod of its namespace references it and its
  ``last-admitted`` time is older than ``grace`` seconds, with a ``resourceVersion``
  precondition, so a template refreshed meanwhile is kept. With ``refresh <= grace / 4``, a pod
  admitted with a template is persisted long before the template can be collected.

Templates written by ``tessera convert`` (no hash label) are never collected.
"""

from __future__ import annotations

import copy
import datetime as _dt
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera import DRIVER_NAME
from tessera.api.pods import pod_claims
from tessera.kube.client import ApiError, KubeClient, Obj
from tessera.scheduler.claims import generated_claim_name

log = logging.getLogger(__name__)

RESOURCE = "resource.k8s.io/v1"
KIND = "ResourceClaimTemplate"
HASH_LABEL = f"{DRIVER_NAME}/template-hash"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
STAMP_ANNOTATION = f"{DRIVER_NAME}/last-admitted"
NAME_PREFIX = "tessera-gpu-"
HASH_LENGTH = 16


def spec_hash(spec: Mapping[str, Any]) -> str:
    """16 hex digits of the sha256 of ``spec`` as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]


def hashed_template(template: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """``template`` (a ResourceClaimTemplate from :func:`tessera.convert.convert_pod`) renamed
    ``tessera-gpu-<spec_hash(spec)>`` in ``namespace``, labelled ``app.kubernetes.io/managed-by:
    tessera`` and ``gpu.tessera.dev/template-hash: <hash>``. Its per-container annotations are
    dropped: pods of different names and containers share it."""
    digest = spec_hash(template["spec"])
    return {
        "apiVersion": RESOURCE,
        "kind": KIND,
        "metadata": {
            "name": NAME_PREFIX + digest,
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: "tessera", HASH_LABEL: digest},
        },
        "spec": template["spec"],  # shared, never mutated
    }


def _now_text(now: float) -> str:
    return _dt.datetime.fromtimestamp(int(now), _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return _dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass
class StoreStats:
    """Counters of :class:`TemplateStore`, for tests and debugging (not exported: the webhook
    serves no ``/metrics``)."""

    created: int = 0
    refreshed: int = 0
    cached: int = 0


FRESH = "fresh"
""":meth:`TemplateStore.state`: stamped less than ``refresh`` seconds ago; nothing to write."""
DUE = "due"
"""Stamped less than ``trusted`` seconds ago: refresh the stamp, but the answer need not wait."""
NEEDED = "needed"
"""Never stamped by this process, or longer than ``trusted`` ago: create or stamp it first."""


def template_key(template: Mapping[str, Any]) -> tuple[str, str]:
    """``(namespace, name)`` of a hashed template."""
    meta = template["metadata"]
    return str(meta["namespace"]), str(meta["name"])


class TemplateStore:
    """Ensures hashed templates exist on the API server (see the module docstring).

    ``refresh``: seconds between two refreshes of one template's ``last-admitted`` stamp by
    this process. ``trusted``: seconds after this process's last stamp during which the
    template is known to exist and to be safe from the collector, so a refresh need not delay
    an admission (at most the collector's grace / 2; ``None``: ``refresh``, every due refresh
    waits). ``clock``: wall-clock seconds (tests pass a fake). Thread-safe.

    Raises :class:`ValueError` when ``trusted < refresh``.
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        refresh: float = 60.0,
        trusted: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if trusted is None:
            trusted = refresh
        if trusted < refresh:
            raise ValueError(f"trusted ({trusted} s) must be at least refresh ({refresh} s)")
        self.client = client
        self.refresh = refresh
        self.trusted = trusted
        self.clock = clock
        self.stats = StoreStats()
        self._stamped: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def state(self, template: Mapping[str, Any]) -> str:
        """:data:`FRESH`, :data:`DUE` or :data:`NEEDED`: what admitting a pod with ``template``
        must do about it, from this process's last stamp (no API call)."""
        with self._lock:
            stamp = self._stamped.get(template_key(template))
        if stamp is None:
            return NEEDED
        age = self.clock() - stamp
        if age < self.refresh:
            self.stats.cached += 1
            return FRESH
        return DUE if age < self.trusted else NEEDED

    def fresh(self, template: Mapping[str, Any]) -> bool:
        """This process stamped ``template`` less than ``refresh`` seconds ago (no API call needed)."""
        return self.state(template) == FRESH

    def ensure(self, template: Mapping[str, Any]) -> None:
        """Create ``template`` or refresh its stamp (a no-op while :meth:`fresh`).

        Raises :class:`ApiError` when the API server refuses (e.g. a ResourceQuota on
        resourceclaimtemplates, or RBAC), with its status and message.
        """
        if self.fresh(template):
            return
        ns, name = template_key(template)
        now = self.clock()
        stamped = copy.deepcopy(dict(template))
        stamped["metadata"].setdefault("annotations", {})[STAMP_ANNOTATION] = _now_text(now)
        patch = {"metadata": {"annotations": {STAMP_ANNOTATION: _now_text(now)}}}
        path = self.client.collection_path(RESOURCE, KIND, ns) + f"/{name}"
        for _ in range(3):
            try:
                self.client.create(stamped)
                self.stats.created += 1
                break
            except ApiError as e:
                if e.status != 409:
                    raise
            try:
                self.client.request(
                    "PATCH",
                    path,
                    body=patch,
                    content_type="application/merge-patch+json",
                    what=f"{KIND} {ns}/{name}",
                )
                self.stats.refreshed += 1
                break
            except ApiError as e:
                if e.status != 404:  # deleted by a collector between our create and patch: retry
                    raise
        with self._lock:
            self._stamped[(ns, name)] = now

    def forget(self, namespace: str, name: str) -> None:
        """Drop the local stamp (the template was collected)."""
        with self._lock:
            self._stamped.pop((namespace, name), None)


def referenced_templates(pods: Iterable[Mapping[str, Any]]) -> set[str]:
    """Names of the ResourceClaimTemplates the pods' ``spec.resourceClaims`` reference."""
    out: set[str] = set()
    for pod in pods:
        for rc in pod_claims(pod):
            if rc.template_name:
                out.add(rc.template_name)
    return out


def needed_templates(pods: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Template name -> the pods (names) that still need it: pods, neither finished nor being
    deleted, that reference it and whose claim for that reference has not been made yet (no
    ``status.resourceClaimStatuses`` entry naming a claim). A pod whose claim exists no longer
    needs its template: the claim is owned by the pod and lives as long as it does."""
    out: dict[str, list[str]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
            continue
        for rc in pod_claims(pod):
            if rc.template_name and generated_claim_name(pod, rc.name) is None:
                out.setdefault(rc.template_name, []).append(str(meta.get("name")))
    return out


@dataclass
class CollectResult:
    """One pass of :meth:`Collector.collect`: templates deleted (``(namespace, name)``), kept in
    use, kept young; with ``everything``, ``needed_by`` names the pods (``namespace/pod``) that
    kept a template."""

    deleted: list[tuple[str, str]] = field(default_factory=list)
    in_use: int = 0
    young: int = 0
    needed_by: list[str] = field(default_factory=list)


class Collector:
    """Deletes the webhook's templates no pod uses, ``grace`` seconds after their last admission.

    :meth:`collect` is one pass (the CLI runs it every ``interval`` seconds in a thread:
    :meth:`start`). Pods are listed only in namespaces that hold a candidate template.
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        grace: float = 600.0,
        interval: float = 60.0,
        clock: Callable[[], float] = time.time,
        store: TemplateStore | None = None,
    ) -> None:
        self.client = client
        self.grace = grace
        self.interval = interval
        self.clock = clock
        self.store = store
        self.total_deleted = 0
        self._stop = threading.Event()

    def collect(self, *, everything: bool = False) -> CollectResult:
        """One pass. Raises :class:`ApiError` when listing fails; a template that cannot be
        deleted (changed meanwhile, already gone) is skipped.

        ``everything`` (``tessera collect-templates --all``, at uninstall): no grace; a template
        is kept only while a pod still needs it (:func:`needed_templates`), not merely because
        a running pod references it."""
        result = CollectResult()
        now = self.clock()
        templates = self.client.list(RESOURCE, KIND, label_selector=HASH_LABEL)
        candidates: dict[str, list[Obj]] = {}
        for t in templates:
            meta = t.get("metadata") or {}
            last = _parse_time((meta.get("annotations") or {}).get(STAMP_ANNOTATION))
            if last is None:
                last = _parse_time(meta.get("creationTimestamp"))
            if not everything and last is not None and now - last <= self.grace:
                result.young += 1
                continue
            candidates.setdefault(str(meta.get("namespace")), []).append(t)
        for ns, items in sorted(candidates.items()):
            pods = self.client.list("v1", "Pod", ns)
            used: Mapping[str, Any] = (
                needed_templates(pods) if everything else dict.fromkeys(referenced_templates(pods))
            )
            for t in items:
                meta = t["metadata"]
                if meta["name"] in used:
                    result.in_use += 1
                    if everything:
                        result.needed_by.extend(f"{ns}/{p}" for p in used[meta["name"]])
                    continue
                path = self.client.collection_path(RESOURCE, KIND, ns) + f"/{meta['name']}"
                body = {"preconditions": {"resourceVersion": meta.get("resourceVersion")}}
                try:
                    self.client.request(
                        "DELETE", path, body=body, what=f"{KIND} {ns}/{meta['name']}"
                    )
                except ApiError as e:
                    if e.status in (404, 409):
                        continue
                    raise
                if self.store is not None:
                    self.store.forget(ns, meta["name"])
                result.deleted.append((ns, meta["name"]))
        self.total_deleted += len(result.deleted)
        return result

    def start(self) -> threading.Thread:
        """Run :meth:`collect` every ``interval`` seconds in a daemon thread until :meth:`stop`."""

        def loop() -> None:
            while not self._stop.wait(self.interval):
                try:
                    r = self.collect()
                    if r.deleted:
                        log.info(
                            "collected %d unused ResourceClaimTemplate(s): %s",
                            len(r.deleted),
                            ", ".join(f"{ns}/{n}" for ns, n in r.deleted),
                        )
                except ApiError as e:
                    log.warning("template collection failed: %s", e)

        t = threading.Thread(target=loop, name="template-collector", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()
