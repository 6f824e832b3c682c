"""OCI image archives built from host files (tessera.localcluster.images): layout, digests,
content."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from tessera.localcluster import images


def read_archive(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as t:
        return {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}  # type: ignore[union-attr]


def layer_of(files: dict[str, bytes]) -> tuple[dict, dict, tarfile.TarFile]:
    index = json.loads(files["index.json"])
    manifest = json.loads(files["blobs/sha256/" + index["manifests"][0]["digest"].split(":")[1]])
    config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    layer = files["blobs/sha256/" + manifest["layers"][0]["digest"].split(":")[1]]
    return manifest, config, tarfile.open(fileobj=io.BytesIO(layer))


def test_archive_is_an_oci_layout_whose_digests_match_its_blobs(tmp_path: Path) -> None:
    program = tmp_path / "prog"
    program.write_bytes(b"#!/bin/sh\necho hi\n")
    os.chmod(program, 0o750)
    image = images.build_image(
        "tessera.local/unit:1",
        {"/usr/bin/prog": program, "/etc/data": b"payload\n"},
        tmp_path / "out",
        env={"A": "1"},
        entrypoint=["/usr/bin/prog"],
        busybox=False,
    )
    files = read_archive(image.archive)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(files["index.json"])
    entry = index["manifests"][0]
    assert entry["digest"] == image.digest
    assert entry["annotations"] == {
        "io.containerd.image.name": "tessera.local/unit:1",
        "org.opencontainers.image.ref.name": "1",
    }
    manifest, config, layer = layer_of(files)
    assert manifest["config"]["digest"] == image.config_digest
    assert config["rootfs"]["diff_ids"] == [manifest["layers"][0]["digest"]]
    assert config["config"]["Env"][1:] == ["A=1"] and config["config"]["Entrypoint"] == [
        "/usr/bin/prog"
    ]
    members = {m.name: m for m in layer.getmembers()}
    assert (
        members["usr/bin/prog"].mode == 0o750
        and members["usr"].isdir()
        and members["tmp"].mode == 0o1777
    )
    assert layer.extractfile(members["etc/data"]).read() == b"payload\n"  # type: ignore[union-attr]
    assert {m.uid for m in members.values()} == {0}
    assert "bin/busybox" not in members


def test_same_inputs_give_the_same_digest(tmp_path: Path) -> None:
    a = images.build_image("tessera.local/same:1", {"/f": b"x"}, tmp_path / "a", busybox=False)
    b = images.build_image("tessera.local/same:1", {"/f": b"x"}, tmp_path / "b", busybox=False)
    c = images.build_image("tessera.local/same:1", {"/f": b"y"}, tmp_path / "c", busybox=False)
    assert a.digest == b.digest and a.archive.read_bytes() == b.archive.read_bytes()
    assert c.digest != a.digest


@pytest.mark.parametrize(
    "ref", ["tessera.local/Upper:1", "tessera.local/x", "x:1", "tessera.local/a b:1"]
)
def test_bad_reference_is_refused(tmp_path: Path, ref: str) -> None:
    with pytest.raises(images.ImageError, match="not valid"):
        images.build_image(ref, {}, tmp_path, busybox=False)


def test_relative_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(images.ImageError, match="must be absolute"):
        images.build_image("tessera.local/rel:1", {"etc/x": b""}, tmp_path, busybox=False)


def test_static_elf_detection(tmp_path: Path) -> None:
    pause = images.compile_pause(tmp_path / "pause")
    assert images.is_static_elf(pause)
    assert not images.is_static_elf(Path("/bin/sh").resolve())
    assert images.host_libraries([pause]) == {}
    libs = images.host_libraries([Path("/bin/sh").resolve()])
    assert any(p.endswith("/libc.so.6") for p in libs) and any("ld-linux" in p for p in libs)


@pytest.mark.node
def test_busybox_rootfs_and_host_libraries(tmp_path: Path) -> None:
    """With busybox (Debian busybox-static) the rootfs has /bin/sh and friends as links to
    /bin/busybox; libraries_for copies what the host's loader resolves for a dynamic program."""
    ls = Path("/bin/ls").resolve()
    image = images.build_image(
        "tessera.local/bb:1", {"/opt/ls": ls}, tmp_path, libraries_for=["/opt/ls"]
    )
    _manifest, config, layer = layer_of(read_archive(image.archive))
    members = {m.name: m for m in layer.getmembers()}
    assert members["bin/sh"].issym() and members["bin/sh"].linkname == "busybox"
    assert members["bin/busybox"].size == images.find_busybox().stat().st_size
    assert config["config"]["Cmd"] == ["/bin/sh"]
    for lib, host in images.host_libraries([ls]).items():
        assert members[lib.lstrip("/")].size == host.stat().st_size
