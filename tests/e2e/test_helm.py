"""The Helm chart ``deploy/helm/tessera`` against the real control plane, with ``helm`` v4 built
from the Go module proxy (``tools/helm``).

One control plane for the module (kube-scheduler started with the chart's rendered extender
configuration, two nodes built from corpus inventories), where:

* the chart is linted and rendered with several value sets (defaults, cert-manager, extender
  on, MIG off, NodePort monitor) and every object is applied with server-side apply;
* the default release stays applied, and each identity it creates is checked with
  ``kubectl auth can-i`` and with real requests: the node agent's token, bound to a pod on one
  node, is refused another node's slice by the ValidatingAdmissionPolicy;
* ``tessera driver``, ``webhook``, ``monitor`` and ``extender`` run as processes under the
  chart's identities and do their work (so the roles are enough, not only narrow);
* the install guide's share (8 GiB, 20 %) is applied as written in ``docs/install.md``.

``test_install_upgrade_uninstall`` runs ``helm install``/``upgrade``/``uninstall`` on a control
plane of its own (an empty cluster: no DeviceClass yet). The chart's own pods, from the image
``make image`` builds, run on a real node in ``test_install.py``.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.api.deviceclass import device_class, mig_device_class
from tessera.driver.access import NODE_AGENT_ACCESS
from tessera.enforcement.layout import DEFAULT_STATE_DIR, claims_dir
from tessera.kube.client import ApiError, KubeClient
from tessera.kube.workloads import wait_for
from tessera.localcluster import build
from tessera.localcluster.cluster import Cluster, ClusterError
from tessera.localcluster.pki import make_serving_certificate

from .conftest import (
    A5000_INVENTORY,
    H100_INVENTORY,
    H100_TOPOLOGY,
    LiveCluster,
    StartCluster,
    corpus_node,
    inventory_of,
)
from .driverkit import *  # noqa: F403 (fixtures: fake_nvml_lib)
from .driverkit import DriverProcess, allocated_claim, make_env, node_slices
from .helmkit import (
    CHART,
    REPO,
    Tools,
    bound_pod,
    cert_manager_crds,
    ensure_namespace,
    helm_bin,
    stop,
    tessera_process,
)

pytestmark = pytest.mark.cluster

RESOURCE = "resource.k8s.io/v1"
NS = "tessera-system"
RELEASE = "tessera"
H100, A5000 = "h100-node", "a5000-node"
#: The default release stays applied for the identity tests; the extender is on in it.
APPLIED_VALUES: dict[str, Any] = {"extender": {"enabled": True, "defaultNodePolicy": "binpack"}}
GPU_NODE_LABELS = {"nvidia.com/gpu.present": "true"}


@dataclass
class Env:
    tools: Tools
    live: LiveCluster
    objects: list[dict[str, Any]]

    @property
    def client(self) -> KubeClient:
        return self.live.client

    def user(self, component: str) -> str:
        return f"system:serviceaccount:{NS}:{RELEASE}-{component}"


def _apply(tools: Tools, objects: list[dict[str, Any]], path: Path, *extra: str) -> str:
    path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    return tools.kubectl(
        "apply", "--server-side", "--field-manager=tessera-chart-test", "-f", str(path), *extra
    ).stdout


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    try:
        build.ensure_built()
    except build.BuildError as e:
        pytest.fail(f"cannot build the control plane: {e}")
    tmp = tmp_path_factory.mktemp("helm")
    helm = helm_bin()
    pre = Tools(helm, tmp / "none", tmp)
    # kube-scheduler runs with the scheduler configuration the chart renders for the extender.
    rendered = pre.render(RELEASE, NS, APPLIED_VALUES)
    (cm,) = [
        o
        for o in rendered
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == f"{RELEASE}-scheduler-config"
    ]
    sched = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    nodes = [
        corpus_node(H100, H100_INVENTORY, H100_TOPOLOGY, GPU_NODE_LABELS),
        corpus_node(A5000, A5000_INVENTORY, labels=GPU_NODE_LABELS),
    ]
    cluster = Cluster(tmp / "cluster")
    procs: list[Any] = []
    try:
        try:
            cluster.up(
                inventory_of(nodes),
                build_binaries=False,
                die_with_parent=True,
                scheduler_config=sched,
            )
        except ClusterError as e:
            pytest.fail(f"tessera cluster up failed: {e}")
        tools = Tools(helm, cluster.kubeconfig, tmp)
        live = LiveCluster(
            cluster, cluster.kubeconfig, cluster.client(), str(cluster.server), inventory_of(nodes)
        )
        for crd in cert_manager_crds():
            tools.kubectl("apply", "--server-side", "-f", str(crd))
        tools.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/certificates.cert-manager.io",
            "crd/issuers.cert-manager.io",
            "crd/clusterissuers.cert-manager.io",
        )
        ensure_namespace(live.client, NS)
        _apply(tools, rendered, tmp / "applied.yaml")
        yield Env(tools, live, rendered)
    finally:
        for p in procs:
            stop(p)
        cluster.down()


# ---- lint, schema, rendering ------------------------------------------------------------------

VALUE_SETS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "defaults": ({}, ()),
    "cert-manager": ({}, ("cert-manager.io/v1",)),  # source auto: cert-manager's API is served
    "cert-manager-issuer": (
        {
            "webhook": {
                "certificates": {
                    "source": "cert-manager",
                    "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"},
                }
            }
        },
        (),
    ),
    "extender": ({"extender": {"enabled": True, "defaultNodePolicy": "spread", "port": 8899}}, ()),
    "no-mig": (
        {
            "deviceClasses": {"mig": {"create": False}, "gpu": {"extendedResourceName": ""}},
            "monitor": {"service": {"type": "NodePort"}},
            "webhook": {"replicas": 1, "skipNamespaces": ["kube-system", "batch"]},
        },
        (),
    ),
}


def test_helm_lint(env: Env) -> None:
    for name, (values, api_versions) in VALUE_SETS.items():
        if api_versions:  # helm lint has no --api-versions: ask for cert-manager directly
            values = {"webhook": {"certificates": {"source": "cert-manager"}}}
        vf = env.tools.tmp / f"lint-{name}.yaml"
        vf.write_text(yaml.safe_dump(values))
        r = env.tools.helm("lint", str(CHART), "--strict", "-f", str(vf))
        assert "1 chart(s) linted, 0 chart(s) failed" in r.stdout, r.stdout


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_value_set_applies(env: Env, value_set: str) -> None:
    """Render with the value set and apply every object with server-side apply: each is
    accepted by kube-apiserver v1.37.2 (DeviceClasses, shared with the applied release, as a
    server-side dry run). The webhook configuration is well-formed: its service, port and path
    exist, its CA signs the serving certificate (or cert-manager injects it), its conditions
    are the shipped ones; the admission policy type-checks."""
    values, api_versions = VALUE_SETS[value_set]
    release, ns = f"vs-{value_set}", f"vs-{value_set}"
    objs = env.tools.render(release, ns, values, api_versions=api_versions)
    ensure_namespace(env.client, ns)
    classes = [o for o in objs if o["kind"] == "DeviceClass"]
    rest = [o for o in objs if o["kind"] != "DeviceClass"]
    path = env.tools.tmp / f"{value_set}.yaml"
    try:
        out = _apply(env.tools, rest, path)
        assert out.count("serverside-applied") == len(rest), out
        if classes:
            out = _apply(
                env.tools, classes, env.tools.tmp / f"{value_set}-classes.yaml", "--dry-run=server"
            )
            assert out.count("serverside-applied (server dry run)") == len(classes), out
        for o in rest:  # stored as sent
            got = env.client.get(
                o["apiVersion"], o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")
            )
            assert got["metadata"]["labels"]["app.kubernetes.io/instance"] == release
        _check_webhook_configuration(
            env, objs, ns, cert_manager=value_set.startswith("cert-manager")
        )
        _check_policy_type_checks(env, f"{release}-tessera-node-resourceslices")
        names = {o["metadata"]["name"] for o in classes}
        if value_set == "no-mig":
            assert names == {"gpu.tessera.dev"} and "extendedResourceName" not in classes[0]["spec"]
            (svc,) = [
                o
                for o in objs
                if o["kind"] == "Service" and o["metadata"]["name"].endswith("-monitor")
            ]
            assert (
                svc["spec"]["type"] == "NodePort" and svc["spec"]["ports"][0]["nodePort"] == 31995
            )
            assert not [o for o in objs if o["kind"] == "PodDisruptionBudget"]
        else:
            assert names == {"gpu.tessera.dev", "mig.gpu.tessera.dev"}
        if value_set == "extender":
            (ds,) = [
                o
                for o in objs
                if o["kind"] == "DaemonSet" and o["metadata"]["name"].endswith("-extender")
            ]
            spec = ds["spec"]["template"]["spec"]
            assert spec["hostNetwork"] is True
            assert spec["containers"][0]["args"] == [
                "extender",
                "--bind-address=127.0.0.1",
                "--port=8899",
                "--default-node-policy=spread",
            ]
            (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
            assert (
                yaml.safe_load(cm["data"]["scheduler-config.yaml"])["extenders"][0]["urlPrefix"]
                == "http://127.0.0.1:8899"
            )
        else:
            assert not [o for o in objs if o["metadata"]["name"].endswith("-extender")]
    finally:
        env.tools.kubectl(
            "delete", "-f", str(path), "--wait=false", "--ignore-not-found", check=False
        )
        env.client.delete("v1", "Namespace", ns)


def _check_webhook_configuration(
    env: Env, objs: list[dict[str, Any]], ns: str, *, cert_manager: bool
) -> None:
    from cryptography import x509

    by_kind: dict[str, list[dict[str, Any]]] = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
    (mwc,) = by_kind["MutatingWebhookConfiguration"]
    (hook,) = mwc["webhooks"]
    ref = hook["clientConfig"]["service"]
    (svc,) = [s for s in by_kind["Service"] if s["metadata"]["name"] == ref["name"]]
    assert ref["namespace"] == ns == svc["metadata"]["namespace"]
    assert ref["path"] == "/mutate-pods" and ref["port"] == 443 == svc["spec"]["ports"][0]["port"]
    (dep,) = by_kind["Deployment"]
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert svc["spec"]["ports"][0]["targetPort"] == container["ports"][0]["name"] == "https"
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    secret_name = dep["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"]
    # The shipped configuration (deploy/webhook) and the chart's send the same pods.
    shipped = yaml.safe_load(
        (REPO / "deploy" / "webhook" / "mutatingwebhookconfiguration.yaml").read_text()
    )["webhooks"][0]
    for key in (
        "matchConditions",
        "rules",
        "sideEffects",
        "admissionReviewVersions",
        "reinvocationPolicy",
    ):
        assert hook[key] == shipped[key], key
    skipped = hook["namespaceSelector"]["matchExpressions"][0]["values"]
    assert ns in skipped and "kube-system" in skipped
    stored = env.client.get(
        "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", mwc["metadata"]["name"]
    )
    if cert_manager:
        (cert,) = by_kind["Certificate"]
        assert (
            mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
            == f"{ns}/{cert['metadata']['name']}"
        )
        assert cert["spec"]["secretName"] == secret_name
        assert set(cert["spec"]["dnsNames"]) == {
            f"{ref['name']}.{ns}.svc",
            f"{ref['name']}.{ns}.svc.cluster.local",
        }
        assert "caBundle" not in hook["clientConfig"]
        return
    secrets = {s["metadata"]["name"]: s for s in by_kind["Secret"]}
    ca_pem = base64.b64decode(hook["clientConfig"]["caBundle"])
    assert base64.b64decode(stored["webhooks"][0]["clientConfig"]["caBundle"]) == ca_pem
    tls = secrets[secret_name]
    ca = x509.load_pem_x509_certificate(ca_pem)
    leaf = x509.load_pem_x509_certificate(base64.b64decode(tls["data"]["tls.crt"]))
    leaf.verify_directly_issued_by(ca)
    san = leaf.extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    ).value.get_values_for_type(x509.DNSName)
    assert set(san) == {f"{ref['name']}.{ns}.svc", f"{ref['name']}.{ns}.svc.cluster.local"}
    assert base64.b64decode(tls["data"]["ca.crt"]) == ca_pem
    not_after = dt.datetime.strptime(
        tls["metadata"]["annotations"]["gpu.tessera.dev/not-after"], "%Y-%m-%dT%H:%M:%SZ"
    ).replace(tzinfo=dt.UTC)
    assert abs((leaf.not_valid_after_utc - not_after).total_seconds()) < 120
    assert 364 <= (leaf.not_valid_after_utc - dt.datetime.now(dt.UTC)).days <= 365


def _check_policy_type_checks(env: Env, name: str) -> None:
    def checked() -> dict[str, Any] | None:
        st = (
            env.client.get(
                "admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", name
            ).get("status")
            or {}
        )
        return st if st.get("observedGeneration") else None

    st = wait_for(checked, timeout=60, what=f"ValidatingAdmissionPolicy {name} to be type-checked")
    assert not (st.get("typeChecking") or {}).get("expressionWarnings"), st


@pytest.mark.parametrize("state_dir", [None, "/srv/tessera/state"])
def test_monitor_reads_where_the_driver_writes(env: Env, state_dir: str | None) -> None:
    """The rendered driver's ``--state-dir`` and the monitor's ``--region-dir`` meet where
    tessera.enforcement.layout says they do: the monitor's directory is the host's
    ``<state-dir>/claims``, mounted read-only."""
    values = {"driver": {"stateDir": state_dir}} if state_dir else {}
    objs = env.tools.render(RELEASE, NS, values)

    def container(ds: str, name: str) -> dict[str, Any]:
        (d,) = [o for o in objs if o["kind"] == "DaemonSet" and o["metadata"]["name"] == ds]
        spec = d["spec"]["template"]["spec"]
        (c,) = [c for c in spec["containers"] if c["name"] == name]
        c["_volumes"] = {v["name"]: v for v in spec["volumes"]}
        return c

    def flag(c: dict[str, Any], name: str) -> str:
        (v,) = [a.split("=", 1)[1] for a in c["args"] if a.startswith(f"--{name}=")]
        return v

    def host_path(c: dict[str, Any], mount: str) -> str:
        (m,) = [m for m in c["volumeMounts"] if m["mountPath"] == mount]
        return str(c["_volumes"][m["name"]]["hostPath"]["path"])

    drv = container(f"{RELEASE}-node", "driver")
    mon = container(f"{RELEASE}-monitor", "monitor")
    state = flag(drv, "state-dir")
    assert state == (state_dir or DEFAULT_STATE_DIR)
    assert host_path(drv, state) == state
    # The monitor reads, at whatever container path, the host's <state-dir>/claims.
    assert host_path(mon, flag(mon, "region-dir")) == str(claims_dir(state))


def test_device_classes_are_tesseras_definitions(env: Env) -> None:
    classes = {o["metadata"]["name"]: o for o in env.objects if o["kind"] == "DeviceClass"}
    assert classes["gpu.tessera.dev"]["spec"] == device_class()["spec"]
    assert classes["mig.gpu.tessera.dev"]["spec"] == mig_device_class()["spec"]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("metrics.port=abc", "- at '/metrics/port': got string, want integer"),
        (
            "driver.enforcementBackend=magic",
            "- at '/driver/enforcementBackend': value must be one of 'auto', 'library', 'driver-native'",
        ),
        (
            "webhook.failurePolicy=Sometimes",
            "- at '/webhook/failurePolicy': value must be one of 'Fail', 'Ignore'",
        ),
        (
            "image.digest=sha256:beef",
            "- at '/image/digest': 'sha256:beef' does not match pattern '^(sha256:[a-f0-9]{64})?$'",
        ),
        (
            "extender.defaultNodePolicy=random",
            "- at '/extender/defaultNodePolicy': value must be one of 'first-fit', 'binpack', 'spread'",
        ),
        ("webhok.replicas=2", "- at '': additional properties 'webhok' not allowed"),
    ],
)
def test_bad_values_fail_helm_install_with_the_schema_message(
    env: Env, setting: str, message: str
) -> None:
    r = env.tools.helm(
        "install",
        "bad",
        str(CHART),
        "-n",
        "bad-values",
        "--create-namespace",
        "--set",
        setting,
        check=False,
    )
    assert r.returncode == 1
    assert (
        "values don't meet the specifications of the schema(s) in the following chart(s):"
        in r.stderr
    )
    assert message in r.stderr.splitlines(), r.stderr
    assert env.tools.helm("list", "-A", "-q").stdout.strip() == ""


# ---- least privilege ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("component", "allowed", "denied"),
    [
        (
            "node",
            [
                ("get", "resourceclaims.resource.k8s.io"),
                ("list", "resourceslices.resource.k8s.io"),
                ("create", "resourceslices.resource.k8s.io"),
                ("patch", "resourceslices.resource.k8s.io"),
                ("delete", "resourceslices.resource.k8s.io"),
                ("patch", "resourceclaims.resource.k8s.io", "--subresource=status"),
                (
                    "associated-node:patch",
                    "resourceclaims.resource.k8s.io/gpu.tessera.dev",
                    "--subresource=driver",
                ),
                ("get", "nodes"),
            ],
            [
                ("list", "resourceclaims.resource.k8s.io"),
                ("watch", "resourceclaims.resource.k8s.io"),
                ("update", "resourceclaims.resource.k8s.io"),
                ("create", "resourceclaims.resource.k8s.io"),
                (
                    "arbitrary-node:patch",
                    "resourceclaims.resource.k8s.io/gpu.tessera.dev",
                    "--subresource=driver",
                ),
                (
                    "associated-node:patch",
                    "resourceclaims.resource.k8s.io/gpu.nvidia.com",
                    "--subresource=driver",
                ),
                ("update", "resourceslices.resource.k8s.io"),
                ("get", "secrets", "-A"),
                ("list", "secrets", "-A"),
                ("create", "pods"),
                ("list", "pods", "-A"),
                ("patch", "nodes"),
                ("patch", "nodes", "--subresource=status"),
                ("delete", "deviceclasses.resource.k8s.io"),
                ("create", "deviceclasses.resource.k8s.io"),
                ("create", "resourceclaimtemplates.resource.k8s.io"),
                ("list", "nodes"),
                ("get", "configmaps"),
            ],
        ),
        (
            "webhook",
            [
                ("create", "resourceclaimtemplates.resource.k8s.io"),
                ("patch", "resourceclaimtemplates.resource.k8s.io"),
                ("list", "resourceclaimtemplates.resource.k8s.io", "-A"),
                ("delete", "resourceclaimtemplates.resource.k8s.io"),
                ("list", "pods", "-A"),
                ("watch", "resourceslices.resource.k8s.io"),
                ("list", "deviceclasses.resource.k8s.io"),
                ("watch", "deviceclasses.resource.k8s.io"),
            ],
            [
                ("create", "resourceclaims.resource.k8s.io"),
                ("create", "pods"),
                ("delete", "pods"),
                ("patch", "pods"),
                ("get", "secrets"),
                ("update", "resourceclaimtemplates.resource.k8s.io"),
                ("create", "resourceslices.resource.k8s.io"),
                ("patch", "mutatingwebhookconfigurations.admissionregistration.k8s.io"),
                ("delete", "deviceclasses.resource.k8s.io"),
            ],
        ),
        (
            "monitor",
            [
                ("list", "resourceslices.resource.k8s.io"),
                ("list", "resourceclaims.resource.k8s.io", "-A"),
                ("list", "pods", "-A"),
            ],
            [
                ("patch", "resourceclaims.resource.k8s.io"),
                ("create", "resourceslices.resource.k8s.io"),
                ("get", "secrets"),
                ("delete", "pods"),
                ("watch", "resourceclaims.resource.k8s.io"),
            ],
        ),
        (
            "extender",
            [
                ("list", "resourceslices.resource.k8s.io"),
                ("watch", "resourceslices.resource.k8s.io"),
                ("list", "resourceclaims.resource.k8s.io", "-A"),
            ],
            [
                ("patch", "resourceclaims.resource.k8s.io"),
                ("create", "pods", "--subresource=binding"),
                ("get", "secrets"),
                ("list", "pods", "-A"),
            ],
        ),
    ],
)
def test_identities_can_do_only_their_job(
    env: Env, component: str, allowed: list[tuple[str, ...]], denied: list[tuple[str, ...]]
) -> None:
    user = env.user(component)
    got_allowed = {a: env.tools.can_i(a[0], a[1], user, *a[2:]) for a in allowed}
    got_denied = {d: env.tools.can_i(d[0], d[1], user, *d[2:]) for d in denied}
    assert [a for a, ok in got_allowed.items() if not ok] == []
    assert [d for d, ok in got_denied.items() if ok] == []


def test_node_role_covers_what_the_driver_checks_at_start(env: Env) -> None:
    """``tessera driver`` checks these rows with SelfSubjectAccessReviews before it writes;
    the applied chart's node identity has every one (the API server's answer)."""
    for a in NODE_AGENT_ACCESS:
        what = f"{a.resource}.{a.group}" if a.group else a.resource
        extra = (f"--subresource={a.subresource}",) if a.subresource else ()
        assert env.tools.can_i(
            a.verb, f"{what}/{a.name}" if a.name else what, env.user("node"), *extra
        ), a.describe()


def _granted(role: dict[str, Any]) -> set[tuple[str, str, str, str, str]]:
    """A ClusterRole's rules as ``(verb, group, resource, subresource, name)`` rows."""
    out = set()
    for rule in role["rules"]:
        for group in rule.get("apiGroups") or []:
            for res in rule.get("resources") or []:
                resource, _, sub = res.partition("/")
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or [""]:
                        out.add((verb, group, resource, sub, name))
    return out


def test_node_role_is_exactly_the_access_table(tmp_path: Path) -> None:
    """The chart's node ClusterRole (``helm template``, defaults) grants exactly the rows of
    :data:`tessera.driver.access.NODE_AGENT_ACCESS` (what the driver uses and checks at start):
    nothing missing, nothing more. No Role or other binding gives the node agent anything."""
    tools = Tools(helm_bin(), tmp_path / "none", tmp_path)
    objects = tools.render(RELEASE, NS, {})
    user = f"{RELEASE}-node"
    bindings = [
        o
        for o in objects
        if o["kind"] in ("ClusterRoleBinding", "RoleBinding")
        and any(s.get("name") == user for s in o.get("subjects") or [])
    ]
    assert [(b["kind"], b["roleRef"]["kind"], b["roleRef"]["name"]) for b in bindings] == [
        ("ClusterRoleBinding", "ClusterRole", user)
    ]
    (role,) = [o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == user]
    table = {(a.verb, a.group, a.resource, a.subresource, a.name) for a in NODE_AGENT_ACCESS}
    granted = _granted(role)
    assert sorted(table - granted) == [], "the driver needs what the chart does not grant"
    assert sorted(granted - table) == [], "the chart grants what the driver does not use"


def _slice(name: str, node: str | None, driver: str = "gpu.tessera.dev") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": node or "shared", "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}],
    }
    if node:
        spec["nodeName"] = node
    else:
        spec["allNodes"] = True
    return {
        "apiVersion": RESOURCE,
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": spec,
    }


def test_node_agent_writes_only_its_own_nodes_slices(env: Env) -> None:
    """The node agent's token, bound to a pod on h100-node (the token carries the node name),
    creates, updates and deletes that node's slices of its driver; everything else on
    ResourceSlices is refused by the API server through the chart's ValidatingAdmissionPolicy;
    a token not bound to a pod on a node is refused outright; other identities are unaffected."""
    pod = bound_pod(env.client, "node-agent-h100", NS, f"{RELEASE}-node", H100)
    agent = KubeClient.from_kubeconfig(
        env.tools.token_kubeconfig(env.client, f"{RELEASE}-node", NS, pod=pod)
    )
    policy = (
        f"ValidatingAdmissionPolicy '{RELEASE}-node-resourceslices' with binding "
        f"'{RELEASE}-node-resourceslices' denied request: "
    )

    def refused(call: Any, message: str) -> None:
        with pytest.raises(ApiError) as e:
            call()
        assert e.value.status == 403, e.value
        assert policy + message in e.value.message, e.value.message

    own = agent.create(_slice("agent-own", H100))
    own["spec"]["devices"][0]["attributes"]["index"] = {"int": 0}
    agent.apply(own | {"metadata": {"name": "agent-own"}}, field_manager="agent")
    refused(
        lambda: agent.create(_slice("agent-other", A5000)),
        f"the node agent of node '{H100}' may not write ResourceSlices of node '{A5000}'",
    )
    refused(
        lambda: agent.create(_slice("agent-all", None)),
        f"the node agent of node '{H100}' may not write ResourceSlices without spec.nodeName",
    )
    refused(
        lambda: agent.create(_slice("agent-nvidia", H100, "gpu.nvidia.com")),
        "the node agent may write ResourceSlices of driver gpu.tessera.dev only, not 'gpu.nvidia.com'",
    )
    # The a5000 node's real slices (published for it by `cluster up`): no update, no delete.
    (theirs,) = [
        s
        for s in env.client.list(RESOURCE, "ResourceSlice", field_selector=f"spec.nodeName={A5000}")
    ]
    name = theirs["metadata"]["name"]
    refused(
        lambda: agent.apply(
            {
                "apiVersion": RESOURCE,
                "kind": "ResourceSlice",
                "metadata": {"name": name},
                "spec": {**theirs["spec"], "pool": {**theirs["spec"]["pool"], "generation": 99}},
            },
            field_manager="agent",
        ),
        f"the node agent of node '{H100}' may not write ResourceSlices of node '{A5000}'",
    )
    refused(
        lambda: agent.delete(RESOURCE, "ResourceSlice", name),
        f"the node agent of node '{H100}' may not write ResourceSlices of node '{A5000}'",
    )
    assert (
        env.client.get(RESOURCE, "ResourceSlice", name)["metadata"]["resourceVersion"]
        == theirs["metadata"]["resourceVersion"]
    )
    agent.delete(RESOURCE, "ResourceSlice", "agent-own", missing_ok=False)
    # A token of the same ServiceAccount that is not bound to a pod carries no node.
    unbound = KubeClient.from_kubeconfig(
        env.tools.token_kubeconfig(env.client, f"{RELEASE}-node", NS)
    )
    refused(
        lambda: unbound.create(_slice("agent-unbound", H100)),
        "the node agent's token is not bound to a pod on a node",
    )
    # The policy only concerns the node agent: the admin writes any slice.
    env.client.create(_slice("admin-any", A5000, "gpu.nvidia.com"))
    env.client.delete(RESOURCE, "ResourceSlice", "admin-any")
    env.client.delete("v1", "Pod", "node-agent-h100", NS)


def test_driver_runs_under_the_chart_identity(
    env: Env, fake_nvml_lib: Path, tmp_path: Path
) -> None:
    """``tessera driver`` with the node agent's pod-bound token: its start-up access checks and
    the guard pass, it publishes its node's slices (admitted by the policy), prepares a claim
    (reading it by name) and writes the claim's device status (``associated-node:patch``)."""
    denv = make_env(tmp_path, env.live, fake_nvml_lib)
    env.client.request(
        "PATCH",
        f"/api/v1/nodes/{denv.node}",
        body={"metadata": {"labels": GPU_NODE_LABELS}},
        content_type="application/merge-patch+json",
        what="Node",
    )
    pod = bound_pod(env.client, f"node-agent-{denv.node}", NS, f"{RELEASE}-node", denv.node)
    kc = env.tools.token_kubeconfig(env.client, f"{RELEASE}-node", NS, pod=pod)
    d = DriverProcess(replace(denv, kubeconfig=kc)).start(timeout=90)
    ns = "driver-identity"
    ensure_namespace(env.client, ns)
    try:
        assert d.returncode is None, d.output
        assert sum(len(s["spec"]["devices"]) for s in node_slices(env.client, denv.node)) == 8
        claim = allocated_claim(
            env.client,
            ns,
            "share",
            [
                {
                    "request": "gpu",
                    "driver": "gpu.tessera.dev",
                    "pool": denv.node,
                    "device": "gpu-1",
                    "consumedCapacity": {"memory": "8Gi", "cores": "20"},
                    "shareID": "5b0c8a8e-6d1f-4b55-9a43-2f1d7c9b0e11",
                }
            ],
            node=denv.node,
        )
        kubelet = denv.kubelet()
        reply = kubelet.prepare([(ns, "share", claim["metadata"]["uid"])])
        kubelet.close()
        assert reply.claims[claim["metadata"]["uid"]].error == ""

        def status() -> list[dict[str, Any]] | None:
            devices = (
                env.client.get(RESOURCE, "ResourceClaim", "share", ns).get("status") or {}
            ).get("devices")
            return devices or None

        (entry,) = wait_for(
            status, timeout=30, what="the claim's device status", last=lambda: d.output
        )
        assert (entry["driver"], entry["pool"], entry["device"]) == (
            "gpu.tessera.dev",
            denv.node,
            "gpu-1",
        )
        assert d.ready()["statusErrors"] == 0
        # helm upgrade replaces the pod; the host paths stay: the new agent serves the prepared
        # claim from its checkpoint (same CDI device, nothing re-read or rewritten).
        spec = denv.cdi_dir / f"gpu.tessera.dev-claim_{claim['metadata']['uid']}.json"
        before = spec.stat().st_mtime_ns
        d.stop()
        d = DriverProcess(replace(denv, kubeconfig=kc)).start(timeout=90)
        assert d.returncode is None, d.output
        assert d.ready()["preparedClaims"] == 1
        kubelet = denv.kubelet()
        again = kubelet.prepare([(ns, "share", claim["metadata"]["uid"])])
        kubelet.close()
        assert again.claims[claim["metadata"]["uid"]] == reply.claims[claim["metadata"]["uid"]]
        assert spec.stat().st_mtime_ns == before
    finally:
        d.stop()
        for s in node_slices(env.client, denv.node):
            env.client.delete(RESOURCE, "ResourceSlice", s["metadata"]["name"])
        env.client.delete("v1", "Pod", f"node-agent-{denv.node}", NS)
        env.client.delete("v1", "Namespace", ns)


def test_monitor_and_extender_run_under_the_chart_identities(env: Env, tmp_path: Path) -> None:
    pod = bound_pod(env.client, "monitor-h100", NS, f"{RELEASE}-monitor", H100)
    mkc = env.tools.token_kubeconfig(env.client, f"{RELEASE}-monitor", NS, pod=pod)
    ekc = env.tools.token_kubeconfig(env.client, f"{RELEASE}-extender", NS)
    regions = tmp_path / "claims"
    regions.mkdir()
    mlog, elog = tmp_path / "monitor.log", tmp_path / "extender.log"
    port_file = tmp_path / "extender.port"
    monitor = tessera_process(
        [
            "monitor",
            "--no-nvml",
            f"--kubeconfig={mkc}",
            f"--node-name={H100}",
            f"--region-dir={regions}",
            "--port=0",
            "--address=127.0.0.1",
        ],
        mlog,
    )
    extender = tessera_process(
        ["extender", f"--kubeconfig={ekc}", "--port=0", f"--port-file={port_file}"], elog
    )
    try:
        url = wait_for(
            lambda: (
                m.group(1) if (m := re.search(r"serving (http://\S+)", mlog.read_text())) else None
            ),
            timeout=60,
            what="the monitor to serve",
            last=mlog.read_text,
        )
        with urllib.request.urlopen(url, timeout=10) as r:
            metrics = r.read().decode()
        # The allocation figures come from the API server, read with the monitor's identity.
        assert re.search(rf'^tessera_monitor_api_up{{node="{H100}"}} 1\.0$', metrics, re.M), (
            metrics[:3000]
        )
        assert len(re.findall(r"^tessera_gpu_memory_capacity_bytes\{", metrics, re.M)) == 8
        port = int(
            wait_for(
                lambda: port_file.read_text() if port_file.is_file() else None,
                timeout=60,
                what="the extender to listen",
                last=elog.read_text,
            )
        )

        def ready() -> bool | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5):
                    return True
            except OSError:
                return None

        wait_for(ready, timeout=60, what="the extender's slice cache", last=elog.read_text)
        body = json.dumps(
            {
                "Pod": {
                    "metadata": {
                        "name": "p",
                        "namespace": "default",
                        "annotations": {"hami.io/node-scheduler-policy": "spread"},
                    }
                },
                "NodeNames": [H100, A5000],
            }
        ).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/prioritize",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            scores = {s["Host"]: s["Score"] for s in json.loads(r.read())}
        assert set(scores) == {H100, A5000}
    finally:
        stop(monitor)
        stop(extender)
        env.client.delete("v1", "Pod", "monitor-h100", NS)


# ---- the webhook under its identity, and the install guide's share -------------------------------


def _doc_blocks() -> list[list[dict[str, Any]]]:
    text = (REPO / "docs" / "install.md").read_text()
    return [
        [d for d in yaml.safe_load_all(b) if d]
        for b in re.findall(r"```yaml\n(.*?)```", text, re.S)
    ]


def test_install_guide_share_and_webhook_under_its_identity(env: Env, tmp_path: Path) -> None:
    """The install guide's 8 GiB / 20 % share, as written in docs/install.md: the claim template
    and pod are accepted and kube-scheduler allocates exactly that share. Its HAMi-style twin
    goes through ``tessera webhook`` running under the chart's webhook identity (the chart's
    MutatingWebhookConfiguration, pointed at the process) and gets the same share."""
    (dra_docs, hami_docs) = _doc_blocks()
    assert [d["kind"] for d in dra_docs] == ["ResourceClaimTemplate", "Pod"] and [
        d["kind"] for d in hami_docs
    ] == ["Pod"]
    ns = "guide"
    ensure_namespace(env.client, ns)
    ca, serving = make_serving_certificate(tmp_path, "webhook")
    kc = env.tools.token_kubeconfig(env.client, f"{RELEASE}-webhook", NS)
    log, port_file = tmp_path / "webhook.log", tmp_path / "webhook.port"
    webhook = tessera_process(
        [
            "webhook",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            "--port=0",
            f"--port-file={port_file}",
            f"--kubeconfig={kc}",
        ],
        log,
    )
    name = f"{RELEASE}-webhook"
    try:
        port = int(
            wait_for(
                lambda: port_file.read_text() if port_file.is_file() else None,
                timeout=60,
                what="the webhook to listen",
                last=log.read_text,
            )
        )
        mwc = env.client.get(
            "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", name
        )
        mwc["webhooks"][0]["clientConfig"] = {
            "url": f"https://127.0.0.1:{port}/mutate-pods",
            "caBundle": base64.b64encode(ca.cert.read_bytes()).decode(),
        }
        env.client.request(
            "PUT",
            f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}",
            body=mwc,
            what="MutatingWebhookConfiguration",
        )
        _apply(
            env.tools,
            [dict(o, metadata={**o["metadata"], "namespace": ns}) for o in dra_docs],
            tmp_path / "dra.yaml",
        )
        hami = dict(hami_docs[0], metadata={**hami_docs[0]["metadata"], "namespace": ns})

        def admitted() -> bool | None:
            r = env.tools.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(hami), check=False)
            return True if r.returncode == 0 else None

        wait_for(
            admitted, timeout=60, what="the API server to call the webhook", last=log.read_text
        )
        pod = env.client.get("v1", "Pod", "share-hami", ns)
        assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].startswith(
            "tessera-gpu-"
        )
        assert not any(
            k.startswith("nvidia.com/")
            for k in pod["spec"]["containers"][0]["resources"].get("limits", {})
        )

        def allocations() -> dict[str, dict[str, Any]] | None:
            out = {}
            for c in env.client.list(RESOURCE, "ResourceClaim", ns):
                results = ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get(
                    "results"
                ) or []
                owner = (
                    c["metadata"]["annotations"].get("resource.kubernetes.io/pod-claim-name")
                    and c["metadata"]["ownerReferences"][0]["name"]
                )
                if results:
                    out[owner] = results[0]
            return out if len(out) == 2 else None

        got = wait_for(allocations, timeout=60, what="both claims to be allocated")
        for pod_name in ("share", "share-hami"):
            r = got[pod_name]
            assert r["driver"] == "gpu.tessera.dev" and r["shareID"]
            assert r["consumedCapacity"] == {"memory": "8Gi", "cores": "20"}, (pod_name, r)
    finally:
        stop(webhook)
        for p in env.client.list("v1", "Pod", ns):
            env.client.request(
                "DELETE",
                f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}",
                body={"gracePeriodSeconds": 0},
                what="Pod",
            )
        env.client.delete("v1", "Namespace", ns)


# ---- helm install, upgrade, uninstall -------------------------------------------------------------


def _secret_data(client: KubeClient, name: str) -> dict[str, str]:
    return dict(client.get("v1", "Secret", name, NS)["data"])


def test_install_upgrade_uninstall(fresh_cluster: StartCluster, tmp_path: Path) -> None:
    """On an empty cluster: ``helm install`` (after a server dry run) creates the release;
    ``helm upgrade`` keeps the webhook's CA and certificate (and the caBundle) until a rotation
    is asked for, which keeps the CA; ``helm uninstall`` (after the chart's pre-delete hook run
    under its identity) removes every object but the DeviceClass a claim still names, which
    Helm reports as kept, and leaves no webhook configuration: a HAMi pod is admitted."""
    live = fresh_cluster([corpus_node(H100, H100_INVENTORY, labels=GPU_NODE_LABELS)])
    tools = Tools(helm_bin(), live.kubeconfig, tmp_path)
    client = live.client
    client.delete(
        RESOURCE, "DeviceClass", "gpu.tessera.dev"
    )  # `cluster up` registered it: start empty
    base = ["-n", NS, "--set", "image.repository=registry.example.com/tessera"]
    tools.helm("install", RELEASE, str(CHART), "--create-namespace", "--dry-run=server", *base)
    assert tools.helm("list", "-A", "-q").stdout.strip() == ""
    tools.helm("install", RELEASE, str(CHART), "--create-namespace", *base)
    manifest = [
        d for d in yaml.safe_load_all(tools.helm("get", "manifest", RELEASE, "-n", NS).stdout) if d
    ]
    for o in manifest:
        got = client.get(
            o["apiVersion"], o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")
        )
        assert got["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    mwc_name = f"{RELEASE}-webhook"

    def ca_bundle() -> str:
        return str(
            client.get("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", mwc_name)[
                "webhooks"
            ][0]["clientConfig"]["caBundle"]
        )

    ca0, tls0, bundle0 = (
        _secret_data(client, f"{RELEASE}-webhook-ca"),
        _secret_data(client, f"{RELEASE}-webhook-tls"),
        ca_bundle(),
    )
    assert base64.b64decode(bundle0) == base64.b64decode(ca0["tls.crt"])
    tools.helm("upgrade", RELEASE, str(CHART), *base)
    assert (
        _secret_data(client, f"{RELEASE}-webhook-ca"),
        _secret_data(client, f"{RELEASE}-webhook-tls"),
        ca_bundle(),
    ) == (ca0, tls0, bundle0)
    tools.helm("upgrade", RELEASE, str(CHART), *base, "--set", "webhook.certificates.rotate=true")
    tls1 = _secret_data(client, f"{RELEASE}-webhook-tls")
    assert _secret_data(client, f"{RELEASE}-webhook-ca") == ca0 and ca_bundle() == bundle0
    assert (
        tls1["tls.crt"] != tls0["tls.crt"]
        and tls1["tls.key"] != tls0["tls.key"]
        and tls1["ca.crt"] == tls0["ca.crt"]
    )
    # A claim still names gpu.tessera.dev; nothing names the MIG class.
    client.create(
        {
            "apiVersion": RESOURCE,
            "kind": "ResourceClaim",
            "metadata": {"name": "still-used", "namespace": "default"},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}]
                }
            },
        }
    )
    # The pre-delete hook, as the Job would run it: its identity, its arguments.
    hook = tools.render(
        RELEASE,
        NS,
        {"image": {"repository": "registry.example.com/tessera"}},
        show_only="templates/uninstall-hook.yaml",
    )
    (job,) = [o for o in hook if o["kind"] == "Job"]
    rbac = [o for o in hook if o["kind"] != "Job"]
    _apply(tools, rbac, tmp_path / "hook-rbac.yaml")
    hkc = tools.token_kubeconfig(client, f"{RELEASE}-uninstall", NS)
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == [
        "deviceclass-usage",
        f"--keep-used={RELEASE}",
        f"--release-namespace={NS}",
        "gpu.tessera.dev",
        "mig.gpu.tessera.dev",
    ]
    import subprocess
    import sys

    # First (an init container): the webhook's templates go, with the hook's identity.
    init = job["spec"]["template"]["spec"]["initContainers"][0]["args"]
    assert init == ["collect-templates", "--all"]
    client.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {
                "name": "tessera-gpu-00000000000000aa",
                "namespace": "default",
                "labels": {"gpu.tessera.dev/template-hash": "00000000000000aa"},
            },
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "mig.gpu.tessera.dev"}}
                        ]
                    }
                }
            },
        }
    )
    r = subprocess.run(
        [sys.executable, "-m", "tessera", *init, f"--kubeconfig={hkc}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "deleted ResourceClaimTemplate default/tessera-gpu-00000000000000aa" in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "tessera", *args, f"--kubeconfig={hkc}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "DeviceClass gpu.tessera.dev: used by 1 object(s): ResourceClaim default/still-used; kept (detached "
        f"from release {NS}/{RELEASE})",
        "DeviceClass mig.gpu.tessera.dev: unused",
    ]
    out = tools.helm("uninstall", RELEASE, "-n", NS, "--no-hooks").stdout
    assert (
        "1 resource(s) were not deleted because they are not owned by this release:\n[DeviceClass] gpu.tessera.dev"
        in out
    ), out
    tools.kubectl("delete", "-f", str(tmp_path / "hook-rbac.yaml"))
    kept = client.get(RESOURCE, "DeviceClass", "gpu.tessera.dev")
    assert (
        "used by 1 object(s) (ResourceClaim default/still-used)"
        in kept["metadata"]["annotations"]["gpu.tessera.dev/kept-at-uninstall"]
    )
    assert kept["spec"] == device_class()["spec"]

    def gone(o: dict[str, Any]) -> bool:
        try:
            client.get(
                o["apiVersion"], o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")
            )
            return False
        except ApiError as e:
            return e.status == 404

    wait_for(
        lambda: (
            True
            if all(gone(o) for o in manifest if o["metadata"]["name"] != "gpu.tessera.dev")
            else None
        ),
        timeout=60,
        what="every other object of the release to be deleted",
        last=lambda: ", ".join(
            f"{o['kind']} {o['metadata']['name']}" for o in manifest if not gone(o)
        ),
    )
    assert tools.helm("list", "-A", "-q").stdout.strip() == ""
    assert client.list("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration") == []
    assert client.list("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") == []
    pod = client.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "hami-after", "namespace": "default"},
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {
                            "limits": {"nvidia.com/gpumem": "1000", "nvidia.com/gpu": "1"}
                        },
                    }
                ]
            },
        }
    )
    assert pod["metadata"]["name"] == "hami-after"
    with contextlib.suppress(ApiError):
        client.delete("v1", "Pod", "hami-after", "default")
    time.sleep(0)


# ---- migrating a node from HAMi ------------------------------------------------------------------


def test_migration_guide_shows_what_moves(env: Env, tmp_path: Path) -> None:
    """docs/install.md, "Migrating a node", step 1, run as written (kubectl, sed, tessera) on a
    HAMi node: the Node carries HAMi's register annotation (from HAMi's docs) and runs two HAMi
    pods (HAMi's sharing example); the simulation places both pods on Tessera's slices of that
    node's GPUs. The chart's default affinity keeps the node agent off the node (gpu=on), and
    the guard would refuse it there."""
    import os
    import subprocess
    import sys

    from tessera.driver.guard import SecondManagerError, check_node

    from .conftest import CORPUS

    hami = dict(
        line.split(": ", 1)
        for line in (
            CORPUS
            / "inventories"
            / "HAMi__docs_develop_protocol__node-register-annotations.2xV100-PCIE-32GB.txt"
        )
        .read_text()
        .splitlines()
    )
    env.client.create(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": "gpu-3",
                "labels": {"gpu": "on", **GPU_NODE_LABELS},
                "annotations": hami,
            },
        }
    )
    pods = [
        p
        for p in yaml.safe_load_all(
            (CORPUS / "hami-pods" / "HAMi__examples_nvidia__use_sharing_card.yaml").read_text()
        )
        if p
    ]
    for (
        p
    ) in pods:  # placed by HAMi's scheduler: bound to the node (kube-system: outside the webhook)
        p["metadata"]["namespace"] = "kube-system"
        p["spec"]["nodeName"] = "gpu-3"
        env.client.create(p)
    try:
        # The chart's node agent does not go there by default...
        (ds,) = [
            o
            for o in env.objects
            if o["kind"] == "DaemonSet" and o["metadata"]["name"] == f"{RELEASE}-node"
        ]
        terms = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert all(
            {"key": "gpu", "operator": "NotIn", "values": ["on"]} in t["matchExpressions"]
            and {"key": "gpu.tessera.dev/mode", "operator": "NotIn", "values": ["legacy"]}
            in t["matchExpressions"]
            for t in terms
        )
        # ... and would refuse to start there.
        with pytest.raises(
            SecondManagerError,
            match=re.escape(
                "Node gpu-3 annotation hami.io/node-nvidia-register; Node gpu-3 annotation "
                "hami.io/node-handshake-nvidia"
            ),
        ):
            check_node(env.client, "gpu-3", ["GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec"])
        text = (REPO / "docs" / "install.md").read_text()
        section = text[text.index("### Migrating a node") :]
        script = re.search(r"```sh\n(.*?)```", section, re.S)
        assert script is not None
        bindir = tmp_path / "bin"
        bindir.mkdir()
        (bindir / "kubectl").write_text(
            f'#!/bin/sh\nexec {build.bin_dir() / "kubectl"} --kubeconfig={env.live.kubeconfig} "$@"\n'
        )
        (bindir / "tessera").write_text(f'#!/bin/sh\nexec {sys.executable} -m tessera "$@"\n')
        for f in bindir.iterdir():
            f.chmod(0o755)
        run = script.group(1).replace("~/.kube/config", str(env.live.kubeconfig))
        r = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", run],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "COLUMNS": "200"},
        )
        assert r.returncode == 0, r.stderr
        # First fit in cluster order: the H100 node, which already runs Tessera, takes both
        # shares on one GPU (HAMi's 40 % and 60 % of its memory, 60 and 40 cores).
        placed = {
            m.group(1): m.group(2)
            for m in re.finditer(r"^(kube-system/gpu-pod\d) {3,}\S+ {3,}(\S+) ", r.stdout, re.M)
        }
        assert placed == {
            "kube-system/gpu-pod1": f"{H100}/gpu-0",
            "kube-system/gpu-pod2": f"{H100}/gpu-0",
        }, r.stdout
        assert "2 pod(s) scheduled, 0 pending." in r.stdout
    finally:
        for p in pods:
            env.client.request(
                "DELETE",
                f"/api/v1/namespaces/kube-system/pods/{p['metadata']['name']}",
                body={"gracePeriodSeconds": 0},
                what="Pod",
            )
        env.client.delete("v1", "Node", "gpu-3")
