"""Upgrades with version skew (docs/install.md, "Supported skew"): the limits file's versions
between the driver's writer and the libraries that read it (this one and the previous release's,
built from git), and the usage region's version between the library and the monitor.

The previous release is ``previous_release.PREVIOUS``, the last commit before limits file versions were
explicit: its library reads version 1 (with ``unlimited``, which it added inside version 1) and
has no ``.tessera_formats`` section; its writer wrote ``unlimited`` lines in version 1 files.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from native_helpers import NATIVE, PHYS, UUIDS, Build, Claim, GiB, MiB, wait_line

from previous_release import build_previous
from tessera.driver.backend import LIBRARY
from tessera.driver.kubelet import ClaimRef
from tessera.driver.prepare import ClaimError, ClaimPlan, Layout, check_library_reads
from tessera.enforcement import library_path
from tessera.enforcement import region as R
from tessera.enforcement.layout import REGION_FILE
from tessera.enforcement.library import library_formats
from tessera.enforcement.limits import (
    GpuLimit,
    Limits,
    LimitsError,
    format_limits,
    parse_limits,
    required_version,
)
from tessera.monitor.collector import TesseraCollector
from tessera.monitor.regions import RegionDir

pytestmark = pytest.mark.native

LIMIT = 1 * GiB


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ModuleType]:
    """The previous release's enforcement library (built from its sources) and limits writer."""
    tmp = tmp_path_factory.mktemp("previous")
    lib = build_previous(tmp, "src/tessera/enforcement/limits.py")
    spec = importlib.util.spec_from_file_location(
        "previous_limits", tmp / "src/tessera/enforcement/limits.py"
    )
    assert spec is not None and spec.loader is not None
    writer = importlib.util.module_from_spec(spec)
    sys.modules["previous_limits"] = writer  # dataclasses look their module up
    spec.loader.exec_module(writer)
    return lib, writer


def _with_lib(plain: Build, lib: Path) -> Build:
    return Build(plain.root, lib, plain.fake, plain.bin)


def _share(tmp: Path, unlimited: tuple[str, ...] = ()) -> Limits:
    return Limits(
        region=str(tmp / REGION_FILE),
        gpus=(GpuLimit(UUIDS[1], LIMIT, 0),),
        claim="team-a/train",
        claim_uid="uid-train",
        unlimited=unlimited,
    )


def _plan(limits: Limits) -> ClaimPlan:
    """A plan holding the limits file text the driver's writer makes for ``limits``."""
    return ClaimPlan(
        ClaimRef("team-a", "train", "uid-train"), LIBRARY, (), format_limits(limits), (), {}
    )


def _claim_with_text(tmp: Path, build: Build, text: str, name: str) -> Claim:
    c = Claim(tmp, build, [GpuLimit(UUIDS[1], LIMIT, 0)], name=name)
    os.chmod(c.limits_path, 0o644)
    Path(c.limits_path).write_text(text)
    return c


LIMITED = f"meminfo 0 free={LIMIT} total={LIMIT}"
WHOLE = ["dev 0 0", f"meminfo 0 free={PHYS} total={PHYS}"]
NOT_THE_CLAIMS = "dev 0 800"  # CUDA_ERROR_NOT_PERMITTED: a GPU in no line of the file


def _enforced(c: Claim) -> list[str]:
    """What a process sees on GPU 1 (its meminfo: limited to LIMIT), then on GPU 0 (a
    context, and its meminfo when the file lists it unlimited; refused when it does not)."""
    out = c.tp("link", "init", "dev", "1", "meminfo", "dev", "0", "meminfo")[2:]
    return out if out[1] == "dev 0 0" else out[:2]


def _dump(build: Build, path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([build.prog("limits_dump"), path], capture_output=True, text=True)


@pytest.mark.parametrize("unlimited", [(), (UUIDS[0],)], ids=["share", "share+whole"])
def test_the_writer_picks_the_lowest_version_and_both_readers_read_it(
    tmp_path: Path, plain: Build, unlimited: tuple[str, ...]
) -> None:
    lim = _share(tmp_path, unlimited)
    text = format_limits(lim)
    want = 2 if unlimited else 1  # 'unlimited' lines are version 2's
    assert required_version(lim) == want and text.startswith(f"version {want}\n")
    p = tmp_path / "limits"
    p.write_text(text)
    r = _dump(plain, str(p))
    assert r.returncode == 0 and r.stdout == text  # the C reader's canonical form: the same
    back = parse_limits(text)
    assert (back.version, back.unlimited, back.gpus) == (want, unlimited, lim.gpus)
    # ... and the library enforces it: GPU 1 limited, GPU 0 usable only when listed unlimited
    c = _claim_with_text(tmp_path, plain, text.replace(lim.region, str(tmp_path / "r")), "c")
    assert _enforced(c) == ([LIMITED, *WHOLE] if unlimited else [LIMITED, NOT_THE_CLAIMS])


def test_the_previous_writers_files_stay_readable(
    tmp_path: Path, plain: Build, previous: tuple[Path, ModuleType]
) -> None:
    """A claim prepared by the previous driver (``unlimited`` inside version 1) keeps working
    when a container of it starts again under this library, and both readers agree on it."""
    _, writer = previous
    old = writer.Limits(
        region=str(tmp_path / "r"),
        gpus=(writer.GpuLimit(UUIDS[1], LIMIT, 0),),
        unlimited=(UUIDS[0],),
    )
    text = writer.format_limits(old)
    assert text.startswith("version 1\n") and f"unlimited {UUIDS[0]}\n" in text
    p = tmp_path / "limits"
    p.write_text(text)
    r = _dump(plain, str(p))
    assert r.returncode == 0 and r.stdout == text
    back = parse_limits(text)
    assert (back.version, back.unlimited) == (1, (UUIDS[0],))
    assert format_limits(back) == text  # a value read keeps the version it declared
    c = _claim_with_text(tmp_path, plain, text, "legacy")
    assert _enforced(c) == [LIMITED, *WHOLE]


def test_a_newer_file_is_refused_naming_its_version_and_the_versions_read(
    tmp_path: Path, plain: Build
) -> None:
    text = format_limits(_share(tmp_path)).replace("version 1\n", "version 3\n")
    want = (
        "line 1: version 3 is newer than this library reads (versions 1..2): upgrade the node's "
        "enforcement library"
    )
    with pytest.raises(LimitsError) as e:
        parse_limits(text)
    assert str(e.value) == want
    c = _claim_with_text(tmp_path, plain, text, "newer")
    assert _dump(plain, c.limits_path).stdout == f"error: {want}\n"
    r = c.run("tp_cuda", "link", "init", "dev", "1", "alloc", str(MiB))
    assert r.stdout.splitlines()[:2] == ["init 0", "dev 1 2"]  # fails closed: no context
    assert f"{c.limits_path}: {want}; refusing GPU memory" in r.stderr


def test_the_driver_learns_what_each_library_reads_from_its_file(
    tmp_path: Path, plain: Build, previous: tuple[Path, ModuleType]
) -> None:
    old_lib, _ = previous
    new = library_formats(plain.lib)
    assert (new.limits, new.marked) == ((1, 2), True)
    old = library_formats(old_lib)
    assert (old.limits, old.marked) == ((1,), False)
    packaged = library_path()  # what `tessera driver` hands to containers by default
    assert packaged is not None and library_formats(packaged).limits == (1, 2)
    # The chart's init container replaces the library on the host: the next read sees it.
    host = tmp_path / "libtessera-enforce.so"
    shutil.copy(plain.lib, host)
    assert library_formats(host).limits == (1, 2)
    shutil.copy(old_lib, tmp_path / ".new")
    os.replace(tmp_path / ".new", host)
    assert library_formats(host).limits == (1,)


def test_prepare_writes_only_what_the_installed_library_reads(
    tmp_path: Path, plain: Build, previous: tuple[Path, ModuleType]
) -> None:
    old_lib, _ = previous
    layout_old = Layout(tmp_path / "state", tmp_path / "cdi", tmp_path, old_lib, "gpu.tessera.dev")
    layout_new = Layout(
        tmp_path / "state", tmp_path / "cdi", tmp_path, plain.lib, "gpu.tessera.dev"
    )
    share, mixed = _share(tmp_path), _share(tmp_path, (UUIDS[0],))
    # A share alone is a version-1 file: accepted for the previous library, which enforces it.
    check_library_reads(_plan(share), layout_old)
    c = _claim_with_text(tmp_path, _with_lib(plain, old_lib), format_limits(share), "old-share")
    assert _enforced(c) == [LIMITED, NOT_THE_CLAIMS]
    # A share beside a whole GPU needs version 2: refused for the previous library, which
    # would refuse the file (fail closed) ...
    with pytest.raises(ClaimError) as e:
        check_library_reads(_plan(mixed), layout_old)
    assert str(e.value) == (
        "ResourceClaim team-a/train: its limits file needs version 2 for its 'unlimited' line(s) "
        "(the claim's whole or adminAccess devices beside a share), but the enforcement library "
        f"{old_lib} reads limits file version 1 only (it predates versioned limits files); "
        "upgrade the node's enforcement library to this driver's (the chart's init container "
        "installs it at start; docs/install.md, 'Supported skew')"
    )
    c = _claim_with_text(tmp_path, _with_lib(plain, old_lib), format_limits(mixed), "old-mixed")
    r = c.run("tp_cuda", "link", "init", "dev", "1", "alloc", str(MiB))
    assert "unsupported version (this library reads 1)" in r.stderr, r.stderr
    assert "refusing GPU memory" in r.stderr
    # ... and accepted for this library, which enforces it.
    check_library_reads(_plan(mixed), layout_new)
    c = _claim_with_text(tmp_path, plain, format_limits(mixed), "new-mixed")
    assert _enforced(c) == [LIMITED, *WHOLE]
    # A library that cannot be read refuses the claim, naming it.
    gone = Layout(tmp_path / "s", tmp_path / "c", tmp_path, tmp_path / "nope.so", "gpu.tessera.dev")
    with pytest.raises(ClaimError, match=r"cannot read the enforcement library .*nope\.so"):
        check_library_reads(_plan(share), gone)


def test_the_monitor_reports_a_region_of_a_newer_version_and_reads_the_others(
    tmp_path: Path, plain: Build
) -> None:
    """Regions written by the real library, read by the real monitor code: one of them is then
    marked with a version this monitor does not read (what a newer library would write)."""
    claims = tmp_path / "claims"
    state = tmp_path / "gpu-state"
    a = Claim(claims, plain, [GpuLimit(UUIDS[0], LIMIT, 30)], state=state, name="a")
    b = Claim(claims, plain, [GpuLimit(UUIDS[1], LIMIT, 0)], state=state, name="b")
    procs = [
        c.spawn("tp_cuda", "link", "init", "dev", str(i), "alloc", str(100 * MiB), "ready", "hold")
        for i, c in enumerate((a, b))
    ]
    try:
        for p in procs:
            wait_line(p, "holding")
        with open(b.region, "r+b") as f:
            f.seek(R.OFFSETS["h.version"])
            f.write((R.VERSION + 1).to_bytes(4, "little"))
        logs: list[str] = []
        col = TesseraCollector("node-1", RegionDir(str(claims)), None, None, logs.append)
        for _ in range(2):  # logged once, not at every scrape
            fams = {f.name: f for f in col.collect()}
    finally:
        for p in procs:
            p.kill()
            p.wait()
    readable = {
        s.labels["dra_claim_uid"]: s.value for s in fams["tessera_share_region_readable"].samples
    }
    assert readable == {"uid-a": 1, "uid-b": 0}
    used = fams["tessera_share_memory_used_bytes"].samples
    assert [(s.labels["dra_claim_uid"], s.value) for s in used] == [("uid-a", 100 * MiB)]
    assert logs == [
        f"{b.region}: not a usable usage region: region version {R.VERSION + 1} is newer than "
        f"this reader's (versions {R.VERSION}): a newer driver and enforcement library made it; "
        "upgrade the monitor"
    ]
    # The library itself uses its own version only, and says so.
    r = b.run("tp_cuda", "link", "init", "dev", "1", "alloc", str(MiB))
    assert f"region version {R.VERSION + 1}, this library uses version {R.VERSION} only" in r.stderr


def test_native_make_builds_the_formats_section() -> None:
    """The section the driver reads is in the library `make -C native` builds (readelf's view,
    independent of the driver's reader)."""
    lib = NATIVE / "build" / "libtessera-enforce.so"
    if shutil.which("readelf") is None or not lib.exists():
        pytest.skip("readelf or native/build not here")
    r = subprocess.run(
        ["readelf", "-p", ".tessera_formats", str(lib)], capture_output=True, text=True, check=True
    )
    assert "limits 1..2" in r.stdout
