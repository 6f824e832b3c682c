"""The ``tessera`` command line: the one entry-point package.

Every command lives in a module here (``simulate``, ``explain``/``lint``, ``convert``, ``cluster``, ``monitor``,
``webhook``, ``extender``) and
reports bad input the same way (:func:`tessera.cli._common.fail`: one line, exit 2), catching
only :class:`tessera.api.errors.TesseraError`, the root of every user error. Services
(``sim``, ``explain``, ``kube``...) and core packages never import this package.
"""

from __future__ import annotations

import click

from tessera import DRIVER_NAME, KUBERNETES_VERSION


@click.group()
@click.version_option(
    package_name="tessera",
    prog_name="tessera",
    message=(
        f"%(prog)s %(version)s\ntargets Kubernetes {KUBERNETES_VERSION}: resource.k8s.io/v1 with "
        f"DRAConsumableCapacity (KEP-5075); DRA driver {DRIVER_NAME}"
    ),
)
def main() -> None:
    """Tessera: share NVIDIA GPUs on Kubernetes by memory and compute through DRA."""


def _register() -> None:
    from tessera.cli.cluster import cluster
    from tessera.cli.convert import convert
    from tessera.cli.explain import explain, lint
    from tessera.cli.extender import extender
    from tessera.cli.monitor import monitor
    from tessera.cli.simulate import simulate
    from tessera.cli.webhook import webhook

    for cmd in (simulate, explain, lint, convert, cluster, monitor, webhook, extender):
        main.add_command(cmd)


_register()

__all__ = ["main"]
