"""Pure parts of tessera.kube and tessera.localcluster (no Go build, no control plane): slice
inputs, Node objects, the local PKI, kubeconfig parsing, status of a stopped cluster."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tessera.cli.cluster import cluster
from tessera.kube.client import KubeClient, KubeconfigError
from tessera.localcluster.cluster import (
    Cluster,
    ClusterInputError,
    NodeSpec,
    load_slice_files,
    node_object,
)
from tessera.localcluster.pki import make_pki

from .conftest import session_nodes, write_slices

SLICE = """apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: %s, uid: abc, resourceVersion: "7"}
spec:
  driver: gpu.tessera.dev
  nodeName: %s
  pool: {name: %s, generation: 1, resourceSliceCount: 1}
  devices: []
"""


def test_inventory_slices_file_gives_two_nodes(tmp_path: Path) -> None:
    inv = load_slice_files([write_slices(tmp_path / "slices.yaml", session_nodes())])
    assert [n.name for n in inv.nodes] == ["h100-node", "a5000-node"]
    assert [s["metadata"]["name"] for s in inv.slices] == [
        "h100-node-gpu.tessera.dev",
        "a5000-node-gpu.tessera.dev",
    ]
    assert [d["name"] for d in inv.slices[0]["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]
    assert [d["name"] for d in inv.slices[1]["spec"]["devices"]] == ["gpu-0", "gpu-1"]


def test_slice_files_lists_and_server_fields(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(
        SLICE % ("a", "n1", "n1")
        + "---\napiVersion: v1\nkind: List\nitems:\n"
        + "".join(
            "- " + (SLICE % (name, node, node)).replace("\n", "\n  ").rstrip() + "\n"
            for name, node in [("b", "n2"), ("c", "n1")]
        )
    )
    inv = load_slice_files([f])
    assert [n.name for n in inv.nodes] == ["n1", "n2"]
    assert [s["metadata"] for s in inv.slices] == [{"name": "a"}, {"name": "b"}, {"name": "c"}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: Pod\napiVersion: v1\n", "document 1: apiVersion/kind is 'v1'/'Pod'"),
        (
            "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: x}\nspec: {pool: {name: p}}\n",
            "document 1: ResourceSlice x: spec.driver is missing",
        ),
        (
            "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: x}\nspec: {driver: d}\n",
            "ResourceSlice x: spec.pool.name is missing",
        ),
        ("a: [\n", "not valid YAML"),
    ],
)
def test_slice_file_errors_name_document_and_field(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ClusterInputError) as err:
        load_slice_files([f])
    assert str(err.value).startswith(f"{f}: ") or str(err.value).startswith(f"--slices {f}: ")
    assert message in str(err.value)


def test_node_object_ready_with_capacity() -> None:
    node = node_object(
        NodeSpec("n1", {"gpu": "h100"}), {"cpu": "8", "memory": "64Gi", "pods": "110"}
    )
    assert node["metadata"]["labels"] == {
        "kubernetes.io/hostname": "n1",
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "tessera.dev/simulated-node": "true",
        "gpu": "h100",
    }
    assert (
        node["status"]["capacity"]
        == node["status"]["allocatable"]
        == {"cpu": "8", "memory": "64Gi", "pods": "110"}
    )
    (ready,) = node["status"]["conditions"]
    assert (ready["type"], ready["status"]) == ("Ready", "True")


def test_pki_chain_and_identities(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    ca = x509.load_pem_x509_certificate(pki.ca.cert.read_bytes())
    api = x509.load_pem_x509_certificate(pki.apiserver.cert.read_bytes())
    admin = x509.load_pem_x509_certificate(pki.admin.cert.read_bytes())
    api.verify_directly_issued_by(ca)
    admin.verify_directly_issued_by(ca)
    sans = api.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {
        "127.0.0.1",
        "10.96.0.1",
    }
    assert "kubernetes.default.svc" in sans.get_values_for_type(x509.DNSName)
    assert (
        admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    )
    eku = admin.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert oct(pki.admin.key.stat().st_mode & 0o777) == "0o600"
    # The files load as a TLS client identity trusting the CA.
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
    ctx.load_cert_chain(str(pki.admin.cert), str(pki.admin.key))


def test_kubeconfig_errors(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError, match="cannot read"):
        KubeClient.from_kubeconfig(tmp_path / "missing")
    kc = tmp_path / "kc"
    kc.write_text(
        "current-context: c\ncontexts: [{name: c, context: {cluster: x, user: u}}]\nclusters: [{name: x, "
        "cluster: {}}]\nusers: [{name: u, user: {}}]\n"
    )
    with pytest.raises(KubeconfigError, match=r"clusters\[x\].server is missing"):
        KubeClient.from_kubeconfig(kc)


def test_status_and_down_of_never_started_cluster(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(cluster, ["status", "--state-dir", str(tmp_path)])
    assert res.exit_code == 3
    assert "cluster: stopped" in res.output
    res = runner.invoke(cluster, ["down", "--state-dir", str(tmp_path)])
    assert res.exit_code == 0 and "nothing was running" in res.output
    assert Cluster(tmp_path).running_components() == []


def test_cluster_description_through_load_cluster() -> None:
    """--cluster reads the bundled cluster file with the simulation's own loader
    (tessera.sim.cluster.load_cluster): every node with its labels, taints and slices."""
    from tessera.cli._common import examples_dir
    from tessera.cli.cluster import load_cluster_file
    from tessera.sim.cluster import load_cluster

    desc = examples_dir() / "cluster.yaml"
    described = load_cluster(desc)
    inv = load_cluster_file(desc)
    assert [(n.name, n.labels) for n in inv.nodes] == [
        (n.name, dict(n.labels)) for n in described.nodes
    ]
    assert [s["metadata"]["name"] for s in inv.slices] == [
        s["metadata"]["name"] for n in described.nodes for s in n.slices
    ]
    assert len(inv.slices) >= 2 and all(
        s["spec"]["driver"] == "gpu.tessera.dev" for s in inv.slices
    )
