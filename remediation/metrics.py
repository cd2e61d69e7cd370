"""Every metric the controller exports (gpupulse_remediation_*), built from gpupulse.metrics.controller,
and the on-call board's series, rendered from the snapshot the engine publishes each tick (read by
remediation/transitions/board.py; a scrape never reads the database)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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


@dataclass(frozen=True)
class OpenIncident:
    """One row of the open-incidents table."""

    incident: int
    signature: str
    target_kind: str
    target: str
    state: str
    rung: str
    opened_at: float


@dataclass(frozen=True)
class RecentAction:
    """One finished action: what was done to what, and how it ended."""

    incident: int
    signature: str
    target_kind: str
    target: str
    rung: str
    outcome: str
    ended_at: float


@dataclass(frozen=True)
class BoardSnapshot:
    """Everything the board's series show at one tick."""

    open_incidents: tuple[OpenIncident, ...] = ()
    unlisted: int = 0
    actions: tuple[RecentAction, ...] = ()
    budgets: tuple[tuple[str, int], ...] = ()  # (budget, remaining)
    signature_pages: tuple[tuple[str, int], ...] = ()  # (signature, pages remaining)
    ready: bool = False  # until the engine publishes one, no unlisted count (a 0 would claim too much)


def _family(s: MetricSpec) -> GaugeMetricFamily:
    # info series are gauges of 1 in the text format, as node_exporter and kube-state-metrics write them
    return GaugeMetricFamily(s.name, s.help, labels=list(s.labels))


class BoardCollector(Collector):
    """Renders the latest published BoardSnapshot; the engine publishes a new one every tick."""

    def __init__(self) -> None:
        self._snapshot = BoardSnapshot()

    @property
    def snapshot(self) -> BoardSnapshot:
        """The snapshot /metrics renders now."""
        return self._snapshot

    def publish(self, snapshot: BoardSnapshot) -> None:
        """Replace the snapshot whole (a scrape renders the old one or the new one, never a mix)."""
        self._snapshot = snapshot

    def describe(self) -> Iterator[Metric]:
        return self._render(BoardSnapshot())

    def collect(self) -> Iterator[Metric]:
        return self._render(self._snapshot)

    def _render(self, s: BoardSnapshot) -> Iterator[Metric]:
        info, opened = _family(spec.INCIDENT_OPEN_INFO), _family(spec.INCIDENT_OPENED)
        for row in s.open_incidents:
            incident = str(row.incident)
            labels = [incident, row.signature, row.target_kind, row.target, row.state, row.rung]
            info.add_metric(labels, 1.0)
            opened.add_metric([incident], row.opened_at)
        unlisted = _family(spec.INCIDENTS_OPEN_UNLISTED)
        last = _family(spec.ACTION_LAST)
        budget = _family(spec.BUDGET_REMAINING)
        pages = _family(spec.SIGNATURE_PAGES_REMAINING)
        if s.ready:
            unlisted.add_metric([], float(s.unlisted))
        for a in s.actions:
            labels = [str(a.incident), a.signature, a.target_kind, a.target, a.rung, a.outcome]
            last.add_metric(labels, a.ended_at)
        for name, left in s.budgets:
            budget.add_metric([name], float(left))
        for name, left in s.signature_pages:
            pages.add_metric([name], float(left))
        yield from (info, opened, unlisted, last, budget, pages)


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
        self.paused_since = _gauge(spec.PAUSED_SINCE, r)
        self.leader = _gauge(spec.LEADER, r)
        self.diagnosis_failures = _counter(spec.DIAGNOSIS_FAILURES, r)
        self.incidents_open = _gauge(spec.INCIDENTS_OPEN, r)
        self.incidents = _counter(spec.INCIDENTS, r)
        self.action_duration = _histogram(spec.ACTION_DURATION, r)
        self.diagnoses = _counter(spec.DIAGNOSES, r)
        self.drain_wait = _histogram(spec.DRAIN_WAIT, r)
        # the on-call board: open incidents, latest actions, budgets left
        self.board = BoardCollector()
        r.register(self.board)
