"""prometheus_client metric families -> OpenTelemetry SDK MetricsData (cumulative, as scraped)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client.core import Metric as PromMetric
from prometheus_client.samples import Sample

SCOPE = InstrumentationScope(name="gpupulse")
_SECOND_NS = 1_000_000_000

LabelKey = tuple[tuple[str, str], ...]


@dataclass
class ConvertStats:
    families: int = 0
    skipped: list[str] = field(default_factory=list)  # families of a type OTLP has no point for here


def _key(labels: Mapping[str, str], drop: str = "") -> LabelKey:
    return tuple(sorted((k, v) for k, v in labels.items() if k != drop))


def _ns(seconds: float | None, default_ns: int) -> int:
    return int(seconds * _SECOND_NS) if seconds is not None else default_ns


def _sample_time_ns(sample: Sample, now_ns: int) -> int:
    ts = sample.timestamp
    return _ns(float(ts), now_ns) if ts is not None else now_ns


def _created(samples: Sequence[Sample], suffix: str) -> dict[LabelKey, int]:
    return {_key(s.labels): int(s.value * _SECOND_NS) for s in samples if s.name.endswith(suffix)}


def _numbers(family: PromMetric, sample_name: str, start_ns: int, now_ns: int) -> list[NumberDataPoint]:
    created = _created(family.samples, "_created")
    return [
        NumberDataPoint(
            attributes=dict(s.labels),
            start_time_unix_nano=created.get(_key(s.labels), start_ns),
            time_unix_nano=_sample_time_ns(s, now_ns),
            value=float(s.value),  # prometheus_client keeps ints (info rows); OTLP must see doubles
        )
        for s in family.samples
        if s.name == sample_name
    ]


def _histogram_points(family: PromMetric, start_ns: int, now_ns: int) -> list[HistogramDataPoint]:
    series: dict[LabelKey, dict[str, Any]] = {}
    for s in family.samples:
        if s.name == family.name + "_bucket":
            entry = series.setdefault(_key(s.labels, drop="le"), {"buckets": {}})
            entry["buckets"][float(s.labels["le"])] = s.value
            entry["time"] = _sample_time_ns(s, now_ns)
        elif s.name in (family.name + "_sum", family.name + "_count"):
            series.setdefault(_key(s.labels), {"buckets": {}})[s.name.rsplit("_", 1)[1]] = s.value
        elif s.name == family.name + "_created":
            series.setdefault(_key(s.labels), {"buckets": {}})["created"] = int(s.value * _SECOND_NS)
    points = []
    for key, entry in series.items():
        cumulative = sorted(entry["buckets"].items())
        bounds = [le for le, _ in cumulative if not math.isinf(le)]
        # Prometheus buckets are cumulative (le); OTLP wants the count in each bucket, +Inf last.
        counts, previous = [], 0.0
        for _le, value in cumulative:
            counts.append(int(value - previous))
            previous = value
        if not cumulative or not math.isinf(cumulative[-1][0]):
            counts.append(int(entry.get("count", previous) - previous))
        points.append(
            HistogramDataPoint(
                attributes=dict(key),
                start_time_unix_nano=entry.get("created", start_ns),
                time_unix_nano=entry.get("time", now_ns),
                count=int(entry.get("count", previous)),
                sum=float(entry.get("sum", 0.0)),
                bucket_counts=counts,
                explicit_bounds=bounds,
                # Prometheus histograms carry no min/max; None leaves the optional OTLP fields unset.
                min=None,  # type: ignore[arg-type]
                max=None,  # type: ignore[arg-type]
            )
        )
    return points


# Catalog base units in UCUM, as OTel semantic conventions spell them.
UCUM = {
    "seconds": "s",
    "bytes": "By",
    "ratio": "1",
    "celsius": "Cel",
    "watts": "W",
    "hertz": "Hz",
    "joules": "J",
}


def convert_family(
    family: PromMetric, start_ns: int, now_ns: int, units: Mapping[str, str] | None = None
) -> Metric | None:
    """One family as an OTel metric; None for types without a faithful mapping (summary, gaugehistogram)."""
    description = family.documentation
    unit = (units or {}).get(family.name) or family.unit or ""
    if family.type == "counter":
        # The OTel name drops `_total`; Prometheus adds it back to monotonic sums on the way in.
        points = _numbers(family, family.name + "_total", start_ns, now_ns)
        data: Gauge | Sum | Histogram = Sum(
            data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE, is_monotonic=True
        )
        return Metric(name=family.name, description=description, unit=unit, data=data)
    if family.type == "info":
        name = family.name + "_info"
        return Metric(name, description, unit, Gauge(data_points=_numbers(family, name, start_ns, now_ns)))
    if family.type in ("gauge", "unknown", "untyped", "stateset"):
        return Metric(
            family.name, description, unit, Gauge(data_points=_numbers(family, family.name, start_ns, now_ns))
        )
    if family.type == "histogram":
        data = Histogram(
            data_points=_histogram_points(family, start_ns, now_ns),
            aggregation_temporality=AggregationTemporality.CUMULATIVE,
        )
        return Metric(name=family.name, description=description, unit=unit, data=data)
    return None


def to_metrics_data(
    families: Sequence[PromMetric],
    resource: Resource,
    start_ns: int,
    now_ns: int,
    units: Mapping[str, str] | None = None,
) -> tuple[MetricsData, ConvertStats]:
    """Every family of one snapshot as a single OTLP batch; `units`: family name -> UCUM unit."""
    stats = ConvertStats()
    metrics = []
    for family in families:
        converted = convert_family(family, start_ns, now_ns, units)
        if converted is None:
            stats.skipped.append(family.name)
            continue
        stats.families += 1
        metrics.append(converted)
    scope = ScopeMetrics(scope=SCOPE, metrics=metrics, schema_url="")
    return MetricsData(
        resource_metrics=[ResourceMetrics(resource=resource, scope_metrics=[scope], schema_url="")]
    ), stats
