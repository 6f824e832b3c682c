"""A node reboot under ``tessera driver`` (a real process, the fake NVML, a live control plane,
a fake kubelet over the real unix sockets).

What a reboot takes: the tmpfs paths (CDI specs, claim directories with their limits files and
usage regions), every dynamic MIG instance, and maybe a GPU (it falls off the bus) or its index
(another enumeration order). The checkpoint, on disk, survives. The kubelet then calls prepare
again for the claims it still has. The NVIDIA DRA driver's #951: a claim the checkpoint lists
as prepared was answered from the recorded plan, and the container got a MIG UUID the reboot
had destroyed. Here the driver must re-create each claim or refuse it in one line.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from dataclasses import replace
from typing import Any

import grpc
import pytest

from tessera.enforcement.limits import read_limits

from .driverkit import *  # noqa: F403 (fixtures)
from .driverkit import GIB, DriverEnv, allocated_claim
from .test_driver_mig import DRIVER, checkpoint, driver, mig_env, mig_log, ref_of, spec_of

pytestmark = pytest.mark.cluster
__all__ = ["mig_env"]

SHARE = "7c1f0a3e-5b2d-4e6f-8a9b-{:012x}"


def _share(env: DriverEnv, device: str, i: int) -> dict[str, Any]:
    return {
        "request": "gpu",
        "driver": DRIVER,
        "pool": env.node,
        "device": device,
        "shareID": SHARE.format(i),
        "consumedCapacity": {"memory": "8Gi", "cores": "20"},
    }


def _visible(spec: dict[str, Any]) -> str:
    env = spec["containerEdits"]["env"]
    return str(next(e for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=")).split("=", 1)[1])


def _gpu_nodes(spec: dict[str, Any]) -> list[str]:
    return [n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])]


def test_a_reboot_recreates_or_refuses_each_claim_never_a_stale_uuid_or_missing_file(
    mig_env: DriverEnv, kube_namespace: str
) -> None:
    env = mig_env
    ns = kube_namespace
    u = {g.index: g.uuid for g in env.gpus}
    claims = {
        "mig": allocated_claim(
            env.client,
            ns,
            "mig",
            [
                {
                    "request": "gpu",
                    "driver": DRIVER,
                    "pool": env.node,
                    "device": "gpu-0-mig-1g10gb-6",
                }
            ],
            env.node,
        ),
        "moved": allocated_claim(env.client, ns, "moved", [_share(env, "gpu-3", 1)], env.node),
        "kept": allocated_claim(env.client, ns, "kept", [_share(env, "gpu-5", 2)], env.node),
        "gone": allocated_claim(env.client, ns, "gone", [_share(env, "gpu-6", 3)], env.node),
    }
    refs = {k: ref_of(c) for k, c in claims.items()}
    uid = {k: r[2] for k, r in refs.items()}
    kubelet = env.kubelet()
    d = driver(env).start()
    assert d.returncode is None, d.output
    try:
        reply = kubelet.prepare(list(refs.values()))
        assert {k: reply.claims[uid[k]].error for k in refs} == dict.fromkeys(refs, "")
        before = {k: spec_of(env, uid[k]) for k in refs}
        old_mig = _visible(before["mig"])
        assert old_mig.startswith("MIG-")
        assert "/dev/nvidia3" in _gpu_nodes(before["moved"])
    finally:
        d.proc.kill() if d.proc is not None else None  # power off: no clean stop
        if d.proc is not None:
            d.proc.wait()

    # The reboot: tmpfs is empty, the dynamic MIG instances are gone (destroyed in the fake
    # NVML's state; GPU 2's operator-made ones stay, as MIG Manager re-makes them), GPU 3 and GPU 4
    # enumerate the other way round (UUID of gpu-3 is /dev/nvidia4 now), GPU 6 is off the bus.
    shutil.rmtree(env.cdi_dir)
    shutil.rmtree(env.state_dir / "claims")
    state = env.root / "mig-state"
    state.write_text(
        "".join(
            ln
            for ln in state.read_text().splitlines(keepends=True)
            if not (ln.split()[:1] in (["gi"], ["ci"]) and ln.split()[1] in (u[0], u[1]))
        )
    )
    g3, g4 = env.gpus[3], env.gpus[4]
    env.gpus[3], env.gpus[4] = replace(g4, index=3), replace(g3, index=4)
    env.set_gpus(gone=[u[6]])

    # The kubelet calls prepare again for the claims it still has, from the moment the driver
    # serves (retrying while its socket is not there yet).
    answers: dict[str, Any] = {}

    def kubelet_retries() -> None:
        k = env.kubelet()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                r = k.prepare(list(refs.values()), timeout=20)
                answers.update({n: r.claims[uid[n]].error for n in refs})
                return
            except grpc.RpcError:
                time.sleep(0.05)
        k.close()

    t = threading.Thread(target=kubelet_retries)
    t.start()
    d2 = driver(env).start()
    try:
        t.join(timeout=120)
        assert d2.returncode is None, d2.output
        assert set(answers) == set(refs), d2.output
        out = d2.output
        # The vanished GPU's claim is refused in one line; nothing of it is left.
        assert answers["gone"] == (
            f"ResourceClaim {ns}/gone: status.allocation.devices.results[0].device: GPU {u[6]} "
            "(gpu-6) is gone from this node"
        )
        assert not (env.cdi_dir / f"{DRIVER}-claim_{uid['gone']}.json").exists()
        assert not (env.state_dir / "claims" / uid["gone"]).exists()
        assert uid["gone"] not in checkpoint(env)
        assert (
            f"ResourceClaim {ns}/gone: its recorded plan is stale: GPU {u[6]} (gpu-6) is gone from this node"
            in out
        )
        # The MIG claim gets a new instance at its placement, and its new UUID - never the old.
        assert answers["mig"] == ""
        new_mig = _visible(spec_of(env, uid["mig"]))
        assert new_mig.startswith("MIG-") and new_mig != old_mig
        assert f"uuid={new_mig}" in (env.root / "mig-state").read_text()
        assert old_mig not in (env.root / "mig-state").read_text()
        assert d2.proc is not None
        made = [rest for op, rest, pid in mig_log(env) if pid == d2.proc.pid]
        assert [m.split(" uuid=")[0] for m in made] == [
            f"{u[0]} gi=1 profile=19 start=6 size=1",
            f"{u[0]} gi=1 ci=0 profile=0",
        ]
        assert f"MIG device {old_mig} (gpu-0-mig-1g10gb-6 of GPU {u[0]}) no longer exists" in out
        # The moved GPU's claim names its device node now.
        assert answers["moved"] == ""
        moved = spec_of(env, uid["moved"])
        assert _gpu_nodes(moved) == ["/dev/nvidia4"]
        assert _visible(moved) == u[3]
        assert f"GPU {u[3]} (gpu-3) is /dev/nvidia4 now, not /dev/nvidia3 as recorded" in out
        # The untouched claim is rewritten from its recorded plan, byte for byte the same.
        assert answers["kept"] == ""
        assert spec_of(env, uid["kept"]) == before["kept"]
        # Every claim answered has its files; the checkpoint says prepared with what is on disk.
        cp = checkpoint(env)
        for k in ("mig", "moved", "kept"):
            entry = cp[uid[k]]
            assert entry["state"] == "prepared"
            assert entry["plan"]["cdiSpec"] == spec_of(env, uid[k])
            if k != "mig":
                lim = read_limits(str(env.state_dir / "claims" / uid[k] / "limits"))
                assert [(g.uuid, g.memory, g.cores) for g in lim.gpus] == [
                    (_visible(spec_of(env, uid[k])), 8 * GIB, 20)
                ]
                assert (env.state_dir / "claims" / uid[k] / "region").stat().st_size > 0
        assert json.loads(json.dumps(cp))  # the file is whole JSON
        # Unprepare after the reboot takes everything, the new instance included.
        r = env.kubelet().unprepare(list(refs.values()))
        assert all(not r.claims[x].error for x in uid.values())
        assert checkpoint(env) == {}
        assert not list(env.cdi_dir.glob(f"{DRIVER}-claim_*"))
        assert new_mig not in (env.root / "mig-state").read_text()
    finally:
        d2.stop()
        kubelet.close()


def test_the_nodes_shares_files_are_written_again_at_start(
    mig_env: DriverEnv, kube_namespace: str
) -> None:
    """The node's per-GPU shares files (what best-effort tenants are held to) lost while the
    driver was down, and no prepare after the start that would write them: the driver writes
    them at start from the checkpoint's prepared claims."""
    env = mig_env
    u = {g.index: g.uuid for g in env.gpus}
    claims = [
        allocated_claim(env.client, kube_namespace, f"s{i}", [_share(env, "gpu-5", i)], env.node)
        for i in (1, 2)
    ]
    kubelet = env.kubelet()
    d = driver(env).start()
    assert d.returncode is None, d.output
    try:
        reply = kubelet.prepare([ref_of(c) for c in claims])
        assert [reply.claims[ref_of(c)[2]].error for c in claims] == ["", ""]
    finally:
        d.proc.kill() if d.proc is not None else None
        if d.proc is not None:
            d.proc.wait()
    shares = env.state_dir / "shares"
    assert (shares / u[5]).read_text() == "version 1\nguaranteed 40\nbest-effort 0\n"
    shutil.rmtree(shares)
    d2 = driver(env).start()
    try:
        assert d2.returncode is None, d2.output
        assert {p.name: p.read_text() for p in shares.iterdir()} == {
            u[5]: "version 1\nguaranteed 40\nbest-effort 0\n"
        }
    finally:
        d2.stop()
        kubelet.close()
