"""``tessera convert``: HAMi manifests in, the DRA manifests to commit and apply out.

The conversion is :func:`tessera.convert.convert_object`, i.e. the :func:`convert_pod` that
``tessera simulate`` and the webhook use: one code path.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from tessera.api.errors import ManifestError
from tessera.api.loader import Manifest, Source, load_files, parse_documents
from tessera.api.vendors import CONVERTED
from tessera.cli._common import UserError, fail, load_nodes, node_inputs, to_yaml, warn


def _yaml(objs: list[dict[str, Any]]) -> str:
    """A multi-document YAML stream, ``---`` between documents; keys in input order."""
    return "---\n".join(to_yaml(o) for o in objs)


def _json(objs: list[dict[str, Any]]) -> str:
    items = {"apiVersion": "v1", "kind": "List", "items": objs}
    return json.dumps(items, indent=2, ensure_ascii=False) + "\n"


def _read(arg: str) -> list[Manifest]:
    """The manifests of one argument: a file, a directory (``*.yaml``/``*.yml``/``*.json``,
    recursively, in name order) or ``-`` (standard input)."""
    if arg == "-":
        text = sys.stdin.read()
        return [Manifest(obj, Source("-", doc)) for doc, obj in parse_documents(text, "-")]
    return load_files([arg])


def _out_path(arg: str, file: str, out_dir: Path) -> Path:
    """Where the converted ``file`` (read through argument ``arg``) is written: its path
    relative to ``arg`` when ``arg`` is a directory, else its name, under ``out_dir``."""
    root = Path(arg)
    rel = Path(file).relative_to(root) if root.is_dir() else Path(Path(file).name)
    return out_dir / rel


@click.command()
@click.argument(
    "manifests", nargs=-1, required=True, type=click.Path(allow_dash=True, readable=False)
)
@node_inputs
@click.option(
    "-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True
)
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write each input file, converted, under this directory (same relative paths) instead of stdout.",
)
@click.option(
    "--vendor",
    "vendor_keys",
    multiple=True,
    type=click.Choice([v.key for v in CONVERTED]),
    help="The cluster has this vendor's DRA driver (repeatable): its HAMi requests become claims "
    "for it. A DeviceClass of the vendor among the manifests says the same.",
)
@click.option(
    "--mode",
    type=click.Choice(["dra", "legacy"]),
    default="dra",
    show_default=True,
    help="dra: claims and templates. legacy (Tessera's legacy mode, no DRA): requests are kept "
    "and each GPU pod gets spec.schedulerName --legacy-scheduler, as the webhook does there.",
)
@click.option(
    "--legacy-scheduler",
    default="tessera-legacy",
    show_default=True,
    help="With --mode legacy: the legacy kube-scheduler's profile name.",
)
def convert(
    manifests: tuple[str, ...],
    cluster_file: str | None,
    node_specs: tuple[str, ...],
    output: str,
    out_dir: Path | None,
    vendor_keys: tuple[str, ...],
    mode: str,
    legacy_scheduler: str,
) -> None:
    """Convert the HAMi-style GPU requests in MANIFESTS (files, directories, or - for stdin)
    into DRA: each Pod, Deployment, StatefulSet, ReplicaSet, DaemonSet, Job or CronJob that
    asks for nvidia.com/gpu, gpumem, gpucores... gets resource claims instead, preceded by the
    ResourceClaimTemplates it needs. Every other object is passed through unchanged.

    Prints one applyable YAML stream (`kubectl apply -f -`; -o json: one List), deterministic,
    with the converter's warnings on stderr. Comments and formatting of the input are not kept.
    gpumem-percentage needs the cluster's GPU memory sizes: give its nodes with --cluster or
    --node (or ResourceSlices among the manifests).

    HAMi's Ascend (huawei.com/Ascend310P...) and Hygon (hygon.com/dcunum...) requests become
    claims for their vendors' DRA drivers when the cluster has them: --vendor ascend / --vendor
    hygon, or their DeviceClass among the manifests; otherwise they are left unchanged, with a
    warning. A hygon.com/dcucores percentage needs the cards' compute units: their
    ResourceSlices among the manifests.

    --mode legacy converts for Tessera's legacy mode (docs/legacy.md): the same checks and
    warnings, the requests unchanged, and spec.schedulerName set to the legacy scheduler
    (pods naming no scheduler, default-scheduler or hami-scheduler).

    Exit status: 0; 2 on bad input (nothing is written).
    """
    from tessera.api.deviceclass import device_class, served_extended_resources
    from tessera.api.slice_validation import validate_resource_slice
    from tessera.api.vendors import installed_vendors
    from tessera.convert import compute_unit_sizes, convert_object, gpu_memory_sizes

    try:
        if mode == "legacy" and not legacy_scheduler:
            raise UserError("--mode legacy needs --legacy-scheduler (the legacy scheduler's name)")
        if out_dir is not None and "-" in manifests:
            raise UserError(
                "--out-dir writes one file per input file: give files or directories, not - (stdin)"
            )
        cluster = load_nodes(cluster_file, node_specs)
        for w in cluster.warnings:
            warn(w)
        read = [(arg, _read(arg)) for arg in manifests]
        if not any(ms for _, ms in read):
            raise UserError(
                f"no Kubernetes objects in {', '.join(manifests)}: pass YAML or JSON manifests (files or directories)"
            )
        slices = [s for n in cluster.nodes for s in n.slices]
        for _, ms in read:
            for m in ms:
                if m.kind == "ResourceSlice":
                    problems = validate_resource_slice(m.obj)
                    if problems:
                        raise ManifestError(
                            problems[0], file=m.source.file, doc=m.source.doc, obj=m.ref()
                        )
                    slices.append(m.obj)
        sizes = gpu_memory_sizes(slices)
        units = compute_unit_sizes(slices)
        classes = [m.obj for _, ms in read for m in ms if m.kind == "DeviceClass"]
        vendors = set(vendor_keys) | installed_vendors(
            {str((c.get("metadata") or {}).get("name") or "") for c in classes}
        )
        # Extended resources the input's DeviceClasses (and Tessera's) serve: left for
        # kube-scheduler (KEP-5004), without a "not converted" warning.
        served = served_extended_resources(
            [device_class(), *(m.obj for _, ms in read for m in ms if m.kind == "DeviceClass")]
        )
        files: dict[str, list[dict[str, Any]]] = {}  # source file -> converted documents
        targets: dict[Path, str] = {}
        templates: dict[tuple[str, str], tuple[dict[str, Any], str]] = {}
        for arg, ms in read:
            for m in ms:
                res = convert_object(
                    m.obj,
                    memory_sizes=sizes,
                    source=str(m.source),
                    served=served,
                    vendors=vendors,
                    compute_units=units,
                    legacy_scheduler=legacy_scheduler if mode == "legacy" else "",
                )
                for w in res.warnings:
                    warn(w)
                docs = files.setdefault(m.source.file, [])
                if out_dir is not None and len(docs) == 0:
                    target = _out_path(arg, m.source.file, out_dir)
                    if target in targets and targets[target] != m.source.file:
                        raise UserError(
                            f"{m.source.file} and {targets[target]} would both be written to {target}: convert "
                            "them separately"
                        )
                    targets[target] = m.source.file
                for t in res.templates:
                    md = t["metadata"]
                    key = (str(md.get("namespace") or "default"), str(md["name"]))
                    prior = templates.get(key)
                    if prior is not None and prior[0] != t:
                        raise ManifestError(
                            f"needs ResourceClaimTemplate {key[0]}/{key[1]}, which {prior[1]} also needs with "
                            "another spec: "
                            "rename one of the objects",
                            file=m.source.file,
                            doc=m.source.doc,
                            obj=m.ref(),
                            field="metadata.name",
                        )
                    if prior is None:
                        templates[key] = (t, str(m.source))
                        docs.append(t)
                docs.append(res.obj)
    except UserError as e:
        fail(str(e))
    render = _json if output == "json" else _yaml
    if out_dir is None:
        click.echo(render([d for docs in files.values() for d in docs]), nl=False)
        return
    from tessera.enforcement._files import write_atomic

    try:
        for target, file in targets.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(str(target), render(files[file]).encode(), 0o644, f".{target.name}.")
    except OSError as e:
        fail(f"--out-dir {out_dir}: cannot write ({e.strerror or e})")
    click.echo(f"tessera convert: wrote {len(targets)} file(s) under {out_dir}", err=True)
