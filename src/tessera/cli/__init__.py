"""The ``tessera`` command line: the one entry-point package.

Every command lives in a module here (``simulate``, ``explain``/``lint``, ``convert``, ``cluster``, ``monitor``,
``webhook``, ``extender``, ``driver``, ``device-plugin``, ``deviceclass-usage``) and
reports bad input the same way (:func:`tessera.cli._common.fail`: one line, exit 2), catching
only :class:`tessera.api.errors.TesseraError`, the root of every user error. Services
(``sim``, ``explain``, ``kube``...) and core packages never import this package.
"""

from __future__ import annotations

import importlib

import click

from tessera import DRIVER_NAME, KUBERNETES_VERSION

#: Command name -> ``module:attribute``, imported when the command is used (so a node agent such
#: as ``tessera driver`` does not pay for the simulator's imports at start).
COMMANDS = {
    "simulate": "tessera.cli.simulate:simulate",
    "explain": "tessera.cli.explain:explain",
    "lint": "tessera.cli.explain:lint",
    "convert": "tessera.cli.convert:convert",
    "cluster": "tessera.cli.cluster:cluster",
    "monitor": "tessera.cli.monitor:monitor",
    "webhook": "tessera.cli.webhook:webhook",
    "collect-templates": "tessera.cli.webhook:collect_templates",
    "extender": "tessera.cli.extender:extender",
    "driver": "tessera.cli.driver:driver",
    "device-plugin": "tessera.cli.device_plugin:device_plugin",
    "deviceclass-usage": "tessera.cli.deviceclass_usage:deviceclass_usage",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(module), attr), cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_LazyGroup)
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


__all__ = ["main"]
