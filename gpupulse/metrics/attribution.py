"""Specs of the attribution collector: kubelet allocations, host CPU of GPU processes, dropped series."""

from __future__ import annotations

from gpupulse.metrics.spec import MetricSpec

GPU_ALLOCATION_INFO = MetricSpec(
    name="gpu_allocation_info",
    type="info",
    unit="",
    labels=("uuid", "gpu", "mig_uuid", "namespace", "pod", "container", "resource"),
    help="A GPU or MIG device the kubelet allocated to a pod container (present even when idle); "
    "one row per pod when several pods share a GPU.",
    collector="attribution",
)

GPU_PROCESS_HOST_CPU_SECONDS_TOTAL = MetricSpec(
    name="gpu_process_host_cpu_seconds_total",
    type="counter",
    unit="seconds",
    labels=("uuid", "gpu", "pid", "namespace", "pod", "container"),
    help="Host CPU time (user + system) consumed by a process that uses the GPU, from /proc/<pid>/stat.",
    collector="attribution",
)

SERIES_DROPPED_TOTAL = MetricSpec(
    name="gpupulse_series_dropped_total",
    type="counter",
    unit="",
    labels=("collector",),
    help="Series a collector did not export because a cardinality cap was reached.",
    collector="attribution",
)

ATTRIBUTION_METRICS: tuple[MetricSpec, ...] = (
    GPU_ALLOCATION_INFO,
    GPU_PROCESS_HOST_CPU_SECONDS_TOTAL,
    SERIES_DROPPED_TOTAL,
)
