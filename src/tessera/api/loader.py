"""Load Kubernetes manifests (multi-document YAML or JSON) into plain dicts with their origin.

Objects stay in their API shape (``dict``), as ``kubectl apply`` would read them. Workloads
(Deployment, ReplicaSet, StatefulSet, Job, CronJob) are expanded into the Pods their controllers
would create, so the scheduler-facing unit is always a Pod.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tessera.api.errors import ManifestError

RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_API_VERSION = "resource.k8s.io/v1"
RESOURCE_KINDS = ("ResourceSlice", "ResourceClaim", "ResourceClaimTemplate", "DeviceClass")
WORKLOAD_KINDS = ("Deployment", "ReplicaSet", "StatefulSet", "Job", "CronJob", "DaemonSet")


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
        return str(self.obj.get("metadata", {}).get("namespace") or "default")

    def ref(self) -> str:
        """``Kind namespace/name`` (cluster-scoped kinds without namespace)."""
        return object_ref(self.obj)


def object_name(obj: dict[str, Any]) -> str:
    md = obj.get("metadata") or {}
    return str(md.get("name") or md.get("generateName") or "")


def object_ref(obj: dict[str, Any]) -> str:
    kind = obj.get("kind", "?")
    md = obj.get("metadata") or {}
    name = md.get("name") or md.get("generateName") or "<unnamed>"
    if kind in ("ResourceSlice", "DeviceClass", "Node"):
        return f"{kind} {name}"
    return f"{kind} {md.get('namespace') or 'default'}/{name}"


_HELM = re.compile(r"\{\{.*?\}\}", re.S)


def parse_documents(text: str, file: str) -> list[tuple[int, dict[str, Any]]]:
    """Parse YAML or JSON text into ``(document number, object)`` pairs.

    ``kind: List`` documents are flattened into their items. Empty documents are skipped.
    Raises :class:`ManifestError` (one line) for text that is not YAML at all, a Helm template,
    or a document that is not a Kubernetes object.
    """
    if _HELM.search(text):
        m = _HELM.search(text)
        assert m is not None
        line = text.count("\n", 0, m.start()) + 1
        raise ManifestError(
            f"line {line}: this is a template ({m.group(0)[:40]!r}), not a manifest: "
            "render it first (`helm template` for a Helm chart) and pass the output",
            file=file,
        )
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ManifestError(
            f"{where}not valid YAML or JSON ({problem}): pass Kubernetes manifests", file=file
        ) from None
    out: list[tuple[int, dict[str, Any]]] = []
    for i, doc in enumerate(docs, start=1):
        if doc is None:
            continue
        if not isinstance(doc, dict) or "kind" not in doc:
            shown = repr(doc)[:60] if not isinstance(doc, dict) else "a mapping without 'kind'"
            raise ManifestError(
                f"not a Kubernetes object (got {shown}): each document needs apiVersion and kind",
                file=file,
                doc=i,
            )
        if doc.get("kind") == "List" or str(doc.get("kind", "")).endswith("List"):
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise ManifestError("items must be a list", file=file, doc=i, field="items")
            for j, item in enumerate(items):
                if not isinstance(item, dict) or "kind" not in item:
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


def load_file(path: str | Path) -> list[Manifest]:
    """Read one manifest file. Raises :class:`ManifestError` if unreadable or not manifests."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError("file not found", file=str(path)) from None
    except UnicodeDecodeError as e:
        raise ManifestError(
            f"not UTF-8 text (byte {e.start}): a binary file? pass YAML or JSON manifests", file=str(path)
        ) from None
    except OSError as e:
        raise ManifestError(f"cannot read: {e.strerror or e}", file=str(path)) from None
    return [Manifest(obj, Source(str(path), doc)) for doc, obj in parse_documents(text, str(path))]


def load_files(paths: Iterable[str | Path]) -> list[Manifest]:
    """Read several manifest files (directories are read for ``*.yaml``, ``*.yml``, ``*.json``)."""
    out: list[Manifest] = []
    for path in paths:
        p = Path(path)
        if p.is_dir():
            files = sorted(
                f for f in p.rglob("*") if f.suffix in (".yaml", ".yml", ".json") and f.is_file()
            )
            for f in files:
                out.extend(load_file(f))
        else:
            out.extend(load_file(p))
    return out


def load_objects(objects: Iterable[dict[str, Any]], origin: str) -> list[Manifest]:
    """Objects already decoded (read from an API server) as Manifests ``origin (document N)``,
    N counting from 1 in order, so they reach validation and simulation exactly as the
    documents of a file do. Raises :class:`ManifestError` for an item that is not an object."""
    out: list[Manifest] = []
    for i, obj in enumerate(objects, start=1):
        if not isinstance(obj, dict) or "kind" not in obj:
            raise ManifestError("not a Kubernetes object (needs apiVersion and kind)", file=origin, doc=i)
        out.append(Manifest(obj, Source(origin, i)))
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


def expand_workloads(manifests: Iterable[Manifest]) -> Iterator[Manifest]:
    """Yield every manifest, replacing workloads by the Pods their controllers would create.

    Deployment/ReplicaSet/StatefulSet: ``spec.replicas`` (default 1) pods named ``<name>-<i>``;
    Job: ``spec.parallelism`` (default 1) pods; CronJob: one run of its job template.
    DaemonSet is rejected (it would need the node list; put the pod in directly).
    """
    for m in manifests:
        kind = m.kind
        if kind not in WORKLOAD_KINDS:
            yield m
            continue
        obj = m.obj
        if kind == "DaemonSet":
            raise ManifestError(
                "DaemonSets are not simulated: give the pod template as a Pod instead",
                file=m.source.file,
                doc=m.source.doc,
                obj=m.ref(),
            )
        spec = obj.get("spec") or {}
        if kind == "CronJob":
            jt = (spec.get("jobTemplate") or {}).get("spec") or {}
            template = jt.get("template")
            replicas = _int_field(obj, "spec.jobTemplate.spec.parallelism", 1, m)
            tpath = "spec.jobTemplate.spec.template"
        else:
            template = spec.get("template")
            if kind == "Job":
                replicas = _int_field(obj, "spec.parallelism", 1, m)
            else:
                replicas = _int_field(obj, "spec.replicas", 1, m)
            tpath = "spec.template"
        if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
            raise ManifestError(
                "missing pod template: a workload needs a pod template with a spec",
                file=m.source.file,
                doc=m.source.doc,
                obj=m.ref(),
                field=tpath,
            )
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
            yield Manifest(pod, m.source, owner=m.ref(), extra={"template": tpath})
