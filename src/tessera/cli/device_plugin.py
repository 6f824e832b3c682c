"""``tessera device-plugin``: run legacy mode's kubelet device plugin on this node.

Everything it does is in :mod:`tessera.deviceplugin` (and ``docs/legacy.md``, "Device
plugin"); this module turns options into a :class:`tessera.deviceplugin.plugin.DevicePluginConfig`
and reports a start-up failure as one line (exit 2).
"""

from __future__ import annotations

import socket
from pathlib import Path

import click

from tessera import DRIVER_NAME
from tessera.cli._common import catch_termination, fail, logger, wait_for_termination
from tessera.cli._node import (
    CDI_DIR,
    CONTEXT_OVERHEAD,
    DEV_ROOT,
    KUBECONFIG,
    LIBRARY,
    NODE_NAME,
    NVML_LIBRARY,
    context_overhead_bytes,
    require_library,
)
from tessera.enforcement.layout import DEFAULT_STATE_DIR


@click.command("device-plugin")
@NODE_NAME
@KUBECONFIG
@click.option(
    "--kubelet-dir",
    type=click.Path(),
    default="/var/lib/kubelet",
    show_default=True,
    help="The kubelet's directory: the plugin registers on <dir>/device-plugins/kubelet.sock "
    "and serves <dir>/device-plugins/<socket>.",
)
@click.option(
    "--socket",
    "socket_name",
    default="tessera-gpu.sock",
    show_default=True,
    help="This plugin's socket name in <kubelet-dir>/device-plugins.",
)
@click.option(
    "--split",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Shareable nvidia.com/gpu slots per GPU (HAMi's deviceSplitCount).",
)
@CDI_DIR
@click.option(
    "--state-dir",
    type=click.Path(),
    default=DEFAULT_STATE_DIR,
    show_default=True,
    help="Allocation records (deviceplugin/) and one directory per container allocation under "
    "claims/ (limits file, usage region): the monitor's --region-dir is <state-dir>/claims.",
)
@DEV_ROOT
@LIBRARY
@NVML_LIBRARY
@CONTEXT_OVERHEAD
@click.option(
    "--rescan-seconds",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="How often the GPUs' health is read again.",
)
@click.option(
    "--reconcile-seconds",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="How often the files of pods that are gone are removed.",
)
def device_plugin(
    node_name: str | None,
    kubeconfig: str | None,
    kubelet_dir: str,
    socket_name: str,
    split: int,
    cdi_dir: str,
    state_dir: str,
    dev_root: str,
    library: str | None,
    nvml_library: str | None,
    context_overhead: str,
    rescan_seconds: float,
    reconcile_seconds: float,
) -> None:
    """Run legacy mode's kubelet device plugin for nvidia.com/gpu (until SIGTERM).

    Advertises SPLIT slots per GPU, writes the node's hami.io/node-nvidia-register annotation,
    and at Allocate hands the container the GPUs, memory and cores the scheduler extender
    recorded on the pod, enforced as a DRA share is. See docs/legacy.md.
    """
    from tessera.api.errors import TesseraError
    from tessera.deviceplugin.plugin import DevicePlugin, DevicePluginConfig
    from tessera.enforcement import library_path
    from tessera.kube.client import ApiError, KubeClient

    if "/" in socket_name or not socket_name.endswith(".sock"):
        fail(
            f"--socket {socket_name!r}: give a file name ending in .sock, such as tessera-gpu.sock"
        )
    lib = require_library(library or library_path())
    cfg = DevicePluginConfig(
        node_name=node_name or socket.gethostname().lower(),
        device_plugin_dir=Path(kubelet_dir) / "device-plugins",
        state_dir=Path(state_dir),
        cdi_dir=Path(cdi_dir),
        dev_root=Path(dev_root),
        library=Path(lib),
        driver=DRIVER_NAME,
        socket=socket_name,
        nvml_library=nvml_library,
        split=split,
        context_overhead=context_overhead_bytes(context_overhead),
        rescan_seconds=rescan_seconds,
        reconcile_seconds=reconcile_seconds,
    )
    try:
        client = (
            KubeClient.from_kubeconfig(Path(kubeconfig)) if kubeconfig else KubeClient.in_cluster()
        )
        plugin = DevicePlugin(cfg, client, log=logger("device-plugin"))
        got = catch_termination()
        plugin.start()
    except (TesseraError, ApiError) as e:
        fail(str(e))
    wait_for_termination(got)
    plugin.stop()
