"""Exporter self-metrics: per-collector success and duration, sample age, stale GPUs, build info, and
the Kubernetes API requests of every reflector."""

from __future__ import annotations

import functools
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.core import Metric

from exporter.collectors.series import Series, table
from exporter.config import exporter_version
from exporter.kube.requests import RequestCounts
from exporter.nvml import BINDING_VERSION
from gpupulse.metrics import exporter_self as c


@dataclass(frozen=True)
class CollectorRound:
    """How one collector's last round went."""

    success: bool
    duration_seconds: float


@functools.cache
def _build_series() -> Series:
    # the installed version is read from package metadata (a file): once per process is enough
    return table(c.BUILD_INFO).series(exporter_version(), platform.python_version(), BINDING_VERSION)


def self_families(
    rounds: Mapping[str, CollectorRound],
    last_good_sample_unix: float | None,
    stale_gpus: Sequence[tuple[str, str, bool]],
    kube_requests: RequestCounts | None = None,
) -> list[Metric]:
    """Families describing the exporter itself (the Kubernetes requests once there is one)."""
    success, duration = table(c.COLLECTOR_SUCCESS).family(), table(c.COLLECTOR_DURATION).family()
    for name in sorted(rounds):
        success.add(success.table.series(name), 1.0 if rounds[name].success else 0.0)
        duration.add(duration.table.series(name), rounds[name].duration_seconds)
    build = table(c.BUILD_INFO).family()
    build.add(_build_series(), 1.0)
    out: list[Metric] = [success, duration, build]
    if last_good_sample_unix is not None:
        ts = table(c.LAST_SAMPLE_TIMESTAMP).family()
        ts.add(ts.table.series(), last_good_sample_unix)
        out.append(ts)
    if stale_gpus:
        stale = table(c.GPU_STALE).family()
        for uuid, index, is_stale in stale_gpus:
            stale.add(stale.table.series(uuid, index), 1.0 if is_stale else 0.0)
        out.append(stale)
    counts = kube_requests.snapshot() if kube_requests is not None else {}
    if counts:
        requests = table(c.KUBE_REQUESTS).family()
        for (resource, verb, code), n in sorted(counts.items()):
            requests.add(requests.table.series(resource, verb, code), float(n))
        out.append(requests)
    return out
