"""A ServiceAccount's kubeconfig for tests that run a component under a narrower identity than
the admin's: the ServiceAccount, optionally a ClusterRole of given rules bound to it, and a
kubeconfig carrying a TokenRequest token (``authentication.k8s.io/v1``) beside the admin's
cluster entry."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tessera.kube.client import KubeClient


def identity_kubeconfig(
    admin: KubeClient,
    admin_kubeconfig: Path,
    namespace: str,
    name: str,
    path: Path,
    *,
    rules: Sequence[dict[str, Any]] | None = None,
    seconds: int = 600,
) -> Path:
    """Create ServiceAccount ``namespace/name`` with ``admin``; with ``rules`` (RBAC
    ``PolicyRule`` dicts) a ClusterRole ``<namespace>-<name>`` of them bound to it (``None``: no
    role at all); write to ``path`` a kubeconfig of ``admin_kubeconfig``'s cluster with a token
    of the ServiceAccount valid ``seconds``; return ``path``. Raises
    :class:`~tessera.kube.client.ApiError` when the API server refuses an object."""
    admin.create(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace},
        }
    )
    if rules is not None:
        role = f"{namespace}-{name}"
        admin.create(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": role},
                "rules": list(rules),
            }
        )
        admin.create(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": role},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
            }
        )
    token = admin.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        body={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        },
    )["status"]["token"]
    cfg = yaml.safe_load(admin_kubeconfig.read_text())
    cfg["users"] = [{"name": name, "user": {"token": token}}]
    cfg["contexts"][0]["context"]["user"] = name
    path.write_text(yaml.safe_dump(cfg))
    return path
