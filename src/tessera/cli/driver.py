"""``tessera driver``: run the DRA node driver (kubelet plugin) of this node.

Everything it does is in :mod:`tessera.driver` (and ``docs/driver.md``); this module turns
options into a :class:`tessera.driver.node.DriverConfig` and reports a start-up failure as one
line (exit 2).
"""

from __future__ import annotations

import re
import signal
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

#: What a rolling-update id may be made of (a pod UID is): it names socket files.
_INSTANCE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@click.command("driver")
@NODE_NAME
@KUBECONFIG
@click.option(
    "--kubelet-root-dir",
    type=click.Path(),
    default="/var/lib/kubelet",
    show_default=True,
    help="The kubelet's --root-dir (plugin sockets go under plugins/ and plugins_registry/).",
)
@CDI_DIR
@click.option(
    "--state-dir",
    type=click.Path(),
    default=DEFAULT_STATE_DIR,
    show_default=True,
    help="Checkpoint, GPU registry, and one directory per claim under claims/ (limits file, "
    "usage region): the monitor's --region-dir is <state-dir>/claims.",
)
@DEV_ROOT
@LIBRARY
@NVML_LIBRARY
@click.option(
    "--nvidia-smi",
    default="nvidia-smi",
    show_default=True,
    help="nvidia-smi for the fallback discovery when NVML cannot be loaded.",
)
@click.option(
    "--enforcement-backend",
    type=click.Choice(["auto", "library", "driver-native"]),
    default="auto",
    show_default=True,
    help="How memory limits are enforced; auto detects the NVIDIA driver's own (r615+).",
)
@click.option(
    "--nvidia-cdi-hook",
    default=None,
    help="Path of NVIDIA's nvidia-cdi-hook (driver-native backend; default: from PATH).",
)
@click.option(
    "--driver-root",
    default="/",
    show_default=True,
    help="NVIDIA driver root passed to nvidia-cdi-hook.",
)
@click.option(
    "--nvidia-cdi-kind",
    default=None,
    help="Also hand out <KIND>=<GPU UUID> (e.g. nvidia.com/gpu) so NVIDIA's CDI spec injects driver libraries.",
)
@CONTEXT_OVERHEAD
@click.option(
    "--health-address",
    default="127.0.0.1:51515",
    show_default=True,
    help="HOST:PORT of /healthz and /readyz ('' to disable).",
)
@click.option(
    "--rescan-seconds",
    type=float,
    default=10.0,
    show_default=True,
    help="How often GPUs and their health are read again.",
)
@click.option(
    "--xid-recovery-seconds",
    type=float,
    default=60.0,
    show_default=True,
    help="How long a GPU stays tainted after its last critical XID.",
)
@click.option(
    "--cgroup-root",
    default="/sys/fs/cgroup",
    show_default=True,
    help="The cgroup mount whose version decides whether driver-native limits can work.",
)
@click.option(
    "--device-plugin-dir",
    type=click.Path(),
    default="/var/lib/kubelet/device-plugins",
    show_default=True,
    help="The kubelet's device-plugin directory, checked for another GPU manager's plugin at start.",
)
@click.option(
    "--dynamic-mig",
    envvar="TESSERA_DYNAMIC_MIG",
    default=None,
    metavar="YAML",
    help="GPUs partitioned on demand (MIG instances made at prepare): true, a list of GPU "
    "indices/UUIDs, or {gpus: [...], profiles: [...]} (docs/mig.md). Default: none.",
)
@click.option(
    "--mig-minors",
    type=click.Path(),
    default="/proc/driver/nvidia-caps/mig-minors",
    show_default=True,
    help="The NVIDIA driver's MIG capability device list (the /dev/nvidia-caps nodes of MIG devices).",
)
@click.option(
    "--rolling-update-id",
    default="",
    metavar="ID",
    help="This instance's id, unique on the node (the pod's UID, from the downward API): "
    "sockets are named after it so that two instances are registered at once during a rolling "
    "update (kubelet 1.33+). Default: none (fixed socket names, one instance per node).",
)
@click.option(
    "--handoff-seconds",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="At SIGTERM: how long calls are still answered after the registration socket is removed.",
)
def driver(
    node_name: str | None,
    kubeconfig: str | None,
    kubelet_root_dir: str,
    cdi_dir: str,
    state_dir: str,
    dev_root: str,
    library: str | None,
    nvml_library: str | None,
    nvidia_smi: str,
    enforcement_backend: str,
    nvidia_cdi_hook: str | None,
    driver_root: str,
    nvidia_cdi_kind: str | None,
    context_overhead: str,
    health_address: str,
    rescan_seconds: float,
    xid_recovery_seconds: float,
    cgroup_root: str,
    device_plugin_dir: str,
    dynamic_mig: str | None,
    mig_minors: str,
    rolling_update_id: str,
    handoff_seconds: float,
) -> None:
    """Run the DRA node driver gpu.tessera.dev on this node (until SIGTERM).

    Publishes the node's GPUs as ResourceSlices, registers with the kubelet, and prepares
    claims: limits file, usage region and CDI spec per claim. With --rolling-update-id, two
    instances can serve the node at once (the new one takes over; the old one, on SIGTERM,
    hands over and finishes what it has). See docs/driver.md.
    """
    from tessera.api.errors import TesseraError
    from tessera.driver.node import DriverConfig, NodeDriver
    from tessera.enforcement import library_path
    from tessera.kube.client import KubeClient

    if rolling_update_id and not _INSTANCE_ID.fullmatch(rolling_update_id):
        fail(
            f"--rolling-update-id {rolling_update_id!r}: use letters, digits, '.', '_' and '-' "
            "(at most 128), such as the pod's UID"
        )
    lib = library or library_path()
    dynamic = None
    if dynamic_mig:
        import yaml

        from tessera.inventory.mig import parse_dynamic_mig

        try:
            dynamic = parse_dynamic_mig(yaml.safe_load(dynamic_mig), "--dynamic-mig")
        except yaml.YAMLError as e:
            fail(
                f"--dynamic-mig: {' '.join(str(e).split())}; write YAML such as true, [0, 1] or "
                "{gpus: [0], profiles: [1g.10gb]}"
            )
        except ValueError as e:
            fail(str(e))
    overhead = context_overhead_bytes(context_overhead)
    cfg = DriverConfig(
        node_name=node_name or socket.gethostname().lower(),
        kubelet_root=Path(kubelet_root_dir),
        cdi_dir=Path(cdi_dir),
        state_dir=Path(state_dir),
        dev_root=Path(dev_root),
        library=Path(lib) if lib else None,
        nvml_library=nvml_library,
        nvidia_smi=nvidia_smi,
        enforcement_backend=enforcement_backend,
        cdi_hook=nvidia_cdi_hook,
        driver_root=driver_root,
        nvidia_cdi_kind=nvidia_cdi_kind,
        context_overhead=overhead,
        driver=DRIVER_NAME,
        health_address=health_address or None,
        rescan_seconds=rescan_seconds,
        xid_recovery_seconds=xid_recovery_seconds,
        cgroup_root=cgroup_root,
        device_plugin_dir=Path(device_plugin_dir),
        dynamic_mig=dynamic,
        mig_minors=Path(mig_minors),
        instance=rolling_update_id,
        handoff_seconds=handoff_seconds,
    )
    require_library(lib)
    try:
        client = (
            KubeClient.from_kubeconfig(Path(kubeconfig)) if kubeconfig else KubeClient.in_cluster()
        )
        node = NodeDriver(cfg, client, log=logger("driver"))
        got = catch_termination()  # before start() logs "serving" (callers stop it at once)
        node.start()
    except TesseraError as e:
        fail(str(e))
    sig = wait_for_termination(got)
    node.stop(why=signal.Signals(sig).name)
