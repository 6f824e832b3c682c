"""Build step: the kubelet plugin APIs as Python gRPC stubs.

The ``.proto`` files come from the Go module ``k8s.io/kubelet`` at the version the project's
Kubernetes is pinned to (``tools/kube/go.mod``), fetched through the Go module proxy with the
ordinary client (``go mod download -json k8s.io/kubelet@<version>``; the module cache is
reused when it already holds it). ``grpcio-tools`` compiles them into
``tessera/driver/_generated/`` (git-ignored), next to a ``STAMP`` file naming the module
version, the proto files' SHA-256 and the grpcio-tools version: a second run with the same
inputs does nothing.

Which protos, and why these: the plugin registration service
(``pkg/apis/pluginregistration/v1/api.proto``, package ``pluginregistration``), the DRA
service (``pkg/apis/dra/v1/api.proto``, package ``k8s.io.kubelet.pkg.apis.dra.v1``) and the
device health service of KEP-4680 in the two versions the kubelet v1.37 speaks
(``pkg/apis/dra-health/v1/api.proto`` and ``.../v1alpha1/api.proto``, packages ``v1`` and
``v1alpha1``: services ``v1.DRAResourceHealth``, ``v1alpha1.DRAResourceHealth``), and the
device plugin API of legacy mode (``pkg/apis/deviceplugin/v1beta1/api.proto``, package
``v1beta1``: services ``v1beta1.Registration``, served by the kubelet on
``device-plugins/kubelet.sock``, and ``v1beta1.DevicePlugin``, served by
``tessera device-plugin``). In v0.37.2 none imports anything: the ``gogoproto`` import and
its ``(gogoproto.*)`` options, which the device plugin proto carried in older releases, are
gone from every one of them (only the pinned version is read), so they compile alone;
:func:`generate` refuses a proto with an ``import`` rather than guess (pinning an older
``k8s.io/kubelet`` fails here, naming the file and its import, instead of compiling a stub
without gogoproto's options).
Each is copied to ``tessera/driver/_generated/<name>.proto`` before compiling so the generated
``*_pb2_grpc.py`` import their messages as ``tessera.driver._generated.<name>_pb2``; the proto
``package`` (and so every gRPC method path the kubelet calls) is unchanged.

Run as ``python -m tessera.driver.protos`` (``make protos``, part of ``make venv``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tessera.api.errors import TesseraError

MODULE = "k8s.io/kubelet"
#: Proto files taken from the module: (path in the module, module name in ``_generated``).
PROTOS: tuple[tuple[str, str], ...] = (
    ("pkg/apis/pluginregistration/v1/api.proto", "pluginregistration_v1"),
    ("pkg/apis/dra/v1/api.proto", "dra_v1"),
    ("pkg/apis/dra-health/v1/api.proto", "dra_health_v1"),
    ("pkg/apis/dra-health/v1alpha1/api.proto", "dra_health_v1alpha1"),
    ("pkg/apis/deviceplugin/v1beta1/api.proto", "deviceplugin_v1beta1"),
)
GENERATED = Path(__file__).resolve().parent / "_generated"
STAMP = "STAMP"


class ProtoBuildError(TesseraError, RuntimeError):
    """The stubs could not be generated (no Go, no module, a proto that imports others)."""


def go_mod_path() -> Path | None:
    """``tools/kube/go.mod`` of the source checkout this package runs from, or ``None``."""
    env = os.environ.get("TESSERA_KUBE_TOOLS")
    if env:
        p = Path(env) / "go.mod"
        return p if p.is_file() else None
    for parent in Path(__file__).resolve().parents:
        p = parent / "tools" / "kube" / "go.mod"
        if p.is_file():
            return p
    return None


def kubelet_version(go_mod: Path) -> str:
    """The ``k8s.io/kubelet`` version ``go_mod`` resolves to (a ``replace`` wins over
    ``require``). Raises :class:`ProtoBuildError` when the file names none."""
    text = go_mod.read_text()
    repl = re.search(r"^\s*k8s\.io/kubelet\s*=>\s*k8s\.io/kubelet\s+(v\S+)", text, re.M)
    if repl:
        return repl.group(1)
    req = re.search(r"^\s*k8s\.io/kubelet\s+(v\S+)", text, re.M)
    if req:
        return req.group(1)
    raise ProtoBuildError(f"{go_mod}: no k8s.io/kubelet version (require or replace); add it")


def module_zip(version: str) -> Path:
    """The module zip of ``k8s.io/kubelet@version`` from the Go module cache, downloading it
    with ``go mod download -json`` when missing. Raises :class:`ProtoBuildError`."""
    go = shutil.which("go")
    if go is None:
        raise ProtoBuildError(
            f"`go` is not on PATH: the kubelet plugin API (.proto files of {MODULE}@{version}) "
            "is fetched through the Go module proxy with `go mod download`; install Go >= 1.26 "
            "and run `make protos`"
        )
    with tempfile.TemporaryDirectory(prefix="tessera-protos-") as d:
        # Outside any module: `go mod download` of a path@version needs no go.mod.
        proc = subprocess.run(
            [go, "mod", "download", "-json", f"{MODULE}@{version}"],
            cwd=d,
            capture_output=True,
            text=True,
            env={**os.environ, "GOFLAGS": "-mod=mod"},
        )
    try:
        info = json.loads(proc.stdout or "{}")
    except json.JSONDecodeError:
        info = {}
    if proc.returncode != 0 or info.get("Error") or not info.get("Zip"):
        why = info.get("Error") or proc.stderr.strip() or proc.stdout.strip()
        raise ProtoBuildError(f"go mod download {MODULE}@{version} failed: {why}")
    return Path(info["Zip"])


def _read_protos(zip_path: Path, version: str) -> dict[str, bytes]:
    prefix = f"{MODULE}@{version}/"
    out: dict[str, bytes] = {}
    with zipfile.ZipFile(zip_path) as z:
        for src, name in PROTOS:
            try:
                data = z.read(prefix + src)
            except KeyError as e:
                raise ProtoBuildError(f"{zip_path}: {prefix + src} is missing") from e
            for line in data.decode().splitlines():
                if re.match(r"\s*import\s", line):
                    raise ProtoBuildError(
                        f"{MODULE}@{version} {src}: `{line.strip()}`: this proto imports "
                        "another file; tessera.driver.protos compiles self-contained protos only"
                    )
            out[name] = data
    return out


def _stamp(version: str, protos: dict[str, bytes]) -> str:
    import grpc_tools

    tools_version = getattr(grpc_tools, "__version__", None)
    if tools_version is None:
        from importlib.metadata import version as dist_version

        tools_version = dist_version("grpcio-tools")
    h = hashlib.sha256()
    for name in sorted(protos):
        h.update(name.encode() + b"\0" + protos[name] + b"\0")
    return f"{MODULE}@{version} sha256:{h.hexdigest()} grpcio-tools {tools_version}\n"


def generate(version: str | None = None, out_dir: Path = GENERATED, *, quiet: bool = False) -> bool:
    """Fetch the protos and (re)generate the stubs in ``out_dir`` when their inputs changed.

    ``version`` defaults to the one in ``tools/kube/go.mod``. Returns True when files were
    written, False when the stamp showed them current. Raises :class:`ProtoBuildError`.
    """
    if version is None:
        go_mod = go_mod_path()
        if go_mod is None:
            raise ProtoBuildError(
                "cannot find tools/kube/go.mod (it pins the kubelet version): run from a source "
                "checkout or set TESSERA_KUBE_TOOLS"
            )
        version = kubelet_version(go_mod)
    zip_path = module_zip(version)
    protos = _read_protos(zip_path, version)
    stamp = _stamp(version, protos)
    stamp_file = out_dir / STAMP
    if (
        stamp_file.is_file()
        and stamp_file.read_text() == stamp
        and all((out_dir / f"{n}_pb2_grpc.py").is_file() for n in protos)
    ):
        return False
    from grpc_tools import protoc

    root = out_dir.parents[2]  # .../src: so modules are tessera.driver._generated.<name>
    rel = out_dir.relative_to(root)
    with tempfile.TemporaryDirectory(prefix="tessera-protos-") as d:
        stage = Path(d) / "stage"
        build = Path(d) / "build"
        (stage / rel).mkdir(parents=True)
        (build / rel).mkdir(parents=True)
        for name, data in protos.items():
            (stage / rel / f"{name}.proto").write_bytes(data)
        include = str(Path(protoc.__file__).parent / "_proto")
        for name in protos:
            args = [
                "grpc_tools.protoc",
                f"-I{stage}",
                f"-I{include}",
                f"--python_out={build}",
                f"--pyi_out={build}",
                f"--grpc_python_out={build}",
                str(rel / f"{name}.proto"),
            ]
            if protoc.main(args) != 0:
                raise ProtoBuildError(f"grpc_tools.protoc failed on {MODULE}@{version} {name}")
        # Replace the generated directory as a whole: never a mix of two versions.
        (build / rel / "__init__.py").write_text(
            f'"""Generated by tessera.driver.protos from {MODULE}@{version}; do not edit."""\n'
        )
        (build / rel / STAMP).write_text(stamp)
        tmp = out_dir.with_name(out_dir.name + ".new")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(build / rel, tmp)
        old = out_dir.with_name(out_dir.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if out_dir.exists():
            out_dir.rename(old)
        tmp.rename(out_dir)
        shutil.rmtree(old, ignore_errors=True)
    if not quiet:
        print(f"tessera.driver.protos: generated {', '.join(protos)} from {MODULE}@{version}")
    return True


def main() -> int:
    """``python -m tessera.driver.protos``: generate; one line on error, exit 2."""
    try:
        generate()
    except ProtoBuildError as e:
        print(f"tessera.driver.protos: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
