"""tessera.webhook (admission decisions, hashed templates), tessera.extender (prioritize), the one
DeviceClass and who owns nvidia.com/gpu, topology subrequests and kube-scheduler's firstAvailable
score. Real inputs: corpus HAMi pods and ResourceSlices built from corpus inventories."""

from __future__ import annotations

import base64
import copy
import json
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from corpus_paths import corpus_path
from tessera.api.deviceclass import device_class, extended_resource_owner
from tessera.convert import convert_pod
from tessera.extender.prioritize import BadArgs, UsageView, prioritize, scores
from tessera.inventory import build_resource_slices, load_inventory, load_topology
from tessera.scheduler.policies import max_prioritized_list_score, prioritized_list_score
from tessera.webhook.admission import BadReview, ClusterView, decide, parse_review
from tessera.webhook.templates import HASH_LABEL, hashed_template, referenced_templates, spec_hash

CORPUS = corpus_path().resolve()
HAMI = CORPUS / "hami-pods"
REPO = Path(__file__).resolve().parents[2]
MiB = 2**20


def h100_slices() -> list[dict[str, Any]]:
    inv = (
        CORPUS
        / "inventories"
        / "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
    )
    topo = CORPUS / "topologies" / "litgpt__tests_test_utils__topo-m.8xGPU-NV12-10nic.txt"
    return build_resource_slices("h100-node", load_inventory(str(inv)), load_topology(str(topo)))


def a5000_slices() -> list[dict[str, Any]]:
    inv = CORPUS / "inventories" / "telegraf__nvidia_smi_testdata__dual_a5000-v13.xml"
    return build_resource_slices("a5000-node", load_inventory(str(inv)))


VIEW = ClusterView.static(h100_slices() + a5000_slices())


def corpus_pod(file: str, doc: int = 0) -> dict[str, Any]:
    return [d for d in yaml.safe_load_all((HAMI / file).read_text()) if d][doc]


def review(obj: Any, *, uid: str = "0001", namespace: str = "team-a", **extra: Any) -> bytes:
    req = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "namespace": namespace,
        "object": obj,
        **extra,
    }
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}
    ).encode()


def applied(pod: dict[str, Any], decision_review: dict[str, Any]) -> dict[str, Any]:
    """The pod after the API server applies the response's JSONPatch."""
    patch = json.loads(base64.b64decode(decision_review["response"]["patch"]))
    return jsonpatch.apply_patch(pod, patch)


# ---- admission decisions ------------------------------------------------------------------------
def test_corpus_pod_is_patched_into_what_convert_gives_with_hashed_template_names() -> None:
    pod = corpus_pod("HAMi__examples_nvidia__use_memory_fraction.yaml")
    d = decide(review(pod), VIEW)
    assert d.allowed and d.warnings == []
    out = d.review()
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["response"]["uid"] == "0001"
    assert out["response"]["patchType"] == "JSONPatch"
    mutated = applied(pod, out)
    conv = convert_pod(
        {**pod, "metadata": {**pod["metadata"], "namespace": "team-a"}},
        memory_sizes=VIEW.memory_sizes(),
    )
    (template,) = d.templates
    assert template == hashed_template(conv.templates[0], "team-a")
    assert template["metadata"]["name"] == f"tessera-gpu-{spec_hash(conv.templates[0]['spec'])}"
    assert template["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "tessera",
        HASH_LABEL: spec_hash(conv.templates[0]["spec"]),
    }
    expected = copy.deepcopy(conv.pod)
    expected["metadata"] = pod["metadata"]
    expected["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = template["metadata"][
        "name"
    ]
    assert mutated == expected
    # 50% of the H100's 81008 MiB and of the A5000's 24114 MiB published (their totals less the
    # driver-reserved 551 and 450 MiB), 2 GPUs: topology levels per size
    subs = template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert [(s["name"], s["capacity"]["requests"]["memory"]) for s in subs] == [
        (f"{level}-mem-{i}", mem)
        for level in ("nvlink", "numa", "any")
        for i, mem in enumerate(("40504Mi", "12057Mi"))
    ]


def test_pods_of_one_shape_share_one_template_and_replicas_have_no_name() -> None:
    a = corpus_pod("HAMi__examples_nvidia__default_use.yaml")
    b = copy.deepcopy(a)
    b["metadata"] = {
        "generateName": "web-7d9c-",
        "ownerReferences": [{"kind": "ReplicaSet", "name": "web-7d9c", "controller": True}],
    }
    b["spec"]["containers"][0]["name"] = "other"
    ta, tb = decide(review(a), VIEW).templates, decide(review(b, uid="2"), VIEW).templates
    assert ta == tb and len(ta) == 1
    assert (
        decide(review(a, namespace="team-b"), VIEW).templates[0]["metadata"]["namespace"]
        == "team-b"
    )


def test_api_server_canonical_quantities_convert_like_the_manifest() -> None:
    """The API server sends ``gpumem: 3000`` as the Quantity ``3k``: same claim."""
    pod = corpus_pod("HAMi__examples_nvidia__default_use.yaml")
    canon = copy.deepcopy(pod)
    canon["spec"]["containers"][0]["resources"]["limits"] = {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "3k",
        "nvidia.com/gpucores": "30",
    }
    assert decide(review(pod), VIEW).templates == decide(review(canon), VIEW).templates


def test_dry_run_patches_but_ensures_no_template() -> None:
    pod = corpus_pod("HAMi__examples_nvidia__default_use.yaml")
    d = decide(review(pod, dryRun=True), VIEW)
    assert d.allowed and d.patch and d.templates == []


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (
            {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "101"},
            "pod team-a/p, container c: nvidia.com/gpucores 101 is over 100: it is a percentage 0-100 of each "
            "GPU's compute (HAMi clamps it silently); write 100 or less",
        ),
        (
            {"nvidia.com/gpumem": "-3k"},
            "pod team-a/p, container c: nvidia.com/gpumem '-3k' is negative; write a whole number of MiB such as 3000",
        ),
    ],
)
def test_values_convert_rejects_are_denied_with_container_and_field(
    limits: dict[str, str], message: str
) -> None:
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }
    out = decide(review(pod), VIEW).review()["response"]
    assert out["allowed"] is False
    assert out["status"] == {"code": 422, "reason": "Invalid", "message": message}


def test_requests_no_gpu_can_hold_are_admitted_with_warnings() -> None:
    pod = {
        "metadata": {"name": "p", "annotations": {"nvidia.com/use-gpuuuid": "GPU-not-here"}},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "resources": {"limits": {"nvidia.com/gpu": "9", "nvidia.com/gpumem": "200k"}},
                }
            ]
        },
    }
    d = decide(review(pod), VIEW)
    assert d.allowed and d.templates
    assert d.warnings == [
        "pod team-a/p, container c: nvidia.com/gpumem: 200000Mi is more than any device has: the largest memory of a "
        "matching device is 81008Mi (gpu.tessera.dev/h100-node/gpu-0); no device can satisfy this request; the pod "
        "stays pending until a GPU that can hold it is published",
        "pod team-a/p, container c: the pod's GPU selection annotations (nvidia.com/use-gpuuuid, "
        "nvidia.com/nouse-gpuuuid, "
        "nvidia.com/use-gputype, nvidia.com/nouse-gputype): matches none of the 10 devices of class gpu.tessera.dev; "
        "the pod stays pending until a GPU that can hold it is published",
        "pod team-a/p, container c: nvidia.com/gpu: 9 GPUs on one node, but the most any node publishes is 8; the pod "
        "stays pending until a GPU that can hold it is published",
    ]
    # No GPU published yet (webhook started before the driver): no cluster warnings at all.
    assert decide(review(pod), ClusterView.static([])).warnings == []


def test_volcano_uuid_pin_becomes_a_selector_and_is_checked_against_the_gpus() -> None:
    # Issue 22 item 5: volcano.sh/vgpu-use-gpuuuid was copied and ignored; now it is the same
    # selector as HAMi's, so a pin no GPU has is said so, in Volcano's own names.
    pod = {
        "metadata": {
            "name": "p",
            "annotations": {"volcano.sh/vgpu-use-gpuuuid": " GPU-not-here , GPU-nor-this"},
        },
        "spec": {
            "containers": [{"name": "c", "resources": {"limits": {"volcano.sh/vgpu-number": "1"}}}]
        },
    }
    d = decide(review(pod), VIEW)
    assert d.allowed and d.templates
    (sel,) = d.templates[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    assert '["GPU-not-here", "GPU-nor-this"]' in sel["cel"]["expression"]
    assert d.warnings == [
        "pod team-a/p, container c: the pod's GPU selection annotations (volcano.sh/vgpu-use-gpuuuid, "
        "volcano.sh/vgpu-nouse-gpuuuid, nvidia.com/use-gputype, nvidia.com/nouse-gputype): matches none "
        "of the 10 devices of class gpu.tessera.dev; the pod stays pending until a GPU that can hold it "
        "is published",
    ]


class Slices:
    """A watched-slices source as the webhook's Informer gives it: items, generation, synced;
    counts how often the items are read."""

    def __init__(self, items: list[dict[str, Any]], *, synced: bool = True) -> None:
        self.items_, self.generation, self.synced, self.reads = items, 1, synced, 0

    def view(self) -> ClusterView:
        return ClusterView(self.items, lambda: self.generation, lambda: self.synced)

    def items(self) -> list[dict[str, Any]]:
        self.reads += 1
        return self.items_

    def change(self, items: list[dict[str, Any]], *, synced: bool = True) -> None:
        self.items_, self.synced = items, synced
        self.generation += 1


SHAPES = [
    "HAMi__examples_nvidia__default_use.yaml",
    "HAMi__examples_nvidia__use_memory_fraction.yaml",
    "HAMi__examples_nvidia__use_exclusive_card.yaml",
    "HAMi__examples_nvidia__specify_card_type_to_use.yaml",
    "HAMi__examples_nvidia__specify_uuid_to_use.yaml",
]


def test_what_the_slices_give_is_derived_once_per_change_not_per_request() -> None:
    """Memory sizes, node sizes, the lint index and each shape's notes: computed when the slices
    change (or a shape is first seen), never per request; answers stay those of a fresh view."""
    source = Slices(h100_slices())
    view = source.view()
    bodies = [review(corpus_pod(f), uid=f"u{i}") for i, f in enumerate(SHAPES)]
    fresh = [decide(b, ClusterView.static(h100_slices())).review() for b in bodies]
    assert [decide(b, view).review() for b in bodies * 20] == fresh * 20
    assert (view.builds, source.reads) == (1, 1)
    snap = view.snapshot()
    world = snap.world()
    assert world is not None and len(snap.notes) == 5  # one entry per template shape
    assert list(world.class_members) == ["gpu.tessera.dev"]  # the lint ran on this index
    assert snap.sizes == (81008 * MiB,)  # 81559 MiB less the driver's 551 MiB
    # A node joins: sizes, notes and the index are those of the new slices, derived once.
    source.change(h100_slices() + a5000_slices())
    answers = [decide(b, view).review() for b in bodies * 3]
    assert answers == [decide(b, VIEW).review() for b in bodies] * 3
    assert view.builds == 2 and view.snapshot().world() is not world
    assert view.snapshot().sizes == (81008 * MiB, 24114 * MiB)


def test_the_background_thread_rebuilds_and_requests_never_wait_for_it() -> None:
    """With ``start``: after a change, requests get the last synced generation until the
    thread has rebuilt (lint index included); before the first sync, they never get a stale one
    (a webhook started before its informer synced must not refuse percentages)."""
    source = Slices([], synced=False)
    view = source.view()
    stop = view.start(interval=3600)  # no tick during the test: refresh() by hand
    try:
        pct = review(corpus_pod("HAMi__examples_nvidia__use_memory_fraction.yaml"))
        assert (
            decide(pct, view).allowed is False
        )  # no sizes yet: "needs the cluster's GPU memory sizes"
        source.change(h100_slices())  # the informer's first list
        assert (
            decide(pct, view).allowed is True and view.builds == 2
        )  # unsynced: looked again at once
        builds = view.builds
        source.change(h100_slices() + a5000_slices())
        old = decide(pct, view)
        assert (
            view.builds == builds
            and len(old.templates[0]["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"])
            == 3
        )
        assert view.refresh() is True and view.refresh() is False
        snap = view.snapshot()
        assert (
            snap.generation == source.generation and snap._world is not None
        )  # built off the request path
        new = decide(pct, view)
        assert (
            len(new.templates[0]["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]) == 6
        )
    finally:
        stop.set()


def _view_thread() -> Any:
    import threading

    (thread,) = [t for t in threading.enumerate() if t.name == "cluster-view"]
    return thread


def first_available(d: Any) -> int:
    return len(d.templates[0]["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"])


def test_the_thread_rebuilds_by_itself_and_stops_when_told() -> None:
    """No request and no ``refresh`` by hand: the thread sees the change, derives the new
    generation (lint index included) and swaps it in; setting the event ends the thread."""
    source = Slices(h100_slices())
    view = source.view()
    stop = view.start(interval=0.01)
    thread = _view_thread()
    try:
        pct = review(corpus_pod("HAMi__examples_nvidia__use_memory_fraction.yaml"))
        assert first_available(decide(pct, view)) == 3 and view.builds == 1
        source.change(h100_slices() + a5000_slices())
        for _ in range(1000):  # up to 10 s on a loaded machine
            if view.builds == 2:
                break
            thread.join(0.01)
        assert view.builds == 2 and source.reads == 2
        snap = view.snapshot()
        assert snap.generation == source.generation and snap._world is not None
        assert snap.sizes == (81008 * MiB, 24114 * MiB)  # less 551 and 450 MiB driver-reserved
        assert first_available(decide(pct, view)) == 6 and view.builds == 2
    finally:
        stop.set()
    thread.join(10)
    assert not thread.is_alive()


def test_a_failing_rebuild_hands_the_work_back_to_requests(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The thread meets an unexpected error while deriving (an informer that breaks): it logs it
    and stops, and from then on each request derives a changed generation itself, so answers
    never stay on old slices."""
    source = Slices(h100_slices())
    items = source.items
    broken = {"on": False}

    def flaky() -> list[dict[str, Any]]:
        if broken["on"]:
            broken["on"] = False
            raise RuntimeError("informer broke")
        return items()

    source.items = flaky  # type: ignore[method-assign]
    view = source.view()
    stop = view.start(interval=0.01)
    thread = _view_thread()
    try:
        broken["on"] = True
        source.change(h100_slices() + a5000_slices())
        thread.join(10)
        assert not thread.is_alive()
        assert "cannot derive the cluster's GPUs from the ResourceSlices" in caplog.text
        assert "informer broke" in caplog.text
        pct = review(corpus_pod("HAMi__examples_nvidia__use_memory_fraction.yaml"))
        assert first_available(decide(pct, view)) == 6  # derived by the request itself
        assert view.snapshot().generation == source.generation
        source.change(h100_slices())
        assert first_available(decide(pct, view)) == 3  # and again at the next change
    finally:
        stop.set()


def test_concurrent_requests_derive_a_generation_once() -> None:
    """Requests in several threads (the server's lint workers beside the event loop) on a view
    without its thread: one build, notes for each shape, every answer a fresh view's."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    source = Slices(h100_slices() + a5000_slices())
    items = source.items

    def slow() -> list[dict[str, Any]]:
        time.sleep(0.05)  # another thread's turn while the first derives (an informer's lock)
        return items()

    source.items = slow  # type: ignore[method-assign]
    view = source.view()
    bodies = [review(corpus_pod(f), uid=f"u{i}") for i, f in enumerate(SHAPES)]
    fresh = [decide(b, VIEW).review() for b in bodies]
    start = threading.Barrier(8)

    def requests(_: int) -> list[dict[str, Any]]:
        start.wait(10)  # all at once, on a view that has derived nothing yet
        return [decide(b, view).review() for b in bodies * 5]

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(requests, range(8)))
    assert answers == [fresh * 5] * 8
    assert (view.builds, source.reads) == (1, 1)
    assert len(view.snapshot().notes) == len(
        {t["metadata"]["name"] for b in bodies for t in decide(b, VIEW).templates}
    )


def test_notes_are_bounded_and_an_unreadable_slice_only_drops_them(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """At most MAX_NOTES shapes keep their lint notes; a slice the lint index cannot read
    (another driver's bad capacity) costs the warnings, never the admission."""
    import tessera.webhook.admission as admission

    monkeypatch.setattr(admission, "MAX_NOTES", 3)
    view = ClusterView.static(h100_slices())
    for mib in range(1000, 6000, 1000):
        pod = {
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {"name": "c", "resources": {"limits": {"nvidia.com/gpumem": str(mib)}}}
                ]
            },
        }
        assert decide(review(pod), view).allowed
    assert len(view.snapshot().notes) == 3
    big = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpumem": "200k"}}}]
        },
    }
    assert "is more than any device has" in decide(review(big), view).warnings[0]
    bad = copy.deepcopy(a5000_slices()[0])
    bad["spec"]["driver"] = "other.example.com"
    bad["spec"]["devices"][0]["capacity"]["memory"] = {"value": "lots"}
    broken = ClusterView.static([*h100_slices(), bad])
    d = decide(review(big), broken)
    assert d.allowed and d.templates and d.warnings == []
    assert "cannot index the ResourceSlices" in caplog.text


def test_the_server_lints_a_new_shape_in_a_thread() -> None:
    """A shape not linted since the slices changed: ``decide(lint_new=False)`` lists it and
    leaves its warnings out; the server lints it in a worker thread (other admissions go on)
    and answers with the warnings, as ``decide`` alone would."""
    import asyncio
    import threading

    from tessera.webhook.server import Webhook

    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpumem": "200k"}}}]
        },
    }
    view = ClusterView.static(h100_slices())
    quick = decide(review(pod), view, lint_new=False)
    assert [t["metadata"]["name"] for t in quick.unlinted] == [
        t["metadata"]["name"] for t in quick.templates
    ]
    assert quick.warnings == [] and quick.patch
    threads = []
    lint_shapes = view.lint_shapes

    def record(templates: list[dict[str, Any]]) -> None:
        threads.append(threading.current_thread())
        lint_shapes(templates)

    view.lint_shapes = record  # type: ignore[method-assign]
    status, answer = asyncio.run(Webhook(view, None).admit(review(pod)))
    assert status == 200 and isinstance(answer, dict)
    assert answer == decide(review(pod), ClusterView.static(h100_slices())).review()
    assert "200000Mi is more than any device has" in answer["response"]["warnings"][0]
    assert len(threads) == 1 and threads[0] is not threading.main_thread()
    asyncio.run(Webhook(view, None).admit(review(pod, uid="2")))
    assert len(threads) == 1  # linted once per shape
    assert decide(review(pod), view, lint_new=False).unlinted == []


@pytest.mark.parametrize(
    "request_fields",
    [
        {"operation": "UPDATE"},
        {"operation": "CREATE", "subResource": "binding"},
        {
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
        },
    ],
)
def test_not_a_pod_create_passes_untouched(request_fields: dict[str, Any]) -> None:
    pod = corpus_pod("HAMi__examples_nvidia__default_use.yaml")
    d = decide(review(pod, **request_fields), VIEW)
    assert d.review()["response"] == {"uid": "0001", "allowed": True}


def test_pod_without_gpu_passes_untouched() -> None:
    pod = {
        "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}]},
    }
    assert decide(review(pod), VIEW).review()["response"] == {"uid": "0001", "allowed": True}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "body is not JSON"),
        (b"[]", "body is not a JSON object"),
        (
            b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}',
            "expected admission.k8s.io/v1 AdmissionReview",
        ),
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}',
            "request.uid is missing",
        ),
    ],
)
def test_bodies_that_are_not_reviews_are_bad_requests(body: bytes, message: str) -> None:
    with pytest.raises(BadReview, match=message):
        decide(body, VIEW)


def test_warnings_are_single_lines_and_bounded() -> None:
    from tessera.webhook.admission import Decision

    d = Decision(uid="u", warnings=[f"line {i}\nsecond" for i in range(30)])
    w = d.review()["response"]["warnings"]
    assert len(w) == 20 and w[0] == "line 0 second" and w[-1] == "... and 11 more warning(s)"


# ---- templates -----------------------------------------------------------------------------------
def test_referenced_templates() -> None:
    pods = [
        {
            "spec": {
                "resourceClaims": [
                    {"name": "a", "resourceClaimTemplateName": "t1"},
                    {"name": "b", "resourceClaimName": "c"},
                ]
            }
        },
        {"spec": {}},
    ]
    assert referenced_templates(pods) == {"t1"}


# ---- the DeviceClass -----------------------------------------------------------------------------
def test_shipped_deviceclass_is_the_one_definition() -> None:
    shipped = yaml.safe_load((REPO / "deploy" / "deviceclass.yaml").read_text())
    assert shipped == device_class()
    assert shipped["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    from tessera.localcluster.cluster import DEVICE_CLASS
    from tessera.sim.simulate import default_device_class

    assert DEVICE_CLASS == default_device_class() == device_class()


def _class(
    name: str, created: str | None, resource: str | None = "nvidia.com/gpu"
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if created:
        meta["creationTimestamp"] = created
    spec: dict[str, Any] = {"selectors": []}
    if resource:
        spec["extendedResourceName"] = resource
    return {"metadata": meta, "spec": spec}


def test_extended_resource_owner_follows_kube_scheduler() -> None:
    """Upstream (extendedresourcecache): the class created last wins; equal times: lowest name."""
    tessera = _class("gpu.tessera.dev", "2026-11-01T10:00:00Z")
    nvidia = _class("gpu.nvidia.com", "2026-11-02T10:00:00Z")
    owner = extended_resource_owner(
        [tessera, nvidia, _class("other", "2026-12-01T00:00:00Z", None)]
    )
    assert (owner.winner, owner.contenders) == (
        "gpu.nvidia.com",
        ("gpu.nvidia.com", "gpu.tessera.dev"),
    )
    assert owner.message() == (
        "nvidia.com/gpu is mapped by 2 DeviceClasses (gpu.nvidia.com, gpu.tessera.dev); kube-scheduler uses "
        "gpu.nvidia.com (the most recently created; equal times: the lowest name) and ignores the others for it"
    )
    same = _class("gpu.nvidia.com", "2026-11-01T10:00:00Z")
    assert extended_resource_owner([tessera, same]).winner == "gpu.nvidia.com"  # "gpu.n" < "gpu.t"
    assert (
        extended_resource_owner([tessera]).message()
        == "nvidia.com/gpu is served by DeviceClass gpu.tessera.dev"
    )
    assert extended_resource_owner([]).winner is None
    assert (
        extended_resource_owner(
            [tessera], "deviceclass.resource.kubernetes.io/gpu.tessera.dev"
        ).winner
        == "gpu.tessera.dev"
    )


# ---- scheduling: the firstAvailable score and the extender -------------------------------------------
def test_prioritized_list_score_is_kube_schedulers() -> None:
    pod = corpus_pod("HAMi-website__docs_nvidia_scheduling-policy__binpack-node-policy.yaml")
    (template,) = convert_pod(pod).templates
    claim = {"spec": template["spec"]["spec"]}
    assert max_prioritized_list_score([claim]) == 8
    for sub, score in (("nvlink", 8), ("numa", 7), ("any", 6)):
        results = {"devices": {"results": [{"request": f"gpu/{sub}"}, {"request": f"gpu/{sub}"}]}}
        assert prioritized_list_score([claim], [results]) == score
    plain = {
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}}
    }
    assert max_prioritized_list_score([plain]) == 0
    assert prioritized_list_score([plain], [{"devices": {"results": [{"request": "gpu"}]}}]) == 0


def _allocated(pool: str, device: str, memory: str, cores: str) -> dict[str, Any]:
    return {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": "gpu.tessera.dev",
                            "pool": pool,
                            "device": device,
                            "shareID": "s",
                            "consumedCapacity": {"memory": memory, "cores": cores},
                        }
                    ]
                }
            }
        }
    }


def test_extender_ranks_nodes_by_simulates_node_usage() -> None:
    slices = h100_slices() + a5000_slices()
    claims = [_allocated("a5000-node", "gpu-0", "4000Mi", "0"), {"status": {}}]
    view = UsageView.static(slices, claims)
    assert view.usage() == {"h100-node": Fraction(0), "a5000-node": Fraction(4000, 24114)}
    args = {
        "Pod": {"metadata": {"annotations": {"hami.io/node-scheduler-policy": "binpack"}}},
        "NodeNames": ["h100-node", "a5000-node"],
    }
    assert prioritize(args, view) == [
        {"Host": "h100-node", "Score": 5},
        {"Host": "a5000-node", "Score": 10},
    ]
    args["Pod"]["metadata"]["annotations"]["hami.io/node-scheduler-policy"] = "spread"
    assert prioritize(args, view) == [
        {"Host": "h100-node", "Score": 10},
        {"Host": "a5000-node", "Score": 5},
    ]
    # Full Node objects (nodeCacheCapable: false), and a pod without policy: no opinion.
    nodes = {
        "Pod": {"metadata": {}},
        "Nodes": {
            "items": [{"metadata": {"name": "h100-node"}}, {"metadata": {"name": "a5000-node"}}]
        },
    }
    assert prioritize(nodes, view) == [
        {"Host": "h100-node", "Score": 0},
        {"Host": "a5000-node", "Score": 0},
    ]
    assert prioritize(nodes, view, default_policy="binpack")[1] == {
        "Host": "a5000-node",
        "Score": 10,
    }
    with pytest.raises(BadArgs):
        prioritize({"Pod": {}}, view)


def test_extender_scores_ties_equally_and_grades_the_rest() -> None:
    usage = {"a": Fraction(1), "b": Fraction(1), "c": Fraction(1, 2), "d": Fraction(0)}
    assert scores("binpack", usage, ["d", "c", "b", "a", "new"]) == [
        {"Host": "d", "Score": 4},
        {"Host": "c", "Score": 5},
        {"Host": "b", "Score": 10},
        {"Host": "a", "Score": 10},
        {"Host": "new", "Score": 4},
    ]


def test_shipped_scheduler_config_names_the_extender() -> None:
    cfg = yaml.safe_load((REPO / "deploy" / "webhook" / "scheduler-config.yaml").read_text())
    (ext,) = cfg["extenders"]
    assert (ext["prioritizeVerb"], ext["nodeCacheCapable"], ext["ignorable"]) == (
        "prioritize",
        True,
        True,
    )
    # the preferred node must gain more than DynamicResources' firstAvailable score can give another
    assert ext["weight"] * (10 - 5) * 10 > 2 * 100


def test_shipped_webhook_configuration() -> None:
    cfg = yaml.safe_load(
        (REPO / "deploy" / "webhook" / "mutatingwebhookconfiguration.yaml").read_text()
    )
    (w,) = cfg["webhooks"]
    assert (w["failurePolicy"], w["sideEffects"], w["admissionReviewVersions"]) == (
        "Fail",
        "NoneOnDryRun",
        ["v1"],
    )
    assert w["namespaceSelector"]["matchExpressions"] == [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", "tessera-system"],
        }
    ]
    assert w["clientConfig"]["service"]["path"] == "/mutate-pods"


def test_serving_pair_loads_and_reloads_without_a_writable_file_system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart runs the webhook with a read-only root and no /tmp: loading and reloading the
    serving pair writes nothing (a temporary directory that cannot be made fails the test)."""
    from tessera.localcluster.pki import make_serving_certificate
    from tessera.webhook.server import CertReloader

    certs = tmp_path / "tls"
    certs.mkdir()
    ca, pair = make_serving_certificate(certs, "webhook")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-dir"))
    r = CertReloader(pair.cert, pair.key)
    assert r.loads == 1
    make_serving_certificate(certs, "webhook", ca=ca)  # rotation: a new pair, same names
    assert r.check() and r.loads == 2
    # A key that does not match the certificate keeps the pair being served.
    other = tmp_path / "other"
    other.mkdir()
    _, stranger = make_serving_certificate(other, "x")
    pair.key.write_bytes(stranger.key.read_bytes())
    assert not r.check() and r.loads == 2


def test_review_with_an_integer_of_5000_digits_is_a_bad_review() -> None:
    body = (
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "x": '
        + b"1" * 5000
        + b"}"
    )
    with pytest.raises(BadReview, match="body is not JSON"):
        parse_review(body)


def test_a_pod_with_hami_annotations_but_no_gpu_is_admitted_unchanged_with_convert_warning() -> (
    None
):
    """The webhook's pre-check is convert's (tessera.convert.mentions_hami): a pod whose only
    HAMi names are annotations is converted (to itself) and kubectl shows the same warning
    simulate gives; a pod without any HAMi name is not converted at all."""
    from tessera.convert import mentions_hami

    pod = {
        "metadata": {"name": "p", "annotations": {"nvidia.com/use-gputype": "H100"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}]},
    }
    assert mentions_hami(pod)
    d = decide(review(pod), VIEW)
    assert d.allowed and d.templates == [] and d.patch == []
    assert (
        d.warnings
        == ["pod team-a/p: HAMi annotations have no effect: no container asks for a GPU"]
        == convert_pod({**pod, "metadata": {**pod["metadata"], "namespace": "team-a"}}).warnings
    )
    plain = {
        "metadata": {"name": "q", "labels": {"hami.io/webhook": "ignore"}},
        "spec": pod["spec"],
    }
    assert not mentions_hami(plain)
    d = decide(review(plain), VIEW)
    assert d.allowed and d.warnings == [] and d.pod == "" and d.patch == []


# ---- HAMi's other vendors: their DeviceClass says their driver is installed --------------------
VENDORS = REPO / "tests" / "data" / "vendors"


def test_hygon_pod_becomes_a_claim_for_the_hcu_driver_once_its_device_class_exists() -> None:
    pod = yaml.safe_load((VENDORS / "hami-examples" / "hygon" / "default_use.yaml").read_text())
    hcu_slice = yaml.safe_load(
        (VENDORS / "hcu-dra-driver" / "resourceslice-k100-ai.yaml").read_text()
    )
    hcu_class = yaml.safe_load((VENDORS / "hcu-dra-driver" / "deviceclass.yaml").read_text())
    # no DeviceClass dra.hygon.com: admitted unchanged, with the converter's warning
    d = decide(review(pod), ClusterView.static([*h100_slices(), hcu_slice]))
    assert d.allowed and d.patch == [] and d.templates == []
    assert d.warnings == [
        "pod team-a/vdcu-pytorch-demo, container vdcu-pytorch-demo: hygon.com/dcucores, "
        "hygon.com/dcumem, hygon.com/dcunum: the cluster has no DRA driver dra.hygon.com for "
        "Hygon DCUs (no DeviceClass dra.hygon.com); left unchanged (tessera convert: --vendor "
        "hygon says it is installed)"
    ]
    view = ClusterView.static([*h100_slices(), hcu_slice], classes=[device_class(), hcu_class])
    d = decide(review(pod), view)
    assert d.allowed and d.warnings == []
    (template,) = d.templates
    req = template["spec"]["spec"]["devices"]["requests"][0]
    assert (req["name"], req["exactly"]["deviceClassName"]) == ("hcu", "dra.hygon.com")
    # 60 % of the K100_AI's 120 compute units, from the watched slice
    assert req["exactly"]["capacity"] == {"requests": {"memory": "2000Mi", "cores": "72"}}
    mutated = applied(pod, d.review())
    (c,) = mutated["spec"]["containers"]
    assert c["resources"] == {"claims": [{"name": "vdcu-pytorch-demo-hcu"}]}
    assert mutated["spec"]["resourceClaims"] == [
        {"name": "vdcu-pytorch-demo-hcu", "resourceClaimTemplateName": template["metadata"]["name"]}
    ]
