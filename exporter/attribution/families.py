"""Helpers to build and fill catalog families from their specs."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.collectors.base import CollectorError
from gpupulse.metrics.spec import MetricSpec

Family = GaugeMetricFamily | CounterMetricFamily


def new_family(spec: MetricSpec) -> Family:
    """An empty family for a gauge, counter or info spec (info rows are gauges of 1)."""
    if spec.type == "counter":
        return CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
    if spec.type in ("gauge", "info"):
        return GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
    raise ValueError(f"{spec.name}: build histograms with prometheus_client directly")


def add_info(family: Family, values: list[str]) -> None:
    """Add one row of 1 to an info family."""
    add_value(family, values, 1.0)


def add_value(family: Family, values: list[str], value: float) -> None:
    """Add one sample to a gauge or counter family."""
    family.add_metric(values, value)


class PartialCollectorError(CollectorError):
    """The round failed (success 0), but these families are still true and may be served.

    The sampler of today drops a failed round's families; one that reads `families` can serve
    them, so a kubelet restart does not blank allocation rows and CPU counters.
    """

    def __init__(self, message: str, families: list[Metric]) -> None:
        super().__init__(message, families)
