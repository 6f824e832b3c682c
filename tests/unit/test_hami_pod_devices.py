"""HAMi's pod device list (``hami.io/vgpu-devices-to-allocate``): the codec the legacy-mode
extender writes with and the device plugin reads with (``tessera.convert.hami``)."""

from __future__ import annotations

import pytest

from corpus_paths import corpus_path
from tessera.convert.hami import (
    DEVICES_TO_ALLOCATE,
    ContainerDevice,
    decode_pod_devices,
    encode_pod_devices,
)

PROTOCOL = (
    corpus_path() / "hami-pods" / "HAMi__docs_develop_protocol__pod-allocation-annotations.txt"
)


def test_hamis_own_protocol_example_decodes_and_encodes_back() -> None:
    """HAMi's protocol document: two containers on one V100, 3000 and 5000 MiB, no core limit."""
    lines = dict(line.split(": ", 1) for line in PROTOCOL.read_text().splitlines() if ": " in line)
    value = lines[DEVICES_TO_ALLOCATE]
    got = decode_pod_devices(value, what=DEVICES_TO_ALLOCATE)
    uuid = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
    assert got == [
        [ContainerDevice(uuid, "NVIDIA", 3000, 0)],
        [ContainerDevice(uuid, "NVIDIA", 5000, 0)],
    ]
    assert encode_pod_devices(got) == value


def test_empty_entries_are_containers_without_gpus() -> None:
    """The reference's example: a non-GPU init container, then two GPU containers."""
    value = ";GPU-a,NVIDIA,3000,30:;GPU-b,NVIDIA,2000,0:;"
    got = decode_pod_devices(value)
    assert [[d.uuid for d in c] for c in got] == [[], ["GPU-a"], ["GPU-b"]]
    assert encode_pod_devices(got) == value
    two = decode_pod_devices("GPU-a,NVIDIA,1000,10:GPU-b,NVIDIA,1000,10:;")
    assert [d.uuid for d in two[0]] == ["GPU-a", "GPU-b"]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("GPU-a,NVIDIA,3000:;", "needs UUID,VENDOR,MiB,cores"),
        ("GPU-a,NVIDIA,3000,lots:;", "whole numbers"),
        ("GPU-a,NVIDIA,-1,0:;", "whole numbers"),
    ],
)
def test_malformed_devices_are_refused_naming_the_annotation(value: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as e:
        decode_pod_devices(value, what=DEVICES_TO_ALLOCATE)
    assert DEVICES_TO_ALLOCATE in str(e.value) and "container entry 0" in str(e.value)
