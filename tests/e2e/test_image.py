"""Tessera's image as ``make image`` builds it (``deploy/images/Dockerfile`` with buildah, a
Debian bookworm base made with mmdebstrap, no registry): built once per session, or reused
when its inputs did not change (``tools/image/build.sh``'s stamp), then checked from the
inside of containers of it, as the chart runs it:

* in a buildah container: the entry points the chart's pods run (``tessera driver``,
  ``webhook``, ``monitor``), the kubelet plugin's generated gRPC stubs, the enforcement
  library where the node DaemonSet's init container copies it from (with its ``/bin/sh``,
  ``install`` and ``mv``), the non-root user, and nothing of the build's host configuration;
* in containerd (the node's runtime, ``tools/kube/bin``, a private instance): the OCI archive
  imports with ``ctr images import`` into the ``k8s.io`` namespace and runs.

Needs root (buildah's storage; ``tools/image/install.sh`` installs buildah, runc and
mmdebstrap from Debian when missing). Marker ``image``; a cold build takes a few minutes
(docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera import __version__
from tessera.localcluster import build, images

pytestmark = pytest.mark.image

LIBRARY = "/usr/lib/tessera/libtessera-enforce.so"


@pytest.fixture(scope="module")
def project_image() -> images.Image:
    if os.geteuid() != 0:
        pytest.fail("the image tests need root: buildah's storage is /var/lib/containers/storage")
    try:
        return images.build_project_image()
    except images.ImageError as e:
        pytest.fail(f"building Tessera's image (tools/image/build.sh, `make image`) failed:\n{e}")


def _buildah() -> str:
    found = shutil.which("buildah")
    if found is None:
        pytest.fail(
            "buildah is not installed: run tools/image/install.sh (Debian's buildah, runc, mmdebstrap)"
        )
    return found


@pytest.fixture(scope="module")
def container(project_image: images.Image) -> Iterator[str]:
    """A buildah working container of the image (removed afterwards)."""
    buildah = _buildah()
    name = f"tessera-image-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(
        [buildah, "from", "--pull-never", "--name", name, project_image.ref],
        check=True,
        capture_output=True,
        text=True,
    )
    try:
        yield name
    finally:
        subprocess.run([buildah, "rm", name], capture_output=True, check=False)


def run_in(container: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``argv`` in the container, as the image's user, with its environment (PATH)."""
    return subprocess.run(
        [_buildah(), "run", "--network", "none", container, "--", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_image_reports_its_version(container: str) -> None:
    r = run_in(container, "tessera", "--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == f"tessera {__version__}"


@pytest.mark.parametrize("command", ["driver", "webhook", "monitor"])
def test_every_entry_point_of_the_chart_starts(container: str, command: str) -> None:
    r = run_in(container, "tessera", command, "--help")
    assert r.returncode == 0, r.stderr
    assert f"Usage: tessera {command} " in r.stdout


def test_the_kubelet_plugin_stubs_are_in_the_image(container: str) -> None:
    r = run_in(
        container,
        "python3",
        "-c",
        "import tessera.driver._generated as g, sys; print(g.__file__); print(sys.prefix)",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [
        "/opt/tessera/lib/python3.11/site-packages/tessera/driver/_generated/__init__.py",
        "/opt/tessera",
    ]


def test_the_library_is_where_the_node_daemonset_copies_it_from(container: str) -> None:
    """The chart's init container runs ``install`` then ``mv`` under ``/bin/sh``."""
    script = (
        f"test -f {LIBRARY} && head -c 4 {LIBRARY} | od -An -c | tr -d ' \\n'; echo;"
        f" install -m 0444 {LIBRARY} /tmp/lib.new && mv /tmp/lib.new /tmp/lib.so"
        " && stat -c %a /tmp/lib.so; id -u; id -g"
    )
    r = run_in(container, "/bin/sh", "-c", script)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["177ELF", "444", "65532", "65532"]


def test_the_image_config_is_the_charts(project_image: images.Image) -> None:
    r = subprocess.run(
        [_buildah(), "inspect", "--type", "image", project_image.ref],
        capture_output=True,
        text=True,
        check=True,
    )
    config = json.loads(r.stdout)["OCIv1"]["config"]
    assert config["Entrypoint"] == ["tessera"]
    assert config["Cmd"] == ["--help"]
    assert config["User"] == "65532:65532"
    assert config["Env"][0].startswith("PATH=/opt/tessera/bin:")


def test_nothing_of_the_build_host_stays_in_the_image(container: str) -> None:
    """pip's configuration and CA bundle were build secrets, apt's sources a mount over a
    directory of the base: no file of them, no mount point, is left; apt's configuration is
    the base's."""
    listing = "ls -A /etc/apt/sources.list.d /etc/apt/apt.conf.d /run 2>&1; ls /etc/pip.conf 2>&1"
    base_ref = subprocess.run(
        ["bash", str(images.project_root() / "tools" / "image" / "base.sh")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[-1]
    base = subprocess.run(
        [_buildah(), "from", "--pull-never", base_ref], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        expected = run_in(base, "/bin/sh", "-c", listing)
    finally:
        subprocess.run([_buildah(), "rm", base], capture_output=True, check=False)
    r = run_in(container, "/bin/sh", "-c", listing)
    assert r.stdout == expected.stdout
    assert "cannot access '/etc/pip.conf'" in r.stdout


def test_the_reference_and_archive_are_the_documented_ones(project_image: images.Image) -> None:
    assert project_image.ref == f"{images.PROJECT_IMAGE_NAME}:{__version__}"
    assert project_image.archive == images.project_root() / "build" / "image" / (
        f"tessera-{__version__}.oci.tar"
    )


def test_a_second_build_is_a_no_op(project_image: images.Image) -> None:
    started = time.monotonic()
    again = images.build_project_image()
    assert time.monotonic() - started < 15
    assert again == project_image


# ---- the archive in containerd ------------------------------------------------------------

CONTAINERD_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")


def _containerd_bins() -> Path:
    try:
        if not os.environ.get("TESSERA_KUBE_BIN"):
            build.ensure_built(node=True)
    except build.BuildError as e:
        pytest.fail(f"containerd is built by tools/kube/build.sh (make kube): {e}")
    missing = build.missing_binaries(CONTAINERD_BINARIES)
    if missing:
        pytest.fail(f"{build.bin_dir()} lacks {', '.join(missing)}: make kube builds them")
    return build.bin_dir()


@pytest.fixture(scope="module")
def containerd() -> Iterator[tuple[Path, Path]]:
    """A containerd of this test's own (no CRI, nothing outside a temporary directory but
    the shim's runc): ``(ctr, socket)``."""
    bins = _containerd_bins()
    runc = shutil.which("runc") or "/usr/sbin/runc"
    d = Path(tempfile.mkdtemp(prefix="tessera-image-ctrd-"))
    sock = d / "containerd.sock"

    def q(v: object) -> str:
        return json.dumps(str(v))

    (d / "config.toml").write_text(
        f"""version = 3
root = {q(d / "root")}
state = {q(d / "state")}
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.grpc.v1.cri",
  "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime",
  "io.containerd.podsandbox.controller.v1.podsandbox"]
[grpc]
  address = {q(sock)}
[ttrpc]
  address = {q(str(sock) + ".ttrpc")}
[plugins."io.containerd.internal.v1.opt"]
  path = {q(d / "opt")}
[plugins."io.containerd.image-verifier.v1.bindir"]
  bin_dir = {q(d / "image-verifier")}
[plugins."io.containerd.shim.v1.manager"]
  socket_dir = {q(d / "s")}
"""
    )
    env = dict(os.environ, PATH=f"{bins}:{Path(runc).parent}:{os.environ.get('PATH', '')}")
    log = open(d / "containerd.log", "w")  # noqa: SIM115 (closed in finally)
    proc = subprocess.Popen(
        [str(bins / "containerd"), "--config", str(d / "config.toml")],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        ctr = bins / "ctr"
        deadline = time.monotonic() + 30
        while True:
            ok = subprocess.run(
                [str(ctr), "--address", str(sock), "version"], capture_output=True, check=False
            )
            if ok.returncode == 0:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"containerd did not start: {(d / 'containerd.log').read_text()[-2000:]}"
                )
            time.sleep(0.2)
        yield ctr, sock
    finally:
        subprocess.run(
            [
                str(bins / "ctr"),
                "--address",
                str(sock),
                "-n",
                images.K8S_NAMESPACE,
                "tasks",
                "kill",
                "-s",
                "KILL",
                "tessera-image-test",
            ],
            capture_output=True,
            check=False,
        )
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        subprocess.run(["umount", "-R", "-l", str(d)], capture_output=True, check=False)
        shutil.rmtree(d, ignore_errors=True)


def test_the_archive_imports_into_containerd_and_runs(
    project_image: images.Image, containerd: tuple[Path, Path]
) -> None:
    ctr, sock = containerd
    images.import_image(ctr, sock, project_image)
    base = [str(ctr), "--address", str(sock), "--namespace", images.K8S_NAMESPACE]
    listed = subprocess.run(
        [*base, "images", "ls", "--quiet"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert project_image.ref in listed
    r = subprocess.run(
        [
            *base,
            "run",
            "--rm",
            project_image.ref,
            "tessera-image-test",
            "/bin/sh",
            "-c",
            "id -u; tessera --version; tessera driver --help >/dev/null && echo driver",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split()[:3] == ["65532", "tessera", __version__]
    assert r.stdout.split()[-1] == "driver"
