"""A container given two Tessera claims: what the enforcement library does with the GPU whose
limits file lost the mount (docs/enforcement.md, section 1; docs/driver.md, section 3).

The container modelled here is the one containerd builds for a pod whose container references
two claims, each a share of a different GPU (or of one GPU): the kubelet hands containerd the
CDI devices in ``pod.spec.resourceClaims`` order, and CDI applies each spec's mounts by removing
a mount of the same destination first, and replaces an environment variable of the same name.
So the container gets the device nodes of both claims' GPUs, but the limits file, the region
and ``CUDA_VISIBLE_DEVICES`` of the last claim only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from native_helpers import PHYS, UUIDS, Build, Claim, GiB, MiB

from tessera.enforcement.limits import GpuLimit

pytestmark = pytest.mark.native

OOM = 2
NOT_PERMITTED = 800
SHARE = 4 * GiB
# The container's GPUs: the device nodes of both claims (claim "a" on GPU 0, "b" on GPU 1).
BOTH = ",".join(f"{u}={PHYS}" for u in UUIDS[:2])


def _container(tmp: Path, build: Build) -> tuple[Claim, Claim]:
    a = Claim(tmp, build, [GpuLimit(UUIDS[0], SHARE, 0)], name="share-a")
    b = Claim(tmp, build, [GpuLimit(UUIDS[1], SHARE, 0)], name="share-b")
    return a, b


def test_the_last_claims_gpu_is_limited_as_the_container_starts(
    tmp_path: Path, plain: Build
) -> None:
    _, b = _container(tmp_path, plain)
    # CUDA_VISIBLE_DEVICES as CDI left it: the last claim's GPU only.
    out = b.tp(
        "link", "init", "dev", "0", "meminfo", "alloc", str(SHARE + MiB),
        FAKE_GPUS=BOTH, CUDA_VISIBLE_DEVICES=UUIDS[1],
    )  # fmt: skip
    assert out == [
        "init 0",
        "dev 0 0",
        f"meminfo 0 free={SHARE} total={SHARE}",
        f"alloc {SHARE + MiB} {OOM}",
    ]


@pytest.mark.parametrize("cvd", [None, f"{UUIDS[0]},{UUIDS[1]}"])
def test_the_other_claims_gpu_is_refused_not_whole(
    tmp_path: Path, anybuild: Build, cvd: str | None
) -> None:
    """The first claim's GPU has device nodes in the container but no limits: the process
    that widens CUDA_VISIBLE_DEVICES (or drops it) reaches it. Before the fix it got the
    whole GPU (``alloc 17179869184 0``, ``meminfo free=total=17179869184``); now its
    contexts are refused with one line naming the GPU."""
    _, b = _container(tmp_path, anybuild)
    env = {"FAKE_GPUS": BOTH}
    if cvd is not None:
        env["CUDA_VISIBLE_DEVICES"] = cvd
    r = b.run(
        "tp_cuda", "link", "init", "dev", "0", "alloc", str(PHYS), "ctx", "0",
        "dev", "1", "alloc", str(SHARE), "alloc", str(MiB), **env,
    )  # fmt: skip
    assert r.stdout.splitlines() == [
        "init 0",
        f"dev 0 {NOT_PERMITTED}",
        f"alloc {PHYS} 201",  # no context: CUDA_ERROR_INVALID_CONTEXT from the driver
        f"ctx 0 {NOT_PERMITTED}",
        "dev 1 0",
        f"alloc {SHARE} 0",
        f"alloc {MiB} {OOM}",
    ]
    lines = [ln for ln in r.stderr.splitlines() if UUIDS[0] in ln]
    assert len(lines) == 1, r.stderr
    assert "this container has more than one Tessera claim" in lines[0]
    assert "use one claim with several requests" in lines[0]


def test_memory_placed_on_the_other_claims_gpu_from_a_covered_context_is_refused(
    tmp_path: Path, plain: Build
) -> None:
    """Without a context on the uncovered GPU: a VMM allocation and a pool located on it,
    asked for from a context on the claim's GPU (ordinal 1), are refused too."""
    _, b = _container(tmp_path, plain)
    r = b.run(
        "tp_cuda", "link", "init", "dev", "1", "vmm", str(GiB), "poolcreate", "dev",
        "palloc", "0", str(GiB), "poolcreate", "dev1", "palloc", "1", str(SHARE + MiB),
        "palloc", "1", str(SHARE), "used", "1",
        FAKE_GPUS=BOTH,
    )  # fmt: skip
    assert r.stdout.splitlines() == [
        "init 0",
        "dev 1 0",
        f"vmm {GiB} {NOT_PERMITTED}",  # location: ordinal 0, the other claim's GPU
        "poolcreate 0 p0",
        f"palloc {GiB} {NOT_PERMITTED}",
        "poolcreate 0 p1",  # the claim's GPU: limited as ever
        f"palloc {SHARE + MiB} {OOM}",
        f"palloc {SHARE} 0",
        f"used 1 {SHARE}",
    ]
    assert sum(UUIDS[0] in ln for ln in r.stderr.splitlines()) == 1, r.stderr


def test_two_shares_of_one_gpu_leave_the_container_the_last_share_only(
    tmp_path: Path, plain: Build
) -> None:
    """Both claims on GPU 0 (4 GiB, then 2 GiB): the GPU is covered by the limits file that won
    the mount, so the container is limited to that share, not to the sum."""
    Claim(tmp_path, plain, [GpuLimit(UUIDS[0], SHARE, 0)], name="share-a")
    b = Claim(tmp_path, plain, [GpuLimit(UUIDS[0], 2 * GiB, 0)], name="share-b")
    out = b.tp(
        "link", "init", "dev", "0", "meminfo", "alloc", str(2 * GiB + MiB), "alloc", str(2 * GiB),
        FAKE_GPUS=f"{UUIDS[0]}={PHYS}",
    )  # fmt: skip
    assert out == [
        "init 0",
        "dev 0 0",
        f"meminfo 0 free={2 * GiB} total={2 * GiB}",
        f"alloc {2 * GiB + MiB} {OOM}",
        f"alloc {2 * GiB} 0",
    ]


def test_a_whole_device_of_the_same_claim_stays_usable(tmp_path: Path, plain: Build) -> None:
    """One claim with a share of GPU 1 and GPU 0 whole (an unlimited line, as prepare writes
    it): GPU 0 is the claim's, so it is not limited."""
    c = Claim(tmp_path, plain, [GpuLimit(UUIDS[1], SHARE, 0)], unlimited=(UUIDS[0],))
    r = c.run(
        "tp_cuda", "link", "init", "dev", "0", "alloc", str(PHYS), "meminfo",
        "dev", "1", "alloc", str(SHARE + MiB),
        FAKE_GPUS=BOTH,
    )  # fmt: skip
    assert r.stdout.splitlines() == [
        "init 0",
        "dev 0 0",
        f"alloc {PHYS} 0",
        f"meminfo 0 free=0 total={PHYS}",
        "dev 1 0",
        f"alloc {SHARE + MiB} {OOM}",
    ]
    assert "more than one Tessera claim" not in r.stderr
