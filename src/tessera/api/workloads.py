"""Where each workload kind keeps its pod template: the one table every command reads.

``simulate``/``explain`` (expanding workloads into pods: :func:`tessera.api.loader.expand_workloads`
and :mod:`tessera.sim.daemonset`), validation (a workload's template is validated as a pod
spec: :func:`tessera.api.validation.manifest_problems`), ``lint`` and ``convert``
(:func:`tessera.convert.convert_object`) all take the template from :data:`POD_TEMPLATE_PATHS`.

Objects of other APIs that hold pod templates (Argo, Kubeflow, Volcano, JobSet, KubeRay,
LeaderWorkerSet, ...) are not read: :func:`foreign_workload` names the kind and where its
templates are, for a one-line warning (the list is in ``docs/inputs.md``). Pure code, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Kind -> the path of its pod template (Kubernetes' own workload controllers).
POD_TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
#: The kinds of :data:`POD_TEMPLATE_PATHS`.
WORKLOAD_KINDS: tuple[str, ...] = tuple(POD_TEMPLATE_PATHS)

#: API group -> (kind -> where its pod templates are), for objects Tessera does not expand.
FOREIGN_WORKLOADS: dict[str, dict[str, str]] = {
    "argoproj.io": {
        "Workflow": "spec.templates[] (Argo makes one pod per step)",
        "CronWorkflow": "spec.workflowSpec.templates[]",
        "WorkflowTemplate": "spec.templates[]",
        "ClusterWorkflowTemplate": "spec.templates[]",
        "Rollout": "spec.template",
    },
    "kubeflow.org": {
        "PyTorchJob": "spec.pytorchReplicaSpecs.<role>.template",
        "TFJob": "spec.tfReplicaSpecs.<role>.template",
        "MPIJob": "spec.mpiReplicaSpecs.<role>.template",
        "XGBoostJob": "spec.xgbReplicaSpecs.<role>.template",
        "PaddleJob": "spec.paddleReplicaSpecs.<role>.template",
        "JAXJob": "spec.jaxReplicaSpecs.<role>.template",
        "Notebook": "spec.template",
    },
    "trainer.kubeflow.org": {"TrainJob": "its TrainingRuntime's template"},
    "batch.volcano.sh": {"Job": "spec.tasks[].template"},
    "jobset.x-k8s.io": {"JobSet": "spec.replicatedJobs[].template.spec.template"},
    "ray.io": {
        "RayCluster": "spec.headGroupSpec.template, spec.workerGroupSpecs[].template",
        "RayJob": "spec.rayClusterSpec.headGroupSpec.template, ...workerGroupSpecs[].template",
        "RayService": "spec.rayClusterConfig.headGroupSpec.template, ...workerGroupSpecs[].template",
    },
    "leaderworkerset.x-k8s.io": {
        "LeaderWorkerSet": "spec.leaderWorkerTemplate.leaderTemplate, .workerTemplate"
    },
    "apps.kruise.io": {
        "CloneSet": "spec.template",
        "StatefulSet": "spec.template",
        "DaemonSet": "spec.template",
    },
    "serving.knative.dev": {"Service": "spec.template"},
}


def pod_template(obj: Any, kind: str) -> tuple[dict[str, Any] | None, str]:
    """The pod template of a workload of ``kind`` (:data:`POD_TEMPLATE_PATHS`) and its dotted
    path, e.g. ``(obj["spec"]["template"], "spec.template")``; a Pod is its own template (path
    ``""``). The template is None where a step is missing or not a mapping."""
    if kind == "Pod":
        return (obj if isinstance(obj, dict) else None), ""
    cur: Any = obj
    for step in POD_TEMPLATE_PATHS[kind]:
        cur = cur.get(step) if isinstance(cur, dict) else None
    return (cur if isinstance(cur, dict) else None), ".".join(POD_TEMPLATE_PATHS[kind])


def foreign_workload(obj: Mapping[str, Any], done: str = "simulated") -> str | None:
    """For an object of another API that holds pod templates (:data:`FOREIGN_WORKLOADS`), one
    line: what it is, that its pods are not ``done`` (simulated, converted), where its
    templates are and what to give instead. None for any other object."""
    api = str(obj.get("apiVersion") or "")
    group = api.rpartition("/")[0] if "/" in api else ""
    kind = str(obj.get("kind") or "")
    where = FOREIGN_WORKLOADS.get(group, {}).get(kind)
    if where is None:
        return None
    return (
        f"{group} {kind} is not expanded into pods, so its pods are not {done} (templates: "
        f"{where}): give each pod template as a Pod, or as a Deployment or Job with the replica "
        "count"
    )
