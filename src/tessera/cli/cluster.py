"""``tessera cluster up|down|status``: a real control plane on loopback (click group ``cluster``).

Exit status: 0 on
success; 1 when the control plane fails (message includes the failing component's log
tail); 2 on bad input (``--slices``/``--cluster`` files, named with document and field).
``status`` exits 0 when every component is healthy, 1 when degraded, 3 when stopped.
``up --kubelet`` adds a real node (containerd and a kubelet; root only, one per machine);
``down`` then also restores what the kubelet changed on the host (exit 1 if it could not).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from tessera.api.errors import TesseraError
from tessera.cli._common import examples_dir, fail
from tessera.localcluster.build import BuildError
from tessera.localcluster.cluster import (
    Cluster,
    ClusterError,
    ClusterInputError,
    Inventory,
    default_state_dir,
    load_slice_files,
)
from tessera.sim.cluster import load_cluster

_state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help=f"Where certificates, etcd data, logs, pids and the kubeconfig live [default: {default_state_dir()}].",
)


def load_cluster_file(path: Path, inventory: Inventory | None = None) -> Inventory:
    """Read a cluster description (``tessera.sim.cluster.load_cluster``) into ``inventory``.

    Every ``Cluster.nodes[i]`` (``.name``, ``.labels``, ``.slices``) becomes a node with
    those labels and slices. Raises :class:`ClusterInputError` when the loader rejects the
    file.
    """
    try:
        described = load_cluster(Path(path))
    except TesseraError as e:
        raise ClusterInputError(f"--cluster {e}") from e
    inv = inventory if inventory is not None else Inventory()
    for node in described.nodes:
        inv.add_node(
            str(node.name),
            {str(k): str(v) for k, v in dict(node.labels).items()},
            getattr(node, "taints", []),
        )
        for j, s in enumerate(node.slices):
            inv.add_slice(s, f"{path}: node {node.name}, slice {j}")
    return inv


def _progress(message: str) -> None:
    click.echo(f"tessera cluster: {message}", err=True)


@click.group(name="cluster")
def cluster() -> None:
    """Run a real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler,
    kube-controller-manager) on loopback, with simulated GPU nodes (pods are scheduled and
    their ResourceClaims allocated, but never run) and, with `up --kubelet`, this machine as
    a real node (containerd and a kubelet: pods run)."""


@cluster.command()
@_state_dir_option
@click.option(
    "--slices",
    "slice_files",
    multiple=True,
    type=click.Path(path_type=Path),
    help="YAML file of resource.k8s.io/v1 ResourceSlices; a Node is registered for each distinct spec.nodeName. "
    "Repeatable.",
)
@click.option(
    "--cluster",
    "cluster_file",
    type=click.Path(path_type=Path),
    default=None,
    help="Cluster description (tessera.sim.cluster format): nodes with labels and slices.",
)
@click.option(
    "--no-build", is_flag=True, help="Do not run tools/kube/build.sh; use the binaries as they are."
)
@click.option(
    "--timeout",
    type=float,
    default=180.0,
    show_default=True,
    help="Seconds to wait for each component.",
)
@click.option(
    "--kubelet",
    is_flag=True,
    help="Also run this machine as a real node: containerd and a kubelet (root; one per machine; "
    "`down` restores the host). Simulated nodes only with --cluster/--slices.",
)
@click.option(
    "--device-classes/--no-device-classes",
    default=None,
    help="Register the DeviceClass gpu.tessera.dev, or not (for `helm install` of the chart, which "
    "creates its own DeviceClasses). [default: registered, except with --kubelet and no simulated node]",
)
def up(
    state_dir: Path | None,
    slice_files: tuple[Path, ...],
    cluster_file: Path | None,
    no_build: bool,
    timeout: float,
    kubelet: bool,
    device_classes: bool | None,
) -> None:
    """Start a fresh control plane and register nodes, ResourceSlices and the DeviceClass gpu.tessera.dev.

    With neither --cluster nor --slices, the nodes of the bundled default cluster (the one
    `tessera simulate` uses with no arguments) are registered, unless --kubelet is given
    (then the real node is the only one, and no DeviceClass is registered unless
    --device-classes says so: the chart's own DeviceClasses come with `helm install`).
    """
    if cluster_file is None and not slice_files and not kubelet:
        cluster_file = examples_dir() / "cluster.yaml"
    try:
        inv = Inventory()
        if cluster_file is not None:
            load_cluster_file(cluster_file, inv)
        load_slice_files(slice_files, inv)
    except ClusterInputError as e:
        fail(str(e), 2)
    c = Cluster(state_dir)
    try:
        c.up(
            inv,
            build_binaries=not no_build,
            timeout=timeout,
            progress=_progress,
            kubelet=kubelet,
            device_classes=device_classes,
        )
    except ClusterInputError as e:
        fail(str(e), 2)
    except (ClusterError, BuildError) as e:
        fail(str(e), 1)
    click.echo(
        f"control plane running at {c.server} ({len(inv.nodes)} simulated nodes, {len(inv.slices)} ResourceSlices)"
    )
    node = c.node
    if node is not None:
        click.echo(
            f"node {node.name} Ready: kubelet root {node.kubelet_root_dir}, CDI spec dir {node.cdi_spec_dir}, "
            f"containerd {node.containerd_socket}"
        )
    click.echo(
        f"state: {c.state_dir}   stop: tessera cluster down --state-dir {shlex.quote(str(c.state_dir))}"
    )
    click.echo(f"export KUBECONFIG={shlex.quote(str(c.kubeconfig))}")


@cluster.command()
@_state_dir_option
def down(state_dir: Path | None) -> None:
    """Stop every component (SIGTERM to each process group, SIGKILL after 10 s); with a real
    node, first its pods, containerd tasks, kubelet, containerd and shims, then restore the host."""
    c = Cluster(state_dir)
    try:
        stopped = c.down(progress=_progress)
    except ClusterError as e:
        fail(str(e), 1)
    left = c.running_components()
    if left:
        fail(f"still running after down: {', '.join(left)} (state {c.state_dir})", 1)
    click.echo(
        f"stopped: {', '.join(stopped)}" if stopped else f"nothing was running ({c.state_dir})"
    )


@cluster.command()
@_state_dir_option
def status(state_dir: Path | None) -> None:
    """Show each component's pid and health; exit 0 healthy, 1 degraded, 3 stopped."""
    st = Cluster(state_dir).status()
    click.echo(f"cluster: {st.state}   state dir: {st.state_dir}")
    if st.server:
        click.echo(f"server: {st.server}   kubeconfig: {st.kubeconfig}")
    width = max(len(c.name) for c in st.components)
    for comp in st.components:
        word = "healthy" if comp.healthy else ("unhealthy" if comp.running else "stopped")
        pid = str(comp.pid) if comp.pid is not None else "-"
        click.echo(f"  {comp.name:<{width}}  pid {pid:>7}  {word:<9}  {comp.detail}")
    sys.exit({"running": 0, "degraded": 1}.get(st.state, 3))


@cluster.command()
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The demo's cluster [default: ~/.cache/tessera/demo]; `tessera cluster down --state-dir` "
    "of it (make demo-down) stops it and restores the host.",
)
def demo(state_dir: Path | None) -> None:
    """Tessera on this machine as a real node (root; `make image` first): a local cluster, 8 fake
    H100 GPUs from the bundled inventory, Tessera installed by its Helm chart, one HAMi pod and
    one DRA pod running; prints what each container sees, the claims' allocations and the
    monitor's metrics URL."""
    from tessera.kube.workloads import WaitTimeout
    from tessera.localcluster.demo import DEFAULT_DEMO_DIR, run_demo
    from tessera.localcluster.images import ImageError
    from tessera.localcluster.localinstall import LocalInstallError

    target = state_dir or DEFAULT_DEMO_DIR
    try:
        report = run_demo(target, say=_progress)
    except (ClusterError, LocalInstallError, BuildError, ImageError, WaitTimeout) as e:
        fail(f"{e} (stop it with: tessera cluster down --state-dir {shlex.quote(str(target))})", 1)
    click.echo(
        f"\nTessera is installed (helm install to every pod Ready: {report.install_to_ready_s:.1f} s)."
    )
    for p in report.pods:
        click.echo(
            f"\n== pod demo/{p.name} ({p.kind}), Running {p.running_after_s:.1f} s after apply"
        )
        for a in p.allocations:
            cap = ", ".join(
                f"{k} {v}" for k, v in sorted((a.get("consumedCapacity") or {}).items())
            )
            click.echo(
                f"  claim: {a['driver']} {a['pool']}/{a['device']}  {cap}  shareID {a.get('shareID', '-')}"
            )
        click.echo(f"  CUDA_VISIBLE_DEVICES={p.visible_devices}")
        click.echo("  /etc/tessera/limits:")
        for line in p.limits:
            click.echo(f"    {line}")
        click.echo(
            "  CUDA probe, two cuMemAlloc of 2 GiB (fake libcuda, Tessera's library preloaded; "
            "alloc BYTES 0 = success, 2 = CUDA_ERROR_OUT_OF_MEMORY):"
        )
        for line in p.probe:
            click.echo(f"    {line}")
    click.echo(f"\nmetrics: curl -s {report.metrics_url} | grep ^tessera_share")
    click.echo(f"export KUBECONFIG={shlex.quote(str(report.kubeconfig))}")
    click.echo(
        f"stop:    make demo-down   (tessera cluster down --state-dir {shlex.quote(str(report.state_dir))})"
    )
