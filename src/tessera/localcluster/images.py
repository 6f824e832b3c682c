"""Container images made from host files, for a node without a registry.

:func:`build_image` writes an OCI image layout archive (OCI image-spec v1.1: ``oci-layout``,
``index.json``, ``blobs/sha256/...``) holding one uncompressed layer: a root filesystem made
of the Debian ``busybox-static`` binary with its applet links (``/bin/sh``, ``/bin/cat``
...), plus the files the caller names (host files or bytes, at given container paths), plus,
on request, the shared libraries a dynamically linked program needs (``ldd`` on the host).
The archive is written with :mod:`tarfile` and :mod:`hashlib` only: deterministic (fixed
mtimes, uid/gid 0, sorted entries), so the same inputs give the same image digest.
:func:`import_image` loads an archive into containerd's ``k8s.io`` namespace (the one the
CRI plugin serves to the kubelet) with ``ctr images import``; pods then use the reference
with ``imagePullPolicy: Never``.

:func:`pause_image` is the pod sandbox image: one static ``pause`` program
(``node_assets/pause.c``, compiled with ``gcc -static``), pinned in containerd's config
(``pinned_images.sandbox``) so that the kubelet's image GC never removes it and CRI never
tries to pull it.

Image references are ``tessera.local/<name>:<tag>`` (:data:`LOCAL_REGISTRY`): a registry
host that does not exist, so nothing is ever pulled by accident.

:func:`build_project_image` is Tessera's own image, ``deploy/images/Dockerfile`` built with
buildah by ``tools/image/build.sh`` (what ``make image`` runs; a no-op when its inputs did not
change): :data:`PROJECT_IMAGE` by default, as an OCI archive that :func:`import_image` loads.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

LOCAL_REGISTRY = "tessera.local"
#: The sandbox image every pod of a real node runs first (see :func:`pause_image`).
PAUSE_IMAGE = f"{LOCAL_REGISTRY}/pause:1"
#: The containerd namespace the CRI plugin (and so the kubelet) uses.
K8S_NAMESPACE = "k8s.io"
#: Tessera's own image as ``make image`` names it (``tools/image/build.sh``; the tag is the
#: package version, the chart's appVersion).
PROJECT_IMAGE_NAME = f"{LOCAL_REGISTRY}/tessera"

_MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
_MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
_MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
_MTIME = 1  # fixed mtime of every layer entry (seconds since the epoch), for reproducible digests
_REF = re.compile(
    r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:\.[a-z0-9-]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)+:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"
)
_ASSETS = Path(__file__).parent / "node_assets"


class ImageError(RuntimeError):
    """An image could not be built or imported; the message names the file or command."""


@dataclass(frozen=True)
class ImageFile:
    """One file of an image: ``source`` (a host file) or ``data`` (its bytes), and ``mode``
    (permission bits; default: the host file's, or 0o644 for ``data``)."""

    source: Path | None = None
    data: bytes | None = None
    mode: int | None = None

    def content(self) -> bytes:
        if self.data is not None:
            return self.data
        assert self.source is not None
        try:
            return Path(self.source).read_bytes()
        except OSError as e:
            raise ImageError(f"image file {self.source}: cannot read: {e.strerror}") from e

    def file_mode(self) -> int:
        if self.mode is not None:
            return self.mode
        if self.source is not None:
            return stat.S_IMODE(os.stat(self.source).st_mode)
        return 0o644


FileLike = Path | bytes | ImageFile


@dataclass(frozen=True)
class Image:
    """A built image: ``ref`` (``tessera.local/name:tag``), ``archive`` (OCI layout tar),
    ``digest`` (``sha256:...`` of the manifest, what containerd reports as the image id's
    target) and ``config_digest`` (the image ID the CRI reports)."""

    ref: str
    archive: Path
    digest: str
    config_digest: str


def image_ref(name: str, tag: str) -> str:
    """``tessera.local/<name>:<tag>``; raises ImageError if the result is not a valid reference."""
    ref = f"{LOCAL_REGISTRY}/{name}:{tag}"
    if not _REF.match(ref):
        raise ImageError(
            f"image reference {ref!r} is not valid: use lower-case name components [a-z0-9._-] and a tag [A-Za-z0-9_.-]"
        )
    return ref


def _as_file(value: FileLike) -> ImageFile:
    if isinstance(value, ImageFile):
        return value
    if isinstance(value, bytes):
        return ImageFile(data=value)
    return ImageFile(source=Path(value))


def is_static_elf(path: Path) -> bool:
    """True if ``path`` is an ELF executable without a program interpreter (statically linked)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:  # ELF, 64-bit
            return False
        order: Literal["little", "big"] = "little" if head[5] == 1 else "big"
        phoff = int.from_bytes(head[32:40], order)
        phentsize = int.from_bytes(head[54:56], order)
        phnum = int.from_bytes(head[56:58], order)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return all(  # no PT_INTERP (3) entry
        int.from_bytes(table[i * phentsize : i * phentsize + 4], order) != 3 for i in range(phnum)
    )


def find_busybox() -> Path:
    """The host's static busybox (Debian ``busybox-static``). Raises ImageError if absent or dynamic."""
    found = shutil.which("busybox")
    if found is None:
        raise ImageError(
            "busybox not found on PATH: install Debian's busybox-static (tools/kube/node-deps.sh)"
        )
    path = Path(found).resolve()
    if not is_static_elf(path):
        raise ImageError(
            f"{path} is dynamically linked: install Debian's busybox-static (tools/kube/node-deps.sh)"
        )
    return path


def host_libraries(programs: Iterable[Path]) -> dict[str, Path]:
    """Shared libraries (and the program interpreter) the host's dynamic loader resolves for
    ``programs``, as ``{path as ldd reports it: host file}``; libraries ldd cannot find are
    left out (give them as image files). Raises ImageError when ldd fails."""
    out: dict[str, Path] = {}
    for prog in programs:
        if is_static_elf(Path(prog)):
            continue
        try:
            proc = subprocess.run(["ldd", str(prog)], capture_output=True, text=True, check=False)
        except OSError as e:
            raise ImageError(f"ldd {prog}: {e}") from e
        if proc.returncode != 0:
            raise ImageError(f"ldd {prog} failed: {(proc.stderr or proc.stdout).strip()}")
        for line in proc.stdout.splitlines():
            line = line.strip()
            m = re.match(r"^\S+ => (/\S+) \(0x[0-9a-f]+\)$", line) or re.match(
                r"^(/\S+) \(0x[0-9a-f]+\)$", line
            )
            if m:
                out[m.group(1)] = Path(m.group(1)).resolve()
    return out


class _Layer:
    """Entries of one layer tar, parents added as directories."""

    def __init__(self) -> None:
        self.entries: dict[str, tarfile.TarInfo] = {}
        self.data: dict[str, bytes] = {}

    def _parents(self, path: PurePosixPath) -> None:
        for parent in reversed(path.parents):
            key = str(parent).lstrip("/")
            if key and key not in self.entries:
                self.dir(str(parent))

    def dir(self, path: str, mode: int = 0o755) -> None:
        p = PurePosixPath(path)
        self._parents(p)
        info = tarfile.TarInfo(str(p).lstrip("/"))
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, _MTIME
        self.entries[info.name] = info

    def file(self, path: str, data: bytes, mode: int) -> None:
        p = PurePosixPath(path)
        self._parents(p)
        info = tarfile.TarInfo(str(p).lstrip("/"))
        info.size, info.mode, info.mtime = len(data), mode, _MTIME
        self.entries[info.name] = info
        self.data[info.name] = data

    def symlink(self, path: str, target: str) -> None:
        p = PurePosixPath(path)
        self._parents(p)
        info = tarfile.TarInfo(str(p).lstrip("/"))
        info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, _MTIME
        self.entries[info.name] = info

    def tar(self) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
            for name in sorted(self.entries):
                info = self.entries[name]
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                data = self.data.get(name)
                t.addfile(info, io.BytesIO(data) if data is not None else None)
        return buf.getvalue()


def _arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _busybox_applets(busybox: Path) -> list[str]:
    proc = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ImageError(f"{busybox} --list failed: {proc.stderr.strip()}")
    return [a for a in proc.stdout.split() if a and "/" not in a and a != "busybox"]


def build_image(
    ref: str,
    files: Mapping[str, FileLike],
    out_dir: Path,
    *,
    env: Mapping[str, str] | None = None,
    entrypoint: Sequence[str] | None = None,
    cmd: Sequence[str] | None = None,
    busybox: bool = True,
    libraries_for: Sequence[str] = (),
    workdir: str = "/",
) -> Image:
    """Write an OCI image layout archive for ``ref`` into ``out_dir``; return the :class:`Image`.

    ``files`` maps absolute container paths to a host file (:class:`~pathlib.Path`), bytes,
    or an :class:`ImageFile`. ``busybox`` adds ``/bin/busybox`` (the host's static one) and
    a ``/bin/<applet>`` symlink for each applet, ``/etc/passwd`` and ``/etc/group`` (root),
    ``/tmp``; the default command is then ``/bin/sh``. ``libraries_for`` names container
    paths among ``files`` (host files) whose shared libraries (``ldd``) are copied to the
    paths the host's loader resolved them at. ``env`` becomes the image config's ``Env``
    (after ``PATH``). Raises :class:`ImageError` for an unreadable file, a relative container
    path or a bad reference.
    """
    if not _REF.match(ref):
        raise ImageError(
            f"image reference {ref!r} is not valid (expected e.g. {LOCAL_REGISTRY}/name:tag)"
        )
    layer = _Layer()
    for d in ("/dev", "/proc", "/sys", "/etc", "/var", "/root", "/run"):
        layer.dir(d)
    layer.dir("/tmp", 0o1777)
    if busybox:
        bb = find_busybox()
        layer.file("/bin/busybox", bb.read_bytes(), 0o755)
        for applet in _busybox_applets(bb):
            layer.symlink(f"/bin/{applet}", "busybox")
        layer.file(
            "/etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
            0o644,
        )
        layer.file("/etc/group", b"root:x:0:\nnogroup:x:65534:\n", 0o644)
    given = {path: _as_file(v) for path, v in files.items()}
    for path in libraries_for:
        f = given.get(path)
        if f is None or f.source is None:
            raise ImageError(f"libraries_for: {path!r} is not one of the image's host files")
        for lib_path, host in host_libraries([f.source]).items():
            if lib_path not in given:
                layer.file(lib_path, host.read_bytes(), stat.S_IMODE(host.stat().st_mode))
    for path, f in sorted(given.items()):
        if not path.startswith("/"):
            raise ImageError(
                f"image file path {path!r} must be absolute (e.g. /usr/bin/test-program)"
            )
        layer.file(path, f.content(), f.file_mode())

    layer_bytes = layer.tar()
    layer_digest = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config_env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    config_env += [f"{k}={v}" for k, v in (env or {}).items()]
    image_config: dict[str, object] = {"Env": config_env, "WorkingDir": workdir}
    if entrypoint is not None:
        image_config["Entrypoint"] = list(entrypoint)
    if cmd is not None:
        image_config["Cmd"] = list(cmd)
    elif entrypoint is None and busybox:
        image_config["Cmd"] = ["/bin/sh"]
    config = {
        "created": "1970-01-01T00:00:01Z",
        "architecture": _arch(),
        "os": "linux",
        "config": image_config,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [
            {
                "created": "1970-01-01T00:00:01Z",
                "created_by": "tessera.localcluster.images.build_image",
            }
        ],
    }
    config_bytes = _json(config)
    config_digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    manifest = {
        "schemaVersion": 2,
        "mediaType": _MEDIA_MANIFEST,
        "config": {"mediaType": _MEDIA_CONFIG, "digest": config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": _MEDIA_LAYER, "digest": layer_digest, "size": len(layer_bytes)}],
    }
    manifest_bytes = _json(manifest)
    manifest_digest = "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()
    index = {
        "schemaVersion": 2,
        "mediaType": _MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": _MEDIA_MANIFEST,
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "platform": {"architecture": _arch(), "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": ref,
                    "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1],
                },
            }
        ],
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    archive = out_dir / (re.sub(r"[^A-Za-z0-9_.-]", "_", ref) + ".oci.tar")
    blobs = {
        layer_digest: layer_bytes,
        config_digest: config_bytes,
        manifest_digest: manifest_bytes,
    }
    fd, tmp_name = tempfile.mkstemp(dir=out_dir, prefix=".image-", suffix=".tmp")
    try:
        with (
            os.fdopen(fd, "wb") as raw,
            tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t,
        ):
            _add(t, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
            _add(t, "index.json", _json(index))
            for digest in sorted(blobs):
                _add(t, "blobs/sha256/" + digest.split(":", 1)[1], blobs[digest])
        os.replace(tmp_name, archive)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return Image(ref, archive, manifest_digest, config_digest)


def _json(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def _add(t: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, _MTIME
    t.addfile(info, io.BytesIO(data))


def compile_pause(out: Path) -> Path:
    """Compile ``node_assets/pause.c`` with ``gcc -static -Os -s`` into ``out``; return it.
    Raises ImageError when gcc (or the static C library, Debian ``libc6-dev``) is missing."""
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        "gcc",
        "-static",
        "-Os",
        "-s",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-o",
        str(out),
        str(_ASSETS / "pause.c"),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as e:
        raise ImageError(f"cannot run gcc to build the pause program: {e}") from e
    if proc.returncode != 0:
        raise ImageError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    return out


def pause_image(out_dir: Path) -> Image:
    """The sandbox image :data:`PAUSE_IMAGE`: only ``/pause`` (static), entrypoint ``/pause``."""
    binary = compile_pause(Path(out_dir) / "pause")
    return build_image(
        PAUSE_IMAGE,
        {"/pause": ImageFile(source=binary, mode=0o755)},
        out_dir,
        entrypoint=["/pause"],
        busybox=False,
    )


def import_image(ctr: Path, address: Path, image: Image, *, timeout: float = 120.0) -> None:
    """``ctr --address ADDRESS -n k8s.io images import ARCHIVE``: store and unpack ``image``
    (into the default snapshotter) where the kubelet's CRI finds it. Raises ImageError with
    ctr's output when it fails."""
    cmd = [
        str(ctr),
        "--address",
        str(address),
        "--namespace",
        K8S_NAMESPACE,
        "images",
        "import",
        "--local",
        str(image.archive),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ImageError(f"{' '.join(cmd)}: {e}") from e
    if proc.returncode != 0:
        raise ImageError(
            f"importing {image.ref}: {' '.join(cmd)} failed: {(proc.stderr or proc.stdout).strip()}"
        )


def project_root() -> Path:
    """The source checkout this package was installed from (editable installs): the directory
    holding ``tools/image/build.sh`` and ``deploy/images/Dockerfile``. Raises ImageError."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "tools" / "image" / "build.sh").is_file() and (
            parent / "deploy" / "images" / "Dockerfile"
        ).is_file():
            return parent
    raise ImageError(
        "cannot find tools/image/build.sh: building Tessera's image needs the source checkout "
        "(pip install -e .)"
    )


def read_archive(ref: str, archive: Path) -> Image:
    """The :class:`Image` of an OCI image layout archive holding one image (its ``index.json``
    and manifest). Raises ImageError when the archive is not one."""
    try:
        with tarfile.open(archive) as t:

            def member(name: str) -> bytes:
                f = t.extractfile(name)
                if f is None:
                    raise KeyError(name)
                return f.read()

            index = json.loads(member("index.json"))
            manifests = index.get("manifests") or []
            if len(manifests) != 1:
                raise ImageError(
                    f"{archive}: expected one image in index.json, found {len(manifests)}"
                )
            digest = manifests[0]["digest"]
            manifest = json.loads(member("blobs/sha256/" + digest.split(":", 1)[1]))
    except (OSError, tarfile.TarError, KeyError, ValueError) as e:
        raise ImageError(f"{archive}: not an OCI image layout archive: {e}") from e
    return Image(ref, Path(archive), digest, manifest["config"]["digest"])


def build_project_image(
    *,
    ref: str | None = None,
    base: str = "local",
    force: bool = False,
    repo: Path | None = None,
    timeout: float = 1800.0,
) -> Image:
    """Build (or reuse) Tessera's image: ``tools/image/build.sh`` in the checkout, what
    ``make image`` runs after ``make protos`` (the kubelet plugin stubs must exist).

    ``ref`` defaults to ``tessera.local/tessera:<version>``; ``base`` is ``local`` (a Debian
    bookworm base made with mmdebstrap: no registry is contacted), ``upstream`` (the
    Dockerfile's pinned ``debian:bookworm-slim``, pulled) or an image reference. Installs
    buildah, runc and mmdebstrap from Debian when root and missing. A no-op of about a second
    when no input changed; cold, a few minutes (docs/benchmarks.md). Returns the image, whose
    ``archive`` :func:`import_image` loads into a node's containerd. Raises ImageError with
    the script's last lines of output when it fails (the builder missing, a failed step).
    """
    root = Path(repo) if repo is not None else project_root()
    script = root / "tools" / "image" / "build.sh"
    env = dict(os.environ, BASE=base)
    if ref is not None:
        env["IMAGE"] = ref
    else:
        env.pop("IMAGE", None)
    cmd = ["bash", str(script), *(["--force"] if force else [])]
    try:
        proc = subprocess.run(
            cmd, cwd=root, env=env, capture_output=True, text=True, check=False, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ImageError(f"{' '.join(cmd)}: {e}") from e
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr + proc.stdout).strip().splitlines()[-25:])
        raise ImageError(f"{script} failed with exit status {proc.returncode}:\n{tail}")
    out = dict(
        line.split("=", 1)
        for line in proc.stdout.splitlines()
        if line.startswith(("image=", "archive="))
    )
    if "image" not in out or "archive" not in out:
        raise ImageError(f"{script} printed no image=/archive= lines:\n{proc.stdout.strip()}")
    return read_archive(out["image"], Path(out["archive"]))
