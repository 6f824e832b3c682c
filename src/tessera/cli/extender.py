"""``tessera extender``: kube-scheduler extender serving HAMi's node policies (binpack, spread)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from tessera.cli._common import UserError, fail
from tessera.cli.webhook import kube_client


@click.command()
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8888,
    show_default=True,
    help="Port (0: any free port).",
)
@click.option(
    "--bind-address",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (kube-scheduler's sidecar: loopback).",
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    default=None,
    help="Kubeconfig; in-cluster config when absent.",
)
@click.option(
    "--default-node-policy",
    type=click.Choice(["first-fit", "binpack", "spread"]),
    default="first-fit",
    show_default=True,
    help="Policy for pods without hami.io/node-scheduler-policy (first-fit: no opinion, the scheduler decides).",
)
@click.option(
    "--tls-cert-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Serve HTTPS with this certificate (reloaded when it changes).",
)
@click.option(
    "--tls-private-key-file", type=click.Path(dir_okay=False), default=None, help="Its private key."
)
@click.option(
    "--port-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the port listened on to this file once serving.",
)
@click.option(
    "--legacy",
    is_flag=True,
    help="Legacy mode (no DRA): also serve filter and bind, deciding with Tessera's allocator over "
    "the GPUs device plugins register in hami.io/node-nvidia-register and the decisions recorded "
    "on pods (deploy/legacy/scheduler-config.yaml).",
)
@click.option(
    "--default-gpu-policy",
    type=click.Choice(["first-fit", "binpack", "spread", "topology"]),
    default=None,
    help="Legacy mode: the policy for pods without HAMi's policy annotations (default: "
    "--default-node-policy).",
)
@click.option("-v", "--verbose", is_flag=True, help="Log every prioritize call and its scores.")
def extender(
    port: int,
    bind_address: str,
    kubeconfig: str | None,
    default_node_policy: str,
    tls_cert_file: str | None,
    tls_private_key_file: str | None,
    port_file: str | None,
    legacy: bool,
    default_gpu_policy: str | None,
    verbose: bool,
) -> None:
    """Serve kube-scheduler's extender `prioritize` verb (POST /prioritize): nodes are ranked
    by the pod's hami.io/node-scheduler-policy (binpack: most-booked first; spread: least-booked
    first), from the ResourceSlices and allocated ResourceClaims it watches: the node usage
    `tessera simulate --policy` uses. Configure it in KubeSchedulerConfiguration.extenders
    (deploy/webhook/scheduler-config.yaml). Device choice inside a node stays the scheduler's.

    With --legacy (clusters without DRA): POST /filter, /prioritize and /bind decide with
    Tessera's allocator over the GPUs device plugins register on Nodes
    (hami.io/node-nvidia-register) and the decisions recorded on pods; bind re-reads the pod,
    the Node and its pods, writes HAMi's records on the pod and POSTs the Binding
    (deploy/legacy/scheduler-config.yaml, docs/legacy-extender.md).

    Exit status: 0 on SIGTERM/SIGINT; 2 on bad input.
    """
    import asyncio
    import ssl

    import uvloop

    from tessera.extender.server import make_app
    from tessera.kube.watch import Informer
    from tessera.webhook.server import CertReloader, serve

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    certs = None
    if (tls_cert_file is None) != (tls_private_key_file is None):
        fail("--tls-cert-file and --tls-private-key-file go together")
    if tls_cert_file and tls_private_key_file:
        try:
            certs = CertReloader(Path(tls_cert_file), Path(tls_private_key_file))
        except (OSError, ssl.SSLError) as e:
            fail(f"--tls-cert-file {tls_cert_file}: cannot load ({e})")
    try:
        client = kube_client(kubeconfig)
    except UserError as e:
        fail(str(e))
    if legacy:
        from tessera.convert.hami import VGPU_NODE
        from tessera.extender.legacy import LegacyExtender

        nodes = Informer(client, "v1", "Node").start()
        booked = Informer(client, "v1", "Pod", label_selector=VGPU_NODE).start()
        ext = LegacyExtender(
            lambda name: nodes.get("", name),
            booked.items,
            client,
            default_gpu_policy or default_node_policy,
            pods_generation=lambda: booked.generation,
        )
        app = make_app(
            None,
            default_node_policy,
            ready=lambda: nodes.synced and booked.synced,
            legacy=ext,
        )
        informers = [nodes, booked]
    else:
        informers = [Informer(client, "resource.k8s.io/v1", "ResourceSlice").start()]
        app = _usage_app(client, informers[0], default_node_policy)

    def on_ready(bound: int) -> None:
        scheme = "https" if certs else "http"
        click.echo(
            f"tessera extender: serving {scheme}://{bind_address}:{bound}/"
            + ("filter, prioritize, bind" if legacy else "prioritize"),
            err=True,
        )
        if port_file:
            tmp = Path(port_file + ".tmp")
            tmp.write_text(f"{bound}\n")
            tmp.replace(port_file)

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(app, host=bind_address, port=port, certs=certs, ready=on_ready))
    except OSError as e:
        fail(f"cannot listen on {bind_address}:{port}: {e.strerror or e}")
    finally:
        for i in informers:
            i.stop()


def _usage_app(client: Any, slices: Any, default_node_policy: str) -> Any:
    """The DRA-mode app: prioritize from ResourceSlices and allocated claims."""
    from tessera.extender.prioritize import UsageView
    from tessera.extender.server import make_app

    calls = iter(range(1 << 62))

    def source() -> tuple[int, list[dict[str, Any]], list[dict[str, Any]]]:
        # Claims are read from the API server on every call for a pod that names a policy: the
        # claim allocated for the previous pod a moment ago must count (a watch may lag behind).
        return next(calls), slices.items(), client.list("resource.k8s.io/v1", "ResourceClaim")

    return make_app(UsageView(source), default_node_policy, ready=lambda: slices.synced)
