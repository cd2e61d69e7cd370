"""Specs of the exporter's own health: per-collector success and duration, sample age, stale GPUs, build."""

from __future__ import annotations

from gpupulse.metrics.spec import MetricSpec, gauge, info

COLLECTOR_SUCCESS = gauge(
    "gpupulse_collector_success", "", "1 when the collector's last round succeeded.", "self", ("collector",)
)
COLLECTOR_DURATION = gauge(
    "gpupulse_collector_duration_seconds",
    "seconds",
    "Wall time of the collector's last round.",
    "self",
    ("collector",),
)
LAST_SAMPLE_TIMESTAMP = gauge(
    "gpupulse_last_sample_timestamp_seconds",
    "seconds",
    "Unix time at which the last good sample finished.",
    "self",
    (),
)
GPU_STALE = gauge(
    "gpupulse_gpu_stale",
    "",
    "1 while an NVML call on this GPU is past its deadline; its values are dropped until it answers.",
    "self",
)
BUILD_INFO = info(
    "gpupulse_build_info",
    "Version of the running exporter.",
    "self",
    ("version", "python_version", "nvml_binding_version"),
)

SELF_METRICS: tuple[MetricSpec, ...] = (
    COLLECTOR_SUCCESS,
    COLLECTOR_DURATION,
    LAST_SAMPLE_TIMESTAMP,
    GPU_STALE,
    BUILD_INFO,
)
