"""Turn normalized readings into catalog families under per-endpoint and total series caps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client.core import Metric

from exporter.collectors.series import family, histogram_family
from exporter.engines.reading import ModelReading
from gpupulse.metrics import engines as spec
from gpupulse.metrics.attribution import SERIES_DROPPED_TOTAL

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


def _series_of(r: ModelReading, gpus: int) -> int:
    """How many series a reading would have produced."""
    n = gpus + sum(
        v is not None
        for v in (
            r.running,
            r.waiting,
            r.kv_usage_ratio,
            r.kv_hit_ratio,
            r.prompt_tokens,
            r.generation_tokens,
        )
    )
    if r.kv_hits is not None and r.kv_queries is not None:
        n += 2
    hists = (*r.batch.values(), r.ttft, r.itl, r.e2e, r.queue_time, r.batch_tokens)
    return n + sum(len(h.buckets) + 2 for h in hists if h is not None)


class Families:
    """One instance per round: every engines family, filled endpoint by endpoint."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.up = family(spec.ENGINE_UP)
        self.gpu_info = family(spec.ENGINE_GPU_INFO)
        self.failures = family(spec.ENGINE_SCRAPE_FAILURES_TOTAL)
        self.duration = family(spec.ENGINE_SCRAPE_DURATION_SECONDS)
        self.down_reason = family(spec.ENGINE_DOWN_REASON)
        self.partial = family(spec.ENGINE_SCRAPE_PARTIAL_TOTAL)
        self.hits = family(spec.KV_CACHE_HITS_TOTAL)
        self.queries = family(spec.KV_CACHE_QUERIES_TOTAL)
        self.hit_ratio = family(spec.KV_CACHE_HIT_RATIO)
        self.prompt_tokens = family(spec.PROMPT_TOKENS_TOTAL)
        self.generation_tokens = family(spec.GENERATION_TOKENS_TOTAL)
        self.usage = family(spec.KV_CACHE_USAGE_RATIO)
        self.running = family(spec.REQUESTS_RUNNING)
        self.waiting = family(spec.REQUESTS_WAITING)
        self.batch = histogram_family(spec.BATCH_LATENCY_SECONDS)
        self.hists = {
            key: histogram_family(hist_spec)
            for key, hist_spec in (
                ("ttft", spec.TIME_TO_FIRST_TOKEN_SECONDS),
                ("itl", spec.INTER_TOKEN_LATENCY_SECONDS),
                ("e2e", spec.REQUEST_LATENCY_SECONDS),
                ("queue_time", spec.REQUEST_QUEUE_TIME_SECONDS),
                ("batch_tokens", spec.BATCH_SIZE_TOKENS),
            )
        }
        self.batch_source = family(spec.BATCH_LATENCY_SOURCE_INFO)
        self._batch_sources: set[tuple[str, str, str]] = set()
        self._identities: set[tuple[str, ...]] = set()
        self.duplicates: list[str] = []
        self.cold_start = family(spec.COLD_START_SECONDS)

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
            (self.prompt_tokens, r.prompt_tokens),
            (self.generation_tokens, r.generation_tokens),
        ):
            if value is not None and take(ep.endpoint, 1):
                fam.add_metric(labels, value)
        if r.kv_hits is not None and r.kv_queries is not None and take(ep.endpoint, 2):
            self.hits.add_metric([*labels, r.kv_unit], r.kv_hits)
            self.queries.add_metric([*labels, r.kv_unit], r.kv_queries)
        batch_added = False
        for phase, h in sorted(r.batch.items()):
            if take(ep.endpoint, len(h.buckets) + 2):
                self.batch.add_metric([*labels, phase], h.buckets, h.sum)
                batch_added = True
        for key, hist_family in self.hists.items():
            h = getattr(r, key)
            if h is not None and take(ep.endpoint, len(h.buckets) + 2):
                hist_family.add_metric(labels, h.buckets, h.sum)
        if batch_added and r.batch_source is not None:
            # Names the source of a histogram that is served; a series of its own under the caps.
            key3 = (ep.kind, r.batch_source.source, "true" if r.batch_source.proxy else "false")
            if key3 not in self._batch_sources and take(ep.endpoint, 1):
                self._batch_sources.add(key3)
                self.batch_source.add_metric(list(key3), 1.0)
        if ep.cold_start_seconds is not None and take(ep.endpoint, 1):
            self.cold_start.add_metric([ep.kind, r.model, ep.namespace, ep.pod], ep.cold_start_seconds)

    def collect(self, dropped_total: float) -> list[Metric]:
        """All families, including the cumulative dropped-series counter."""
        dropped = family(SERIES_DROPPED_TOTAL)
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
            self.prompt_tokens,
            self.generation_tokens,
            self.usage,
            self.running,
            self.waiting,
            self.batch,
            *self.hists.values(),
            self.batch_source,
            self.cold_start,
            dropped,
        ]
