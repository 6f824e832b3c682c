"""Every metric ``tessera monitor`` exports: name, type, labels, unit and the HAMi name it
mirrors. ``docs/monitoring.md`` lists exactly these (a test compares the two).

Tessera's names follow Prometheus conventions (base units, ``_bytes``, ``_ratio`` in 0..1,
``_total`` for counters) and use dcgm-exporter's label names for DRA (``dra_claim_name``,
``dra_claim_namespace``, ``dra_pool_name``, ``dra_device_name``, ``dra_driver_name``, and
``UUID``/``gpu``/``modelName`` for the device), so a query can join them with dcgm-exporter's
device-level series. HAMi's names keep HAMi's labels, units (cores in percent 0..100) and
constant label ``zone="vGPU"``, so HAMi dashboards keep working.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Labels of a GPU (device-level) series.
GPU_LABELS = ("node", "UUID", "gpu", "modelName", "dra_pool_name", "dra_device_name")
#: Labels of a share: one claim's allocation on one GPU.
SHARE_LABELS = (
    "node",
    "UUID",
    "dra_driver_name",
    "dra_pool_name",
    "dra_device_name",
    "dra_claim_namespace",
    "dra_claim_name",
    "dra_claim_uid",
    "namespace",
    "pod",
    "container",
)
#: Labels of a claim as a whole (its processes span its GPUs).
CLAIM_LABELS = (
    "node",
    "dra_claim_namespace",
    "dra_claim_name",
    "dra_claim_uid",
    "namespace",
    "pod",
    "container",
)
#: HAMi's labels (hami.md section 5), plus the constant ``zone``.
HAMI_HOST_LABELS = ("node", "device_index", "device_uuid", "device_type", "zone")
HAMI_HOST_MC_LABELS = ("device_index", "device_uuid", "device_type", "zone")
HAMI_VGPU_LABELS = ("namespace", "pod", "container", "vdevice_index", "device_uuid", "zone")
HAMI_GPU_LABELS = ("node", "device_uuid", "device_index", "device_type", "zone")
HAMI_GPU_CORES_LABELS = (
    "node",
    "device_uuid",
    "device_index",
    "device_type",
    "device_cores",
    "zone",
)
HAMI_OVERVIEW_LABELS = (
    "node",
    "device_uuid",
    "device_index",
    "device_type",
    "device_cores",
    "device_memory_limit",
    "zone",
)
HAMI_VGPU_ALLOC_LABELS = ("namespace", "node", "pod", "container_index", "device_uuid", "zone")
HAMI_ZONE = "vGPU"


@dataclass(frozen=True)
class MetricDef:
    """One exported metric. ``source``: ``region`` (usage regions), ``nvml``, ``api``
    (the API server's allocations) or ``exporter``; ``hami``: the HAMi metric it mirrors."""

    name: str
    kind: str  # gauge | counter
    help: str
    labels: tuple[str, ...]
    unit: str
    source: str
    hami: str = ""


def _m(
    name: str, kind: str, help: str, labels: tuple[str, ...], unit: str, source: str, hami: str = ""
) -> MetricDef:
    return MetricDef(name, kind, help, labels, unit, source, hami)


METRICS: tuple[MetricDef, ...] = (
    # ---- Tessera, per share (usage region) ----------------------------------------------
    _m(
        "tessera_share_memory_used_bytes",
        "gauge",
        "GPU memory the share's live processes hold (sum over live slots of the usage region).",
        SHARE_LABELS,
        "bytes",
        "region",
        "hami_vgpu_memory_used_bytes",
    ),
    _m(
        "tessera_share_memory_limit_bytes",
        "gauge",
        "The share's memory limit on this GPU, as the enforcement library applies it.",
        SHARE_LABELS,
        "bytes",
        "region",
        "hami_vgpu_memory_limit_bytes",
    ),
    _m(
        "tessera_share_cores_ratio",
        "gauge",
        "The share's compute share of this GPU (cores / 100; 0 = best effort, 1 = whole GPU).",
        SHARE_LABELS,
        "ratio",
        "region",
    ),
    _m(
        "tessera_share_kernel_launches_total",
        "counter",
        "Kernel and graph launches the pacer admitted for the share on this GPU.",
        SHARE_LABELS,
        "launches",
        "region",
    ),
    _m(
        "tessera_share_paced_seconds_total",
        "counter",
        "Time the share's launches were held back by the pacer to keep it to its compute share.",
        SHARE_LABELS,
        "seconds",
        "region",
    ),
    _m(
        "tessera_share_contexts",
        "gauge",
        "CUDA contexts the share's live processes hold on this GPU.",
        SHARE_LABELS,
        "contexts",
        "region",
    ),
    _m(
        "tessera_share_processes",
        "gauge",
        "Live processes of the claim (slots whose owner holds its lock); dead ones are never counted.",
        CLAIM_LABELS,
        "processes",
        "region",
    ),
    _m(
        "tessera_share_region_readable",
        "gauge",
        "1 when the claim's usage region could be read at this scrape, 0 when it is truncated, "
        "of another version or unreadable (the exporter logs why, once).",
        CLAIM_LABELS,
        "boolean",
        "region",
    ),
    # ---- Tessera, per share (API server) -------------------------------------------------
    _m(
        "tessera_share_memory_allocated_bytes",
        "gauge",
        "Memory allocated to the share by the scheduler (consumedCapacity; a dedicated GPU counts whole).",
        SHARE_LABELS,
        "bytes",
        "api",
        "hami_vgpu_memory_allocated_bytes",
    ),
    _m(
        "tessera_share_cores_allocated_ratio",
        "gauge",
        "Cores allocated to the share by the scheduler (consumedCapacity cores / 100).",
        SHARE_LABELS,
        "ratio",
        "api",
        "hami_vgpu_core_allocated_ratio",
    ),
    # ---- Tessera, per GPU (NVML) ---------------------------------------------------------
    _m(
        "tessera_gpu_memory_total_bytes",
        "gauge",
        "The GPU's memory (NVML).",
        GPU_LABELS,
        "bytes",
        "nvml",
    ),
    _m(
        "tessera_gpu_memory_used_bytes",
        "gauge",
        "GPU memory in use by every process on the GPU (NVML).",
        GPU_LABELS,
        "bytes",
        "nvml",
        "hami_host_gpu_memory_used_bytes",
    ),
    _m(
        "tessera_gpu_utilization_ratio",
        "gauge",
        "Fraction of the last NVML sample period in which a kernel ran (NVML utilization.gpu / 100).",
        GPU_LABELS,
        "ratio",
        "nvml",
        "hami_host_gpu_utilization_ratio",
    ),
    _m(
        "tessera_gpu_memory_utilization_ratio",
        "gauge",
        "Fraction of the last NVML sample period in which device memory was read or written (utilization.memory "
        "/ 100).",
        GPU_LABELS,
        "ratio",
        "nvml",
        "hami_host_gpu_memory_controller_utilization_ratio",
    ),
    # ---- Tessera, per GPU (API server) ---------------------------------------------------
    _m(
        "tessera_gpu_memory_capacity_bytes",
        "gauge",
        "Memory the GPU publishes in its ResourceSlice (capacity memory).",
        GPU_LABELS,
        "bytes",
        "api",
        "hami_gpu_memory_limit_bytes",
    ),
    _m(
        "tessera_gpu_memory_allocated_bytes",
        "gauge",
        "Memory allocated on the GPU: sum of its shares, or all of it when dedicated.",
        GPU_LABELS,
        "bytes",
        "api",
        "hami_gpu_memory_allocated_bytes",
    ),
    _m(
        "tessera_gpu_cores_allocated_ratio",
        "gauge",
        "Cores allocated on the GPU / 100 (1 = every SM promised; above 1 = over-committed).",
        GPU_LABELS,
        "ratio",
        "api",
        "hami_gpu_core_allocated_ratio",
    ),
    _m(
        "tessera_gpu_shares",
        "gauge",
        "Shares (allocation results with a shareID) on the GPU.",
        GPU_LABELS,
        "shares",
        "api",
        "hami_gpu_shared_count",
    ),
    _m(
        "tessera_gpu_dedicated",
        "gauge",
        "1 when the GPU is allocated whole (a result without shareID).",
        GPU_LABELS,
        "boolean",
        "api",
    ),
    # ---- the exporter itself -------------------------------------------------------------
    _m(
        "tessera_monitor_api_up",
        "gauge",
        "1 when the last read of the API server succeeded (allocation figures are from it), else 0.",
        ("node",),
        "boolean",
        "exporter",
    ),
    _m(
        "tessera_monitor_api_last_success_timestamp_seconds",
        "gauge",
        "When the allocation figures were last read from the API server (Unix time).",
        ("node",),
        "seconds",
        "exporter",
    ),
    _m(
        "tessera_monitor_nvml_up",
        "gauge",
        "1 when NVML answered at this scrape, 0 when it failed, absent with --no-nvml.",
        ("node",),
        "boolean",
        "exporter",
    ),
    _m(
        "tessera_monitor_collect_duration_seconds",
        "gauge",
        "Time this scrape spent collecting: reading every region, sampling NVML, joining the cached API figures.",
        ("node",),
        "seconds",
        "exporter",
    ),
    # ---- HAMi's names (vGPUmonitor: runtime view) -----------------------------------------
    _m(
        "hami_host_gpu_memory_used_bytes",
        "gauge",
        "NVML used bytes of the GPU (HAMi vGPUmonitor name).",
        HAMI_HOST_LABELS,
        "bytes",
        "nvml",
        "hami_host_gpu_memory_used_bytes",
    ),
    _m(
        "hami_host_gpu_utilization_ratio",
        "gauge",
        "NVML GPU utilisation in percent 0..100 (HAMi's unit despite the name).",
        HAMI_HOST_LABELS,
        "percent",
        "nvml",
        "hami_host_gpu_utilization_ratio",
    ),
    _m(
        "hami_host_gpu_memory_controller_utilization_ratio",
        "gauge",
        "NVML memory utilisation in percent 0..100.",
        HAMI_HOST_MC_LABELS,
        "percent",
        "nvml",
        "hami_host_gpu_memory_controller_utilization_ratio",
    ),
    _m(
        "hami_vgpu_memory_used_bytes",
        "gauge",
        "Memory the share's processes hold (sum over live slots).",
        HAMI_VGPU_LABELS,
        "bytes",
        "region",
        "hami_vgpu_memory_used_bytes",
    ),
    _m(
        "hami_vgpu_memory_limit_bytes",
        "gauge",
        "The share's memory limit.",
        HAMI_VGPU_LABELS,
        "bytes",
        "region",
        "hami_vgpu_memory_limit_bytes",
    ),
    _m(
        "hami_container_device_memory_bytes",
        "gauge",
        "Same value as hami_vgpu_memory_used_bytes (HAMi exports both).",
        HAMI_VGPU_LABELS,
        "bytes",
        "region",
        "hami_container_device_memory_bytes",
    ),
    _m(
        "hami_vgpu_memory_context_bytes",
        "gauge",
        "Memory charged for CUDA contexts (contexts x the claim's context-overhead).",
        HAMI_VGPU_LABELS,
        "bytes",
        "region",
        "hami_vgpu_memory_context_bytes",
    ),
    _m(
        "hami_vgpu_memory_buffer_bytes",
        "gauge",
        "Memory charged for allocations (used minus contexts).",
        HAMI_VGPU_LABELS,
        "bytes",
        "region",
        "hami_vgpu_memory_buffer_bytes",
    ),
    # ---- HAMi's names (scheduler: allocation view) ----------------------------------------
    _m(
        "hami_gpu_memory_limit_bytes",
        "gauge",
        "The GPU's published memory.",
        HAMI_GPU_LABELS,
        "bytes",
        "api",
        "hami_gpu_memory_limit_bytes",
    ),
    _m(
        "hami_gpu_core_limit_ratio",
        "gauge",
        "The GPU's cores capacity (100 = whole GPU; HAMi's unit).",
        HAMI_GPU_LABELS,
        "percent",
        "api",
        "hami_gpu_core_limit_ratio",
    ),
    _m(
        "hami_gpu_memory_allocated_bytes",
        "gauge",
        "Memory allocated on the GPU.",
        HAMI_GPU_CORES_LABELS,
        "bytes",
        "api",
        "hami_gpu_memory_allocated_bytes",
    ),
    _m(
        "hami_gpu_shared_count",
        "gauge",
        "Shares on the GPU.",
        HAMI_GPU_LABELS,
        "shares",
        "api",
        "hami_gpu_shared_count",
    ),
    _m(
        "hami_gpu_core_allocated_ratio",
        "gauge",
        "Cores allocated on the GPU, percent 0..100.",
        HAMI_GPU_LABELS,
        "percent",
        "api",
        "hami_gpu_core_allocated_ratio",
    ),
    _m(
        "hami_node_gpu_overview",
        "gauge",
        "Memory allocated on the GPU, with its cores and memory as labels.",
        HAMI_OVERVIEW_LABELS,
        "bytes",
        "api",
        "hami_node_gpu_overview",
    ),
    _m(
        "hami_node_gpu_memory_allocated_ratio",
        "gauge",
        "Memory allocated / published memory (0..1).",
        HAMI_GPU_LABELS,
        "ratio",
        "api",
        "hami_node_gpu_memory_allocated_ratio",
    ),
    _m(
        "hami_vgpu_memory_allocated_bytes",
        "gauge",
        "Memory allocated to the share.",
        HAMI_VGPU_ALLOC_LABELS,
        "bytes",
        "api",
        "hami_vgpu_memory_allocated_bytes",
    ),
    _m(
        "hami_vgpu_core_allocated_ratio",
        "gauge",
        "Cores allocated to the share, percent 0..100.",
        HAMI_VGPU_ALLOC_LABELS,
        "percent",
        "api",
        "hami_vgpu_core_allocated_ratio",
    ),
)

BY_NAME = {m.name: m for m in METRICS}
