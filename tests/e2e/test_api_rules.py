"""The API rules Tessera took from upstream validation (issue 22 items 8 and 10), checked against
the live control plane: what it refuses, Tessera refuses naming the same field; a whole-number
float is the integer kubectl sends.

* workloads: ``spec.selector`` required, not empty, matching the template's labels;
* a container listing one claim twice;
* a ResourceClaim's ``status`` (written through the ``status`` subresource, dry run);
* ``count: 2.0`` in a YAML manifest: ``kubectl create --dry-run=server`` sends ``2``.
"""

from __future__ import annotations

import copy
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.api.loader import Manifest, Source
from tessera.api.validation import manifest_problems
from tessera.kube.client import ApiError, KubeClient
from tessera.localcluster import build

from .conftest import LiveCluster

pytestmark = pytest.mark.cluster

DEPLOYMENT: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "web"},
    "spec": {
        "selector": {"matchLabels": {"app": "web"}},
        "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        },
    },
}
POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p"},
    "spec": {
        "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": "c1"}],
    },
}
CLAIM: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "c1"},
    "spec": {
        "devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}]
        }
    },
}


def _variant(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``base`` with the dotted ``path`` set to ``value`` (deleted for ``...``)."""
    obj = copy.deepcopy(base)
    cur: Any = obj
    parts = path.split(".")
    for p in parts[:-1]:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    last: Any = int(parts[-1]) if isinstance(cur, list) else parts[-1]
    if value is ...:
        del cur[last]
    else:
        cur[last] = value
    return obj


def _refused(client: KubeClient, verb: str, path: str, obj: dict[str, Any]) -> str:
    """The API server's message refusing ``obj`` (dry run); fails the test if it accepts it."""
    try:
        client.request(verb, path, body=obj, query={"dryRun": "All", "fieldValidation": "Strict"})
    except ApiError as e:
        assert e.status == 422, (e.status, e.message)
        return e.message
    pytest.fail(f"the API server accepted {json.dumps(obj)[:200]}")


def _tessera_field(obj: dict[str, Any]) -> str:
    probs = manifest_problems(Manifest(obj, Source("t.yaml", 1)))
    assert probs, f"Tessera accepts {json.dumps(obj)[:200]}"
    return probs[0].field


@pytest.mark.parametrize(
    ("base", "path", "value", "field"),
    [
        (DEPLOYMENT, "spec.selector", ..., "spec.selector"),
        (DEPLOYMENT, "spec.selector", {}, "spec.selector"),
        (
            DEPLOYMENT,
            "spec.selector.matchLabels.app",
            "api",
            "spec.template.metadata.labels",
        ),
        (
            POD,
            "spec.containers.0.resources.claims",
            [{"name": "gpu"}, {"name": "gpu"}],
            "spec.containers[0].resources.claims[1]",
        ),
    ],
)
def test_the_api_server_refuses_what_tessera_refuses(
    kube_cluster: LiveCluster, base: dict[str, Any], path: str, value: Any, field: str
) -> None:
    client = kube_cluster.client
    obj = _variant(base, path, value)
    message = _refused(client, "POST", client._obj_path(obj, with_name=False), obj)
    assert field in message, message
    assert _tessera_field(obj) == field
    assert manifest_problems(Manifest(copy.deepcopy(base), Source("t.yaml", 1))) == []


RESULT = {"request": "gpu", "driver": "gpu.tessera.dev", "pool": "n1", "device": "gpu-0"}


@pytest.mark.parametrize(
    ("status", "field"),
    [
        ({"allocation": {"devices": {"results": [{**RESULT, "pool": ""}]}}}, "pool"),
        ({"allocation": {"devices": {"results": [{**RESULT, "device": ""}]}}}, "device"),
        ({"allocation": {"devices": {"results": [{**RESULT, "request": "nope"}]}}}, "request"),
        (
            {"allocation": {"devices": {"results": [{**RESULT, "shareID": "ABC"}]}}},
            "shareID",
        ),
        (
            {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]},
            "reservedFor",
        ),
    ],
)
def test_claim_status_the_api_server_refuses_tessera_refuses(
    kube_cluster: LiveCluster, status: dict[str, Any], field: str
) -> None:
    client = kube_cluster.client
    claim = _variant(CLAIM, "metadata.name", f"c-{uuid.uuid4().hex[:8]}")
    stored = client.create(claim)
    try:
        obj = {**stored, "status": status}
        path = client._obj_path(obj) + "/status"
        message = _refused(client, "PUT", path, obj)
        assert (
            f"status.{'allocation.devices.results[0].' if 'allocation' in status else ''}{field}"
            in message
        ), message
        assert _tessera_field(obj).endswith(field)
    finally:
        client.request("DELETE", client._obj_path(stored))


def test_a_whole_number_float_is_the_integer_kubectl_sends(
    kube_cluster: LiveCluster, tmp_path: Path
) -> None:
    f = tmp_path / "c.yaml"
    claim = _variant(CLAIM, "spec.devices.requests.0.exactly.count", 2)
    f.write_text(yaml.safe_dump(claim).replace("count: 2", "count: 2.0"))
    assert "count: 2.0" in f.read_text()
    r = subprocess.run(
        [
            str(build.bin_dir() / "kubectl"),
            f"--kubeconfig={kube_cluster.kubeconfig}",
            "create",
            "--dry-run=server",
            "-o",
            "json",
            "-f",
            str(f),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    sent = json.loads(r.stdout)
    assert sent["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
    from tessera.api.loader import load_file

    (m,) = load_file(f)
    assert m.obj["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
    assert manifest_problems(m) == []
