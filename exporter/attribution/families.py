"""Helpers to fill catalog families (exporter.catalog.family builds them from the specs)."""

from __future__ import annotations

from prometheus_client.core import Metric

from exporter.catalog import Family
from exporter.catalog import family as catalog_family
from exporter.collectors.base import CollectorError
from exporter.metricspec import MetricSpec


def new_family(spec: MetricSpec) -> Family:
    """An empty family for a gauge, counter or info spec (info rows are gauges of 1)."""
    return catalog_family(spec)


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
