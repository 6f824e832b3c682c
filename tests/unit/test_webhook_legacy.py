"""Legacy mode's conversion (``tessera.convert.legacy_pod``), through the webhook
(``decide(..., legacy_scheduler=...)`` and the server's paths per ``mode``) and ``tessera
convert --mode legacy``, over the corpus HAMi pods: requests unchanged, the legacy scheduler
named, and the pod the API server stores read by legacy mode's decision
(``tessera.scheduler.legacy.decide``) as the DRA conversion reads the original."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from test_webhook import applied, review

from corpus_paths import corpus_path
from hami_register import A5000, H100, H100_TOPOLOGY, register_node
from tessera.cli import main
from tessera.convert import LEGACY_SCHEDULER, ConversionError, convert_pod, legacy_pod
from tessera.scheduler.legacy import decide as legacy_decide
from tessera.scheduler.legacy import legacy_node
from tessera.webhook.admission import ClusterView, decide
from tessera.webhook.server import MUTATE_LEGACY_PATH, MUTATE_PATH, Webhook

PODS = corpus_path() / "hami-pods"
EMPTY = ClusterView.static([])

#: Corpus files with NVIDIA HAMi pods (kind Pod), each converted by the DRA path too.
NVIDIA_PODS = [
    "HAMi__examples_nvidia__default_use.yaml",
    "HAMi__examples_nvidia__default_use_legacy.yaml",
    "HAMi__examples_nvidia__use_sharing_card.yaml",
    "HAMi__examples_nvidia__use_exclusive_card.yaml",
    "HAMi__examples_nvidia__use_memory_fraction.yaml",
    "HAMi__examples_nvidia__specify_scheduling_policy.yaml",
    "HAMi__examples_nvidia__specify_card_type_to_use.yaml",
    "HAMi__examples_nvidia__specify_uuid_not_use.yaml",
    "HAMi__examples_nvidia__use_as_normal.yaml",
]


def corpus_pods(name: str) -> list[dict[str, Any]]:
    out = []
    for doc in yaml.safe_load_all((PODS / name).read_text()):
        if doc and doc.get("kind") == "Pod":
            doc.setdefault("metadata", {}).setdefault("namespace", "default")
            out.append(doc)
    assert out, f"{name}: no Pod in the corpus file"
    return out


def _without_scheduler(pod: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["spec"].pop("schedulerName", None)
    return out


@pytest.mark.parametrize("name", NVIDIA_PODS)
def test_webhook_legacy_keeps_requests_and_names_the_scheduler(name: str) -> None:
    """The API server's pod after the webhook's legacy patch is the corpus pod with
    ``spec.schedulerName: tessera-legacy`` and nothing else changed (its HAMi requests and
    annotations as written); legacy mode's decision reads from it the containers and GPUs the
    DRA conversion reads from the original."""
    nodes = [
        legacy_node(register_node("a5000", A5000)),
        legacy_node(register_node("h100", H100, H100_TOPOLOGY)),
    ]
    for p in corpus_pods(name):
        d = decide(review(p, namespace="default"), EMPTY, legacy_scheduler=LEGACY_SCHEDULER)
        assert d.allowed and d.templates == []
        got = applied(p, d.review())
        assert got["spec"]["schedulerName"] == LEGACY_SCHEDULER
        assert _without_scheduler(got) == _without_scheduler(p)
        assert [op["path"] for op in d.patch] == ["/spec/schedulerName"]
        want = convert_pod(p, memory_sizes=[80 * 2**30]).requests
        decision = legacy_decide(got, nodes, [])
        assert decision.hami
        assert [(r.container, r.gpus) for r in decision.requests] == [
            (r.container, r.gpus) for r in want
        ]


def test_refusals_and_warnings_are_the_dra_conversions() -> None:
    """A value the DRA conversion refuses is refused in legacy mode with the same message; a
    pod whose HAMi resources ask for no GPU (gpu: 0) is left alone (no scheduler)."""
    p = corpus_pods("HAMi__examples_nvidia__default_use.yaml")[0]
    bad = copy.deepcopy(p)
    bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] = 101
    with pytest.raises(ConversionError) as dra:
        convert_pod(bad)
    d = decide(review(bad, namespace="default"), EMPTY, legacy_scheduler=LEGACY_SCHEDULER)
    assert not d.allowed and d.code == 422 and d.message == str(dra.value)
    none = copy.deepcopy(p)
    none["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 0}}
    conv = legacy_pod(none)
    assert "schedulerName" not in conv.pod["spec"] and conv.pod == none


def test_a_percentage_needs_no_gpu_memory_sizes() -> None:
    """``gpumem-percentage`` below 100 is resolved by the extender per GPU in legacy mode: the
    webhook, which sees no ResourceSlices there, admits it unchanged (the DRA path refuses it
    without the cluster's sizes)."""
    p = corpus_pods("HAMi__examples_nvidia__use_memory_fraction.yaml")[0]
    limits = p["spec"]["containers"][0]["resources"]["limits"]
    assert (
        "nvidia.com/gpumem-percentage" in limits
        and int(limits["nvidia.com/gpumem-percentage"]) < 100
    )
    with pytest.raises(ConversionError, match="needs the cluster's GPU memory sizes"):
        convert_pod(p)
    d = decide(review(p, namespace="default"), EMPTY, legacy_scheduler=LEGACY_SCHEDULER)
    assert d.allowed
    assert applied(p, d.review())["spec"]["containers"] == p["spec"]["containers"]


@pytest.mark.parametrize(
    ("scheduler", "replaced"),
    [("default-scheduler", True), ("hami-scheduler", True), ("volcano", False)],
)
def test_which_schedulers_are_replaced(scheduler: str, replaced: bool) -> None:
    """As HAMi's webhook: no scheduler, the default one or HAMi's becomes the legacy
    scheduler; another one is kept, with a warning naming it."""
    p = corpus_pods("HAMi__examples_nvidia__default_use.yaml")[0]
    p["spec"]["schedulerName"] = scheduler
    conv = legacy_pod(p, "gpu-legacy")
    assert conv.pod["spec"]["schedulerName"] == ("gpu-legacy" if replaced else scheduler)
    kept = [w for w in conv.warnings if "is kept" in w]
    assert bool(kept) is not replaced
    if kept:
        assert f"spec.schedulerName '{scheduler}' is kept" in kept[0]


def test_volcano_pods_are_left_for_volcano() -> None:
    """Volcano's vGPU pods (volcano.sh/ names, schedulerName volcano) keep everything: legacy
    mode's scheduler serves nvidia.com/ names only."""
    docs = [
        d
        for d in yaml.safe_load_all(
            (PODS / "volcano-vgpu-device-plugin__examples__vgpu-case01.yml").read_text()
        )
        if d and d.get("kind") == "Pod"
    ]
    assert docs
    for p in docs:
        conv = legacy_pod(p)
        assert conv.pod == p
        assert any("volcano.sh/ GPU resources are left" in w for w in conv.warnings)


async def _post(app: Any, path: str, body: bytes) -> tuple[int, bytes]:
    """One POST through the ASGI app (the routes uvicorn serves), without a socket."""
    sent: list[dict[str, Any]] = []
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "https",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8443),
    }
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def _server_answer(mode: str, path: str, pod: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    hook = Webhook(EMPTY, None, mode=mode, legacy_scheduler=LEGACY_SCHEDULER)
    status, body = asyncio.run(_post(hook.app(), path, review(pod, namespace="default")))
    return status, (json.loads(body) if status == 200 else {})


def test_server_paths_by_mode() -> None:
    """mode legacy: /mutate-pods converts for legacy mode; mode both: /mutate-pods for DRA
    (the pod gets a claim) and /mutate-pods-legacy for legacy mode; mode dra has no legacy
    path (404)."""
    p = corpus_pods("HAMi__examples_nvidia__default_use.yaml")[0]
    status, out = _server_answer("legacy", MUTATE_PATH, p)
    assert status == 200 and applied(p, out)["spec"]["schedulerName"] == LEGACY_SCHEDULER
    status, out = _server_answer("both", MUTATE_LEGACY_PATH, p)
    assert status == 200 and applied(p, out)["spec"]["schedulerName"] == LEGACY_SCHEDULER
    status, out = _server_answer("both", MUTATE_PATH, p)
    got = applied(p, out)
    assert status == 200 and "schedulerName" not in got["spec"] and got["spec"]["resourceClaims"]
    assert _server_answer("dra", MUTATE_LEGACY_PATH, p)[0] == 404
    with pytest.raises(ValueError, match="needs legacy_scheduler"):
        Webhook(EMPTY, None, mode="legacy")


def test_cli_convert_legacy_matches_the_webhook(tmp_path: Path) -> None:
    """``tessera convert --mode legacy`` writes, for a corpus pod and a Deployment, what the
    webhook makes of them: the scheduler named, requests unchanged, no template."""
    pod_file = PODS / "HAMi__examples_nvidia__default_use.yaml"
    dep_file = PODS / "HAMi__examples_nvidia__example.yaml"
    r = CliRunner().invoke(main, ["convert", "--mode", "legacy", str(pod_file), str(dep_file)])
    assert r.exit_code == 0, r.output
    out = [d for d in yaml.safe_load_all(r.stdout) if d]
    assert not [d for d in out if d["kind"] == "ResourceClaimTemplate"]
    (pod,) = [d for d in out if d["kind"] == "Pod"]
    src = corpus_pods(pod_file.name)[0]
    d = decide(review(src, namespace="default"), EMPTY, legacy_scheduler=LEGACY_SCHEDULER)
    assert json.dumps(pod, sort_keys=True) == json.dumps(
        {**applied(src, d.review()), "metadata": pod["metadata"]}, sort_keys=True
    )
    (dep,) = [d for d in out if d["kind"] == "Deployment"]
    src_dep = next(
        d for d in yaml.safe_load_all(dep_file.read_text()) if d and d.get("kind") == "Deployment"
    )
    spec = dep["spec"]["template"]["spec"]
    assert spec["schedulerName"] == LEGACY_SCHEDULER
    assert spec["containers"] == src_dep["spec"]["template"]["spec"]["containers"]
