"""DeviceTaintRules (resource.k8s.io/v1, KEP-5055, GA in Kubernetes 1.37) in simulate and
explain: a rule taints the devices its selector selects exactly as a taint the driver
publishes does (issue 22.2). Inputs: the dra-example-driver's published slices, DeviceClass,
claim template and DeviceTaintRule from the corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tessera.api.errors import ManifestError
from tessera.api.loader import Manifest, Source, expand_workloads, load_file, parse_documents
from tessera.cli import main
from tessera.explain.explain import explain, render_text
from tessera.sim.cluster import Cluster, SimNode
from tessera.sim.simulate import PendingCause, Simulation

D = "dra-manifests"
RULE_FILE = "dra-example-driver__demo_examples_device-taints-tolerations__noexecute_3-device-taint-rule.yaml"
NS = "basic-resourceclaimtemplate"
NODE = "dra-example-driver-cluster-worker"


def worker() -> Cluster:
    """The example driver's one node; its slices come with the manifests."""
    return Cluster([SimNode(NODE, {}, [])])


def docs(text: str, file: str = "rules.yaml") -> list[Manifest]:
    return [Manifest(o, Source(file, i)) for i, o in parse_documents(text, file)]


def example_driver(corpus: Path) -> list[Manifest]:
    """The example driver's 8 GPUs on one node (``kubectl get resourceslice -o yaml``), its
    DeviceClass (the chart's template, rendered) and two pods with one GPU each."""
    d = corpus / D
    slices = (d / "dra-example-driver__README__kubectl-get-resourceslice-8gpu.yaml").read_text()
    tpl = (d / "dra-example-driver__helm_templates__deviceclass.helm-template.yaml").read_text()
    cls = "\n".join(
        line.replace(
            '{{ include "dra-example-driver.resourceApiVersion" . }}', "resource.k8s.io/v1"
        ).replace('{{ include "dra-example-driver.driverName" . }}', "gpu.example.com")
        for line in tpl.splitlines()
        if "{{-" not in line and "extendedResourceName" not in line
    )
    pods = list(
        expand_workloads(
            load_file(d / "dra-example-driver__demo_examples__basic-resourceclaimtemplate.yaml")
        )
    )
    return docs(slices.split("\n", 1)[1], "slices.yaml") + docs(cls, "class.yaml") + pods


def rule(selector: str | None, effect: str = "NoSchedule", name: str = "fence") -> str:
    sel = f"  deviceSelector: {selector}\n" if selector is not None else ""
    return (
        "apiVersion: resource.k8s.io/v1\nkind: DeviceTaintRule\n"
        f"metadata: {{name: {name}}}\nspec:\n{sel}"
        f"  taint: {{key: example.com/maintenance, value: planned, effect: {effect}}}\n"
    )


def placed(res: object) -> list[tuple[str, str]]:
    return [(p.pod, p.device) for p in res.placements]  # type: ignore[attr-defined]


def test_the_example_drivers_noexecute_rule_keeps_both_pods_off(corpus: Path) -> None:
    ms = example_driver(corpus) + list(load_file(corpus / D / RULE_FILE))
    res = Simulation(worker(), ms).run()
    assert res.placements == []
    why = (
        "0/1 nodes are available: 1 cannot allocate all claims. claim {ns}/{p}-gpu, request gpu: needs 1 "
        "device with memory 80Gi (all of it: the request names no memory, so the request policy's default "
        "applies); 8 devices in the cluster match its selectors, none has room now: 8 devices tainted "
        "gpu.example.com/unhealthy=true:NoExecute (DeviceTaintRule example) (not tolerated)"
    )
    assert [(p.pod, p.reason) for p in res.pending] == [
        (f"{NS}/{p}", why.format(ns=NS, p=p)) for p in ("pod0", "pod1")
    ]
    # A cluster-scoped object is named without a namespace.
    assert any(
        w.endswith(
            "DeviceTaintRule example: resource.k8s.io/v1beta2 is read as resource.k8s.io/v1 (the same shape)"
        )
        for w in res.warnings
    )
    assert not any(
        "DeviceTaintRule default/" in w or ("is not simulated" in w and "DeviceTaintRule" in w)
        for w in res.warnings
    )
    # The rule travels with simulate's output (fed back, it still applies).
    assert [o["metadata"]["name"] for o in res.objects if o["kind"] == "DeviceTaintRule"] == [
        "example"
    ]


def test_explain_names_the_taint_and_the_rule(corpus: Path) -> None:
    ms = example_driver(corpus) + list(load_file(corpus / D / RULE_FILE))
    exp = explain(worker(), ms, f"{NS}/pod0")
    (g,) = exp.nodes[0].requests[0].groups
    assert (g.count, g.check, g.reason) == (
        8,
        "taint",
        "taint gpu.example.com/unhealthy=true:NoExecute (DeviceTaintRule example) not tolerated: "
        "add a toleration to request gpu",
    )
    assert "DeviceTaintRule example" in render_text(exp)


def test_selector_by_device_pool_and_driver(corpus: Path) -> None:
    base = example_driver(corpus)
    free = Simulation(worker(), base).run()
    assert placed(free) == [
        (f"{NS}/pod0", "gpu.example.com/dra-example-driver-cluster-worker/gpu-0"),
        (f"{NS}/pod1", "gpu.example.com/dra-example-driver-cluster-worker/gpu-1"),
    ]
    # One device fenced: the pods take the next ones.
    one = Simulation(worker(), base + docs(rule("{device: gpu-0}"))).run()
    assert placed(one) == [
        (f"{NS}/pod0", "gpu.example.com/dra-example-driver-cluster-worker/gpu-1"),
        (f"{NS}/pod1", "gpu.example.com/dra-example-driver-cluster-worker/gpu-2"),
    ]
    # All three fields must match: another driver's pool of the same name is not fenced.
    other = rule("{driver: gpu.tessera.dev, pool: dra-example-driver-cluster-worker}")
    assert placed(Simulation(worker(), base + docs(other)).run()) == placed(free)
    pool = rule("{driver: gpu.example.com, pool: dra-example-driver-cluster-worker}")
    assert placed(Simulation(worker(), base + docs(pool)).run()) == []


def test_empty_selector_selects_every_device_and_an_omitted_one_none(corpus: Path) -> None:
    base = example_driver(corpus)
    every = Simulation(worker(), base + docs(rule("{}"))).run()
    assert [p.pod for p in every.pending] == [f"{NS}/pod0", f"{NS}/pod1"]
    assert (
        "tainted example.com/maintenance=planned:NoSchedule (DeviceTaintRule fence)"
        in every.pending[0].reason
    )
    none = Simulation(worker(), base + docs(rule(None))).run()
    assert len(none.placements) == 2
    # Effect None only informs.
    info = Simulation(worker(), base + docs(rule("{}", effect="None"))).run()
    assert len(info.placements) == 2


def test_a_tolerating_request_is_placed_and_its_result_carries_the_toleration(corpus: Path) -> None:
    tol = {"key": "example.com/maintenance", "operator": "Exists", "effect": "NoSchedule"}
    ms = example_driver(corpus)
    for m in ms:
        if m.kind == "ResourceClaimTemplate":
            m.obj["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [tol]
    res = Simulation(worker(), ms + docs(rule("{}"))).run()
    assert len(res.placements) == 2
    claims = [o for o in res.objects if o["kind"] == "ResourceClaim"]
    assert [
        r["tolerations"] for c in claims for r in c["status"]["allocation"]["devices"]["results"]
    ] == [
        [tol],
        [tol],
    ]


def test_noexecute_rule_on_an_allocated_claim_warns_of_eviction(corpus: Path) -> None:
    first = Simulation(worker(), example_driver(corpus)).run()
    kept = [
        o for o in first.objects if o["kind"] in ("ResourceSlice", "DeviceClass", "ResourceClaim")
    ]
    again = docs(yaml.safe_dump_all(kept)) + docs(
        rule("{device: gpu-1}", effect="NoExecute", name="drain")
    )
    res = Simulation(worker(), again).run()
    assert [w for w in res.warnings if "evicts" in w] == [
        f"ResourceClaim {NS}/pod1-gpu: device gpu.example.com/dra-example-driver-cluster-worker/gpu-1 has "
        "taint example.com/maintenance=planned:NoExecute (DeviceTaintRule drain) and no toleration with "
        "effect NoExecute for it: the device taint eviction controller evicts the pods using it (the "
        "simulation keeps the allocation)"
    ]


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        (
            "{deviceSelector: {}, taint: {key: example.com/x, effect: PreferNoSchedule}}",
            "spec.taint.effect",
            "",
        ),
        (
            "{deviceSelector: {}, taint: {key: example.com/x}}",
            "spec.taint.effect",
            "required: one of None, NoSchedule, NoExecute (missing)",
        ),
        (
            "{deviceSelector: {}, taint: {effect: NoSchedule}}",
            "spec.taint.key",
            "required: a label key such as example.com/fenced",
        ),
        ("{deviceSelector: {}}", "spec.taint", "required: {key, value, effect}"),
        (
            "{deviceSelector: {device: GPU_0}, taint: {key: k, effect: NoSchedule}}",
            "spec.deviceSelector.device",
            "'GPU_0' must be a device name: a DNS label (at most 63 of a-z, 0-9, '-')",
        ),
        (
            "{deviceSelector: {driver: Gpu.Example.com}, taint: {key: k, effect: NoSchedule}}",
            "spec.deviceSelector.driver",
            "'Gpu.Example.com' must be a driver name: a lower-case DNS subdomain of at most 63 characters",
        ),
        (
            "{deviceSelector: {}, taint: {key: k, value: not ok, effect: NoSchedule}}",
            "spec.taint.value",
            "'not ok' must be a label value: at most 63 alphanumerics, '-', '_' or '.', starting and ending "
            "alphanumeric",
        ),
        (
            "{deviceSelector: {cel: x}, taint: {key: k, effect: NoSchedule}}",
            "spec.deviceSelector",
            "",
        ),
    ],
)
def test_invalid_rules_are_refused_naming_object_and_field(
    spec: str, field: str, message: str
) -> None:
    text = f"apiVersion: resource.k8s.io/v1\nkind: DeviceTaintRule\nmetadata: {{name: bad}}\nspec: {spec}\n"
    with pytest.raises(ManifestError) as e:
        Simulation(worker(), docs(text))
    err = e.value
    assert err.obj == "DeviceTaintRule bad"
    assert (err.field or "").startswith(field)
    if message:
        assert message in str(err)


def test_cli_simulate_json_pending_names_the_rule(corpus: Path, tmp_path: Path) -> None:
    f = tmp_path / "rule.yaml"
    f.write_text(rule("{driver: gpu.example.com}"))
    ms = example_driver(corpus)
    inp = tmp_path / "in.yaml"
    inp.write_text(yaml.safe_dump_all([m.obj for m in ms]))
    r = CliRunner().invoke(main, ["simulate", str(inp), str(f), "-o", "json"])
    assert r.exit_code == 0, r.output
    pods = [o for o in json.loads(r.stdout)["items"] if o["kind"] == "Pod"]
    assert all(
        "tainted example.com/maintenance=planned:NoSchedule (DeviceTaintRule fence) (not tolerated)"
        in p["status"]["conditions"][0]["message"]
        for p in pods
    )


class _FakeClient:
    """The two calls live reading makes; ``served``: kind -> objects (absent: not served)."""

    server = "https://10.0.0.1:6443"

    def __init__(self, served: dict[str, list[dict[str, object]]]) -> None:
        self.served = served

    def list_pages(self, api_version: str, kind: str, *, limit: int = 500):  # type: ignore[no-untyped-def]
        from tessera.kube.client import ApiError

        if kind not in self.served:
            raise ApiError("discover", f"{kind} in {api_version}", 404, "NotFound", "not served")
        items = [{"apiVersion": api_version, "kind": kind, **o} for o in self.served[kind]]
        yield items


def test_live_mode_reads_rules_and_a_cluster_without_the_kind_has_none(corpus: Path) -> None:
    from tessera.kube.live import LiveClusterError, live_manifests

    base = example_driver(corpus)
    served: dict[str, list[dict[str, object]]] = {
        k: []
        for k in (
            "Node",
            "DeviceClass",
            "ResourceSlice",
            "ResourceClaimTemplate",
            "ResourceClaim",
            "Pod",
        )
    }
    for m in base:
        if m.kind in served:
            served[m.kind].append(
                {k: v for k, v in m.obj.items() if k not in ("apiVersion", "kind")}
            )
    rule_obj = yaml.safe_load(rule("{device: gpu-0}"))
    with_rules = {
        **served,
        "DeviceTaintRule": [{"metadata": rule_obj["metadata"], "spec": rule_obj["spec"]}],
    }
    ms = live_manifests(_FakeClient(with_rules))  # type: ignore[arg-type]
    assert [m.ref() for m in ms if m.kind == "DeviceTaintRule"] == ["DeviceTaintRule fence"]
    # Pending pods of the cluster keep away from the fenced device.
    res = Simulation(worker(), ms).run()
    assert placed(res) == [
        (f"{NS}/pod0", f"gpu.example.com/{NODE}/gpu-1"),
        (f"{NS}/pod1", f"gpu.example.com/{NODE}/gpu-2"),
    ]
    # A cluster that does not serve DeviceTaintRule (DRADeviceTaintRules off) has none.
    assert not [m for m in live_manifests(_FakeClient(served)) if m.kind == "DeviceTaintRule"]  # type: ignore[arg-type]
    # Any other kind missing is still an error.
    del served["ResourceSlice"]
    with pytest.raises(LiveClusterError):
        live_manifests(_FakeClient(served))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("toleration", "outcome"),
    [
        # Found by the differential against the real cluster: the scheduler allocates with a
        # toleration that names no effect, kube-controller-manager's eviction controller then
        # deletes the pod (it counts only tolerations with effect NoExecute).
        ({"operator": "Exists"}, ""),
        ({"key": "example.com/maintenance", "operator": "Exists"}, ""),
        ({"key": "example.com/maintenance", "operator": "Exists", "effect": "NoExecute"}, "placed"),
        (
            {
                "key": "example.com/maintenance",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 60,
            },
            " after the toleration's tolerationSeconds (60 s)",
        ),
    ],
)
def test_a_pod_the_eviction_controller_deletes_never_runs(
    corpus: Path, toleration: dict[str, object], outcome: str
) -> None:
    ms = example_driver(corpus)
    for m in ms:
        if m.kind == "ResourceClaimTemplate":
            m.obj["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [toleration]
    res = Simulation(worker(), ms + docs(rule("{}", effect="NoExecute"))).run()
    if outcome == "placed":
        assert len(res.placements) == 2 and res.pending == []
        return
    assert res.placements == []
    assert [(p.pod, p.reason) for p in res.pending] == [
        (
            f"{NS}/{p}",
            f"scheduled on {NODE}, then evicted: device gpu.example.com/{NODE}/gpu-0 has taint "
            "example.com/maintenance=planned:NoExecute (DeviceTaintRule fence) and no toleration with effect "
            f"NoExecute for it: the device taint eviction controller evicts the pods using it{outcome}",
        )
        for p in ("pod0", "pod1")
    ]
    assert [p.cause for p in res.pending] == [PendingCause.EVICTED] * 2
    exp = explain(worker(), ms + docs(rule("{}", effect="NoExecute")), f"{NS}/pod0")
    assert exp.status == "pending" and exp.nodes[0].verdict == "fits"
    assert any(
        "a request toleration with effect NoExecute for the taint keeps it" in n for n in exp.notes
    )
