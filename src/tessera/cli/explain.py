"""``tessera explain`` and ``tessera lint``. Bad input prints one line and exits 2, as every
Tessera command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from tessera.cli._common import (
    UserError,
    class_map,
    cluster_inputs,
    fail,
    input_limits,
    limits_from,
    load_inputs,
    warn,
)


@click.command()
@click.argument("target", metavar="POD_OR_CLAIM")
@click.argument("manifests", nargs=-1, type=click.Path(readable=False))
@cluster_inputs
@click.option(
    "-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@click.option(
    "--all-devices",
    is_flag=True,
    help="Also list every device's verdict, not only grouped reasons.",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed for shareIDs, as in simulate."
)
@click.option(
    "--policy",
    type=click.Choice(["first-fit", "binpack", "spread", "topology"]),
    default="first-fit",
    show_default=True,
    help="Placement policy of the simulation explained, as in simulate; the nodes are reported in its ranking.",
)
@input_limits
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
    policy: str,
    max_input_size: int | None,
    max_pods: int | None,
) -> None:
    """Explain why POD_OR_CLAIM (namespace/name or name) is pending, or where and why it fit.

    Takes the same inputs as `tessera simulate` (with none: the bundled default; with
    --kubeconfig: a live cluster, e.g. `tessera explain NS/POD --kubeconfig ~/.kube/config`
    for a pod pending there), runs the simulation, then for the pod's claims reports per node and
    per device the first check that refused it: selector sub-expression, capacity short by how
    much, request policy, taint,
    constraint, incomplete pool. HAMi-style pods get a line in HAMi's words as well.
    """
    from tessera.explain.explain import explain as run_explain
    from tessera.explain.explain import render_text

    try:
        notes: list[str] = []
        limits = limits_from(max_input_size, max_pods)
        cluster, loaded = load_inputs(
            manifests, cluster_file, node_specs, kubeconfig, add_nodes, limits, notes
        )
        exp = run_explain(
            cluster,
            loaded,
            target,
            seed=seed,
            all_devices=all_devices,
            class_map=class_map(class_maps),
            policy=policy,
        )
        for w in notes:
            warn(w)
    except UserError as e:
        fail(str(e))
        return
    if output == "json":
        click.echo(json.dumps(exp.to_dict(), indent=2, ensure_ascii=False))
    else:
        click.echo(render_text(exp))


@click.command()
@click.argument("manifests", nargs=-1, required=True, type=click.Path(readable=False))
@click.option(
    "--cluster",
    "cluster_file",
    type=click.Path(readable=False),
    help="Check names against the devices this cluster publishes.",
)
@input_limits
def lint(
    manifests: tuple[str, ...],
    cluster_file: str | None,
    max_input_size: int | None,
    max_pods: int | None,
) -> None:
    """Lint MANIFESTS (files, directories or `-` for standard input) before they are applied:
    what the API server would refuse in any object (unknown fields, wrong types, API rules), and
    in DeviceClasses, ResourceClaims, ResourceClaimTemplates and (HAMi-style) pods the mistakes
    Tessera knows. Prints one line per finding:
    `file (document N): Kind ns/name: field: problem. fix: ...`, and goes on to every other
    object and file.

    Exit status: 0 clean, 1 findings, 2 an input that could not be read at all (e.g. a Helm
    template; one line each on stderr, after the findings of the others).
    """
    from tessera.api.loader import ReadBudget, is_directory, load_file, load_files, manifest_files
    from tessera.lint import lint as run_lint
    from tessera.sim.cluster import load_cluster

    limits = limits_from(max_input_size, max_pods)
    budget = ReadBudget.of(limits)
    notes: list[str] = []
    unreadable: list[str] = []
    loaded = []
    try:
        slices = (
            [s for n in load_cluster(cluster_file, budget=budget).nodes for s in n.slices]
            if cluster_file
            else []
        )
    except UserError as e:
        fail(str(e))
        return
    for path in manifests:
        # A directory is read file by file, so that one unreadable file (a Helm template)
        # is reported beside the findings of the others instead of stopping the lint.
        probe: list[str] = []  # load_files walks an empty directory again and warns itself
        try:
            files = manifest_files(Path(path), probe) if is_directory(path) else []
        except UserError as e:
            unreadable.append(str(e))
            continue
        notes.extend(probe if files else ())
        if not files:
            try:
                loaded.extend(load_files([path], limits=limits, warnings=notes, budget=budget))
            except UserError as e:
                unreadable.append(str(e))
            continue
        for f in files:
            try:
                loaded.extend(load_file(f, budget=budget, skip_foreign=notes))
            except UserError as e:
                unreadable.append(str(e))
    if not loaded and not unreadable:
        fail(
            f"no Kubernetes objects in {', '.join(manifests)}: nothing was checked (pass YAML or JSON manifests)"
        )
        return
    findings = run_lint(loaded, slices)
    for finding in findings:
        click.echo(str(finding))
    if not unreadable:  # exit 2: the error lines only
        for w in notes:
            warn(w)
    for msg in unreadable:
        click.echo(f"tessera: error: {msg}", err=True)
    sys.exit(2 if unreadable else 1 if findings else 0)
