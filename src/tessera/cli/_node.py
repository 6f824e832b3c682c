"""Options the two node agents share (``tessera driver`` and ``tessera device-plugin``): the
node's identity and the claim files both modes write the same way (CDI specs, device nodes,
the enforcement library, NVML, the per-context charge). One definition each, so the two
commands take the same flags with the same defaults and help."""

from __future__ import annotations

import click

from tessera.cli._common import fail

NODE_NAME = click.option(
    "--node-name",
    envvar="NODE_NAME",
    default=None,
    help="This node's name (default: $NODE_NAME, else the host name).",
)
KUBECONFIG = click.option(
    "--kubeconfig",
    type=click.Path(),
    envvar="KUBECONFIG",
    default=None,
    help="Kubeconfig of the API server (default: $KUBECONFIG, else in-cluster).",
)
CDI_DIR = click.option(
    "--cdi-dir",
    type=click.Path(),
    default="/var/run/cdi",
    show_default=True,
    help="CDI spec directory the container runtime reads.",
)
DEV_ROOT = click.option(
    "--dev-root",
    type=click.Path(),
    default="/",
    show_default=True,
    help="Host directory holding dev/nvidia* (the device nodes handed to containers).",
)
LIBRARY = click.option(
    "--library",
    type=click.Path(),
    default=None,
    help="Host path of libtessera-enforce.so (default: the one installed with Tessera).",
)
NVML_LIBRARY = click.option(
    "--nvml-library",
    type=click.Path(),
    default=None,
    help="Path of libnvidia-ml.so.1 to use (default: the loader's search).",
)
CONTEXT_OVERHEAD = click.option(
    "--context-overhead",
    default="512Mi",
    show_default=True,
    help="Device memory each CUDA context is charged of a share's memory (a quantity: 512Mi).",
)


def context_overhead_bytes(text: str) -> int:
    """``--context-overhead`` in bytes; a clear one-line failure (exit 2) for anything but a
    whole, non-negative quantity."""
    from tessera.api.quantity import Quantity, QuantityError

    try:
        q = Quantity.parse(text)
    except QuantityError as e:
        fail(f"--context-overhead {text!r}: {e}; write bytes or a quantity such as 512Mi")
    if not q.is_integer() or q.sign() < 0:
        fail(f"--context-overhead {text!r}: write a whole, non-negative quantity such as 512Mi")
    return q.value_int()


def require_library(lib: str | None) -> str:
    """``lib`` (the enforcement library's host path) when the file exists; else a one-line
    failure (exit 2) naming it and how to build it."""
    import os

    if lib is None or not os.path.isfile(lib):
        fail(
            f"--library: enforcement library {lib or 'libtessera-enforce.so'} not found; build it "
            "with `make native`"
        )
    return lib
