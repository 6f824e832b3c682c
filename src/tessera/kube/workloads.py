"""Helpers for driving a live control plane from tests: build GPU pods and claim templates,
apply objects, wait for the scheduler's verdict, read claim allocations.

All waits poll the API server (every ``interval`` seconds) and raise :class:`WaitTimeout`
with the last observed state, e.g. the pod's ``PodScheduled`` condition message.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tessera import DEVICE_CLASS_NAME
from tessera.api.pods import pod_claims as claim_entries
from tessera.kube.client import ApiError, KubeClient, Obj
from tessera.scheduler.claims import pod_claim_name

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """A condition was not reached in time; the message has the last observed state."""


def load_objects(source: str | Path) -> list[Obj]:
    """Parse YAML (a path or the text itself) into API objects; ``List`` kinds are flattened."""
    text = Path(source).read_text() if isinstance(source, Path) else source
    out: list[Obj] = []
    for doc in yaml.safe_load_all(text):
        if doc is None:
            continue
        if isinstance(doc, dict) and doc.get("kind", "").endswith("List") and "items" in doc:
            out.extend(doc["items"])
        elif isinstance(doc, list):
            out.extend(doc)
        else:
            out.append(doc)
    return out


def apply_objects(
    client: KubeClient, objects: Iterable[Mapping[str, Any]], *, namespace: str | None = None
) -> list[Obj]:
    """Server-side apply each object (``namespace`` fills in a missing metadata.namespace)."""
    applied = []
    for obj in objects:
        o = dict(obj)
        if namespace is not None:
            meta = dict(o.get("metadata") or {})
            meta.setdefault("namespace", namespace)
            o["metadata"] = meta
            if client.resource(o["apiVersion"], o["kind"]).namespaced is False:
                meta.pop("namespace")
        applied.append(client.apply(o))
    return applied


def wait_for(
    check: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.2,
    what: str,
    last: Callable[[], str] | None = None,
) -> T:
    """Call ``check`` until it returns something other than None; return that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None:
            return value
        if time.monotonic() >= deadline:
            detail = f"; last seen: {last()}" if last is not None else ""
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)


def pod_condition(pod: Mapping[str, Any], cond_type: str = "PodScheduled") -> dict[str, Any] | None:
    """The pod's status condition of ``cond_type`` or None."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == cond_type:
            return dict(c)
    return None


def _describe_pod(pod: Mapping[str, Any] | None) -> str:
    if pod is None:
        return "pod not found"
    cond = pod_condition(pod)
    node = (pod.get("spec") or {}).get("nodeName")
    return f"nodeName={node!r}, PodScheduled={cond!r}"


def wait_pod_scheduled(
    client: KubeClient, name: str, namespace: str = "default", *, timeout: float = 60.0
) -> Obj:
    """Wait until the scheduler bound the pod (``spec.nodeName`` set); return the pod."""
    seen: list[Obj | None] = [None]

    def check() -> Obj | None:
        pod = client.get("v1", "Pod", name, namespace)
        seen[0] = pod
        return pod if pod.get("spec", {}).get("nodeName") else None

    return wait_for(
        check,
        timeout=timeout,
        what=f"pod {namespace}/{name} to be scheduled",
        last=lambda: _describe_pod(seen[0]),
    )


def _describe_containers(pod: Mapping[str, Any] | None) -> str:
    if pod is None:
        return "pod not found"
    status = pod.get("status") or {}
    parts = [f"phase={status.get('phase')!r}"]
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        for key, detail in state.items():
            parts.append(
                f"{cs.get('name')}: {key} {detail.get('reason', '')} {detail.get('message', '')}".rstrip()
            )
    for c in status.get("conditions") or []:
        if c.get("status") != "True" and c.get("message"):
            parts.append(f"{c.get('type')}={c.get('status')}: {c.get('message')}")
    return "; ".join(parts)


def wait_pod_running(
    client: KubeClient, name: str, namespace: str = "default", *, timeout: float = 120.0
) -> Obj:
    """Wait until a pod on a real node is ``Running`` with every container ready; return it.

    Raises :class:`AssertionError` when the pod fails (phase ``Failed``/``Succeeded``, or a
    container waiting with ``ErrImageNeverPull``, ``CreateContainerError``...), and
    :class:`WaitTimeout` with the container states otherwise.
    """
    seen: list[Obj | None] = [None]
    fatal = {
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "InvalidImageName",
        "RunContainerError",
    }

    def check() -> Obj | None:
        pod = client.get("v1", "Pod", name, namespace)
        seen[0] = pod
        status = pod.get("status") or {}
        if status.get("phase") in ("Failed", "Succeeded"):
            raise AssertionError(f"pod {namespace}/{name} ended: {_describe_containers(pod)}")
        for cs in status.get("containerStatuses") or []:
            reason = ((cs.get("state") or {}).get("waiting") or {}).get("reason")
            if reason in fatal:
                raise AssertionError(
                    f"pod {namespace}/{name} cannot start: {_describe_containers(pod)}"
                )
        ready = status.get("containerStatuses") or []
        if status.get("phase") == "Running" and ready and all(cs.get("ready") for cs in ready):
            return pod
        return None

    return wait_for(
        check,
        timeout=timeout,
        what=f"pod {namespace}/{name} to run",
        last=lambda: _describe_containers(seen[0]),
    )


def wait_pod_unschedulable(
    client: KubeClient, name: str, namespace: str = "default", *, timeout: float = 60.0
) -> str:
    """Wait for ``PodScheduled=False`` with reason ``Unschedulable``; return its message.

    Raises :class:`AssertionError` if the pod gets scheduled instead.
    """
    seen: list[Obj | None] = [None]

    def check() -> str | None:
        pod = client.get("v1", "Pod", name, namespace)
        seen[0] = pod
        if pod.get("spec", {}).get("nodeName"):
            raise AssertionError(
                f"pod {namespace}/{name} was scheduled to {pod['spec']['nodeName']}, expected it to stay pending"
            )
        cond = pod_condition(pod)
        if cond and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            return str(cond.get("message", ""))
        return None

    return wait_for(
        check,
        timeout=timeout,
        what=f"pod {namespace}/{name} to be unschedulable",
        last=lambda: _describe_pod(seen[0]),
    )


def pod_claim_names(pod: Mapping[str, Any]) -> dict[str, str]:
    """Map each ``spec.resourceClaims[].name`` to the ResourceClaim's name (generated ones
    from ``status.resourceClaimStatuses``; missing until the claim controller made it)."""
    out: dict[str, str] = {}
    for ref in claim_entries(pod):
        claim_name = pod_claim_name(pod, ref)
        if claim_name:
            out[ref.name] = claim_name
    return out


def pod_claims(client: KubeClient, name: str, namespace: str = "default") -> dict[str, Obj]:
    """The pod's ResourceClaims keyed by the pod's claim reference name."""
    pod = client.get("v1", "Pod", name, namespace)
    return {
        ref: client.get("resource.k8s.io/v1", "ResourceClaim", claim, namespace)
        for ref, claim in pod_claim_names(pod).items()
    }


def pod_allocations(
    client: KubeClient, name: str, namespace: str = "default"
) -> dict[str, Obj | None]:
    """``status.allocation`` of each of the pod's claims (None while unallocated)."""
    return {
        ref: (c.get("status") or {}).get("allocation")
        for ref, c in pod_claims(client, name, namespace).items()
    }


def delete_pod(
    client: KubeClient,
    name: str,
    namespace: str = "default",
    *,
    wait: float = 30.0,
    grace_period: int = 0,
) -> None:
    """Delete a pod and wait until the API object is gone.

    ``grace_period`` 0 (default) removes it at once, for simulated nodes where no kubelet
    will confirm; on a real node give a few seconds, so that the object only goes once the
    kubelet has stopped the containers (and unprepared the pod's claims).
    """
    try:
        client.request(
            "DELETE",
            f"/api/v1/namespaces/{namespace}/pods/{name}",
            body={"gracePeriodSeconds": grace_period},
            what=f"Pod {namespace}/{name}",
        )
    except ApiError as e:
        if e.status != 404:
            raise

    def gone() -> bool | None:
        try:
            client.get("v1", "Pod", name, namespace)
        except ApiError as e:
            if e.status == 404:
                return True
            raise
        return None

    wait_for(gone, timeout=wait, what=f"pod {namespace}/{name} to be deleted")


def gpu_claim_template(
    name: str,
    *,
    namespace: str = "default",
    memory: str | None = None,
    cores: str | int | None = None,
    device_class: str = DEVICE_CLASS_NAME,
    request: str = "gpu",
) -> Obj:
    """A ResourceClaimTemplate asking one device of ``device_class`` with
    ``capacity.requests`` memory (Quantity, bytes) and cores (percent of SMs, 0-100)."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    requests: dict[str, str] = {}
    if memory is not None:
        requests["memory"] = str(memory)
    if cores is not None:
        requests["cores"] = str(cores)
    if requests:
        exactly["capacity"] = {"requests": requests}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": request, "exactly": exactly}]}}},
    }


def gpu_pod(
    name: str,
    *,
    namespace: str = "default",
    template: str | None = None,
    claim: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    image: str = "registry.k8s.io/pause:3.10",
    command: Sequence[str] | None = None,
) -> Obj:
    """A pod with one container using one claim: from ResourceClaimTemplate ``template`` or
    the existing ResourceClaim ``claim`` (exactly one of them); ``command``: the container's
    command (the image's default when None)."""
    if (template is None) == (claim is None):
        raise ValueError("gpu_pod: give exactly one of template= or claim=")
    ref: dict[str, str] = {"name": "gpu"}
    if template is not None:
        ref["resourceClaimTemplateName"] = template
    else:
        ref["resourceClaimName"] = str(claim)
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 0,
        "resourceClaims": [ref],
        "containers": [
            {"name": "main", "image": image, "resources": {"claims": [{"name": "gpu"}]}}
        ],
    }
    if command is not None:
        spec["containers"][0]["command"] = list(command)
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
