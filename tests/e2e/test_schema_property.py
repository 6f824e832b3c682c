"""Property: Tessera accepts what the API server accepts, and refuses what it refuses for a
schema reason with the same field path (server-side dry-run, strict field validation).

Inputs: every object of a kind Tessera reads in the corpus DRA manifests, and a few hundred
generated from them by the fuzz test's structural mutations (a value of another type, a key
misspelt, dropped or added). For each, the live control plane (``kube_cluster``) answers a
``dryRun=All&fieldValidation=Strict`` create, and :func:`tessera.api.validation.manifest_problems`
answers for Tessera:

* accepted by the API server -> no problem found by Tessera;
* refused as undecodable (400: ``unknown field "P"``, ``cannot unmarshal ... field T.P``) ->
  Tessera refuses, naming the same field path (list indices aside, which the decoder's message
  leaves out);
* refused by validation (422) -> not asserted (Tessera implements the rules a user meets with
  GPU claims, not all of Kubernetes'); counted in the summary.

Not generated: quantities beyond 2^63-1 or with huge exponents. Kubernetes caps the first and its
API server spends minutes parsing ``1e-999999999``; Tessera refuses both, naming the field
(docs/limits.md).
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
from pathlib import Path
from typing import Any

import pytest

from fuzz import mutate as fuzz_mutate
from tessera.api.errors import TesseraError
from tessera.api.loader import Manifest, Source, load_file, parse_documents
from tessera.api.validation import READ_KINDS, manifest_problems
from tessera.kube.client import ApiError, KubeClient

from .conftest import CORPUS, LiveCluster

pytestmark = pytest.mark.cluster

GENERATED = 300
SAFE_VALUES = [
    v for v in fuzz_mutate.HOSTILE_VALUES if v not in ("1e999999999", 2**63, 10**40, "9" * 30)
]


def _corpus_objects() -> list[Manifest]:
    out = []
    for f in sorted((CORPUS / "dra-manifests").iterdir()):
        try:
            ms = load_file(f)
        except TesseraError:
            continue  # templates, prompts, fragments: not objects
        out.extend(m for m in ms if m.kind in READ_KINDS)
    return out


def _dry_run(client: KubeClient, obj: dict[str, Any]) -> tuple[int, str]:
    """(0, "") when the API server accepts ``obj``, else (HTTP status, message)."""
    try:
        path = client._obj_path(obj, with_name=False)
    except ApiError as e:
        return e.status or 404, e.message
    except ValueError as e:
        return 400, str(e)
    try:
        client.request("POST", path, body=obj, query={"dryRun": "All", "fieldValidation": "Strict"})
    except ApiError as e:
        return e.status, e.message
    return 0, ""


def _no_index(path: str) -> str:
    return re.sub(r"\[[^\]]*\]", "", path)


def _check(client: KubeClient, m: Manifest, ns: str, tally: dict[str, int]) -> str | None:
    obj, sent = copy.deepcopy(m.obj), copy.deepcopy(m.extra.get("sent", m.obj))
    for o in (obj, sent):
        if isinstance(o.get("metadata"), dict) and m.kind not in (
            "DeviceClass",
            "ResourceSlice",
            "Node",
        ):
            o["metadata"]["namespace"] = ns
    status, message = _dry_run(client, sent)
    ours = manifest_problems(Manifest(obj, m.source))
    fields = [p.field for p in ours]
    where = f"{m.source} {m.ref()}"
    if status == 0:
        tally["accepted"] += 1
        return (
            f"{where}: the API server accepts it, Tessera refuses: {[f'{p.field}: {p.message}' for p in ours]}"
            if ours
            else None
        )
    unknown = re.findall(r'unknown field "([^"]+)"', message)
    # "Go struct field T.spec.x.Embedded.y": the Go names of embedded structs are not JSON fields.
    unmarshal = [
        ".".join(p for p in path.split(".") if not p[:1].isupper())
        for path in re.findall(r"Go struct field [A-Za-z0-9_]+\.(\S+) of type", message)
    ]
    if status == 400 and (unknown or unmarshal):
        tally["refused (schema)"] += 1
        # The decoder writes a map key as ".key" where validation (and Tessera) write "[key]".
        dotted = {re.sub(r"\[([^\]0-9][^\]]*)\]", r".\1", f) for f in fields}
        for path in unknown:
            if path not in fields and path not in dotted:
                return (
                    f"{where}: the API server refuses unknown field {path}, Tessera finds {fields}"
                )
        for path in unmarshal:
            if path not in {_no_index(f) for f in fields}:
                return f"{where}: the API server cannot decode {path}, Tessera finds {fields}"
        return None
    tally["refused (validation)"] += 1
    tally["of which Tessera refuses too"] += 1 if ours else 0
    return None


def test_corpus_and_generated_manifests_agree_with_the_api_server(
    kube_cluster: LiveCluster, kube_namespace: str
) -> None:
    client = kube_cluster.client
    base = _corpus_objects()
    assert len(base) >= 30, [m.ref() for m in base]
    rng = random.Random(int(os.environ.get("TESSERA_PROPERTY_SEED", "7")))
    generated: list[Manifest] = []
    while len(generated) < GENERATED:
        m = rng.choice(base)
        docs = [copy.deepcopy(m.obj)]
        old = fuzz_mutate.HOSTILE_VALUES
        try:
            fuzz_mutate.HOSTILE_VALUES = SAFE_VALUES
            mutated = fuzz_mutate._structural_mutation(rng, docs)
        finally:
            fuzz_mutate.HOSTILE_VALUES = old
        if (
            not mutated
            or not isinstance(mutated[0], dict)
            or not isinstance(mutated[0].get("kind"), str)
            or mutated[0]["kind"] not in READ_KINDS
        ):
            continue
        md = mutated[0].get("metadata")
        if (
            not isinstance(md, dict)
            or not isinstance(md.get("name"), str)
            or not isinstance(mutated[0].get("apiVersion"), str)
        ):
            continue  # the object must still name itself for the API server to answer about it
        # What Tessera reads is the text: through its loader (a null field is an unset field).
        name = f"generated-{len(generated)}"
        try:
            ((_, obj),) = parse_documents(json.dumps(mutated[0]), name)
        except TesseraError:
            continue
        generated.append(Manifest(obj, Source(name, 1), extra={"sent": mutated[0]}))
    tally = {
        "accepted": 0,
        "refused (schema)": 0,
        "refused (validation)": 0,
        "of which Tessera refuses too": 0,
    }
    failures = [f for m in base + generated if (f := _check(client, m, kube_namespace, tally))]
    print(f"\n{len(base)} corpus + {len(generated)} generated objects: {tally}")
    assert not failures, f"{len(failures)} disagreements:\n" + "\n".join(failures[:25])
    assert tally["accepted"] >= 20 and tally["refused (schema)"] >= 20, tally


def test_selector_typed_for_selectors(
    kube_cluster: LiveCluster, kube_namespace: str, tmp_path: Path
) -> None:
    f = tmp_path / "claim.yaml"
    f.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: typo}\nspec:\n  devices:\n    "
        "requests:\n"
        "    - name: gpu\n      exactly:\n        deviceClassName: gpu.tessera.dev\n"
        "        selector:\n        - cel: {expression: 'true'}\n"
    )
    (m,) = load_file(f)
    status, message = _dry_run(
        kube_cluster.client, {**m.obj, "metadata": {"name": "typo", "namespace": kube_namespace}}
    )
    assert status == 400 and 'unknown field "spec.devices.requests[0].exactly.selector"' in message
    (p,) = manifest_problems(m)
    assert (p.field, p.message) == (
        "spec.devices.requests[0].exactly.selector",
        "unknown field 'selector': did you mean 'selectors'?",
    )
