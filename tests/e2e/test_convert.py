"""``tessera convert`` output applied to a real control plane, and a GPU without a memory
figure (unified memory) scheduled by the real kube-scheduler.

Single-node clusters, so nothing is random: the real scheduler's allocations must be those
``tessera simulate`` predicts for the HAMi originals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from tessera.api.loader import load_file
from tessera.cli import main
from tessera.kube.workloads import apply_objects, load_objects
from tessera.sim.cluster import SimNode
from tessera.sim.simulate import Simulation

from .conftest import CORPUS, H100_INVENTORY, StartCluster, corpus_node, sim_cluster
from .test_simulate import comparable, live_allocations, sim_allocations, wait_verdict

pytestmark = pytest.mark.cluster

GB10_INVENTORY = (
    Path(__file__).resolve().parents[1]
    / "data"
    / "new-hardware"
    / "gb10-dgx-spark.nvidia-smi-q.txt"
)
HAMI = CORPUS / "hami-pods"
#: Corpus HAMi pods (all named gpu-pod upstream, renamed here): a percentage, a plain share,
#: and exclusive whole GPUs.
PODS = {
    "fraction": "HAMi__examples_nvidia__use_memory_fraction.yaml",
    "share": "HAMi__examples_nvidia__default_use.yaml",
    "exclusive": "HAMi__examples_nvidia__use_exclusive_card.yaml",
}


def _convert(node: SimNode, inventory: Path, files: list[Path]) -> tuple[list[dict[str, Any]], str]:
    r = CliRunner().invoke(
        main, ["convert", "--node", f"{node.name}={inventory}", *map(str, files)]
    )
    assert r.exit_code == 0, r.stderr
    return load_objects(r.stdout), r.stderr


def _simulate(nodes: list[SimNode], files: list[Path]) -> Any:
    manifests = [m for f in files for m in load_file(f)]
    return Simulation(sim_cluster(nodes), manifests, seed=1).run()


def test_converted_hami_pods_schedule_as_simulated(
    fresh_cluster: StartCluster, tmp_path: Path
) -> None:
    """The corpus HAMi pods, converted by ``tessera convert`` and applied one at a time to a
    single 8x H100 node: the API server accepts every template (its CEL compiles there, the
    ``has()``-guarded memory selectors of a percentage included) and the scheduler allocates
    exactly what ``tessera simulate`` predicts for the unconverted originals."""
    node = corpus_node("h100-node", H100_INVENTORY)
    originals = []
    for name, file in PODS.items():
        pod = yaml.safe_load((HAMI / file).read_text())
        pod["metadata"]["name"] = name
        f = tmp_path / f"{name}.yaml"
        f.write_text(yaml.safe_dump(pod, sort_keys=False))
        originals.append(f)
    live = fresh_cluster([node])
    ns = "default"
    for f in originals:
        objects, _ = _convert(node, H100_INVENTORY, [f])
        assert [o["kind"] for o in objects] == ["ResourceClaimTemplate", "Pod"]
        apply_objects(live.client, objects, namespace=ns)
        assert wait_verdict(live.client, f.stem, ns)[0] == "h100-node"
    predicted = sim_allocations(_simulate([node], originals))
    got = live_allocations(live.client, ns)
    assert set(got) == set(PODS)
    for pod, refs in got.items():
        assert {k: comparable(v) for k, v in refs.items()} == {
            k: comparable(v) for k, v in predicted[pod].items()
        }, pod


def test_unified_memory_gpu_is_handed_out_whole_by_the_real_scheduler(
    fresh_cluster: StartCluster, tmp_path: Path
) -> None:
    """A GB10 (memory N/A) published as a dedicated device with cores only: a whole-GPU pod
    gets it (no shareID), a memory share and a second whole-GPU pod stay pending, as
    ``tessera simulate`` says."""
    node = corpus_node("spark", GB10_INVENTORY)
    (dev,) = [d for s in node.slices for d in s["spec"]["devices"]]
    assert "allowMultipleAllocations" not in dev and set(dev["capacity"]) == {"cores"}
    pod = (
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers:\n  - name: c\n    image: "
        "x\n    resources: {{limits: {{{res}}}}}\n"
    )
    files = []
    for name, res in [
        ("whole", "nvidia.com/gpu: 1"),
        ("share", "nvidia.com/gpu: 1, nvidia.com/gpumem: 4096"),
        ("whole-2", "nvidia.com/gpu: 1"),
    ]:
        f = tmp_path / f"{name}.yaml"
        f.write_text(pod.format(name=name, res=res))
        files.append(f)
    live = fresh_cluster([node])
    ns = "default"
    verdicts = {}
    for f in files:
        objects, err = _convert(node, GB10_INVENTORY, [f])
        assert "memory total is N/A" in err
        apply_objects(live.client, objects, namespace=ns)
        verdicts[f.stem] = wait_verdict(live.client, f.stem, ns)
    assert verdicts["whole"] == ("spark", "")
    assert verdicts["share"][0] is None and verdicts["whole-2"][0] is None
    result = _simulate([node], files)
    assert result.scheduled == [f"{ns}/whole"]
    predicted = sim_allocations(result)
    got = live_allocations(live.client, ns)
    for name in ("whole", "share", "whole-2"):
        assert {k: comparable(v) for k, v in got[name].items()} == {
            k: comparable(v) for k, v in predicted[name].items()
        }
    whole = got["whole"]["c-gpu"]
    assert whole is not None
    (r,) = whole["devices"]["results"]
    assert (r["device"], r.get("shareID"), r.get("consumedCapacity")) == ("gpu-0", None, None)
    for name in ("share", "whole-2"):
        sim_reason = next(p.reason for p in result.pending if p.pod == f"{ns}/{name}")
        assert verdicts[name][1].split(".", 1)[0] == sim_reason.split(".", 1)[0]
