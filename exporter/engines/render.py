"""Turn normalized readings into catalog families under per-endpoint and total series caps."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from exporter.engines.reading import Histogram, ModelReading
from gpupulse.metrics.attribution import SERIES_DROPPED_TOTAL
from gpupulse.metrics.engines import ENDPOINT_LABELS, ENGINE_LABELS, ENGINE_METRICS

_HELP = {s.name: s.help for s in ENGINE_METRICS}
COLLECTOR = "engines"


@dataclass
class EndpointView:
    """What render needs of one endpoint this round."""

    endpoint: str
    kind: str
    namespace: str
    pod: str
    models: str  # model label of the up series
    gpus: Sequence[tuple[str, str]]  # (index, uuid)
    up: bool
    duration_seconds: float | None
    failures: dict[str, float]
    readings: Sequence[ModelReading]
    cold_start_seconds: float | None
    down_reason: str | None = None  # why the last scrape failed; None while it succeeds
    partial: dict[str, float] = field(default_factory=dict)  # reason -> scrapes that used part of the page


@dataclass
class Budget:
    """Series caps: per endpoint and across all endpoints; counts what it refused."""

    total: int
    per_endpoint: int
    used_total: int = 0
    used: dict[str, int] = field(default_factory=dict)
    dropped: int = 0

    def take(self, endpoint: str, n: int) -> bool:
        """Reserve n series for endpoint, or count them as dropped."""
        mine = self.used.get(endpoint, 0)
        if mine + n > self.per_endpoint or self.used_total + n > self.total:
            self.dropped += n
            return False
        self.used[endpoint] = mine + n
        self.used_total += n
        return True


def _gauge(name: str, labels: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, _HELP[name], labels=list(labels))


def _hist_buckets(h: Histogram) -> list[tuple[str, float]]:
    return [("+Inf" if b == math.inf else repr(float(b)), v) for b, v in h.buckets]


def _series_of(r: ModelReading, gpus: int) -> int:
    """How many series a reading would have produced."""
    n = gpus + sum(v is not None for v in (r.running, r.waiting, r.kv_usage_ratio, r.kv_hit_ratio))
    if r.kv_hits is not None and r.kv_queries is not None:
        n += 2
    hists = (*r.batch.values(), r.ttft, r.itl, r.e2e, r.queue_time, r.batch_tokens)
    return n + sum(len(h.buckets) + 2 for h in hists if h is not None)


class Families:
    """One instance per round: every engines family, filled endpoint by endpoint."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        el = [*ENGINE_LABELS]
        self.up = _gauge("inference_engine_up", [*el, "endpoint"])
        self.gpu_info = _gauge("inference_engine_gpu_info", el)
        self.failures = CounterMetricFamily(
            "inference_engine_scrape_failures_total",
            _HELP["inference_engine_scrape_failures_total"],
            labels=[*ENDPOINT_LABELS, "reason"],
        )
        self.duration = _gauge("inference_engine_scrape_duration_seconds", ENDPOINT_LABELS)
        self.down_reason = _gauge("inference_engine_down_reason", [*ENDPOINT_LABELS, "reason"])
        self.partial = CounterMetricFamily(
            "inference_engine_scrape_partial_total",
            _HELP["inference_engine_scrape_partial_total"],
            labels=[*ENDPOINT_LABELS, "reason"],
        )
        self.hits = CounterMetricFamily(
            "inference_kv_cache_hits_total", _HELP["inference_kv_cache_hits_total"], labels=[*el, "unit"]
        )
        self.queries = CounterMetricFamily(
            "inference_kv_cache_queries_total",
            _HELP["inference_kv_cache_queries_total"],
            labels=[*el, "unit"],
        )
        self.hit_ratio = _gauge("inference_kv_cache_hit_ratio", el)
        self.usage = _gauge("inference_kv_cache_usage_ratio", el)
        self.running = _gauge("inference_requests_running", el)
        self.waiting = _gauge("inference_requests_waiting", el)
        self.batch = HistogramMetricFamily(
            "inference_batch_latency_seconds", _HELP["inference_batch_latency_seconds"], labels=[*el, "phase"]
        )
        self.hists = {
            key: HistogramMetricFamily(name, _HELP[name], labels=el)
            for key, name in (
                ("ttft", "inference_time_to_first_token_seconds"),
                ("itl", "inference_inter_token_latency_seconds"),
                ("e2e", "inference_request_latency_seconds"),
                ("queue_time", "inference_request_queue_time_seconds"),
                ("batch_tokens", "inference_batch_size_tokens"),
            )
        }
        self.batch_source = _gauge("inference_batch_latency_source_info", ("engine", "source", "proxy"))
        self._batch_sources: set[tuple[str, str, str]] = set()
        self._identities: set[tuple[str, ...]] = set()
        self.duplicates: list[str] = []
        self.cold_start = _gauge("inference_cold_start_seconds", ("engine", "model", "namespace", "pod"))

    def add(self, ep: EndpointView) -> None:
        """Add one endpoint's series, within its budget."""
        gpu = ",".join(i for i, _ in ep.gpus)
        uuid = ",".join(u for _, u in ep.gpus)
        ident = [ep.kind, ep.namespace, ep.pod, ep.endpoint]
        # up is never dropped: it is how a capped or failing endpoint stays visible.
        self.budget.take(ep.endpoint, 1)
        self.up.add_metric(
            [ep.kind, ep.models, ep.namespace, ep.pod, gpu, uuid, ep.endpoint], 1.0 if ep.up else 0.0
        )
        if ep.down_reason is not None:
            self.budget.take(ep.endpoint, 1)  # like up, never dropped: it says why up is 0
            self.down_reason.add_metric([*ident, ep.down_reason], 1.0)
        if ep.duration_seconds is not None and self.budget.take(ep.endpoint, 1):
            self.duration.add_metric(ident, ep.duration_seconds)
        for reason, count in sorted(ep.failures.items()):
            if self.budget.take(ep.endpoint, 1):
                self.failures.add_metric([*ident, reason], count)
        for reason, count in sorted(ep.partial.items()):
            if self.budget.take(ep.endpoint, 1):
                self.partial.add_metric([*ident, reason], count)
        for r in ep.readings:
            self._add_reading(ep, r, gpu, uuid)

    def _add_reading(self, ep: EndpointView, r: ModelReading, gpu: str, uuid: str) -> None:
        labels = [ep.kind, r.model, ep.namespace, ep.pod, gpu, uuid]
        if tuple(labels) in self._identities:
            # Two endpoints with the same identity (e.g. no pod and unknown GPUs) would emit duplicate
            # series, which Prometheus rejects; the first endpoint (by URL) keeps it.
            self.duplicates.append(ep.endpoint)
            self.budget.dropped += _series_of(r, len(ep.gpus))
            return
        self._identities.add(tuple(labels))
        take = self.budget.take
        for i, u in ep.gpus:
            if take(ep.endpoint, 1):
                self.gpu_info.add_metric([ep.kind, r.model, ep.namespace, ep.pod, i, u], 1.0)
        for fam, value in (
            (self.running, r.running),
            (self.waiting, r.waiting),
            (self.usage, r.kv_usage_ratio),
            (self.hit_ratio, r.kv_hit_ratio),
        ):
            if value is not None and take(ep.endpoint, 1):
                fam.add_metric(labels, value)
        if r.kv_hits is not None and r.kv_queries is not None and take(ep.endpoint, 2):
            self.hits.add_metric([*labels, r.kv_unit], r.kv_hits)
            self.queries.add_metric([*labels, r.kv_unit], r.kv_queries)
        for phase, h in sorted(r.batch.items()):
            if take(ep.endpoint, len(h.buckets) + 2):
                self.batch.add_metric([*labels, phase], _hist_buckets(h), h.sum)
        for key, hist_family in self.hists.items():
            h = getattr(r, key)
            if h is not None and take(ep.endpoint, len(h.buckets) + 2):
                hist_family.add_metric(labels, _hist_buckets(h), h.sum)
        if r.batch and r.batch_source is not None:
            key3 = (ep.kind, r.batch_source.source, "true" if r.batch_source.proxy else "false")
            if key3 not in self._batch_sources:
                self._batch_sources.add(key3)
                self.batch_source.add_metric(list(key3), 1.0)
        if ep.cold_start_seconds is not None and take(ep.endpoint, 1):
            self.cold_start.add_metric([ep.kind, r.model, ep.namespace, ep.pod], ep.cold_start_seconds)

    def collect(self, dropped_total: float) -> list[Metric]:
        """All families, including the cumulative dropped-series counter."""
        dropped = CounterMetricFamily(
            SERIES_DROPPED_TOTAL.name, SERIES_DROPPED_TOTAL.help, labels=["collector"]
        )
        dropped.add_metric([COLLECTOR], dropped_total)
        return [
            self.up,
            self.gpu_info,
            self.failures,
            self.down_reason,
            self.partial,
            self.duration,
            self.hits,
            self.queries,
            self.hit_ratio,
            self.usage,
            self.running,
            self.waiting,
            self.batch,
            *self.hists.values(),
            self.batch_source,
            self.cold_start,
            dropped,
        ]
