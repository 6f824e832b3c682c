"""Load Kubernetes manifests (multi-document YAML or JSON) into plain dicts with their origin.

Objects stay in their API shape (``dict``), as ``kubectl apply`` would read them. Workloads
(Deployment, ReplicaSet, StatefulSet, Job, CronJob) are expanded into the Pods their controllers
would create, so the scheduler-facing unit is always a Pod.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.api.documents import documents, template_action, without_nulls
from tessera.api.errors import ManifestError
from tessera.api.heap import collector_paused
from tessera.api.limits import DEFAULT_LIMITS, Limits
from tessera.api.workloads import WORKLOAD_KINDS, pod_template

RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_API_VERSION = "resource.k8s.io/v1"
RESOURCE_KINDS = ("ResourceSlice", "ResourceClaim", "ResourceClaimTemplate", "DeviceClass")
#: Kinds the API server keeps without a namespace (``kubectl api-resources --namespaced=false``,
#: the ones a user's manifests commonly hold): messages name them ``Kind name``, without the
#: ``metadata.namespace`` they may carry (the API server ignores it).
CLUSTER_SCOPED_KINDS = frozenset(
    {
        "ResourceSlice",
        "DeviceClass",
        "DeviceTaintRule",
        "ResourcePoolStatusRequest",
        "Node",
        "Namespace",
        "PersistentVolume",
        "StorageClass",
        "CSIDriver",
        "CSINode",
        "VolumeAttachment",
        "PriorityClass",
        "RuntimeClass",
        "IngressClass",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "APIService",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
        "CertificateSigningRequest",
        "FlowSchema",
        "PriorityLevelConfiguration",
    }
)


@dataclass(frozen=True)
class Source:
    """Where an object came from: file path and 1-based document number."""

    file: str
    doc: int

    def __str__(self) -> str:
        return f"{self.file} (document {self.doc})"


@dataclass
class Manifest:
    """One API object and its origin. ``obj`` is the object in API shape."""

    obj: dict[str, Any]
    source: Source
    # For pods expanded from a workload: "Deployment default/web".
    owner: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind", ""))

    @property
    def name(self) -> str:
        return object_name(self.obj)

    @property
    def namespace(self) -> str:
        return _text(_meta(self.obj).get("namespace") or "default")

    def ref(self) -> str:
        """``Kind namespace/name`` (cluster-scoped kinds without namespace)."""
        return object_ref(self.obj)


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    md = obj.get("metadata")
    return md if isinstance(md, dict) else {}


def _text(v: Any) -> str:
    """A name for messages: strings as they are, anything else (not yet validated) shortened."""
    s = v if isinstance(v, str) else repr(v)
    return s if len(s) <= 80 else s[:77] + "..."


def object_name(obj: dict[str, Any]) -> str:
    md = _meta(obj)
    return _text(md.get("name") or md.get("generateName") or "")


def object_ref(obj: dict[str, Any]) -> str:
    kind = _text(obj.get("kind", "?"))
    md = _meta(obj)
    name = _text(md.get("name") or md.get("generateName") or "<unnamed>")
    if kind in CLUSTER_SCOPED_KINDS:
        return f"{kind} {name}"
    return f"{kind} {_text(md.get('namespace') or 'default')}/{name}"


def _kind_of_list_items(doc: dict[str, Any]) -> tuple[str | None, str | None]:
    """For ``PodList``/``NodeList``... (API list responses), the kind and apiVersion their items
    lack; ``(None, None)`` for a plain ``List``."""
    kind = str(doc.get("kind", ""))
    if kind == "List" or not kind.endswith("List"):
        return None, None
    return kind[: -len("List")], doc.get("apiVersion") if isinstance(
        doc.get("apiVersion"), str
    ) else None


def _is_list(doc: dict[str, Any]) -> bool:
    return (str(doc.get("kind", "")).endswith("List") and "items" in doc) or doc.get(
        "kind"
    ) == "List"


def parse_documents(
    text: str, file: str, *, skip_foreign: list[str] | None = None
) -> list[tuple[int, dict[str, Any]]]:
    """Parse YAML or JSON text (a stream of documents or JSON values) into ``(document number,
    object)`` pairs, bounded as :mod:`tessera.api.documents` says.

    ``kind: List`` and ``<Kind>List`` documents are flattened into their items (items without
    ``kind`` take it from the list's, as in API list responses). Empty documents are skipped.
    Raises :class:`ManifestError` (one line) for text that is not YAML or JSON, a Helm or Go
    template, or a document that is not a Kubernetes object; with ``skip_foreign`` (a list to
    append warnings to), a file of documents that are not Kubernetes objects (a CI workflow, a
    kustomization) is skipped with one warning instead.
    """
    tpl = template_action(text)
    if tpl is not None:
        line, action = tpl
        raise ManifestError(
            f"line {line}: this is a template ({action[:40]!r}), not a manifest: "
            "render it first (`helm template CHART | tessera ... -` for a Helm chart) and pass the output",
            file=file,
        )
    out: list[tuple[int, dict[str, Any]]] = []
    for i, doc in enumerate(documents(text, file), start=1):
        if doc is None:
            continue
        if (
            not isinstance(doc, dict)
            or not isinstance(doc.get("kind"), str)
            or not isinstance(doc.get("apiVersion"), str)
        ):
            why = _foreign(doc)
            if skip_foreign is not None:
                skip_foreign.append(f"{file}: {why}; skipped")
                return []
            raise ManifestError(f"{why}: each document needs apiVersion and kind", file=file, doc=i)
        if doc.get("kind") == "Kustomization":
            msg = "a kustomization is instructions, not objects: render it with `kubectl kustomize DIR | tessera ... -`"
            if skip_foreign is not None:
                skip_foreign.append(f"{file}: {msg}; skipped")
                return []
            raise ManifestError(msg, file=file, doc=i)
        if _is_list(doc):
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise ManifestError("items must be a list", file=file, doc=i, field="items")
            item_kind, item_version = _kind_of_list_items(doc)
            for j, item in enumerate(items):
                if isinstance(item, dict) and item_kind and "kind" not in item:
                    item = {"apiVersion": item_version, "kind": item_kind, **item}
                if (
                    not isinstance(item, dict)
                    or not isinstance(item.get("kind"), str)
                    or not isinstance(item.get("apiVersion"), str)
                ):
                    raise ManifestError(
                        "List item is not a Kubernetes object (needs apiVersion and kind)",
                        file=file,
                        doc=i,
                        field=f"items[{j}]",
                    )
                out.append((i, item))
        else:
            out.append((i, doc))
    return out


def _foreign(doc: Any) -> str:
    """Why ``doc`` is not a Kubernetes object, in a few words."""
    if isinstance(doc, dict) and "kind" in doc and "apiVersion" in doc:
        return "not a Kubernetes object (apiVersion and kind must be strings)"
    if isinstance(doc, dict):
        if "jobs" in doc and ("on" in doc or "true" in doc):
            return "a CI workflow (GitHub Actions), not a Kubernetes object"
        keys = ", ".join(sorted(str(k) for k in doc)[:4])
        missing = " and ".join(k for k in ("apiVersion", "kind") if k not in doc)
        return f"not a Kubernetes object (a mapping without {missing}; keys: {keys})"
    shown = repr(doc)
    return f"not a Kubernetes object (got {shown[:60]}{'...' if len(shown) > 60 else ''})"


@dataclass
class ReadBudget:
    """Bytes that may still be read by one command (all inputs together)."""

    remaining: int
    limit: int = 0

    @classmethod
    def of(cls, limits: Limits) -> ReadBudget:
        return cls(limits.max_input_bytes, limits.max_input_bytes)


def _too_big(file: str, limit: int) -> ManifestError:
    return ManifestError(
        f"input larger than {limit:,} bytes (all inputs together): raise the limit with "
        "--max-input-size (e.g. --max-input-size 2Gi) if this is really one manifest",
        file=file,
    )


STDIN = "-"


def read_text(path: str | Path, budget: ReadBudget | None = None) -> str:
    """Read one input as UTF-8 text, at most ``budget.remaining`` bytes; ``-`` is standard input.

    A directory, a device that never ends (``/dev/zero``), a non-UTF-8 byte, an unreadable
    path: :class:`ManifestError` naming the path. A UTF-8 BOM is dropped.
    """
    import sys

    budget = budget if budget is not None else ReadBudget.of(DEFAULT_LIMITS)
    name = "<stdin>" if str(path) == STDIN else str(path)
    limit = budget.remaining
    try:
        if str(path) == STDIN:
            data = sys.stdin.buffer.read(limit + 1)
        else:
            p = Path(path)
            if p.is_dir():
                raise ManifestError(
                    "is a directory: pass it on its own to read its manifests", file=name
                )
            with p.open("rb") as f:
                data = f.read(limit + 1)
    except FileNotFoundError:
        raise ManifestError("file not found", file=name) from None
    except IsADirectoryError:
        raise ManifestError("is a directory", file=name) from None
    except OSError as e:
        raise ManifestError(f"cannot read: {e.strerror or e}", file=name) from None
    if len(data) > limit:
        raise _too_big(name, budget.limit or limit)
    budget.remaining -= len(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestError(
            f"not UTF-8 text (byte {e.start}): a binary file? pass YAML or JSON manifests",
            file=name,
        ) from None
    return text[1:] if text.startswith("\ufeff") else text


def load_file(
    path: str | Path,
    *,
    budget: ReadBudget | None = None,
    skip_foreign: list[str] | None = None,
) -> list[Manifest]:
    """Read one manifest file (``-``: standard input). Raises :class:`ManifestError` if
    unreadable or not manifests (see :func:`parse_documents` for ``skip_foreign``)."""
    text = read_text(path, budget)
    name = "<stdin>" if str(path) == STDIN else str(path)
    return [
        Manifest(obj, Source(name, doc))
        for doc, obj in parse_documents(text, name, skip_foreign=skip_foreign)
    ]


MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


def is_directory(path: str | Path) -> bool:
    """Whether ``path`` (not ``-``) is a directory; False where it cannot even be looked at (a
    name too long, a link loop): reading it then says why in one line."""
    try:
        return str(path) != STDIN and Path(path).is_dir()
    except OSError:
        return False


def _link_problem(p: Path) -> str | None:
    """Why the directory entry ``p`` (a symbolic link) cannot be read, or None when it can."""
    import errno
    import os

    try:
        os.stat(p)
        return None
    except OSError as e:
        try:
            target = os.readlink(p)
        except OSError:
            target = "?"
        if e.errno == errno.ELOOP:
            return f"{p}: a symbolic link loop (-> {target})"
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return f"{p}: a dangling symbolic link (-> {target}, which does not exist)"
        return f"{p}: cannot read: {e.strerror or e}"


def manifest_files(
    folder: Path, warnings: list[str], skipped: list[str] | None = None
) -> list[Path]:
    """``*.yaml``, ``*.yml`` and ``*.json`` files under ``folder`` (sorted, symbolic links to
    folders not followed, ``.git`` left out). A dangling or looping link is skipped with a
    warning naming it (also appended to ``skipped``). Raises :class:`ManifestError` naming a
    directory that cannot be listed (permissions)."""
    import os

    def unlistable(e: OSError) -> None:
        raise ManifestError(
            f"cannot read this directory: {e.strerror or e}", file=str(e.filename or folder)
        )

    out: list[Path] = []
    for root, dirs, files in os.walk(folder, onerror=unlistable, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d != ".git")
        for f in sorted(files):
            p = Path(root) / f
            if p.suffix not in MANIFEST_SUFFIXES:
                continue
            problem = _link_problem(p) if p.is_symlink() else None
            if problem is not None:
                warnings.append(f"{problem}; skipped")
                if skipped is not None:
                    skipped.append(problem)
                continue
            if p.is_file():
                out.append(p)
    return out


def load_files(
    paths: Iterable[str | Path],
    *,
    limits: Limits = DEFAULT_LIMITS,
    warnings: list[str] | None = None,
    budget: ReadBudget | None = None,
) -> list[Manifest]:
    """Read several manifest files; ``-`` is standard input. Directories are read for
    ``*.yaml``, ``*.yml`` and ``*.json`` (see :func:`manifest_files`); there, a file that holds
    no Kubernetes object (a CI workflow, a kustomization) is skipped with a warning appended to
    ``warnings``. A directory with no manifest file at all is an error (naming the links it
    skipped, if any), so is any unreadable input. All inputs together are read up to
    ``limits.max_input_bytes`` (or what ``budget``, shared with other readers of the same
    command, has left)."""
    out: list[Manifest] = []
    notes = warnings if warnings is not None else []
    budget = budget if budget is not None else ReadBudget.of(limits)
    with collector_paused():  # decoded documents hold no cycles (tessera.api.heap)
        for path in paths:
            p = Path(path)
            if is_directory(path):
                skipped: list[str] = []
                files = manifest_files(p, notes, skipped)
                if not files:
                    raise ManifestError(
                        "no *.yaml, *.yml or *.json file in this directory: nothing to read"
                        if not skipped
                        else "no readable *.yaml, *.yml or *.json file in this directory: "
                        + "; ".join(skipped),
                        file=str(path),
                    )
                for f in files:
                    out.extend(load_file(f, budget=budget, skip_foreign=notes))
            else:
                out.extend(load_file(p if str(path) != STDIN else STDIN, budget=budget))
    return out


def load_objects(objects: Iterable[dict[str, Any]], origin: str) -> list[Manifest]:
    """Objects already decoded (read from an API server) as Manifests ``origin (document N)``,
    N counting from 1 in order, so they reach validation and simulation exactly as the
    documents of a file do. Raises :class:`ManifestError` for an item that is not an object."""
    out: list[Manifest] = []
    for i, obj in enumerate(objects, start=1):
        if not isinstance(obj, dict) or "kind" not in obj:
            raise ManifestError(
                "not a Kubernetes object (needs apiVersion and kind)", file=origin, doc=i
            )
        out.append(Manifest(without_nulls(obj, origin, i), Source(origin, i)))
    return out


def _int_field(obj: dict[str, Any], path: str, default: int, m: Manifest) -> int:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return default
        cur = cur[part]
    if cur is None:
        return default
    if isinstance(cur, bool) or not isinstance(cur, int) or cur < 0:
        raise ManifestError(
            f"must be a non-negative integer, got {cur!r}",
            file=m.source.file,
            doc=m.source.doc,
            obj=m.ref(),
            field=path,
        )
    return cur


def _job_pods(obj: dict[str, Any], m: Manifest, base: str) -> tuple[int, str]:
    """How many pods the Job controller runs at once for the JobSpec at ``base`` (``spec`` or
    ``spec.jobTemplate.spec``): ``parallelism`` (default 1), at most ``completions`` where set,
    none while ``suspend`` is true. Returns the count and the field that decided it."""
    js: Any = obj
    for part in base.split("."):
        js = js.get(part) if isinstance(js, dict) else None
    if isinstance(js, dict) and js.get("suspend") is True:
        return 0, f"{base}.suspend"
    parallelism = _int_field(obj, f"{base}.parallelism", 1, m)
    completions = _int_field(obj, f"{base}.completions", parallelism, m)
    if completions < parallelism:
        return completions, f"{base}.completions"
    return parallelism, f"{base}.parallelism"


def template_with_spec(m: Manifest, template: Any, path: str) -> dict[str, Any]:
    """``template`` (the workload ``m``'s pod template at ``path``) when it is an object with a
    ``spec`` object. Raises :class:`ManifestError` naming ``m`` and ``path`` otherwise."""
    if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
        raise ManifestError(
            "missing pod template: a workload needs a pod template with a spec",
            file=m.source.file,
            doc=m.source.doc,
            obj=m.ref(),
            field=path,
        )
    return template


def expand_workloads(
    manifests: Iterable[Manifest],
    *,
    max_pods: int = DEFAULT_LIMITS.max_pods,
    notes: list[str] | None = None,
) -> Iterator[Manifest]:
    """Yield every manifest, replacing workloads by the Pods their controllers would create
    (templates from :data:`tessera.api.workloads.POD_TEMPLATE_PATHS`).

    Deployment/ReplicaSet/StatefulSet/ReplicationController: ``spec.replicas`` (default 1)
    pods named ``<name>-<i>``; Job: the pods its controller runs at once (``parallelism``,
    default 1, at most ``completions``; none while suspended); CronJob: one run of its job
    template (none while the CronJob is suspended). A DaemonSet is yielded as is: its pods
    depend on the nodes (:func:`tessera.sim.daemonset.expand_daemonsets`). A workload that
    makes no pod is said in ``notes``. More than ``max_pods`` Pods in all (given and expanded)
    is a :class:`ManifestError` naming the workload's field, raised before any of its pods is
    made.
    """
    pods = 0
    for m in manifests:
        kind = m.kind
        if kind not in WORKLOAD_KINDS or kind == "DaemonSet":
            if kind == "Pod":
                pods += 1
                if pods > max_pods:
                    raise ManifestError(
                        f"more than {max_pods:,} pods in the input: raise the limit with --max-pods",
                        file=m.source.file,
                        doc=m.source.doc,
                        obj=m.ref(),
                    )
            yield m
            continue
        obj = m.obj
        spec = obj.get("spec") or {}
        template, tpath = pod_template(obj, kind)
        if kind == "CronJob" and spec.get("suspend") is True:
            replicas, field = 0, "spec.suspend"
        elif kind == "CronJob":
            replicas, field = _job_pods(obj, m, "spec.jobTemplate.spec")
        elif kind == "Job":
            replicas, field = _job_pods(obj, m, "spec")
        else:
            replicas, field = _int_field(obj, "spec.replicas", 1, m), "spec.replicas"
        if replicas == 0 and notes is not None:
            notes.append(f"{m.source}: {m.ref()}: {field} makes no pod now; none is simulated")
        if pods + replicas > max_pods:
            raise ManifestError(
                f"{replicas:,} pods would bring the input to {pods + replicas:,}, over the limit of {max_pods:,}: "
                "lower it, or raise the limit with --max-pods",
                file=m.source.file,
                doc=m.source.doc,
                obj=m.ref(),
                field=field,
            )
        pods += replicas
        template = template_with_spec(m, template, tpath)
        base = object_name(obj) or "workload"
        ns = (obj.get("metadata") or {}).get("namespace")
        for i in range(replicas):
            tmd = copy.deepcopy(template.get("metadata") or {})
            tmd["name"] = f"{base}-{i}"
            tmd.pop("generateName", None)
            if ns:
                tmd["namespace"] = ns
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": tmd,
                "spec": copy.deepcopy(template["spec"]),
            }
            yield Manifest(
                pod,
                m.source,
                owner=m.ref(),
                extra={"template": tpath, "validated": m.extra.get("validated", False)},
            )
