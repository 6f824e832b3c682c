"""kube-scheduler's node filters, decided once (tessera.scheduler.nodes.node_refusal) and read
by the simulation's FitError, its pending reasons and explain alike."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from tessera.allocator.model import Node
from tessera.cli import main
from tessera.scheduler.nodes import NodeFilter, node_refusal

REPO = Path(__file__).resolve().parents[2]
H100 = (
    REPO
    / "src/tessera/examples/inventories/gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
)
TAINT = {"key": "dedicated", "value": "training", "effect": "NoSchedule"}


def test_filters_refuse_in_kube_schedulers_order() -> None:
    node = Node("gpu-1", {"zone": "a"})
    only_gpu_2 = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-2"]}]}
        ]
    }
    elsewhere = {
        "metadata": {"name": "c", "namespace": "ns"},
        "status": {"allocation": {"nodeSelector": only_gpu_2}},
    }
    # A DaemonSet pod's pin: NodeAffinity's PreFilter leaves the other nodes out.
    pinned = {
        "spec": {
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": only_gpu_2}
            }
        }
    }
    # Node affinity comes before taints, taints before the claims' allocation.
    wrong_zone = node_refusal({"spec": {"nodeSelector": {"zone": "b"}}}, node, [TAINT], [elsewhere])
    assert wrong_zone is not None and wrong_zone.filter is NodeFilter.AFFINITY
    assert wrong_zone.reason == "node(s) didn't match Pod's node affinity/selector"
    pin = node_refusal(pinned, node, [TAINT])
    assert pin is not None and pin.filter is NodeFilter.AFFINITY_PREFILTER
    assert pin.reason == "node(s) didn't satisfy plugin(s) [NodeAffinity]"
    assert pin.explanation == "didn't match Pod's node affinity/selector"
    taint = node_refusal({"spec": {}}, node, [TAINT], [elsewhere])
    assert taint is not None and taint.filter is NodeFilter.TAINT
    assert taint.reason == "node(s) had untolerated taint {dedicated: training}"
    tolerated = {"spec": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}}
    claim = node_refusal(tolerated, node, [TAINT], [elsewhere])
    assert claim is not None and claim.filter is NodeFilter.CLAIM_ELSEWHERE
    assert claim.reason == "resourceclaim not available on the node"
    assert claim.explanation == (
        "resourceclaim not available on the node: claim ns/c is allocated for another node"
    )
    assert node_refusal(tolerated, Node("gpu-2"), [TAINT], [elsewhere]) is None
    # PreferNoSchedule never refuses.
    assert node_refusal({"spec": {}}, node, [{**TAINT, "effect": "PreferNoSchedule"}]) is None


def test_pending_reason_counts_each_node_once_and_explains_only_usable_nodes(
    tmp_path: Path,
) -> None:
    """Two nodes of 8 H100s, one tainted; two pods asking 8 GPUs each. The second pod's FitError
    counts the tainted node once (it counted it twice: the first pod's scan went on past its fit
    and added to the counts it had saved for the next pod), and its explanation reads only the
    node it may use (the tainted node's 8 free GPUs are not "the nodes it may use")."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "apiVersion: tessera.dev/v1alpha1\nkind: Cluster\nmetadata: {name: t}\nnodes:\n"
        f"- name: gpu\n  inventory: {H100}\n"
        f"- name: tainted\n  inventory: {H100}\n"
        "  taints: [{key: dedicated, value: training, effect: NoSchedule}]\n"
    )
    pods = tmp_path / "pods.yaml"
    pods.write_text(
        "".join(
            f"---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {n}}}\nspec:\n"
            "  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 8}}}]\n"
            for n in ("first", "second")
        )
    )
    r = CliRunner().invoke(main, ["simulate", "--cluster", str(cluster), str(pods), "-o", "json"])
    assert r.exit_code == 0, r.output
    items = json.loads(r.stdout)["items"]
    pods_out = {o["metadata"]["name"]: o for o in items if o["kind"] == "Pod"}
    assert pods_out["first"]["spec"]["nodeName"] == "gpu"
    message = pods_out["second"]["status"]["conditions"][0]["message"]
    head, _, explanation = message.partition(". ")
    assert head == (
        "0/2 nodes are available: 1 cannot allocate all claims, "
        "1 node(s) had untolerated taint {dedicated: training}"
    )
    assert explanation.startswith("claim default/second-c-gpu, request gpu")
    assert "8 GPUs on the 1 node it may use match its selectors, none has room now" in explanation
    assert "tainted/" not in explanation
