"""Regenerate ``src/tessera/api/schemas/kubernetes.json`` from the control plane Tessera targets.

Starts the local control plane (``tessera.localcluster.cluster.Cluster``: the binaries ``make kube``
builds, or ``$TESSERA_KUBE_BIN``), fetches the OpenAPI v3 documents of the groups Tessera reads
and keeps the schemas of the kinds it reads, with every type they reference, then stops the
control plane. Run it after a Kubernetes version bump in ``tools/kube``::

    TESSERA_KUBE_BIN=/path/to/bin .venv/bin/python tools/openapi/generate.py

What is changed on the way (so that the JSON-schema validator decides what the API server's
decoder and strict field validation decide):

* descriptions are dropped (size); ``#/components/schemas/X`` becomes ``#/definitions/X``;
* every object schema with ``properties`` gets ``additionalProperties: false`` (an unknown
  field is refused, as ``kubectl apply`` refuses it), unless it preserves unknown fields;
* ``x-kubernetes-int-or-string`` becomes ``type: [integer, string]``; ``int32``/``int64``
  integers get the bounds of their Go type; Quantity is a string or a number;
* elements of lists of strings, numbers or booleans may be ``null`` (Go decodes it as the zero
  value);
* ``required`` is dropped: it marks fields without ``omitempty``, which the API server's decoder
  does not enforce (a ResourcePool without ``generation`` is accepted as 0); the fields its
  validation requires are checked by ``tessera.api.validation``'s rules instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "src" / "tessera" / "api" / "schemas" / "kubernetes.json"

#: apiVersion/kind -> (OpenAPI v3 document path, schema name)
ROOTS: dict[str, tuple[str, str]] = {
    "v1/Pod": ("api/v1", "io.k8s.api.core.v1.Pod"),
    "v1/Node": ("api/v1", "io.k8s.api.core.v1.Node"),
    "v1/ReplicationController": ("api/v1", "io.k8s.api.core.v1.ReplicationController"),
    "apps/v1/Deployment": ("apis/apps/v1", "io.k8s.api.apps.v1.Deployment"),
    "apps/v1/ReplicaSet": ("apis/apps/v1", "io.k8s.api.apps.v1.ReplicaSet"),
    "apps/v1/StatefulSet": ("apis/apps/v1", "io.k8s.api.apps.v1.StatefulSet"),
    "apps/v1/DaemonSet": ("apis/apps/v1", "io.k8s.api.apps.v1.DaemonSet"),
    "batch/v1/Job": ("apis/batch/v1", "io.k8s.api.batch.v1.Job"),
    "batch/v1/CronJob": ("apis/batch/v1", "io.k8s.api.batch.v1.CronJob"),
}
# Only v1 of resource.k8s.io: the control plane (like a default kube-apiserver of this version)
# does not serve the beta versions, so their objects are refused as kubectl would refuse them.
for _k in (
    "ResourceClaim",
    "ResourceClaimTemplate",
    "DeviceClass",
    "ResourceSlice",
    "DeviceTaintRule",
):
    ROOTS[f"resource.k8s.io/v1/{_k}"] = ("apis/resource.k8s.io/v1", f"io.k8s.api.resource.v1.{_k}")

INT_BOUNDS = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"


def _rewrite(schema: Any, refs: set[str]) -> Any:
    if isinstance(schema, list):
        return [_rewrite(s, refs) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if k in (
            "description",
            "example",
            "x-kubernetes-group-version-kind",
            "x-kubernetes-list-map-keys",
            "x-kubernetes-list-type",
            "x-kubernetes-patch-merge-key",
            "x-kubernetes-patch-strategy",
            "x-kubernetes-map-type",
            "x-kubernetes-unions",
            "x-kubernetes-validations",
            "default",
            "required",
        ):
            continue
        if k == "$ref":
            name = v.rsplit("/", 1)[1]
            refs.add(name)
            out[k] = f"#/definitions/{name}"
            continue
        if k == "properties":  # field names, not keywords: keep every one
            out[k] = {name: _rewrite(sub, refs) for name, sub in v.items()}
            continue
        out[k] = _rewrite(v, refs)
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("x-kubernetes-int-or-string", None)
        out["type"] = ["integer", "string"]
    if out.get("type") == "integer" and out.get("format") in INT_BOUNDS:
        lo, hi = INT_BOUNDS[out.pop("format")]
        out.setdefault("minimum", lo)
        out.setdefault("maximum", hi)
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.pop("x-kubernetes-preserve-unknown-fields", False)
    ):
        out["additionalProperties"] = False
    out.pop("x-kubernetes-preserve-unknown-fields", None)
    items = out.get("items")
    if (
        out.get("type") == "array"
        and isinstance(items, dict)
        and items.get("type") in ("string", "integer", "boolean", "number")
    ):
        # Go decodes a null list element into the zero value ("" / 0 / false): accepted.
        out["items"] = {**items, "type": [items["type"], "null"]}
    if "allOf" in out and len(out["allOf"]) == 1 and set(out) == {"allOf"}:
        return out["allOf"][0]
    return out


def build(documents: dict[str, dict[str, Any]], version: str) -> dict[str, Any]:
    """The trimmed schema document from the fetched OpenAPI v3 documents (path -> document)."""
    all_schemas: dict[str, Any] = {}
    for doc in documents.values():
        all_schemas.update(doc.get("components", {}).get("schemas", {}))
    definitions: dict[str, Any] = {}
    todo = [name for _, name in ROOTS.values()]
    while todo:
        name = todo.pop()
        if name in definitions:
            continue
        refs: set[str] = set()
        definitions[name] = _rewrite(all_schemas[name], refs)
        todo.extend(r for r in refs if r not in definitions)
    # A Quantity is a string (or a number, which the API server reads as its decimal text).
    definitions[QUANTITY] = {"type": ["string", "number"]}
    roots = {}
    for key, (_, name) in ROOTS.items():
        api_version, kind = key.rsplit("/", 1)
        root = dict(definitions[name])
        props = dict(root.get("properties", {}))
        props["apiVersion"] = {"enum": [api_version]}
        props["kind"] = {"enum": [kind]}
        root["properties"] = props
        roots[key] = root
    return {
        "kubernetesVersion": version,
        "generatedBy": "tools/openapi/generate.py",
        "roots": dict(sorted(roots.items())),
        "definitions": dict(sorted(definitions.items())),
    }


def fetch() -> tuple[dict[str, dict[str, Any]], str]:
    from tessera.localcluster.cluster import Cluster, Inventory

    with tempfile.TemporaryDirectory(prefix="tessera-openapi-") as tmp:
        cluster = Cluster(Path(tmp))
        try:
            cluster.up(Inventory(), build_binaries=False, die_with_parent=True)
            client = cluster.client()
            version = client.raw_get("/version")["gitVersion"]
            docs = {
                path: client.raw_get(f"/openapi/v3/{path}")
                for path in sorted({p for p, _ in ROOTS.values()})
            }
        finally:
            cluster.down()
    return docs, version


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--from-dir",
        type=Path,
        help="read saved OpenAPI v3 documents (<path with / as __>.json) instead of starting a control plane",
    )
    ap.add_argument(
        "--version", default=None, help="Kubernetes version to record (with --from-dir)"
    )
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    if a.from_dir:
        docs = {
            p: json.loads((a.from_dir / (p.replace("/", "__") + ".json")).read_text())
            for p, _ in ROOTS.values()
        }
        version = a.version or "unknown"
    else:
        docs, version = fetch()
    out = build(docs, version)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1, sort_keys=False) + "\n")
    tmp.replace(a.out)
    print(
        f"{a.out}: {len(out['roots'])} kinds, {len(out['definitions'])} types, Kubernetes {version}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
