"""Specs of the exporter's own health: per-collector success and duration, sample age, stale GPUs, build,
and the requests it sends the Kubernetes API."""

from __future__ import annotations

from gpupulse.metrics.spec import MetricSpec, counter, gauge, info

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
# Every plug-in's reflectors together (exporter/kube/requests.py): a watch storm or a relist loop shows
# as a rate, per node, before the API server's own metrics name the culprit.
KUBE_REQUESTS = counter(
    "gpupulse_kube_requests_total",
    "",
    "LIST and WATCH requests the exporter sent to the Kubernetes API, by resource, verb and HTTP status "
    "of the answer (<error>: none came).",
    "self",
    ("resource", "verb", "code"),
)

SELF_METRICS: tuple[MetricSpec, ...] = (
    COLLECTOR_SUCCESS,
    COLLECTOR_DURATION,
    LAST_SAMPLE_TIMESTAMP,
    GPU_STALE,
    BUILD_INFO,
    KUBE_REQUESTS,
)
