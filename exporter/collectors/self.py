"""Exporter self-metrics: per-collector success and duration, sample age, stale GPUs, build info."""

from __future__ import annotations

import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.core import Metric

from exporter import catalog as c
from exporter.config import exporter_version
from exporter.nvml import BINDING_VERSION


@dataclass(frozen=True)
class CollectorRound:
    """How one collector's last round went."""

    success: bool
    duration_seconds: float


def self_families(
    rounds: Mapping[str, CollectorRound],
    last_good_sample_unix: float | None,
    stale_gpus: Sequence[tuple[str, str, bool]],
) -> list[Metric]:
    """Families describing the exporter itself."""
    success, duration = c.family(c.COLLECTOR_SUCCESS), c.family(c.COLLECTOR_DURATION)
    for name in sorted(rounds):
        success.add_metric([name], 1.0 if rounds[name].success else 0.0)
        duration.add_metric([name], rounds[name].duration_seconds)
    build = c.family(c.BUILD_INFO)
    build.add_metric([exporter_version(), platform.python_version(), BINDING_VERSION], 1.0)
    out: list[Metric] = [success, duration, build]
    if last_good_sample_unix is not None:
        ts = c.family(c.LAST_SAMPLE_TIMESTAMP)
        ts.add_metric([], last_good_sample_unix)
        out.append(ts)
    if stale_gpus:
        stale = c.family(c.GPU_STALE)
        for uuid, index, is_stale in stale_gpus:
            stale.add_metric([uuid, index], 1.0 if is_stale else 0.0)
        out.append(stale)
    return out
