"""``admission.k8s.io/v1`` AdmissionReview in, AdmissionReview out: the webhook's decision.

:func:`decide` parses one request body and converts the pod with
:func:`tessera.convert.convert_pod` (the one conversion code path, shared with ``tessera
simulate`` and ``tessera convert``), renames its templates by the hash of their spec
(:mod:`tessera.webhook.templates`) and returns a :class:`Decision`: the JSONPatch, the
templates to ensure, and the warnings. It does no I/O; the server ensures the templates
(unless ``dryRun``) and then sends :meth:`Decision.review`.

Outcomes, by input (``docs/webhook.md``):

* not a Pod CREATE, or a pod without HAMi resources: allowed, no patch;
* a HAMi pod: allowed with a JSONPatch (HAMi's Ascend and Hygon requests too, as claims for
  their DRA drivers when the cluster has their DeviceClass, else left unchanged with a
  warning); the converter's warnings, and requests the cluster's current GPUs cannot hold
  (gpumem above every GPU's memory, more GPUs than any node has, a UUID or type no GPU has),
  go into ``response.warnings`` -- HAMi admits those too, and a node that
  can hold them may join;
* with ``legacy_scheduler`` (legacy mode, no DRA): a HAMi pod asking for NVIDIA GPUs is allowed
  with a JSONPatch that sets only ``spec.schedulerName`` (requests unchanged,
  :func:`tessera.convert.legacy_pod`); the refusals and warnings are the same;
* what :class:`~tessera.convert.ConversionError` rejects (gpucores 101, a negative value,
  gpumem with a unit...): denied, code 422, the converter's one-line message naming pod,
  container and field;
* a body that is not an AdmissionReview: :class:`BadReview` (HTTP 400).

Never an HTTP 500: an unexpected exception while converting is a denial with reason
``InternalError`` naming the exception, in a well-formed AdmissionReview.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera import DRIVER_NAME
from tessera.api.loader import Manifest, Source
from tessera.api.vendors import TESSERA, installed_vendors
from tessera.convert import (
    ContainerRequest,
    ConversionError,
    compute_unit_sizes,
    convert_pod,
    gpu_memory_sizes,
    hami,
    legacy_pod,
    mentions_hami,
)
from tessera.lint import LintWorld, lint
from tessera.webhook.templates import HASH_LABEL, hashed_template

ADMISSION_VERSION = "admission.k8s.io/v1"
#: Largest AdmissionReview body read (bytes); the API server's own request limit is 3 MiB.
MAX_BODY = 8 * 2**20
MAX_WARNINGS = 20  # the API server keeps 4 KiB of warnings per request
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
log = logging.getLogger("tessera.webhook")


class BadReview(ValueError):
    """The body is not an ``admission.k8s.io/v1`` AdmissionReview with a request uid (HTTP 400)."""


# ---- the cluster as the webhook sees it ------------------------------------------------------
#: Template shapes whose lint notes one snapshot keeps (least recently used dropped first).
MAX_NOTES = 4096


class _Snapshot:
    """What the webhook derives from one generation of the watched ResourceSlices: the GPU
    memory sizes, the most GPUs of a node, the lint index of the devices (built on first use),
    and the notes of each template shape linted against them."""

    def __init__(
        self,
        generation: int,
        slices: Sequence[Mapping[str, Any]],
        synced: bool,
        classes: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self.generation = generation
        self.slices = slices
        self.synced = synced
        #: the other vendors whose DRA driver is installed (their DeviceClass exists)
        self.vendors = installed_vendors(
            {str((c.get("metadata") or {}).get("name") or "") for c in classes}
        )
        try:
            units = compute_unit_sizes(slices)
        except ValueError:
            units = []  # a malformed slice: Hygon percentages then fail with a clear message
        self.compute_units: tuple[int, ...] = tuple(units)
        per_node: dict[str, int] = {}
        for s in slices:
            spec = s.get("spec") or {}
            if spec.get("driver") == DRIVER_NAME:
                node = str(spec.get("nodeName") or (spec.get("pool") or {}).get("name") or "")
                per_node[node] = per_node.get(node, 0) + len(spec.get("devices") or [])
        try:
            sizes = gpu_memory_sizes(slices)
        except ValueError:
            sizes = []  # a malformed slice: percentages then fail with a clear message
        self.sizes: tuple[int, ...] = tuple(sizes)
        self.max_gpus = max(per_node.values(), default=0)
        self._world: LintWorld | None = None
        self._world_error: str | None = None
        self.notes: OrderedDict[str, list[tuple[str, str]]] = OrderedDict()

    def world(self) -> LintWorld | None:
        """The lint index of the devices; None (logged once) when the slices cannot be read."""
        if self._world is None and self._world_error is None:
            try:
                self._world = LintWorld(self.slices)
            except Exception as e:  # another driver's odd slice must not deny pods: no notes then
                self._world_error = f"{type(e).__name__}: {e}"
                log.warning(
                    "cannot index the ResourceSlices (%s); admitting without the checks of what no GPU "
                    "can hold",
                    self._world_error,
                )
        return self._world


class ClusterView:
    """The ResourceSlices of the cluster, and what the webhook derives from them: GPU memory
    sizes (for ``gpumem-percentage``: :func:`tessera.convert.gpu_memory_sizes`, as ``tessera
    simulate`` uses) and, per claim shape, what no GPU can hold (``tessera lint``'s checks).

    ``items`` returns the slices, ``generation`` a number that changes whenever they do, and
    ``synced`` whether they are complete (an :class:`~tessera.kube.watch.Informer`'s ``items``,
    ``generation`` and ``synced``). Everything derived is computed once per generation, never
    per request: the sizes and node sizes when a generation is first seen, the lint index of the
    devices on the first new template shape, each shape's notes once (at most :data:`MAX_NOTES`
    shapes kept). With :meth:`start`, a thread rebuilds them when the slices change, and
    requests meanwhile use the previous synced generation (as a watch lags anyway); before the
    first sync, each request looks again. Thread-safe.
    """

    def __init__(
        self,
        items: Callable[[], Sequence[Mapping[str, Any]]],
        generation: Callable[[], int] = lambda: 0,
        synced: Callable[[], bool] = lambda: True,
        classes: Callable[[], Sequence[Mapping[str, Any]]] = lambda: (),
    ) -> None:
        self.items = items
        self.classes = classes
        self.generation = generation
        self.synced = synced
        self._lock = threading.Lock()
        self._snap: _Snapshot | None = None
        self._background = False
        self.builds = 0

    @classmethod
    def static(
        cls, slices: Sequence[Mapping[str, Any]], classes: Sequence[Mapping[str, Any]] = ()
    ) -> ClusterView:
        """A view of fixed slices and DeviceClasses (tests, benchmarks)."""
        items, dcs = list(slices), list(classes)
        return cls(lambda: items, classes=lambda: dcs)

    def _build(self) -> _Snapshot:
        # generation and synced before the items: a change meanwhile is seen next time
        gen, synced = self.generation(), self.synced()
        snap = _Snapshot(gen, list(self.items()), synced, list(self.classes()))
        self.builds += 1
        return snap

    def snapshot(self) -> _Snapshot:
        """The derived state of the current slices (the previous synced generation's while the
        background thread rebuilds)."""
        snap = self._snap
        if snap is not None and (
            (self._background and snap.synced) or snap.generation == self.generation()
        ):
            return snap
        with self._lock:
            snap = self._snap
            if snap is None or snap.generation != self.generation():
                snap = self._snap = self._build()
            return snap

    def refresh(self) -> bool:
        """Rebuild now if the slices changed (with the lint index, so that no request waits for
        it); True if rebuilt."""
        snap = self._snap
        if snap is not None and snap.generation == self.generation():
            return False
        new = self._build()
        if new.max_gpus:
            new.world()
        with self._lock:
            if (
                self._snap is None or self._snap.generation <= new.generation
            ):  # not over a newer one
                self._snap = new
        return True

    def start(self, interval: float = 0.5) -> threading.Event:
        """Rebuild in a daemon thread, checking every ``interval`` seconds, until the returned
        event is set."""
        stop = threading.Event()
        self.refresh()
        self._background = True

        def loop() -> None:
            while not stop.wait(interval):
                try:
                    self.refresh()
                except Exception:  # unexpected: requests rebuild the view themselves from now on
                    log.exception("cannot derive the cluster's GPUs from the ResourceSlices")
                    self._background = False
                    return

        threading.Thread(target=loop, name="cluster-view", daemon=True).start()
        return stop

    def memory_sizes(self) -> list[int]:
        """Distinct GPU memory sizes in bytes, largest first."""
        return list(self.snapshot().sizes)

    def lint_shapes(self, templates: Sequence[Mapping[str, Any]]) -> None:
        """Lint the shapes of ``templates`` (:func:`hashed_template` dicts) that have no notes
        yet against the current slices, and keep their notes. CPU work proportional to the
        devices published (their selectors run on every device): the server calls it in a
        worker thread, so that other admissions go on meanwhile."""
        snap = self.snapshot()
        if not snap.max_gpus:
            return
        with self._lock:  # one lint at a time: the index's caches are not thread-safe
            world = snap.world()
            for template in templates:
                key = template["metadata"]["labels"][HASH_LABEL]
                if key in snap.notes:
                    continue
                notes: list[tuple[str, str]] = []
                for f in (
                    lint([Manifest(dict(template), Source("admission", 1))], world=world)
                    if world
                    else ()
                ):
                    what = _finding_field(f.field)
                    if what and (what, f.problem) not in notes:
                        notes.append((what, f.problem))
                snap.notes[key] = notes
                if len(snap.notes) > MAX_NOTES:
                    snap.notes.popitem(last=False)

    def unholdable(
        self, template: Mapping[str, Any], request: ContainerRequest, *, lint_new: bool = True
    ) -> list[str] | None:
        """Why no GPU of the cluster can hold ``template`` (a :func:`hashed_template`, container
        ``request``), in HAMi's terms: ``["nvidia.com/gpumem: 100000Mi is more than any device
        has: ..."]``; [] when one can, or when no Tessera GPU is published yet. A shape not seen
        since the slices last changed is linted first (:meth:`lint_shapes`); with
        ``lint_new=False`` the answer is then None instead."""
        if request.vendor != TESSERA.key:
            return []  # the lint index knows Tessera's GPUs only (docs/convert.md, vendors)
        snap = self.snapshot()
        key = template["metadata"]["labels"][HASH_LABEL]
        notes = snap.notes.get(key)
        if notes is None and snap.max_gpus:
            if not lint_new:
                return None
            self.lint_shapes([template])
            notes = snap.notes.get(key, [])
        elif notes is not None:
            with contextlib.suppress(KeyError):  # dropped by another thread meanwhile
                snap.notes.move_to_end(key)
        fam = hami.VOLCANO if request.family == "volcano" else hami.NVIDIA
        out = []
        for what, problem in notes or ():
            name = {
                "memory": fam.memory if request.memory_mib is not None else fam.percentage,
                "cores": fam.cores,
            }.get(what)
            if name is None:
                spelled = (
                    (hami.VOLCANO_USE_UUID, hami.VOLCANO_NOUSE_UUID, hami.USE_TYPE, hami.NOUSE_TYPE)
                    if request.family == "volcano"
                    else hami.SELECTOR_ANNOTATIONS[:4]
                )
                name = "the pod's GPU selection annotations (" + ", ".join(spelled) + ")"
            out.append(f"{name}: {problem}")
        if snap.max_gpus and request.gpus > snap.max_gpus:
            out.append(
                f"{fam.count}: {request.gpus} GPUs on one node, but the most any node publishes is {snap.max_gpus}"
            )
        return out


def _finding_field(path: str) -> str | None:
    """What a ``tessera lint`` finding on a converted template is about: memory, cores, selectors."""
    if ".capacity.requests[memory]" in path:
        return "memory"
    if ".capacity.requests[cores]" in path:
        return "cores"
    if ".selectors[" in path:
        return "selectors"
    return None


# ---- the decision ----------------------------------------------------------------------------
@dataclass
class Decision:
    """What to answer one AdmissionReview: ``allowed``, the JSONPatch ops, the templates to
    ensure first (none for ``dry_run``), warnings, and for a denial ``code``/``reason``/``message``;
    ``unlinted``: templates whose shape was not linted yet (``decide(..., lint_new=False)``)."""

    uid: str
    allowed: bool = True
    patch: list[dict[str, Any]] = field(default_factory=list)
    templates: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    dry_run: bool = False
    code: int = 200
    reason: str = ""
    message: str = ""
    pod: str = ""
    unlinted: list[dict[str, Any]] = field(default_factory=list)

    def deny(self, code: int, reason: str, message: str) -> Decision:
        """This decision turned into a denial (e.g. the template could not be created)."""
        self.allowed, self.code, self.reason, self.message = False, code, reason, message
        self.patch, self.templates = [], []
        return self

    def review(self) -> dict[str, Any]:
        """The AdmissionReview to send back."""
        response: dict[str, Any] = {"uid": self.uid, "allowed": self.allowed}
        if self.allowed and self.patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(
                json.dumps(self.patch, separators=(",", ":")).encode()
            ).decode()
        if not self.allowed:
            response["status"] = {"code": self.code, "reason": self.reason, "message": self.message}
        if self.warnings:
            response["warnings"] = _clean_warnings(self.warnings)
        return {"apiVersion": ADMISSION_VERSION, "kind": "AdmissionReview", "response": response}


def _clean_warnings(warnings: Sequence[str]) -> list[str]:
    out: list[str] = []
    for w in warnings:
        text = _CONTROL.sub(" ", str(w)).strip()
        if text and text not in out:
            out.append(text)
    if len(out) > MAX_WARNINGS:
        out = [*out[: MAX_WARNINGS - 1], f"... and {len(out) - MAX_WARNINGS + 1} more warning(s)"]
    return out


def parse_review(body: bytes) -> dict[str, Any]:
    """The ``request`` of an AdmissionReview body. Raises :class:`BadReview` naming what is wrong."""
    if len(body) > MAX_BODY:
        raise BadReview(
            f"AdmissionReview body is {len(body)} bytes, over the {MAX_BODY}-byte limit"
        )
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, an int over 4300 digits
        raise BadReview(f"body is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise BadReview("body is not a JSON object")
    if doc.get("apiVersion") != ADMISSION_VERSION or doc.get("kind") != "AdmissionReview":
        raise BadReview(
            f"apiVersion/kind is {doc.get('apiVersion')!r}/{doc.get('kind')!r}: expected {ADMISSION_VERSION} "
            "AdmissionReview (set admissionReviewVersions: [v1] in the webhook configuration)"
        )
    request = doc.get("request")
    if not isinstance(request, dict):
        raise BadReview("AdmissionReview has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid is missing")
    return request


def _is_pod_create(request: Mapping[str, Any]) -> bool:
    kind = request.get("kind")
    resource = request.get("resource")
    if request.get("operation") != "CREATE" or request.get("subResource"):
        return False
    if isinstance(kind, Mapping):
        return kind.get("group", "") == "" and kind.get("kind") == "Pod"
    return (
        isinstance(resource, Mapping)
        and resource.get("group", "") == ""
        and resource.get("resource") == "pods"
    )


def decide(
    body: bytes, view: ClusterView, *, lint_new: bool = True, legacy_scheduler: str = ""
) -> Decision:
    """The decision for one AdmissionReview body (see the module docstring). Raises
    :class:`BadReview` only for bodies without a usable ``request.uid``.

    ``legacy_scheduler``: legacy mode (no DRA, docs/legacy.md): a HAMi pod keeps its requests
    and gets ``spec.schedulerName`` = this name (:func:`tessera.convert.legacy_pod`), no
    templates; refusals and warnings are the DRA conversion's.

    ``lint_new=False``: a template shape not linted since the slices last changed is not linted
    here; it is listed in :attr:`Decision.unlinted` and its warnings are missing (the server
    lints them in a thread with :meth:`ClusterView.lint_shapes`, then decides again)."""
    request = parse_review(body)
    d = Decision(uid=request["uid"], dry_run=request.get("dryRun") is True)
    if not _is_pod_create(request):
        return d
    pod = request.get("object")
    if (
        not isinstance(pod, dict)
        or not isinstance(pod.get("metadata", {}), dict)
        or not isinstance(pod.get("spec"), dict)
    ):
        return d.deny(400, "BadRequest", "request.object is not a Pod with metadata and spec")
    try:
        if legacy_scheduler:
            return _legacy(d, request, pod, view, legacy_scheduler)
        return _convert(d, request, pod, view, lint_new)
    except ConversionError as e:
        return d.deny(422, "Invalid", str(e))
    except RecursionError:
        return d.deny(400, "BadRequest", "the pod is nested too deeply to be read")
    except Exception as e:  # never a 500 for a user's pod: say what broke, deny it
        return d.deny(
            500,
            "InternalError",
            f"tessera webhook could not convert the pod ({type(e).__name__}: {e}); the pod is not admitted; "
            "please report this",
        )


def _legacy(
    d: Decision, request: Mapping[str, Any], pod: dict[str, Any], view: ClusterView, scheduler: str
) -> Decision:
    meta = pod.get("metadata") or {}
    namespace = request.get("namespace") or meta.get("namespace") or "default"
    if not isinstance(namespace, str):
        return d.deny(400, "BadRequest", "request.namespace is not a string")
    if not mentions_hami(pod):
        return d
    work = {**pod, "metadata": {**meta, "namespace": namespace}}
    conv = legacy_pod(work, scheduler, memory_sizes=view.snapshot().sizes)
    d.pod = f"{namespace}/{meta.get('name') or str(meta.get('generateName') or '') + '*'}"
    d.warnings.extend(conv.warnings)
    d.patch = _patch(pod, conv.pod)
    return d


def _convert(
    d: Decision, request: Mapping[str, Any], pod: dict[str, Any], view: ClusterView, lint_new: bool
) -> Decision:
    meta = pod.get("metadata") or {}
    namespace = request.get("namespace") or meta.get("namespace") or "default"
    if not isinstance(namespace, str):
        return d.deny(400, "BadRequest", "request.namespace is not a string")
    work = dict(pod)
    work["metadata"] = {**meta, "namespace": namespace}
    if not mentions_hami(pod):
        return d
    snap = view.snapshot()
    conv = convert_pod(
        work, memory_sizes=snap.sizes, vendors=snap.vendors, compute_units=snap.compute_units
    )
    d.pod = f"{namespace}/{meta.get('name') or str(meta.get('generateName') or '') + '*'}"
    d.warnings.extend(conv.warnings)
    if not conv.converted:
        if conv.pod["spec"] != pod["spec"]:  # stripped resources that asked for no GPU (gpu: 0)
            d.patch = _patch(pod, conv.pod)
        return d
    renamed: dict[str, str] = {}
    for t, req in zip(conv.templates, conv.requests, strict=True):
        h = hashed_template(t, namespace)
        renamed[t["metadata"]["name"]] = h["metadata"]["name"]
        if h not in d.templates:
            d.templates.append(h)
        notes = view.unholdable(h, req, lint_new=lint_new)
        if notes is None:
            d.unlinted.append(h)
        for note in notes or ():
            d.warnings.append(
                f"pod {d.pod}, container {req.container}: {note}; the pod stays pending until a GPU that can "
                "hold it is published"
            )
    new_pod = conv.pod  # new down to spec.resourceClaims: convert_pod never mutates its input
    new_pod["metadata"] = meta
    spec = new_pod["spec"]
    spec["resourceClaims"] = [
        {**rc, "resourceClaimTemplateName": renamed[rc["resourceClaimTemplateName"]]}
        if isinstance(rc, dict) and rc.get("resourceClaimTemplateName") in renamed
        else rc
        for rc in spec.get("resourceClaims") or []
    ]
    d.patch = _patch(pod, new_pod)
    if d.dry_run:
        d.templates = []
    return d


def _esc(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _diff_keys(
    old: Mapping[str, Any], new: Mapping[str, Any], base: str, ops: list[dict[str, Any]]
) -> None:
    for key in sorted(set(old) | set(new), key=str):
        if key in old and key in new and old[key] == new[key]:
            continue
        path = f"{base}/{_esc(str(key))}"
        if key not in new:
            ops.append({"op": "remove", "path": path})
        else:
            ops.append({"op": "replace" if key in old else "add", "path": path, "value": new[key]})


def _patch(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """RFC 6902 operations turning pod ``old`` into ``new``: per changed container, its changed
    keys (``resources``); per other changed ``spec`` key (``resourceClaims``), the new value.
    The converter changes nothing else (``metadata`` is kept as received); the unit tests apply
    these patches with python-json-patch and compare with the converted pod."""
    ops: list[dict[str, Any]] = []
    ospec, nspec = old["spec"], new["spec"]
    for key in sorted(set(ospec) | set(nspec), key=str):
        o, n = ospec.get(key), nspec.get(key)
        if key in ospec and key in nspec and o == n:
            continue
        if (
            key in ("initContainers", "containers")
            and isinstance(o, list)
            and isinstance(n, list)
            and len(o) == len(n)
            and all(isinstance(x, dict) for x in (*o, *n))
        ):
            for i, (oc, nc) in enumerate(zip(o, n, strict=True)):
                if oc != nc:
                    _diff_keys(oc, nc, f"/spec/{key}/{i}", ops)
            continue
        _diff_keys({key: o} if key in ospec else {}, {key: n} if key in nspec else {}, "/spec", ops)
    return ops
