"""Every metric the controller exports (gpupulse_remediation_*), built from gpupulse.metrics.controller."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpupulse.metrics import controller as spec
from gpupulse.metrics.spec import MetricSpec


def _counter(s: MetricSpec, registry: CollectorRegistry) -> Counter:
    return Counter(s.name, s.help, s.labels, registry=registry)


def _gauge(s: MetricSpec, registry: CollectorRegistry) -> Gauge:
    return Gauge(s.name, s.help, s.labels, registry=registry)


def _histogram(s: MetricSpec, registry: CollectorRegistry) -> Histogram:
    if s.buckets:
        return Histogram(s.name, s.help, s.labels, registry=registry, buckets=s.buckets)
    return Histogram(s.name, s.help, s.labels, registry=registry)


class RemediationMetrics:
    """Holds the controller's metrics on its own registry (tests make one each)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.alerts_received = _counter(spec.ALERTS_RECEIVED, r)
        self.alerts_rejected = _counter(spec.ALERTS_REJECTED, r)
        self.ingest_latency = _histogram(spec.INGEST_LATENCY, r)
        self.inbox_writable = _gauge(spec.INBOX_WRITABLE, r)
        self.inbox_recreated = _counter(spec.INBOX_RECREATED, r)
        self.inbox_alerts_lost = _counter(spec.INBOX_ALERTS_LOST, r)
        self.queue_depth = _gauge(spec.QUEUE_DEPTH, r)
        self.actions = _counter(spec.ACTIONS, r)
        self.stale_alerts = _counter(spec.STALE_ALERTS, r)
        self.loops = _counter(spec.LOOPS_DETECTED, r)
        self.flapping = _counter(spec.FLAPPING_ALERTS, r)
        self.breaker_open = _gauge(spec.BREAKER_OPEN, r)
        self.paused = _gauge(spec.PAUSED, r)
        self.incidents_open = _gauge(spec.INCIDENTS_OPEN, r)
        self.incidents = _counter(spec.INCIDENTS, r)
        self.action_duration = _histogram(spec.ACTION_DURATION, r)
        self.diagnoses = _counter(spec.DIAGNOSES, r)
