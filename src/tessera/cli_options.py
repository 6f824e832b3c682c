"""Click options shared by the commands that build a simulated cluster (simulate, explain)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def cluster_inputs(f: F) -> F:
    """``--cluster FILE`` and repeatable ``--node NAME=INVENTORY[:TOPOLOGY]``."""
    f = click.option(
        "--node",
        "node_specs",
        multiple=True,
        metavar="NAME=INVENTORY[:TOPOLOGY]",
        help="Add a node from an nvidia-smi inventory file (and optional `nvidia-smi topo -m` file). Repeatable.",
    )(f)
    f = click.option(
        "--cluster",
        "cluster_file",
        type=click.Path(),
        help="Cluster description (kind: Cluster) naming each node's GPU inventory.",
    )(f)
    return f
