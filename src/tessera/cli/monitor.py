"""``tessera monitor``: the node exporter of per-share GPU metrics (Prometheus).

Exit status: 0 after SIGTERM/SIGINT; 2 when it cannot start (bad ``--region-dir``, NVML
missing without ``--no-nvml``, API server unreachable or refusing, port taken), with one line
on stderr saying how to fix it. Once running, a bad region or a failing API server is logged
once and the other figures keep being served.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import click

from tessera.cli._common import (
    UserError,
    catch_termination,
    fail,
    logger,
    wait_for_termination,
)
from tessera.monitor import DEFAULT_PORT
from tessera.monitor.regions import DEFAULT_REGION_DIR

#: Every line the monitor logs: RFC 3339 UTC time, ``tessera monitor:``, the message.
_log = logger("monitor")


@click.command()
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="Port of the /metrics endpoint (HAMi's vGPU monitor port; 0 = any free port).",
)
@click.option("--address", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option(
    "--region-dir",
    type=click.Path(path_type=Path),
    default=DEFAULT_REGION_DIR,
    show_default=True,
    help="Where the node driver keeps one directory per claim (usage region, limits, claim.json).",
)
@click.option(
    "--node-name",
    default=None,
    help="This node's name (as in its ResourceSlices) [default: $NODE_NAME, else the host name].",
)
@click.option(
    "--nvml/--no-nvml",
    "use_nvml",
    default=True,
    show_default=True,
    help="Read device-level figures from NVML (nvidia-ml-py, libnvidia-ml.so.1).",
)
@click.option(
    "--kubeconfig",
    type=click.Path(path_type=Path),
    default=None,
    help="Read allocations from this cluster [default: in-cluster ServiceAccount when run in a pod].",
)
@click.option(
    "--api/--no-api",
    "use_api",
    default=True,
    show_default=True,
    help="Export allocation figures from the API server (ResourceSlices, ResourceClaims, Pods).",
)
@click.option(
    "--api-interval",
    type=click.FloatRange(min=1),
    default=30.0,
    show_default=True,
    help="Seconds between reads of the API server.",
)
def monitor(
    port: int,
    address: str,
    region_dir: Path,
    node_name: str | None,
    use_nvml: bool,
    kubeconfig: Path | None,
    use_api: bool,
    api_interval: float,
) -> None:
    """Export per-share and per-GPU metrics of this node for Prometheus on PORT.

    Per share (claim x GPU): memory used and limit, cores share, pacing, live processes, read
    from the usage regions the enforcement library keeps; per GPU: memory and utilisation from
    NVML; from the API server: memory and cores allocated per GPU and per share against
    capacity. Both HAMi's metric names and Tessera's are exported (docs/monitoring.md).
    """
    from tessera.kube.client import KubeClient
    from tessera.monitor.nvml import Nvml
    from tessera.monitor.server import ApiRefresher, start

    node = node_name or os.environ.get("NODE_NAME") or socket.gethostname()
    nvml = None
    api = None
    try:
        try:
            listable = region_dir.is_dir() and os.access(region_dir, os.R_OK | os.X_OK)
        except OSError as e:  # a parent the monitor's user cannot enter
            raise UserError(
                f"--region-dir {region_dir}: cannot read it as uid {os.getuid()}: {e.strerror}; "
                "give the monitor read access to the driver's <state-dir>/claims and its parents"
            ) from None
        if not region_dir.is_dir():
            raise UserError(
                f"--region-dir {region_dir}: no such directory: give the directory where the "
                "Tessera driver keeps the claims' usage regions (its <state-dir>/claims)"
            )
        if not listable:
            raise UserError(
                f"--region-dir {region_dir}: cannot list it as uid {os.getuid()}: give the "
                "monitor read access to the driver's <state-dir>/claims"
            )
        if use_nvml:
            nvml = Nvml()
        if use_api:
            client = (
                KubeClient.from_kubeconfig(kubeconfig)
                if kubeconfig is not None
                else KubeClient.in_cluster()
            )
            api = ApiRefresher(client, node, api_interval, _log)
            api.refresh()
        running = start(
            node=node,
            region_dir=str(region_dir),
            port=port,
            address=address,
            nvml=nvml,
            api=api,
            log=_log,
        )
    except UserError as e:
        if nvml is not None:
            nvml.close()
        if use_api and kubeconfig is None and "not running in a pod" in str(e):
            fail(f"{e}, or pass --no-api")
        fail(str(e))
        return
    sources = [
        f"regions {region_dir}",
        f"NVML {nvml.count} GPU(s)" if nvml else "no NVML",
        f"API {api.client.server}" if api else "no API",
    ]
    got = catch_termination()  # before the line callers wait for (tests stop it at once)
    _log(f"node {node}: serving {running.url} ({', '.join(sources)})")
    sig = wait_for_termination(got)
    t0 = time.monotonic()
    running.stop()
    _log(f"stopped (signal {sig}) in {time.monotonic() - t0:.2f} s")
