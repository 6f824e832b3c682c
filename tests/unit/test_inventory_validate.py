"""validate_resource_slice against the API server's rules, and the bundled example inputs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

import tessera
from corpus_paths import corpus_path
from tessera.api.slice_validation import validate_resource_slice as validate
from tessera.inventory import build_resource_slices, load_inventory, load_topology

EXAMPLES = Path(tessera.__file__).resolve().parent / "examples"


def good() -> dict[str, Any]:
    (s,) = build_resource_slices(
        "node-1",
        load_inventory(
            EXAMPLES / "inventories" / "telegraf__nvidia_smi_testdata__dual_a5000-v13.xml"
        ),
    )
    assert validate(s) == []
    return s


def dev0(s: dict[str, Any]) -> dict[str, Any]:
    d: dict[str, Any] = s["spec"]["devices"][0]
    return d


def test_request_policy_forbidden_on_dedicated_device() -> None:
    s = good()
    del dev0(s)["allowMultipleAllocations"]
    assert validate(s) == [
        "spec.devices[0].capacity[memory].requestPolicy: forbidden unless allowMultipleAllocations is true",
        "spec.devices[0].capacity[cores].requestPolicy: forbidden unless allowMultipleAllocations is true",
    ]


def test_version_must_be_strict_semver() -> None:
    s = good()
    dev0(s)["attributes"]["driverVersion"] = {"version": "590.44.01"}
    assert validate(s) == [
        "spec.devices[0].attributes[driverVersion].version: '590.44.01' is not a semantic "
        "version 2.0.0 (e.g. 535.161.8)"
    ]


def test_string_attribute_limit_and_names() -> None:
    s = good()
    attrs = dev0(s)["attributes"]
    attrs["productName"] = {"string": "x" * 65}
    attrs["a" * 33] = {"int": 1}
    attrs["bad/domain/name"] = {"bool": True}
    attrs["two"] = {"int": 1, "string": "1"}
    assert validate(s) == [
        "spec.devices[0].attributes[productName].string: longer than 64 characters (65)",
        f"spec.devices[0].attributes[{'a' * 33}]: {'a' * 33!r} is not a C identifier of at most 32 characters",
        "spec.devices[0].attributes[bad/domain/name]: more than one '/'",
        "spec.devices[0].attributes[two]: exactly one of int, bool, string, version must be set (found ['int', "
        "'string'])",
    ]


def test_too_many_attributes_and_devices() -> None:
    s = good()
    dev0(s)["attributes"].update({f"extra{i}": {"int": i} for i in range(25)})
    assert validate(s) == [
        "spec.devices[0]: 35 attributes + 2 capacities exceed 32"
    ]  # 10 published (incl. unit) + 25
    s = good()
    base = dev0(s)
    s["spec"]["devices"] = [{**copy.deepcopy(base), "name": f"gpu-{i}"} for i in range(129)]
    assert validate(s) == ["spec.devices: 129 devices exceed the limit of 128"]


def test_range_policy_rules() -> None:
    s = good()
    mem = dev0(s)["capacity"]["memory"]
    mem["requestPolicy"] = {"default": "1536Ki", "validRange": {"min": "1Mi", "step": "1Mi"}}
    assert validate(s) == [
        "spec.devices[0].capacity[memory].requestPolicy.default: not min + k*step"
    ]
    mem["requestPolicy"] = {"validRange": {"min": "1Mi", "max": "100Gi"}}
    assert validate(s) == [
        "spec.devices[0].capacity[memory].requestPolicy.default: required when validValues or validRange is set",
        "spec.devices[0].capacity[memory].requestPolicy.validRange.max: exceeds the capacity value",
    ]


def test_slice_level_rules() -> None:
    s = good()
    s["spec"]["allNodes"] = True
    s["spec"]["pool"]["resourceSliceCount"] = 0
    s["spec"]["driver"] = "GPU.tessera.dev"
    s["spec"]["devices"].append(copy.deepcopy(dev0(s)))
    assert validate(s) == [
        "spec.driver: 'GPU.tessera.dev' is not a lower-case DNS subdomain <= 63",
        "spec.pool.resourceSliceCount: 0 is not an integer > 0",
        "spec: exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection must be set (found "
        "['nodeName', 'allNodes'])",
        "spec.devices[2].name: duplicate device name 'gpu-0'",
    ]
    assert validate({"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceSlice"}) == [
        "apiVersion: 'resource.k8s.io/v1beta1' is not 'resource.k8s.io/v1'",
        "metadata.name: must be a DNS subdomain of at most 253 characters",
        "spec: required",
    ]


@pytest.mark.parametrize(
    "name",
    sorted(
        str(p.relative_to(EXAMPLES))
        for p in EXAMPLES.glob("*/*")
        if p.is_file() and p.parent.name in ("inventories", "topologies")
    ),
)
def test_bundled_examples_are_byte_copies_of_the_corpus(name: str) -> None:
    corpus = corpus_path() / name
    assert corpus.is_file(), f"corpus file missing: {corpus} (set TESSERA_CORPUS)"
    original = corpus.read_bytes()
    sources = (EXAMPLES / "SOURCES.md").read_text(encoding="utf-8")
    for old, new in BUNDLED_EDITS.get(name, ()):
        assert original.count(old) == 1
        original = original.replace(old, new)
        assert f"`{old.decode()}` → `{new.decode()}`" in sources
    assert (EXAMPLES / name).read_bytes() == original
    assert f"`{Path(name).name}`" in sources


#: The edits SOURCES.md lists ("Edits"): the bundled copy is the corpus file with these applied.
BUNDLED_EDITS = {
    "inventories/telegraf__nvidia_smi_testdata__a100-sxm4-v12.xml": [
        (b"<attached_gpus>4</attached_gpus>", b"<attached_gpus>1</attached_gpus>")
    ],
}


def test_the_bundled_default_cluster_loads_without_a_warning() -> None:
    # Issue 22 item 14: the first thing `make simulate` printed was a warning about the example.
    from click.testing import CliRunner

    from tessera.cli import main

    r = CliRunner().invoke(main, ["simulate"])
    assert r.exit_code == 0 and r.stderr == ""


def test_bundled_default_node_inputs() -> None:
    inv, top = EXAMPLES / "inventories", EXAMPLES / "topologies"
    h100 = load_inventory(
        inv / "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
    )
    topo = load_topology(top / "litgpt__tests_test_utils__topo-m.8xGPU-NV12-10nic.txt")
    (s,) = build_resource_slices("h100-node", h100, topo)
    assert validate(s) == []
    assert {d["attributes"]["nvlinkDomain"]["int"] for d in s["spec"]["devices"]} == {0}
    a100 = load_inventory(inv / "telegraf__nvidia_smi_testdata__a100-sxm4-v12.xml")
    (m,) = build_resource_slices("a100-mig-node", a100)
    assert [d["name"] for d in m["spec"]["devices"]] == [f"gpu-0-mig-{gi}-0" for gi in (3, 4, 5, 6)]
    assert {d["capacity"]["memory"]["value"] for d in m["spec"]["devices"]} == {"19968Mi"}
    assert (
        len(load_topology(top / "litgpt__tests_test_utils__topo-m.8xGPU-NV12-10nic.txt").links)
        == 56
    )


def test_counter_set_names_in_shared_counters_and_consumes_counters() -> None:
    """The API server's rule for a list of counter sets (DNS-label names, unique, a counters
    map) holds for a slice's ``sharedCounters`` and a device's ``consumesCounters`` alike."""
    s = good()
    counters = {"memory": {"value": "24Gi"}}
    dev0(s)["consumesCounters"] = [
        {"counterSet": "gpu-0", "counters": counters},
        {"counterSet": "gpu-0", "counters": counters},
    ]
    shared = copy.deepcopy(s)
    del shared["spec"]["devices"]
    shared["spec"]["sharedCounters"] = [
        {"name": "gpu-0", "counters": counters},
        {"name": "gpu-0", "counters": counters},
        {"counters": counters},
    ]
    assert validate(s) == [
        "spec.devices[0].consumesCounters[1].counterSet: duplicate counter set 'gpu-0'"
    ]
    dev0(s)["consumesCounters"] = [{"counterSet": "GPU_1", "counters": {"memory": {}}}]
    assert validate(s) == [
        "spec.devices[0].consumesCounters[0].counterSet: 'GPU_1' is not a DNS label",
        "spec.devices[0].consumesCounters[0].counters[memory].value: required",
    ]
    dev0(s)["consumesCounters"] = [
        {"counterSet": f"gpu-{i}", "counters": counters} for i in range(3)
    ]
    assert validate(s) == ["spec.devices[0].consumesCounters: must be a list of at most 2 entries"]
    assert validate(shared) == [
        "spec.sharedCounters[1].name: duplicate counter set 'gpu-0'",
        "spec.sharedCounters[2].name: None is not a DNS label",
    ]
    shared["spec"]["sharedCounters"] = {"gpu-0": counters}
    assert validate(shared) == ["spec.sharedCounters: must be a list of at most 8 counter sets"]
