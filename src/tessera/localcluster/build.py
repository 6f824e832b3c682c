"""Where the control-plane and node binaries live, and building them (``tools/kube/build.sh``).

Binaries (:data:`BINARIES`): the control plane (:data:`CONTROL_PLANE_BINARIES`: ``etcd``,
``kube-apiserver``, ``kube-scheduler``, ``kube-controller-manager``, ``kubectl``,
``allocator-harness``) and a real node (:data:`NODE_BINARIES`: ``kubelet``, ``kube-proxy``, ``containerd``,
``containerd-shim-runc-v2``, ``ctr``), compiled from Go modules into ``tools/kube/bin``.

Lookup order for the directory holding them:

1. ``$TESSERA_KUBE_BIN`` (prebuilt binaries; never rebuilt),
2. ``<tools>/bin`` where ``<tools>`` is ``$TESSERA_KUBE_TOOLS`` or the ``tools/kube`` folder
   of the source checkout this package was installed from (editable installs).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TextIO

CONTROL_PLANE_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubectl",
    "allocator-harness",
)
#: What ``tessera cluster up --kubelet`` needs besides the control plane.
NODE_BINARIES = ("kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2", "ctr")
BINARIES = CONTROL_PLANE_BINARIES + NODE_BINARIES


class BuildError(RuntimeError):
    """The binaries are missing and could not be built; the message says why and what to do."""


def tools_dir() -> Path | None:
    """The ``tools/kube`` directory (with ``build.sh``), or None when not available."""
    env = os.environ.get("TESSERA_KUBE_TOOLS")
    if env:
        return Path(env)
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "tools" / "kube"
        if (candidate / "build.sh").is_file():
            return candidate
    return None


def bin_dir() -> Path:
    """Directory the binaries are (or will be) in. Raises :class:`BuildError` if unknown."""
    env = os.environ.get("TESSERA_KUBE_BIN")
    if env:
        return Path(env)
    tools = tools_dir()
    if tools is None:
        raise BuildError(
            "cannot find tools/kube (the Go module that builds the control plane): run from a "
            "Tessera source checkout installed with `pip install -e .`, or set TESSERA_KUBE_TOOLS "
            "to its tools/kube directory, or TESSERA_KUBE_BIN to a directory of prebuilt binaries"
        )
    return tools / "bin"


def missing_binaries(names: tuple[str, ...] = CONTROL_PLANE_BINARIES) -> list[str]:
    """Names from ``names`` (default: the control plane) that are not executable files in
    :func:`bin_dir`."""
    d = bin_dir()
    return [b for b in names if not os.access(d / b, os.X_OK)]


def ensure_built(*, force: bool = False, output: TextIO | None = None, node: bool = False) -> Path:
    """Run ``tools/kube/build.sh`` (a no-op when up to date) and return :func:`bin_dir`.

    With ``$TESSERA_KUBE_BIN`` set nothing is built; missing binaries raise: those of the
    control plane, and with ``node`` also :data:`NODE_BINARIES`. Build output goes to
    ``output`` (default: stderr). The first build compiles Kubernetes, etcd and containerd
    from the Go module proxy: about 30 minutes on 2 cores (see docs/cluster.md).
    Raises :class:`BuildError` when go is missing or the build fails.
    """
    if os.environ.get("TESSERA_KUBE_BIN"):
        missing = missing_binaries(BINARIES if node else CONTROL_PLANE_BINARIES)
        if missing:
            raise BuildError(
                f"TESSERA_KUBE_BIN={os.environ['TESSERA_KUBE_BIN']} lacks {', '.join(missing)}; "
                "unset it to build from tools/kube, or copy the binaries there"
            )
        return bin_dir()
    tools = tools_dir()
    if tools is None:
        bin_dir()  # raises with the explanation
        raise AssertionError("unreachable")
    script = tools / "build.sh"
    out = output if output is not None else sys.stderr
    cmd = ["bash", str(script), *(["--force"] if force else [])]
    proc = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
    )
    out.write(proc.stdout)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-20:])
        raise BuildError(f"{script} failed with exit status {proc.returncode}:\n{tail}")
    return bin_dir()


def binary(name: str) -> Path:
    """Path of one binary (not checked for existence)."""
    if name not in BINARIES:
        raise ValueError(f"unknown binary {name!r}; known: {', '.join(BINARIES)}")
    return bin_dir() / name
