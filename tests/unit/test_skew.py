"""Upgrades with version skew, the parts without a native build: the driver's checkpoint
versions (real checkpoints of the previous driver and a newer one's) and the reader of the
enforcement library's formats on files that are not marked libraries. The pairs with the real
libraries are in tests/native/test_library_skew.py."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tessera.driver.backend import LIBRARY
from tessera.driver.checkpoint import (
    FIELDS_BY_VERSION,
    VERSION,
    Checkpoint,
    CheckpointError,
    ClaimEntry,
)
from tessera.driver.context import DriverConfig, DriverStartError
from tessera.driver.kubelet import ClaimRef
from tessera.driver.node import NodeDriver
from tessera.driver.prepare import ClaimPlan, Layout, materialize
from tessera.enforcement.library import LibraryError, library_formats
from tessera.enforcement.limits import LimitsError
from tessera.kube.client import KubeClient

CHECKPOINTS = Path(__file__).resolve().parents[1] / "data" / "checkpoints"
NEWER = (
    "version 2 is newer than this driver reads (versions 1): a newer driver wrote it; roll "
    "forward to that driver, or drain the node (no prepared claims left) and remove the file to "
    "start with an empty state"
)


def test_a_newer_checkpoint_refuses_the_start_in_one_line_and_is_left_alone(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    path = state / "checkpoint.json"
    raw = (CHECKPOINTS / "v2-newer.json").read_bytes()
    path.write_bytes(raw)
    with pytest.raises(CheckpointError) as e:
        Checkpoint(path)
    assert str(e.value) == f"{path}: {NEWER}"
    # The driver's start step that loads it (nothing before it writes the state directory).
    driver = NodeDriver(
        DriverConfig(node_name="n1", state_dir=state, kubelet_root=tmp_path),
        KubeClient("https://127.0.0.1:9"),
        log=lambda _m: None,
    )
    with pytest.raises(DriverStartError) as s:
        driver._open_state()
    assert str(s.value) == f"{path}: {NEWER}" and "\n" not in str(s.value)
    assert path.read_bytes() == raw  # no entry dropped, nothing rewritten


def test_a_key_without_a_version_bump_is_refused_not_dropped(tmp_path: Path) -> None:
    """A version-1 file whose plan has a key version 1 does not have (a newer driver that
    added a field without bumping the version) is refused naming the key, not read without it."""
    doc = json.loads((CHECKPOINTS / "v1-prepared.json").read_text())
    [uid] = doc["claims"]
    doc["claims"][uid]["plan"]["limitsVersion"] = 1
    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError) as e:
        Checkpoint(path)
    assert str(e.value).startswith(
        f"{path}: claims[{uid!r}].plan: limitsVersion: not a field of a version 1 plan"
    )


@pytest.mark.parametrize("name", sorted(p.name for p in CHECKPOINTS.glob("v1-*.json")))
def test_what_this_driver_writes_is_in_the_version_it_writes(name: str) -> None:
    """The writer's keys (entries and plans, from the previous driver's real checkpoints read
    back) are all keys of :data:`VERSION`: a key added to a writer without a new version row
    fails here, before an older driver refuses (or drops) it on a rollback."""
    assert max(FIELDS_BY_VERSION) == VERSION
    entry_keys, plan_keys = FIELDS_BY_VERSION[VERSION]
    doc = json.loads((CHECKPOINTS / name).read_text())
    assert doc["version"] in FIELDS_BY_VERSION
    for raw in doc["claims"].values():
        written = ClaimEntry.from_json(raw, doc["version"]).to_json()
        assert set(written) <= entry_keys
        if "plan" in written:
            assert set(written["plan"]) <= plan_keys


def test_library_formats_of_files_that_are_not_marked_libraries(tmp_path: Path) -> None:
    """An ELF file without the section (a library built before it) reads limits version 1
    only; a file that is not ELF, or a truncated one, is refused naming the file."""
    elf = Path(sys.executable).resolve()
    plain = library_formats(elf)
    assert (plain.limits, plain.marked) == ((1,), False)
    assert plain.describe() == "limits file version 1 only (it predates versioned limits files)"
    text = tmp_path / "lib.so"
    text.write_text("not a library\n")
    with pytest.raises(LibraryError, match=r"lib\.so: not an ELF file"):
        library_formats(text)
    cut = tmp_path / "cut.so"
    shutil.copy(elf, cut)
    with open(cut, "r+b") as f:
        f.truncate(4096)
    with pytest.raises(LibraryError, match=r"cut\.so: ELF section headers out of the file"):
        library_formats(cut)
    with pytest.raises(FileNotFoundError):
        library_formats(tmp_path / "absent.so")


def _recorded(tmp_path: Path, text: str) -> tuple[ClaimPlan, Layout]:
    layout = Layout(tmp_path / "state", tmp_path / "cdi", tmp_path, None, "gpu.tessera.dev")
    plan = ClaimPlan(ClaimRef("ns", "c", "uid-1"), LIBRARY, (), text, ((U1, 1 << 30, 0),), {})
    return plan, layout


U0 = "GPU-00000000-1111-2222-3333-444444444444"
U1 = "GPU-11111111-2222-3333-4444-555555555555"
PREVIOUS_TEXT = (  # what the driver before limits file versions wrote for a share beside a GPU
    "version 1\nregion /run/tessera/region\ncontext-overhead 0\n"
    f"gpu {U1} memory 1073741824 cores 0\nunlimited {U0}\n"
)


def test_a_recorded_limits_file_is_written_again_as_recorded(tmp_path: Path) -> None:
    plan, layout = _recorded(tmp_path, PREVIOUS_TEXT)
    assert materialize(plan, layout) is True
    limits = layout.claim_dir("uid-1") / "limits"
    assert limits.read_text() == PREVIOUS_TEXT  # not turned into version 2
    assert materialize(plan, layout) is False


def test_a_recorded_limits_file_of_a_newer_version_writes_nothing(tmp_path: Path) -> None:
    """A plan recorded by a newer driver (a rollback) in a limits version this one does not
    read: refused before any file is written (the caller logs it, or fails that claim)."""
    plan, layout = _recorded(tmp_path, PREVIOUS_TEXT.replace("version 1", "version 3"))
    with pytest.raises(LimitsError, match=r"version 3 is newer than this library reads"):
        materialize(plan, layout)
    assert not (tmp_path / "state").exists() and not (tmp_path / "cdi").exists()
