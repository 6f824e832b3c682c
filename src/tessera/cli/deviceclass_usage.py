"""``tessera deviceclass-usage``: which claims name a DeviceClass; keeps used classes out of
``helm uninstall``.

The chart's pre-delete hook runs ``tessera deviceclass-usage --keep-used RELEASE
--release-namespace NS gpu.tessera.dev mig.gpu.tessera.dev``: a class that a ResourceClaim or
ResourceClaimTemplate still names is detached from the Helm release (Helm 4 deletes only what
its release owns, by the live object's ``meta.helm.sh/release-name`` and
``meta.helm.sh/release-namespace`` annotations) and annotated with why it was kept; an unused
class is left to ``helm uninstall``, which deletes it. RBAC: ``list`` on resourceclaims and
resourceclaimtemplates, ``get``/``patch`` on deviceclasses.
"""

from __future__ import annotations

from pathlib import Path

import click

from tessera.cli._common import fail

#: Annotation set on a DeviceClass kept at uninstall: why, and how to delete it later.
KEPT_ANNOTATION = "gpu.tessera.dev/kept-at-uninstall"
HELM_OWNER_ANNOTATIONS = ("meta.helm.sh/release-name", "meta.helm.sh/release-namespace")


@click.command("deviceclass-usage")
@click.argument("classes", nargs=-1, required=True)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    default=None,
    help="Kubeconfig; in-cluster config (the pod's ServiceAccount) when absent.",
)
@click.option(
    "--keep-used",
    "release",
    default=None,
    metavar="RELEASE",
    help="Detach each used class from Helm release RELEASE, so that `helm uninstall` keeps it.",
)
@click.option(
    "--release-namespace", default=None, help="The release's namespace (with --keep-used)."
)
def deviceclass_usage(
    classes: tuple[str, ...],
    kubeconfig: str | None,
    release: str | None,
    release_namespace: str | None,
) -> None:
    """Print, for each DeviceClass, the ResourceClaims and ResourceClaimTemplates naming it.

    One line per class. Exit 0; 2 when the cluster cannot be read or written.
    """
    from tessera.api.deviceclass import class_users
    from tessera.api.errors import TesseraError
    from tessera.kube.client import ApiError, KubeClient

    if release and not release_namespace:
        fail("--keep-used needs --release-namespace (the namespace the release was installed in)")
    try:
        client = (
            KubeClient.from_kubeconfig(Path(kubeconfig)) if kubeconfig else KubeClient.in_cluster()
        )
    except TesseraError as e:
        fail(str(e))
    try:
        objects = client.list("resource.k8s.io/v1", "ResourceClaim") + client.list(
            "resource.k8s.io/v1", "ResourceClaimTemplate"
        )
        for name in classes:
            users = class_users(objects, name)
            try:
                current = client.get("resource.k8s.io/v1", "DeviceClass", name)
            except ApiError as e:
                if e.status != 404:
                    raise
                click.echo(f"DeviceClass {name}: not found")
                continue
            if not users:
                click.echo(f"DeviceClass {name}: unused")
                continue
            shown = ", ".join(users[:5]) + (f" and {len(users) - 5} more" if len(users) > 5 else "")
            line = f"DeviceClass {name}: used by {len(users)} object(s): {shown}"
            if release:
                annotations = (current.get("metadata") or {}).get("annotations") or {}
                if (
                    annotations.get(HELM_OWNER_ANNOTATIONS[0]) == release
                    and annotations.get(HELM_OWNER_ANNOTATIONS[1]) == release_namespace
                ):
                    why = (
                        f"kept by helm uninstall of {release_namespace}/{release}: used by {len(users)} object(s) "
                        f"({shown}); delete it with `kubectl delete deviceclass {name}` once they are gone"
                    )
                    client.request(
                        "PATCH",
                        client.collection_path("resource.k8s.io/v1", "DeviceClass", None)
                        + f"/{name}",
                        body={
                            "metadata": {
                                "annotations": {
                                    HELM_OWNER_ANNOTATIONS[0]: None,
                                    HELM_OWNER_ANNOTATIONS[1]: None,
                                    KEPT_ANNOTATION: why,
                                }
                            }
                        },
                        content_type="application/merge-patch+json",
                        what=f"DeviceClass {name}",
                    )
                    line += f"; kept (detached from release {release_namespace}/{release})"
            click.echo(line)
    except ApiError as e:
        fail(
            f"API server {client.server}: {e} (this needs list on resourceclaims and resourceclaimtemplates, "
            "get and patch on deviceclasses: the chart's uninstall hook ClusterRole)"
        )
