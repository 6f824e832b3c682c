"""Which objects name a DeviceClass (``tessera.api.deviceclass.class_users``: what the chart's
uninstall hook asks before Helm may delete a class), on real manifests, and the MIG class."""

from __future__ import annotations

from pathlib import Path

import yaml

from tessera.api.deviceclass import MIG_DEVICE_CLASS_NAME, class_users, mig_device_class

DRA = "dra-manifests"


def docs(corpus: Path, name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((corpus / DRA / name).read_text()) if d]


def test_requests_and_first_available_subrequests(corpus: Path) -> None:
    objs = (
        docs(
            corpus,
            "kubernetes__scheduler_perf_dra_templates__resourceclaimtemplate-first-available.yaml",
        )
        + docs(corpus, "dra-example-driver__demo_examples__basic-multiple-requests.yaml")
        + docs(corpus, "kubernetes-website__examples_dra__resourceclaim.yaml")
    )
    # A subrequest of firstAvailable names the class: the template uses it.
    assert class_users(objs, "test-class") == ["ResourceClaimTemplate test-claim-template"]
    assert class_users(objs, "no-such-class") == ["ResourceClaimTemplate test-claim-template"]
    assert class_users(objs, "gpu.example.com") == [
        "ResourceClaimTemplate basic-multiple-requests/multiple-gpus"
    ]
    assert class_users(objs, "example-device-class") == ["ResourceClaim example-resource-claim"]
    # Pods and Namespaces in the same files are not users; nothing names an unknown class.
    assert class_users(objs, "gpu.tessera.dev") == []


def test_mig_class_selects_tessera_mig_devices_only() -> None:
    cls = mig_device_class()
    assert cls["metadata"]["name"] == MIG_DEVICE_CLASS_NAME == "mig.gpu.tessera.dev"
    (sel,) = cls["spec"]["selectors"]
    assert sel["cel"]["expression"] == (
        'device.driver == "gpu.tessera.dev" && has(device.attributes["gpu.tessera.dev"].type) && '
        'device.attributes["gpu.tessera.dev"].type == "mig"'
    )
