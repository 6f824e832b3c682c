"""``tessera webhook``: the mutating admission webhook that turns HAMi requests into DRA claims.

See ``docs/webhook.md`` for deployment (``deploy/webhook/``), certificates and the template
life cycle.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tessera.cli._common import UserError, configure_logging, fail, logger

if TYPE_CHECKING:
    from tessera.kube.client import KubeClient


def kube_client(kubeconfig: str | None) -> KubeClient:
    """A :class:`~tessera.kube.client.KubeClient` from ``--kubeconfig``, else the pod's own
    ServiceAccount (in-cluster). Raises :class:`UserError` (``KubeconfigError``)."""
    from tessera.kube.client import KubeClient

    if kubeconfig:
        return KubeClient.from_kubeconfig(Path(kubeconfig))
    return KubeClient.in_cluster()


def check_extended_resource(client: KubeClient) -> str:
    """Who serves ``nvidia.com/gpu`` now (logged at start-up): Tessera's DeviceClass, another
    class that maps the same name (the NVIDIA DRA driver's), or nobody."""
    from tessera import DEVICE_CLASS_NAME
    from tessera.api.deviceclass import extended_resource_owner
    from tessera.kube.client import ApiError

    try:
        classes = client.list("resource.k8s.io/v1", "DeviceClass")
    except ApiError as e:
        return f"cannot list DeviceClasses to check who serves nvidia.com/gpu: {e}"
    owner = extended_resource_owner(classes)
    msg = owner.message()
    if owner.winner is not None and owner.winner != DEVICE_CLASS_NAME:
        msg += (
            f"; pods asking only nvidia.com/gpu that this webhook does not convert are served by {owner.winner}, "
            f"not by Tessera (see docs/webhook.md, 'Who owns nvidia.com/gpu')"
        )
    return msg


@click.command()
@click.option(
    "--tls-cert-file",
    type=click.Path(dir_okay=False),
    required=True,
    help="Serving certificate (PEM); reloaded when the file changes.",
)
@click.option(
    "--tls-private-key-file",
    type=click.Path(dir_okay=False),
    required=True,
    help="Its private key (PEM); reloaded with it.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8443,
    show_default=True,
    help="HTTPS port (0: any free port).",
)
@click.option("--bind-address", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    default=None,
    help="Kubeconfig; in-cluster config (the pod's ServiceAccount) when absent.",
)
@click.option(
    "--template-grace",
    type=click.FloatRange(min=1),
    default=600.0,
    show_default=True,
    help="Seconds an unused ResourceClaimTemplate of the webhook is kept after its last admission.",
)
@click.option(
    "--collect-interval",
    type=click.FloatRange(min=0.1),
    default=60.0,
    show_default=True,
    help="Seconds between two passes of the template collector.",
)
@click.option(
    "--no-collector",
    is_flag=True,
    help="Do not run the template collector in this process (run it elsewhere).",
)
@click.option(
    "--port-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the port listened on to this file once serving (tests, --port 0).",
)
@click.option(
    "--drain-seconds",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="After SIGTERM, keep answering for this long (connections closed after each answer, "
    "/readyz 503) while the pod leaves the Service's endpoints; then stop.",
)
@click.option(
    "--mode",
    type=click.Choice(["dra", "legacy", "both"]),
    default="dra",
    show_default=True,
    help="dra: HAMi pods become DRA claims. legacy (no DRA on the cluster): they keep their "
    "requests and get spec.schedulerName --legacy-scheduler, on /mutate-pods; no ResourceSlice, "
    "DeviceClass or template is read or written. both: /mutate-pods converts for DRA, "
    "/mutate-pods-legacy for legacy mode (docs/legacy.md).",
)
@click.option(
    "--legacy-scheduler",
    default="tessera-legacy",
    show_default=True,
    help="Legacy mode's scheduler name (its kube-scheduler profile's schedulerName).",
)
@click.option("-v", "--verbose", is_flag=True, help="Log each denial and collection.")
def webhook(
    tls_cert_file: str,
    tls_private_key_file: str,
    port: int,
    bind_address: str,
    kubeconfig: str | None,
    template_grace: float,
    collect_interval: float,
    no_collector: bool,
    port_file: str | None,
    drain_seconds: float,
    mode: str,
    legacy_scheduler: str,
    verbose: bool,
) -> None:
    """Serve the mutating admission webhook on HTTPS: AdmissionReview (admission.k8s.io/v1) on
    /mutate-pods, /healthz, /readyz.

    HAMi-style pods (nvidia.com/gpu, gpumem, gpucores, gpumem-percentage, ...) are converted by
    the same code as `tessera convert` and `tessera simulate` into DRA claims: the webhook
    ensures a ResourceClaimTemplate named by the hash of its spec and patches the pod to use it.
    Unused templates are deleted --template-grace seconds after their last admission. With
    --mode legacy or both, HAMi pods for legacy mode keep their requests and get the legacy
    scheduler (spec.schedulerName). On SIGTERM it drains for --drain-seconds (still answering), then stops.

    Exit status: 0 on SIGTERM/SIGINT; 2 on bad input (certificates, kubeconfig).
    """
    import ssl

    from tessera.kube.watch import Informer
    from tessera.webhook.admission import ClusterView
    from tessera.webhook.server import CertReloader, Webhook
    from tessera.webhook.templates import Collector, TemplateStore

    if mode != "dra" and not legacy_scheduler:
        fail(f"--mode {mode} needs --legacy-scheduler (the legacy kube-scheduler's profile name)")
    configure_logging("webhook", logging.INFO if verbose else logging.WARNING)
    log = logger("webhook")
    try:
        certs = CertReloader(Path(tls_cert_file), Path(tls_private_key_file))
    except (OSError, ssl.SSLError) as e:
        fail(
            f"--tls-cert-file {tls_cert_file} / --tls-private-key-file {tls_private_key_file}: cannot load ({e}); "
            "give a PEM certificate and its matching key"
        )
    try:
        client = kube_client(kubeconfig)
    except UserError as e:
        fail(str(e))
    if mode == "legacy":  # resource.k8s.io may not be served: nothing of DRA is read
        _serve(
            Webhook(ClusterView.static([]), None, mode=mode, legacy_scheduler=legacy_scheduler),
            certs,
            bind_address,
            port,
            port_file,
            drain_seconds,
            log,
        )
        return
    log(check_extended_resource(client))
    slices = Informer(client, "resource.k8s.io/v1", "ResourceSlice").start()
    # the DeviceClasses say which other vendors' DRA drivers are installed (tessera.api.vendors)
    classes = Informer(client, "resource.k8s.io/v1", "DeviceClass").start()
    view = ClusterView(
        slices.items,
        lambda: slices.generation + classes.generation,
        lambda: slices.synced and classes.synced,
        classes=classes.items,
    )
    view_stop = view.start()  # derived state rebuilt off the request path when slices change
    # a stamp younger than grace / 2 leaves the template safe from every collector for
    # grace / 2 more: admissions do not wait for its refresh
    store = TemplateStore(client, refresh=min(60.0, template_grace / 4), trusted=template_grace / 2)
    collector = None
    if not no_collector:
        collector = Collector(client, grace=template_grace, interval=collect_interval, store=store)
        collector.start()
    hook = Webhook(
        view, store, ready=lambda: slices.synced, mode=mode, legacy_scheduler=legacy_scheduler
    )
    try:
        _serve(hook, certs, bind_address, port, port_file, drain_seconds, log)
    finally:
        view_stop.set()
        slices.stop()
        classes.stop()
        if collector is not None:
            collector.stop()


def _serve(
    hook: Any,
    certs: Any,
    bind_address: str,
    port: int,
    port_file: str | None,
    drain_seconds: float,
    log: Callable[[str], None],
) -> None:
    """Serve ``hook`` (a :class:`tessera.webhook.server.Webhook`) until SIGTERM, then log its
    counters."""
    import asyncio

    import uvloop

    from tessera.webhook.server import MUTATE_LEGACY_PATH, MUTATE_PATH, serve

    def on_ready(bound: int) -> None:
        paths = [MUTATE_PATH] + ([MUTATE_LEGACY_PATH] if hook.mode == "both" else [])
        log(
            f"serving https://{bind_address}:{bound}{', '.join(paths)} (mode {hook.mode}"
            + (f", legacy scheduler {hook.legacy_scheduler})" if hook.mode != "dra" else ")")
        )
        if port_file:
            tmp = Path(port_file + ".tmp")
            tmp.write_text(f"{bound}\n")
            tmp.replace(port_file)

    def on_drain() -> None:  # in a signal handler: only a flag
        hook.draining = True

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(
                serve(
                    hook.app(),
                    host=bind_address,
                    port=port,
                    certs=certs,
                    ready=on_ready,
                    drain=drain_seconds,
                    on_drain=on_drain,
                    log_stop=log,
                )
            )
    except OSError as e:
        fail(f"cannot listen on {bind_address}:{port}: {e.strerror or e}")
    finally:
        c = hook.counters
        log(
            f"stopped: {c.reviews} review(s) answered ({c.converted} converted, {c.denied} denied, "
            f"{c.bad_requests} bad)"
        )


@click.command("collect-templates")
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    default=None,
    help="Kubeconfig; in-cluster config (the pod's ServiceAccount) when absent.",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=600.0,
    show_default=True,
    help="Keep a template admitted less than this many seconds ago (the webhook's --template-grace).",
)
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="Ignore --grace: delete every template of the webhook that no pod still needs "
    "(a pod whose claim has not been made from it yet). For `helm uninstall`.",
)
def collect_templates(kubeconfig: str | None, grace: float, everything: bool) -> None:
    """Delete the webhook's unused hashed ResourceClaimTemplates, once, and say what was done.

    Without --all: what the webhook's own collector does every --collect-interval (unused and
    not admitted for --grace seconds). With --all (the chart's pre-delete hook): every template
    labelled gpu.tessera.dev/template-hash, except those a pod still needs to get its claim
    made. Prints one line per deleted template, then a summary. RBAC: list and delete
    resourceclaimtemplates, list pods.

    Exit status: 0 (templates still needed are named, not an error: the pod can go on once
    Tessera is installed again); 2 when the cluster cannot be read or a template cannot be
    deleted.
    """
    from tessera.kube.client import ApiError
    from tessera.webhook.templates import Collector

    try:
        client = kube_client(kubeconfig)
        collector = Collector(client, grace=grace)
        result = collector.collect(everything=everything)
    except UserError as e:
        fail(str(e))
    except ApiError as e:
        fail(f"collecting ResourceClaimTemplates: {e}")
    for ns, name in result.deleted:
        click.echo(f"deleted ResourceClaimTemplate {ns}/{name}")
    click.echo(
        f"{len(result.deleted)} deleted, {result.in_use} kept in use, {result.young} kept young"
        + (
            f"; still needed by pods waiting for their claim: {', '.join(result.needed_by)}"
            if result.needed_by
            else ""
        )
    )
