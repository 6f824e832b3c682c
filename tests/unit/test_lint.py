"""tessera lint: exact findings for real manifests from the corpus and for hand-written mistakes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tessera.api.loader import Manifest, Source, load_files
from tessera.cli import main
from tessera.cli._common import examples_dir
from tessera.lint import LintWorld, lint
from tessera.sim.cluster import load_cluster


def _lint(corpus: Path, *names: str) -> list[str]:
    files = [corpus / "dra-manifests" / n for n in names]
    return [
        str(f).replace(str(corpus / "dra-manifests") + "/", "") for f in lint(load_files(files))
    ]


def _one(expr: str, *, cluster: bool = False) -> list[str]:
    obj = yaml.safe_load(f"""
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {{name: c}}
spec:
  selectors: [{{cel: {{expression: {expr!r}}}}}]
""")
    slices = (
        [s for n in load_cluster(examples_dir() / "cluster.yaml").nodes for s in n.slices]
        if cluster
        else []
    )
    return [
        f"{f.problem}. fix: {f.fix}" for f in lint([Manifest(obj, Source("x.yaml", 1))], slices)
    ]


def test_kubernetes_website_examples(corpus: Path) -> None:
    assert _lint(
        corpus,
        "kubernetes-website__examples_dra__deviceclass.yaml",
        "kubernetes-website__examples_dra__resourceclaim.yaml",
    ) == [
        # The DeviceClass is resource.k8s.io/v1beta2, the same shape as v1: accepted.
        # The page's YAML puts `expression` beside `cel`, not under it.
        "kubernetes-website__examples_dra__resourceclaim.yaml (document 1): ResourceClaim "
        "default/example-resource-claim: "
        "spec.devices.requests[0].exactly.selectors[0].expression: unknown field 'expression'. "
        "fix: it belongs under 'cel' (indent it one level)",
    ]


def test_dra_example_driver_cel_selector(corpus: Path) -> None:
    assert _lint(corpus, "dra-example-driver__demo_examples__cel-selector.yaml") == [
        "dra-example-driver__demo_examples__cel-selector.yaml (document 2): ResourceClaimTemplate "
        "cel-selector/single-gpu-cel: "
        "spec.spec.devices.requests[0].exactly.deviceClassName: DeviceClass 'gpu.example.com' does not exist "
        "(known: gpu.tessera.dev). fix: name an existing DeviceClass or add its manifest to the input"
    ]


def test_gpu_cel_nomatch_against_a_tessera_cluster(corpus: Path) -> None:
    slices = [s for n in load_cluster(examples_dir() / "cluster.yaml").nodes for s in n.slices]
    f = corpus / "dra-manifests" / "k8s-dra-driver-gpu__tests_bats_specs__gpu-cel-nomatch.yaml"
    got = [f"{x.field}: {x.problem}. fix: {x.fix}" for x in lint(load_files([f]), slices)]
    assert got == [
        "spec.spec.devices.requests[0].exactly.deviceClassName: DeviceClass 'gpu.nvidia.com' does not exist "
        "(known: gpu.tessera.dev). fix: name an existing DeviceClass or add its manifest to the input",
        "spec.spec.devices.requests[0].exactly.selectors[0].cel.expression: "
        '`device.attributes["gpu.nvidia.com"].productName`: '
        "no device publishes domain 'gpu.nvidia.com'; an unknown domain reads as an empty map, so `.productName` is a "
        "runtime error (no such key) that aborts scheduling. fix: use a published domain (gpu.tessera.dev, "
        "resource.kubernetes.io)",
    ]


def test_a_prepared_world_gives_the_same_findings(corpus: Path) -> None:
    """``lint(..., world=LintWorld(slices))`` (the webhook's way: the devices indexed once per
    change of the slices) finds what ``lint(..., slices)`` finds, call after call."""
    slices = [s for n in load_cluster(examples_dir() / "cluster.yaml").nodes for s in n.slices]
    files = [
        corpus / "dra-manifests" / "k8s-dra-driver-gpu__tests_bats_specs__gpu-cel-nomatch.yaml",
        examples_dir() / "workloads" / "dra-native.yaml",
    ]
    manifests = [
        m for m in load_files(files) if m.kind in ("ResourceClaim", "ResourceClaimTemplate")
    ]
    expected = lint(manifests, slices)
    assert len(expected) >= 3
    world = LintWorld(slices)
    assert lint(manifests, world=world) == expected
    assert list(world.class_members) == ["gpu.tessera.dev"]  # the class's devices selected once
    assert lint(manifests, world=world) == expected


def test_a_long_lived_world_keeps_its_caches_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The webhook's world lives until the slices change and sees every user's selectors: its
    findings cache starts again past FINDINGS_CACHE, and the findings stay right."""
    import tessera.lint.checks as lint_mod

    monkeypatch.setattr(lint_mod, "FINDINGS_CACHE", 2)
    slices = [s for n in load_cluster(examples_dir() / "cluster.yaml").nodes for s in n.slices]
    world = LintWorld(slices)
    exprs = [f'device.attributes["gpu.tessera.dev"].uuid == "GPU-{i}"' for i in range(5)] + [
        "device.attributes.size() >"
    ]
    for i, expr in enumerate(exprs):
        obj = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": f"c{i}"},
               "spec": {"selectors": [{"cel": {"expression": expr}}]}}  # fmt: skip
        ms = [Manifest(obj, Source("x.yaml", 1))]
        assert lint(ms, world=world) == lint(ms, slices)
        assert len(world.selector_findings) <= 2
    assert len(lint(ms, world=world)) == 1  # the last one does not compile: still found


def test_helm_template_is_unreadable_input(corpus: Path) -> None:
    f = (
        corpus
        / "dra-manifests"
        / "k8s-dra-driver-gpu__helm_templates__deviceclass-gpu.helm-template.yaml"
    )
    r = CliRunner().invoke(main, ["lint", str(f)])
    assert r.exit_code == 2
    assert r.output.count("\n") == 1
    assert (
        "this is a template ('{{- if .Values.resources.gpus.enabled }}'), not a manifest"
        in r.output
    )


def test_memory_as_attribute_domain() -> None:
    assert _one("device.attributes['memory'].quantity >= quantity('40Gi')") == [
        "`device.attributes['memory'].quantity` reads attribute domain 'memory': device.attributes is keyed by domain "
        "(e.g. gpu.tessera.dev), and memory is a capacity (a Quantity under device.capacity), not an attribute. "
        'fix: write device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("40Gi")) >= 0'
    ]


def test_quantity_and_semver_ordering() -> None:
    assert _one('device.capacity["gpu.tessera.dev"].memory >= quantity("40Gi")') == [
        '`device.capacity["gpu.tessera.dev"].memory >= quantity("40Gi")` orders Quantity values with >=: '
        "Kubernetes CEL "
        "has no such overload (the API server rejects it). fix: write "
        'device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("40Gi")) >= 0'
    ]
    got = _one(
        'has(device.attributes["gpu.tessera.dev"].driverVersion) && '
        'device.attributes["gpu.tessera.dev"].driverVersion < semver("550.0.0")'
    )
    assert got == [
        '`device.attributes["gpu.tessera.dev"].driverVersion < semver("550.0.0")` orders semver values with <: '
        "Kubernetes CEL has no such overload (the API server rejects it). fix: write "
        'device.attributes["gpu.tessera.dev"].driverVersion.compareTo(semver("550.0.0")) < 0'
    ]
    assert _one('device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("40Gi")) >= 0') == []


def test_domain_typo_and_attribute_typo() -> None:
    assert _one('device.attributes["gpu.tesera.dev"].productName == "x"') == [
        "`device.attributes[\"gpu.tesera.dev\"].productName`: no device publishes domain 'gpu.tesera.dev'; an unknown "
        "domain reads as an empty map, so `.productName` is a runtime error (no such key) that aborts scheduling. "
        'fix: write device.attributes["gpu.tessera.dev"]'
    ]
    assert _one('device.attributes["gpu.tessera.dev"].prodctName == "x"') == [
        '`device.attributes["gpu.tessera.dev"].prodctName`: no device publishes attribute gpu.tessera.dev/prodctName; '
        "reading it is a runtime error (no such key) that aborts scheduling. "
        'fix: write device.attributes["gpu.tessera.dev"].productName'
    ]


def test_unguarded_optional_attribute() -> None:
    assert _one('device.attributes["gpu.tessera.dev"].nvlinkDomain == 0') == [
        '`device.attributes["gpu.tessera.dev"].nvlinkDomain` is read without has(): MIG devices publish no '
        "nvlinkDomain, "
        "and reading it on a device without it is a runtime error that aborts scheduling of the pod. "
        'fix: guard it: has(device.attributes["gpu.tessera.dev"].nvlinkDomain) && ...'
    ]
    assert (
        _one(
            'has(device.attributes["gpu.tessera.dev"].nvlinkDomain) && '
            'device.attributes["gpu.tessera.dev"].nvlinkDomain == 0'
        )
        == []
    )


def test_with_cluster_runtime_error_counts_and_no_match() -> None:
    # The bundled A100 in MIG mode publishes no uuid for its MIG devices.
    assert _one('device.attributes["gpu.tessera.dev"].uuid == "GPU-1"', cluster=True) == [
        "CEL runtime error on 4 of 22 devices (e.g. gpu.tessera.dev/a100-mig-node/gpu-0-mig-3-0: no such key: uuid); "
        "a runtime error aborts scheduling of the pod. fix: guard the read with has(...) so devices without it "
        "simply do not match"
    ]
    assert _one(
        'device.attributes["gpu.tessera.dev"].productName == "NONEXISTENT-GPU-XYZ"', cluster=True
    ) == [
        "matches none of the 22 published devices. fix: check the values against the ResourceSlices "
        "(tessera explain shows the false sub-expression)"
    ]


def test_optional_syntax_and_bind() -> None:
    # Optional reads are guarded reads: no finding without a cluster, none with one (MIG devices
    # have no uuid, and .?uuid.orValue("") reads "" there instead of failing).
    assert _one('device.attributes["gpu.tessera.dev"].?uuid.orValue("") == "x"') == []
    assert (
        _one(
            'cel.bind(g, device.attributes["gpu.tessera.dev"], g.?uuid.orValue("") != "")',
            cluster=True,
        )
        == []
    )
    # A misspelt name stays a finding under .?: it is never present.
    assert _one('device.attributes["gpu.tessera.dev"].?uuidd.hasValue()') == [
        '`device.attributes["gpu.tessera.dev"].?uuidd`: no device publishes attribute gpu.tessera.dev/uuidd; '
        "reading it "
        'is a runtime error (no such key) that aborts scheduling. fix: write device.attributes["gpu.tessera.dev"].uuid'
    ]


def test_cost_over_the_limit() -> None:
    # About a million iterations: the API server rejects it with this wording.
    expr = "lists.range(1000).all(i, lists.range(1000).all(j, i != j || i == j))"
    assert _one(expr) == [
        "Forbidden: too complex, exceeds cost limit (estimated worst-case cost 10016012 exceeds the limit of 1000000; "
        "the API server rejects the object). fix: bound the work: iterate over fewer or smaller lists, avoid nested "
        "macros over large ranges"
    ]
    # With a cluster it is not evaluated (the allocator would run to the runtime limit per device).
    assert _one(expr, cluster=True) == _one(expr)


@pytest.mark.parametrize(
    ("caps", "expected"),
    [
        (
            "{mem: 8Gi}",
            "no device of class gpu.tessera.dev publishes a capacity 'mem' (published: cores, memory); "
            "no device can satisfy this request. fix: use 'memory'",
        ),
        (
            "{cores: '150'}",
            "cores 150 is over 100: cores is percent of one GPU's SMs (0-100). fix: ask for at most 100 "
            "per device, and count: N for several GPUs",
        ),
    ],
)
def test_capacity_requests(caps: str, expected: str) -> None:
    obj = yaml.safe_load(f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: c}}
spec: {{devices: {{requests: [{{name: gpu, exactly: {{deviceClassName: gpu.tessera.dev, capacity: {{requests: {caps}}}}}}}]}}}}
""")  # noqa: E501
    assert [f"{f.problem}. fix: {f.fix}" for f in lint([Manifest(obj, Source("x.yaml", 1))])] == [
        expected
    ]


def test_cli_exit_codes(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: ok}\nspec: {devices: {requests: "
        "[{name: gpu, exactly: {deviceClassName: gpu.tessera.dev, capacity: {requests: {memory: 8Gi, cores: "
        "'20'}}}}]}}\n"
    )
    assert CliRunner().invoke(main, ["lint", str(good)]).exit_code == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("gpu.tessera.dev,", "gpu.tesera.dev,"))
    r = CliRunner().invoke(main, ["lint", str(bad)])
    assert r.exit_code == 1
    assert r.output == (
        f"{bad} (document 1): ResourceClaim default/ok: spec.devices.requests[0].exactly.deviceClassName: DeviceClass "
        "'gpu.tesera.dev' does not exist (known: gpu.tessera.dev). fix: use 'gpu.tessera.dev'\n"
    )
    assert CliRunner().invoke(main, ["lint", str(tmp_path / "missing.yaml")]).exit_code == 2


def test_bundled_workloads_too_big_claim_is_found() -> None:
    ex = examples_dir()
    r = CliRunner().invoke(
        main, ["lint", "--cluster", str(ex / "cluster.yaml"), str(ex / "workloads")]
    )
    assert r.exit_code == 1
    assert r.stdout.strip().splitlines() == [
        f"{ex / 'workloads' / 'dra-native.yaml'} (document 8): ResourceClaim default/too-big: "
        "spec.devices.requests[0].exactly.capacity.requests[memory]: 100Gi is more than any device has: the largest "
        "memory of a matching device is 81008Mi (gpu.tessera.dev/h100-node/gpu-0); no device can satisfy this "
        "request. fix: ask for at most 81008Mi per device, or use several devices (count: N)"
    ]


TWO_CLAIMS = "k8s-dra-driver-gpu__tests_bats_specs__gpu-two-claims-one-pod.yaml"


def _as_tessera(text: str, tmp_path: Path, name: str = "two.yaml") -> Path:
    """NVIDIA's two-claims pod moved to Tessera: its templates ask for gpu.tessera.dev."""
    p = tmp_path / name
    p.write_text(
        text.replace("deviceClassName: gpu.nvidia.com", "deviceClassName: gpu.tessera.dev")
    )
    return p


def test_a_container_with_two_tessera_claims_is_reported(corpus: Path, tmp_path: Path) -> None:
    text = (corpus / "dra-manifests" / TWO_CLAIMS).read_text()
    got = [str(f) for f in lint(load_files([_as_tessera(text, tmp_path)]))]
    assert got == [
        f"{tmp_path}/two.yaml (document 3): Pod default/pod-two-claims: "
        "spec.containers[0].resources.claims: container 'ctr' references 2 claims served by "
        "gpu.tessera.dev: gpu-a (ResourceClaimTemplate default/rct-claim-a), gpu-b "
        "(ResourceClaimTemplate default/rct-claim-b); the container sees the limits file of one "
        "of them only, and the enforcement library refuses the GPUs of the others. "
        "fix: one ResourceClaim with several requests, or one claim per container"
    ]
    # As published (gpu.nvidia.com, another driver's class): not Tessera's concern here.
    assert [
        f
        for f in lint(load_files([corpus / "dra-manifests" / TWO_CLAIMS]))
        if "claims served" in f.problem
    ] == []


def test_two_tessera_claims_in_a_workload_template_and_through_a_driver_selector(
    corpus: Path, tmp_path: Path
) -> None:
    """A Deployment's pod template, one claim through a class whose selector names Tessera's
    driver; the same pod with one claim per container is clean."""
    docs = list(yaml.safe_load_all((corpus / "dra-manifests" / TWO_CLAIMS).read_text()))
    a, b, pod = docs
    b["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "big-gpus"
    a["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.tessera.dev"
    cls = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "big-gpus"},
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.tessera.dev"'}}]},
    }
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": pod["spec"]},
        },
    }
    objs = [cls, a, b, deploy]
    ms = [Manifest(o, Source("x.yaml", i + 1)) for i, o in enumerate(objs)]
    assert [(f.obj, f.field) for f in lint(ms)] == [
        ("Deployment default/web", "spec.template.spec.containers[0].resources.claims")
    ]
    one_each = yaml.safe_load(yaml.safe_dump(deploy))
    ctr = one_each["spec"]["template"]["spec"]["containers"][0]
    ctr["resources"]["claims"] = [{"name": "gpu-a"}]
    one_each["spec"]["template"]["spec"]["containers"].append(
        {**ctr, "name": "ctr-b", "resources": {"claims": [{"name": "gpu-b"}]}}
    )
    ms = [Manifest(o, Source("x.yaml", i + 1)) for i, o in enumerate([cls, a, b, one_each])]
    assert lint(ms) == []
