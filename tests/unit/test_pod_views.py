"""Typed views of a pod's claim entries and containers (tessera.api.pods), read from the
corpus's own manifests, and the parts they skip."""

from __future__ import annotations

from pathlib import Path

import yaml

from tessera.api.pods import ContainerClaim, pod_claims, pod_containers, spec_claims
from tessera.scheduler.claims import pod_claim_name


def _pods(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "Pod"]


def test_init_container_shares_a_template_claim(corpus: Path) -> None:
    (pod,) = _pods(
        corpus / "dra-manifests/dra-example-driver__demo_examples__initcontainer-shared-gpu.yaml"
    )
    (entry,) = pod_claims(pod)
    assert (entry.name, entry.claim_name, entry.template_name) == ("shared-gpu", None, "single-gpu")
    assert entry.field == "spec.resourceClaims[0]"
    ctrs = pod_containers(pod)
    # init containers first, in the kubelet's order
    assert [(c.name, c.init, c.field) for c in ctrs] == [
        ("init0", True, "spec.initContainers[0]"),
        ("ctr0", False, "spec.containers[0]"),
    ]
    assert [c.claims for c in ctrs] == [(ContainerClaim("shared-gpu", None),)] * 2
    # no controller has made the claim: a live reader has none, the simulation names it
    assert pod_claim_name(pod, entry) is None
    assert pod_claim_name(pod, entry, simulated=True) == "pod0-shared-gpu"
    pod["status"] = {
        "resourceClaimStatuses": [
            {"name": "shared-gpu", "resourceClaimName": "pod0-shared-gpu-x7k2p"}
        ]
    }
    assert pod_claim_name(pod, entry) == "pod0-shared-gpu-x7k2p"


def test_containers_limited_to_one_request(corpus: Path) -> None:
    (pod,) = _pods(
        corpus
        / "dra-manifests/dra-example-driver__demo_examples__basic-resourceclaim-opaque-config.yaml"
    )
    (entry,) = pod_claims(pod)
    assert (entry.name, entry.claim_name, entry.template_name) == (
        "shared-gpus",
        None,
        "multiple-gpus",
    )
    by_ctr = {c.name: c.claims for c in pod_containers(pod)}
    assert by_ctr["ts-ctr0"] == (ContainerClaim("shared-gpus", "ts-gpu"),)
    assert by_ctr["sp-ctr0"] == (ContainerClaim("shared-gpus", "sp-gpu"),)


def test_parts_that_are_not_objects_are_skipped_not_raised() -> None:
    spec = {
        "resourceClaims": [
            "gpu",
            {"name": 7, "resourceClaimName": ""},
            {"name": "b", "resourceClaimTemplateName": "t"},
        ],
        "containers": [3, {"resources": {"claims": ["x", {"name": "b", "request": ""}]}}],
        "initContainers": "none",
    }
    entries = spec_claims(spec)
    # the string entry is skipped; a non-string name reads as "", an empty claim name as none
    assert [(e.index, e.name, e.claim_name, e.template_name) for e in entries] == [
        (1, "", None, None),
        (2, "b", None, "t"),
    ]
    (c,) = pod_containers({"spec": spec})
    assert (c.name, c.index, c.claims) == ("", 1, (ContainerClaim("b", None),))
    assert pod_containers({"spec": None}) == [] and spec_claims(None) == []
