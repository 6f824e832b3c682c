"""``tessera explain`` and ``tessera lint``. Bad input prints one line and exits 2, as every
Tessera command."""

from __future__ import annotations

import json
import sys

import click

from tessera.cli._common import UserError, class_map, cluster_inputs, fail, load_inputs


@click.command()
@click.argument("target", metavar="POD_OR_CLAIM")
@click.argument("manifests", nargs=-1, type=click.Path())
@cluster_inputs
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--all-devices", is_flag=True, help="Also list every device's verdict, not only grouped reasons.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for shareIDs, as in simulate.")
def explain(
    target: str,
    manifests: tuple[str, ...],
    cluster_file: str | None,
    node_specs: tuple[str, ...],
    kubeconfig: str | None,
    add_nodes: tuple[str, ...],
    class_maps: tuple[str, ...],
    output: str,
    all_devices: bool,
    seed: int,
) -> None:
    """Explain why POD_OR_CLAIM (namespace/name or name) is pending, or where and why it fit.

    Takes the same inputs as `tessera simulate` (with none: the bundled default; with
    --kubeconfig: a live cluster, e.g. `tessera explain NS/POD --kubeconfig ~/.kube/config`
    for a pod pending there), runs the simulation, then for the pod's claims reports per node and per device the first check that
    refused it: selector sub-expression, capacity short by how much, request policy, taint,
    constraint, incomplete pool. HAMi-style pods get a line in HAMi's words as well.
    """
    from tessera.explain.explain import explain as run_explain
    from tessera.explain.explain import render_text

    try:
        cluster, loaded = load_inputs(manifests, cluster_file, node_specs, kubeconfig, add_nodes)
        exp = run_explain(cluster, loaded, target, seed=seed, all_devices=all_devices, class_map=class_map(class_maps))
    except UserError as e:
        fail(str(e))
        return
    if output == "json":
        click.echo(json.dumps(exp.to_dict(), indent=2, ensure_ascii=False))
    else:
        click.echo(render_text(exp))


@click.command()
@click.argument("manifests", nargs=-1, required=True, type=click.Path())
@click.option("--cluster", "cluster_file", type=click.Path(), help="Check names against the devices this cluster publishes.")
def lint(manifests: tuple[str, ...], cluster_file: str | None) -> None:
    """Lint DeviceClasses, ResourceClaims and ResourceClaimTemplates in MANIFESTS before they
    are applied. Prints one line per finding:
    `file (document N): Kind ns/name: field: problem. fix: ...`.

    Exit status: 0 clean, 1 findings, 2 unreadable input (e.g. a Helm template).
    """
    from tessera.api.loader import load_files
    from tessera.explain.lint import lint as run_lint
    from tessera.sim.cluster import load_cluster

    try:
        loaded = load_files(manifests)
        slices = [s for n in load_cluster(cluster_file).nodes for s in n.slices] if cluster_file else []
        findings = run_lint(loaded, slices)
    except UserError as e:
        fail(str(e))
        return
    for f in findings:
        click.echo(str(f))
    sys.exit(1 if findings else 0)
