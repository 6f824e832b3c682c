"""Which device fields a selector can read (tessera.cel.reading.device_fields), the allocator's
memo key built on it, and the memo's answers against evaluating every device."""

from __future__ import annotations

import pytest

from tessera.allocator import Allocator, slice_from_dict
from tessera.cel import compile_selector
from tessera.cel.reading import device_fields

D = "gpu.tessera.dev"


def fields(expr: str) -> set[tuple[str, str]] | None:
    got = device_fields(compile_selector(expr).tree)
    return None if got is None else set(got)


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ('device.driver == "gpu.tessera.dev"', set()),
        ("device.allowMultipleAllocations", set()),
        (
            'device.attributes["gpu.tessera.dev"].productName.startsWith("NVIDIA A100")',
            {("attributes", f"{D}/productName")},
        ),
        (  # HAMi's UUID pin as the converter writes it
            f'device.attributes["{D}"].uuid in ["GPU-1", "GPU-2"]',
            {("attributes", f"{D}/uuid")},
        ),
        (
            f'has(device.attributes["{D}"].numa) && device.attributes["{D}"]["numa"] == 1',
            {("attributes", f"{D}/numa")},
        ),
        (
            f'device.attributes[?"{D}"][?"type"].orValue("") == "mig" && '
            f'device.capacity["{D}"].memory.compareTo(quantity("40Gi")) >= 0',
            {("attributes", f"{D}/type"), ("capacity", f"{D}/memory")},
        ),
    ],
)
def test_named_fields(expr: str, want: set[tuple[str, str]]) -> None:
    assert fields(expr) == want


@pytest.mark.parametrize(
    "expr",
    [
        f'device.attributes["{D}"].exists(k, k == "uuid")',  # the domain map enumerated
        f'size(device.attributes["{D}"]) > 2',
        f'"uuid" in device.attributes["{D}"]',
        f'cel.bind(a, device.attributes["{D}"], a.uuid == "GPU-1")',  # bound whole
        f'device.attributes["{D}"][device.driver] == 1',  # a computed key
        'device.attributes.exists(d, d == "x")',
        "[1].exists(device, device == 1)",  # a variable named device
    ],
)
def test_fields_it_does_not_name_mean_no_sharing(expr: str) -> None:
    assert fields(expr) is None


def _slice(devices: list[dict]) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": {
            "driver": D,
            "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _gpu(i: int, memory: str, *, qualified: bool = False) -> dict:
    cap = f"{D}/memory" if qualified else "memory"
    return {
        "name": f"gpu-{i}",
        "attributes": {"uuid": {"string": f"GPU-{i}"}, "numa": {"int": i % 2}},
        "capacity": {cap: {"value": memory}},
    }


def test_memo_matches_evaluating_every_device() -> None:
    """Devices that agree on every field an expression names share one result; a field named
    under its qualified name in one slice and its short name in the other still counts."""
    devs = [
        _gpu(0, "80Gi"),
        _gpu(1, "80Gi"),
        _gpu(2, "40Gi", qualified=True),
        _gpu(3, "80Gi", qualified=True),
        _gpu(4, "40Gi"),
    ]
    s = slice_from_dict(_slice(devs))
    exprs = [
        f'device.capacity["{D}"].memory.compareTo(quantity("50Gi")) >= 0',
        f'device.attributes["{D}"].numa == 0',
        f'device.attributes["{D}"].uuid != "GPU-3"',
        f'size(device.attributes["{D}"]) == 2',
    ]
    alloc = Allocator([s], {})
    for e in exprs:
        sel = compile_selector(e)
        want = [sel.evaluate(d.activation()) for d in s.devices]
        got = [alloc.first_false([sel], d, "request gpu") < 0 for d in s.devices]
        assert got == want, e
    assert [alloc.first_false([compile_selector(exprs[0])], d, "r") < 0 for d in s.devices] == [
        True,
        True,
        False,
        True,
        False,
    ]
