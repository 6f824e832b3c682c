"""The chart in legacy mode (``mode: legacy | both``, docs/install.md "Legacy mode"):
rendered with ``helm template`` (the identities' rules against their access tables, what is
rendered where, the values it refuses) and applied, object by object with server-side apply,
to a real kube-apiserver v1.37.2 that does not serve ``resource.k8s.io`` at all (as on a
cluster without DRA), whose RBAC then answers ``kubectl auth can-i`` for the identities.

No ``helm install`` here: the chart's legacy-mode pods run on a real node without
``resource.k8s.io`` in ``test_install_legacy.py``; legacy mode's processes alone are the
``legacy`` tests' (``tests/e2e/test_legacy_*.py``).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
import yaml

from tessera.driver.access import DEVICE_PLUGIN_ACCESS
from tessera.kube.access import (
    LEGACY_EXTENDER_ACCESS,
    WEBHOOK_ACCESS,
    WEBHOOK_LEGACY_ACCESS,
    Access,
)
from tessera.localcluster import build
from tessera.localcluster.cluster import NO_RESOURCE_API_SCHEDULER_FLAGS, Cluster, ClusterError

from .helmkit import CHART, REPO, Tools, helm_bin

NS, RELEASE = "tessera-system", "tessera"
MODE = "gpu.tessera.dev/mode"
LEGACY_CONFIG = REPO / "deploy" / "legacy" / "scheduler-config.yaml"


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Tools:
    tmp = tmp_path_factory.mktemp("helm-legacy")
    return Tools(helm_bin(), tmp / "none", tmp)


def render(
    tools: Tools, values: Mapping[str, Any], kube_version: str = "1.37.2"
) -> list[dict[str, Any]]:
    r = _template(tools, values, kube_version)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def _template(
    tools: Tools, values: Mapping[str, Any], kube_version: str
) -> subprocess.CompletedProcess[str]:
    vf = tools.tmp / f"values-{abs(hash(yaml.safe_dump(dict(values))))}.yaml"
    vf.write_text(yaml.safe_dump(dict(values)))
    return tools.helm(
        "template",
        RELEASE,
        str(CHART),
        "-n",
        NS,
        f"--kube-version={kube_version}",
        "-f",
        str(vf),
        check=False,
    )


def one(objs: Sequence[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (o,) = [x for x in objs if x["kind"] == kind and x["metadata"]["name"] == name]
    return o


def granted(role: Mapping[str, Any]) -> set[tuple[str, str, str, str, str]]:
    """A (Cluster)Role's rules as ``(verb, group, resource, subresource, name)`` rows."""
    out = set()
    for rule in role["rules"]:
        for group in rule.get("apiGroups") or []:
            for res in rule.get("resources") or []:
                resource, _, sub = res.partition("/")
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or [""]:
                        out.add((verb, group, resource, sub, name))
    return out


def bound_roles(objs: Sequence[dict[str, Any]], sa: str) -> list[tuple[str, str, str]]:
    return sorted(
        (b["kind"], b["roleRef"]["kind"], b["roleRef"]["name"])
        for b in objs
        if b["kind"] in ("ClusterRoleBinding", "RoleBinding")
        and any(s.get("name") == sa for s in b.get("subjects") or [])
    )


# ---- what legacy mode renders ---------------------------------------------------------------


def test_device_plugin_role_is_exactly_the_access_table(tools: Tools) -> None:
    """The device plugin's ClusterRole grants exactly :data:`DEVICE_PLUGIN_ACCESS` (what
    ``tessera device-plugin`` and its guard request), and nothing else is bound to it."""
    objs = render(tools, {"mode": "legacy"})
    sa = f"{RELEASE}-device-plugin"
    assert bound_roles(objs, sa) == [("ClusterRoleBinding", "ClusterRole", sa)]
    got = granted(one(objs, "ClusterRole", sa))
    table = {a.row() for a in DEVICE_PLUGIN_ACCESS}
    assert sorted(table - got) == [], "the device plugin needs what the chart does not grant"
    assert sorted(got - table) == [], "the chart grants what the device plugin does not use"


def test_legacy_extender_role_is_exactly_the_access_table(tools: Tools) -> None:
    """The legacy scheduler pod's identity: kube-scheduler's own roles (upstream's, plus its
    own Lease and the authentication reader), and the extender's ClusterRole, which grants
    exactly :data:`LEGACY_EXTENDER_ACCESS`."""
    objs = render(tools, {"mode": "legacy"})
    sa = f"{RELEASE}-legacy-scheduler"
    assert bound_roles(objs, sa) == [
        ("ClusterRoleBinding", "ClusterRole", "system:kube-scheduler"),
        ("ClusterRoleBinding", "ClusterRole", "system:volume-scheduler"),
        ("ClusterRoleBinding", "ClusterRole", f"{sa}-extender"),
        ("RoleBinding", "Role", "extension-apiserver-authentication-reader"),
        ("RoleBinding", "Role", sa),
    ]
    got = granted(one(objs, "ClusterRole", f"{sa}-extender"))
    table = {a.row() for a in LEGACY_EXTENDER_ACCESS}
    assert sorted(table - got) == [] and sorted(got - table) == []
    lease = one(objs, "Role", sa)
    assert granted(lease) == {
        ("create", "coordination.k8s.io", "leases", "", ""),
        ("get", "coordination.k8s.io", "leases", "", sa),
        ("update", "coordination.k8s.io", "leases", "", sa),
    }


@pytest.mark.parametrize(
    ("mode", "table"),
    [("dra", WEBHOOK_ACCESS), ("both", WEBHOOK_ACCESS), ("legacy", WEBHOOK_LEGACY_ACCESS)],
)
def test_webhook_role_is_exactly_its_modes_access_table(
    tools: Tools, mode: str, table: tuple[Access, ...]
) -> None:
    """The webhook's identity grants exactly its mode's table: DRA mode's templates, slices,
    classes and pods; in mode legacy (which reads and writes nothing) no role at all, so
    nothing of resource.k8s.io."""
    objs = render(tools, {"mode": mode})
    sa = f"{RELEASE}-webhook"
    roles = [o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"] == sa]
    got = granted(roles[0]) if roles else set()
    assert sorted(got ^ {a.row() for a in table}) == []
    assert bound_roles(objs, sa) == ([("ClusterRoleBinding", "ClusterRole", sa)] if table else [])


def test_legacy_scheduler_takes_extra_args(tools: Tools) -> None:
    """legacy.scheduler.extraArgs follow the chart's own flags (a cluster without
    resource.k8s.io: tessera.localcluster.cluster.NO_RESOURCE_API_SCHEDULER_FLAGS)."""
    flags = list(NO_RESOURCE_API_SCHEDULER_FLAGS)
    objs = render(tools, {"mode": "legacy", "legacy": {"scheduler": {"extraArgs": flags}}})
    sched = one(objs, "Deployment", f"{RELEASE}-legacy-scheduler")["spec"]["template"]["spec"]
    (ks,) = [c for c in sched["containers"] if c["name"] == "kube-scheduler"]
    assert ks["command"][-len(flags) :] == flags
    assert ks["command"][:2] == ["kube-scheduler", "--config=/etc/tessera/scheduler-config.yaml"]


def test_legacy_only_renders_nothing_of_dra(tools: Tools) -> None:
    """mode legacy: no object of resource.k8s.io or admissionregistration's policies, no DRA
    node agent, no DRA extender, no uninstall hook (it deletes templates and classes); the
    device plugin, the monitor, the webhook and the legacy scheduler are there."""
    objs = render(tools, {"mode": "legacy"}, kube_version="1.35.0")
    assert not [o for o in objs if o["apiVersion"].startswith("resource.k8s.io")]
    assert not [o for o in objs if o["kind"].startswith("ValidatingAdmissionPolicy")]
    assert not [o for o in objs if o["kind"] == "Job"]
    workloads = sorted(
        (o["kind"], o["metadata"]["name"]) for o in objs if o["kind"] in ("DaemonSet", "Deployment")
    )
    assert workloads == [
        ("DaemonSet", f"{RELEASE}-device-plugin"),
        ("DaemonSet", f"{RELEASE}-monitor"),
        ("Deployment", f"{RELEASE}-legacy-scheduler"),
        ("Deployment", f"{RELEASE}-webhook"),
    ]
    sched = one(objs, "Deployment", f"{RELEASE}-legacy-scheduler")["spec"]["template"]["spec"]
    images = {c["name"]: c["image"] for c in sched["containers"]}
    assert images["kube-scheduler"] == "registry.k8s.io/kube-scheduler:v1.35.0"
    (ext,) = [c for c in sched["containers"] if c["name"] == "extender"]
    assert ext["args"][:2] == ["extender", "--legacy"]
    mon = one(objs, "DaemonSet", f"{RELEASE}-monitor")["spec"]["template"]["spec"]
    assert "--no-api" in mon["containers"][0]["args"]
    hook = one(objs, "Deployment", f"{RELEASE}-webhook")["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert {"--mode=legacy", "--legacy-scheduler=tessera-legacy"} <= set(hook["args"])
    (wh,) = one(objs, "MutatingWebhookConfiguration", f"{RELEASE}-webhook")["webhooks"]
    assert wh["clientConfig"]["service"]["path"] == "/mutate-pods-legacy"


def test_scheduler_config_is_the_shipped_profile(tools: Tools) -> None:
    """The chart's KubeSchedulerConfiguration is deploy/legacy/scheduler-config.yaml's profile
    and extender, with leader election on its own Lease; the DynamicResources plugin is off
    (as shipped) in both modes (HAMi pods carry no claims; in mode both gpu.tessera.dev's
    extendedResourceName would have the plugin refuse legacy nodes: test_legacy_extender.py),
    on again with disableDynamicResources: false."""
    shipped = yaml.safe_load(LEGACY_CONFIG.read_text())
    for mode, disabled, value in (
        ("legacy", True, "auto"),
        ("both", True, "auto"),
        ("both", True, True),
        ("both", False, False),
    ):
        scheduler = {"extenderPort": 8899, "disableDynamicResources": value}
        objs = render(tools, {"mode": mode, "legacy": {"scheduler": scheduler}})
        cm = one(objs, "ConfigMap", f"{RELEASE}-legacy-scheduler")
        cfg = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
        assert cfg["leaderElection"] == {
            "leaderElect": True,
            "resourceNamespace": NS,
            "resourceName": f"{RELEASE}-legacy-scheduler",
        }
        (profile,) = cfg["profiles"]
        (want_profile,) = shipped["profiles"]
        assert want_profile["plugins"] == {
            "multiPoint": {"disabled": [{"name": "DynamicResources"}]}
        }
        if not disabled:
            want_profile = {k: v for k, v in want_profile.items() if k != "plugins"}
        assert profile == want_profile
        want = [{**shipped["extenders"][0], "urlPrefix": "http://127.0.0.1:8899"}]
        assert cfg["extenders"] == want
        sched = one(objs, "Deployment", f"{RELEASE}-legacy-scheduler")["spec"]["template"]["spec"]
        (ext,) = [c for c in sched["containers"] if c["name"] == "extender"]
        assert "--port=8899" in ext["args"]


# A tiny evaluator of a pod's node placement (nodeSelector AND any required affinity term).
def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    for e in term.get("matchExpressions") or []:
        v = labels.get(e["key"])
        op = e["operator"]
        ok = {
            "In": v is not None and v in e.get("values", []),
            "NotIn": v is None or v not in e.get("values", []),
            "Exists": v is not None,
            "DoesNotExist": v is None,
        }[op]
        if not ok:
            return False
    return True


def runs_on(ds: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    spec = ds["spec"]["template"]["spec"]
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    req = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    return req is None or any(_term_matches(t, labels) for t in req["nodeSelectorTerms"])


GPU_NODES = {
    "dra (NFD)": {"feature.node.kubernetes.io/pci-10de.present": "true"},
    "dra (GFD)": {"nvidia.com/gpu.present": "true"},
    "dra (labelled dra)": {"nvidia.com/gpu.present": "true", MODE: "dra"},
    "legacy": {"nvidia.com/gpu.present": "true", MODE: "legacy"},
    "legacy, no GPU label": {MODE: "legacy"},
    "HAMi (gpu=on)": {"nvidia.com/gpu.present": "true", "gpu": "on"},
}


@pytest.mark.parametrize("mode", ["dra", "legacy", "both"])
def test_each_node_gets_one_modes_agent_and_the_monitor(tools: Tools, mode: str) -> None:
    """On each kind of GPU node, the DaemonSets that would run there: at most one of the two
    node agents, never both; the monitor wherever one of them runs."""
    objs = render(tools, {"mode": mode})
    ds = {
        o["metadata"]["name"].removeprefix(f"{RELEASE}-"): o
        for o in objs
        if o["kind"] == "DaemonSet"
    }
    got = {
        n: sorted(k for k, d in ds.items() if runs_on(d, labels)) for n, labels in GPU_NODES.items()
    }
    legacy = ["device-plugin", "monitor"]
    dra = ["monitor", "node"]
    want = {
        "dra": {
            "dra (NFD)": dra,
            "dra (GFD)": dra,
            "dra (labelled dra)": dra,
            "legacy": [],
            "legacy, no GPU label": [],
            "HAMi (gpu=on)": [],
        },
        "legacy": {
            "dra (NFD)": [],
            "dra (GFD)": [],
            "dra (labelled dra)": [],
            "legacy": legacy,
            "legacy, no GPU label": legacy,
            "HAMi (gpu=on)": [],
        },
        "both": {
            "dra (NFD)": dra,
            "dra (GFD)": dra,
            "dra (labelled dra)": dra,
            "legacy": legacy,
            "legacy, no GPU label": legacy,
            "HAMi (gpu=on)": [],
        },
    }[mode]
    assert got == want


def _affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]
            }
        }
    }


GPU = {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}


@pytest.mark.parametrize(
    ("values", "kube_version", "message"),
    [
        (
            {"mode": "both", "node": {"affinity": _affinity([GPU])}},
            "1.37.2",
            "mode=both: node.affinity nodeSelectorTerms[0] does not exclude nodes labelled "
            "gpu.tessera.dev/mode=legacy, so the DRA node agent could run beside legacy mode's "
            "device plugin on one node: add {key: gpu.tessera.dev/mode, operator: NotIn, values: "
            "[legacy]} to it, or set node.nodeSelector: {gpu.tessera.dev/mode: dra}",
        ),
        (
            {
                "mode": "both",
                "node": {
                    "affinity": _affinity(
                        [GPU, {"key": MODE, "operator": "NotIn", "values": ["legacy"]}],
                        [{"key": MODE, "operator": "Exists"}],
                    )
                },
            },
            "1.37.2",
            "mode=both: node.affinity nodeSelectorTerms[1] does not exclude nodes labelled",
        ),
        (
            {"mode": "both", "node": {"affinity": None}},
            "1.37.2",
            "mode=both: node.affinity has no required nodeSelectorTerms",
        ),
        (
            {},
            "1.35.4",
            "mode=dra: DRA mode needs Kubernetes 1.36 or newer (consumable capacity); this "
            "cluster is v1.35.4: set mode=legacy (docs/install.md, 'Legacy mode')",
        ),
        ({"mode": "both"}, "1.34.0", "mode=both: DRA mode needs Kubernetes 1.36 or newer"),
    ],
)
def test_refused_values_fail_the_render(
    tools: Tools, values: dict[str, Any], kube_version: str, message: str
) -> None:
    r = _template(tools, values, kube_version)
    assert r.returncode == 1 and message in r.stderr, r.stderr


@pytest.mark.parametrize(
    "values",
    [
        {"mode": "both", "node": {"nodeSelector": {MODE: "dra"}, "affinity": None}},
        {
            "mode": "both",
            "node": {
                "affinity": _affinity([GPU, {"key": MODE, "operator": "In", "values": ["dra"]}])
            },
        },
        {"mode": "legacy", "node": {"affinity": None}},  # no DRA node agent at all
    ],
)
def test_accepted_placements_keep_the_agents_apart(tools: Tools, values: dict[str, Any]) -> None:
    objs = render(tools, values)
    ds = [
        o
        for o in objs
        if o["kind"] == "DaemonSet" and o["metadata"]["name"].endswith(("-node", "-device-plugin"))
    ]
    for labels in GPU_NODES.values():
        assert sum(runs_on(d, labels) for d in ds) <= 1, labels


def test_schema_names_the_modes(tools: Tools) -> None:
    r = _template(tools, {"mode": "hybrid"}, "1.37.2")
    assert r.returncode == 1
    assert "- at '/mode': value must be one of 'dra', 'legacy', 'both'" in r.stderr.splitlines(), (
        r.stderr
    )


def test_helm_lint_legacy_and_both(tools: Tools) -> None:
    for mode in ("legacy", "both"):
        vf = tools.tmp / f"lint-{mode}.yaml"
        vf.write_text(yaml.safe_dump({"mode": mode}))
        r = tools.helm("lint", str(CHART), "--strict", "-f", str(vf))
        assert "1 chart(s) linted, 0 chart(s) failed" in r.stdout, r.stdout


# ---- applied to a real API server ---------------------------------------------------


@pytest.fixture(scope="module")
def no_dra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tools]:
    """A control plane that does not serve resource.k8s.io at all (``resource_api=False``:
    ``--runtime-config=resource.k8s.io/v1=false``, RBAC alone, kube-scheduler with DRA's gates
    off; :data:`tessera.localcluster.cluster.NO_RESOURCE_API_RUNTIME_CONFIG`), with
    nothing of Tessera's: no DeviceClass, no ResourceSlice, no node."""
    try:
        build.ensure_built()
    except build.BuildError as e:
        pytest.fail(f"cannot build the control plane: {e}")
    tmp = tmp_path_factory.mktemp("no-dra")
    cluster = Cluster(tmp / "cluster")
    try:
        try:
            cluster.up(None, build_binaries=False, die_with_parent=True, resource_api=False)
        except ClusterError as e:
            pytest.fail(f"tessera cluster up failed: {e}")
        yield Tools(helm_bin(), cluster.kubeconfig, tmp)
    finally:
        cluster.down()


def _can_i(tools: Tools, a: Access, user: str) -> bool:
    """The API server's SubjectAccessReview of row ``a`` for ``user``. (Not ``kubectl auth
    can-i``: for a group the server does not serve, such as resource.k8s.io here, kubectl warns
    "the server doesn't have a resource type" and answers no, whatever RBAC grants.)"""
    attrs = {"verb": a.verb, "group": a.group, "resource": a.resource}
    attrs.update({k: v for k, v in (("subresource", a.subresource), ("name", a.name)) if v})
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": user, "resourceAttributes": attrs},
    }
    out = tools.kubectl(
        "create", "--validate=false", "-o", "json", "-f", "-", stdin=json.dumps(review)
    ).stdout
    return bool(json.loads(out)["status"].get("allowed"))


@pytest.mark.cluster
def test_legacy_release_applies_and_grants_the_access_tables(no_dra: Tools) -> None:
    """Every object of a legacy-only release (none of resource.k8s.io: see
    ``test_legacy_only_renders_nothing_of_dra``) is accepted by kube-apiserver v1.37.2 with
    server-side apply and stored; its RBAC then grants the device plugin and the legacy
    scheduler's pod each row of their tables, and denies the writes they do not make."""
    groups = no_dra.kubectl("api-versions").stdout.split()
    assert "apps/v1" in groups and not [g for g in groups if g.startswith("resource.k8s.io/")]
    ensure_namespace_kubectl(no_dra, NS)
    objs = render(no_dra, {"mode": "legacy"})
    path = no_dra.tmp / "legacy.yaml"
    path.write_text(yaml.safe_dump_all(objs, sort_keys=False))
    out = no_dra.kubectl(
        "apply", "--server-side", "--field-manager=tessera-chart-test", "-f", str(path)
    ).stdout
    assert out.count("serverside-applied") == len(objs), out
    for o in objs:
        md = o["metadata"]
        args = ["get", o["kind"], md["name"], "-o", "name"]
        if md.get("namespace"):
            args += ["-n", md["namespace"]]
        assert no_dra.kubectl(*args).stdout.strip()
    dp = f"system:serviceaccount:{NS}:{RELEASE}-device-plugin"
    sched = f"system:serviceaccount:{NS}:{RELEASE}-legacy-scheduler"
    assert [a.describe() for a in DEVICE_PLUGIN_ACCESS if not _can_i(no_dra, a, dp)] == []
    assert [a.describe() for a in LEGACY_EXTENDER_ACCESS if not _can_i(no_dra, a, sched)] == []
    for verb, res in [
        ("delete", "pods"),
        ("create", "pods"),
        ("get", "secrets"),
        ("update", "nodes"),
        ("patch", "nodes/status"),
    ]:
        sub = res.partition("/")[2]
        assert not no_dra.can_i(
            verb, res.partition("/")[0], dp, *((f"--subresource={sub}",) if sub else ())
        ), (verb, res)
    assert not no_dra.can_i("patch", "nodes", sched) and not no_dra.can_i("get", "secrets", sched)


def ensure_namespace_kubectl(tools: Tools, ns: str) -> None:
    r = tools.kubectl("create", "namespace", ns, check=False)
    assert r.returncode == 0 or "AlreadyExists" in r.stderr, r.stderr
