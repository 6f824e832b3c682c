"""``tessera driver`` with an older enforcement library on the node (docs/install.md,
"Supported skew"): over the kubelet plugin protocol, a claim whose limits file the library could
not read is refused at prepare, that claim only (a dynamic-MIG instance made for it is destroyed
again); a claim of shares only is prepared for it.

The older library is the previous release's (``previous_release.PREVIOUS``, built from git): it
reads limits file version 1 only and has no ``.tessera_formats`` section.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from previous_release import build_previous
from tessera.enforcement.limits import read_limits

from .driverkit import *  # noqa: F403 (fixtures)
from .driverkit import DriverEnv, DriverProcess, admin_result, allocated_claim
from .test_driver_mig import checkpoint, driver, mig_env, mig_log, ref_of

pytestmark = pytest.mark.cluster
__all__ = ["mig_env"]

SHARE = "0b0d3b4e-9f0c-4cf5-8c8e-0123456789ab"


def _previous_library(tmp: Path) -> Path:
    return build_previous(tmp)


def _share(device: str) -> dict[str, object]:
    return {
        "request": "gpu",
        "driver": "gpu.tessera.dev",
        "device": device,
        "shareID": SHARE,
        "consumedCapacity": {"memory": "1Gi", "cores": "10"},
    }


def test_a_claim_the_older_library_could_not_read_is_refused_at_prepare(
    driver_env: DriverEnv, kube_namespace: str, tmp_path: Path
) -> None:
    env, ns = driver_env, kube_namespace
    old_lib = _previous_library(tmp_path)
    env.client.request(
        "PATCH",
        f"/api/v1/namespaces/{ns}",
        content_type="application/merge-patch+json",
        body={"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}},
    )
    shares = allocated_claim(
        env.client, ns, "shares", [{**_share("gpu-1"), "pool": env.node}], env.node
    )
    mixed = allocated_claim(
        env.client,
        ns,
        "mixed",
        [
            {**_share("gpu-2"), "pool": env.node},
            admin_result(env.node, "gpu-5"),
        ],
        env.node,
    )
    refs = [(ns, c["metadata"]["name"], c["metadata"]["uid"]) for c in (shares, mixed)]
    (_, _, shares_uid), (_, _, mixed_uid) = refs

    d = DriverProcess(env, "--library", str(old_lib)).start()
    assert d.returncode is None, d.output
    try:
        kubelet = env.kubelet()
        resp = kubelet.prepare(refs)
        assert resp.claims[shares_uid].error == ""
        lim = read_limits(str(env.state_dir / "claims" / shares_uid / "limits"))
        assert (lim.version, lim.unlimited) == (1, ())
        assert resp.claims[mixed_uid].error == (
            f"ResourceClaim {ns}/mixed: its limits file needs version 2 for its 'unlimited' "
            "line(s) (the claim's whole or adminAccess devices beside a share), but the "
            f"enforcement library {old_lib} reads limits file version 1 only (it predates "
            "versioned limits files); upgrade the node's enforcement library to this driver's "
            "(the chart's init container installs it at start; docs/install.md, 'Supported skew')"
        )
        assert not (env.state_dir / "claims" / mixed_uid).exists()
        assert not (env.cdi_dir / f"gpu.tessera.dev-claim_{mixed_uid}.json").exists()
        kubelet.close()
    finally:
        d.stop()
    assert (
        f"enforcement library {old_lib} reads limits file version 1 only (it predates "
        "versioned limits files)"
    ) in d.output

    # The node's library upgraded (this driver's, the default): the same claim is prepared,
    # in version 2, and the claim prepared before is served as recorded.
    d = DriverProcess(env).start()
    assert d.returncode is None, d.output
    try:
        kubelet = env.kubelet()
        resp = kubelet.prepare(refs)
        assert [resp.claims[u].error for u in (shares_uid, mixed_uid)] == ["", ""]
        lim = read_limits(str(env.state_dir / "claims" / mixed_uid / "limits"))
        assert (lim.version, lim.unlimited) == (2, (env.gpus[5].uuid,))
        assert read_limits(str(env.state_dir / "claims" / shares_uid / "limits")).version == 1
        kubelet.unprepare(refs)
        kubelet.close()
    finally:
        d.stop()


def test_a_refused_claim_gives_back_the_mig_instance_made_for_it(
    mig_env: DriverEnv, kube_namespace: str, tmp_path: Path
) -> None:
    """A dynamic-MIG device beside a share: the instance is made before the limits file can
    be checked against the older library; the claim is refused, and the instance made for it
    is destroyed (not left recorded for a claim every retry refuses)."""
    env, ns = mig_env, kube_namespace
    old_lib = _previous_library(tmp_path)
    claim = allocated_claim(
        env.client,
        ns,
        "mig-and-share",
        [
            {
                "request": "gpu",
                "driver": "gpu.tessera.dev",
                "pool": env.node,
                "device": "gpu-0-mig-1g10gb-6",
            },
            {**_share("gpu-5"), "pool": env.node},
        ],
        env.node,
    )
    ref = ref_of(claim)
    d = driver(env, "--library", str(old_lib)).start()
    assert d.returncode is None, d.output
    try:
        kubelet = env.kubelet()
        resp = kubelet.prepare([ref])
        assert "its limits file needs version 2 for its 'unlimited' line(s)" in (
            resp.claims[ref[2]].error
        )
        kubelet.close()
        assert d.proc is not None
        ops = [op for op, _rest, pid in mig_log(env) if pid == d.proc.pid]
        assert ops == ["create-gi", "create-ci", "destroy-ci", "destroy-gi"], mig_log(env)
        assert ref[2] not in checkpoint(env)
        assert not (env.state_dir / "claims" / ref[2]).exists()
    finally:
        d.stop()
