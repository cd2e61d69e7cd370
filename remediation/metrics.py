"""Every metric the controller exports (gpupulse_remediation_*), owned in one place."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class RemediationMetrics:
    """Holds the controller's metrics on its own registry (tests make one each)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.alerts_received = Counter(
            "gpupulse_remediation_alerts_received_total",
            "Alerts accepted from Alertmanager, by status.",
            ["status"],
            registry=r,
        )
        self.alerts_rejected = Counter(
            "gpupulse_remediation_alerts_rejected_total",
            "Webhook requests rejected, by reason (auth, size, invalid, overloaded, storage).",
            ["reason"],
            registry=r,
        )
        self.ingest_latency = Histogram(
            "gpupulse_remediation_ingest_latency_seconds",
            "Time from request received to durable acknowledgement.",
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
        )
        self.inbox_writable = Gauge(
            "gpupulse_remediation_inbox_writable",
            "1 while the inbox commits (0 after a failed transaction, e.g. disk full, until one succeeds).",
            registry=r,
        )
        self.inbox_recreated = Counter(
            "gpupulse_remediation_inbox_recreated_total",
            "Corrupt inboxes set aside and replaced by an empty one (--storage.on-corrupt=recreate).",
            registry=r,
        )
        self.inbox_alerts_lost = Counter(
            "gpupulse_remediation_inbox_alerts_lost_total",
            "Unprocessed alerts the set-aside corrupt inboxes still showed (a lower bound of the loss).",
            registry=r,
        )
        self.queue_depth = Gauge(
            "gpupulse_remediation_queue_depth", "Accepted alerts not yet processed by the engine.", registry=r
        )
        self.diagnoses = Counter(
            "gpupulse_remediation_diagnoses_total",
            "Incident diagnoses, by the layer and cause they name (none: no diagnosis) and whether "
            "they were confident; the dashboards' diagnosis annotations.",
            ["layer", "cause", "confident"],
            registry=r,
        )
        self.actions = Counter(
            "gpupulse_remediation_actions_total",
            "Ladder actions, by rung (restart, migrate, page) and outcome "
            "(success, failed, skipped, dry_run, blocked).",
            ["rung", "outcome"],
            registry=r,
        )
        self.stale_alerts = Counter(
            "gpupulse_remediation_stale_alerts_total",
            "Alerts recorded but never acted on because their evidence was stale, by reason "
            "(out_of_order, expired, too_old).",
            ["reason"],
            registry=r,
        )
        self.loops = Counter(
            "gpupulse_remediation_loops_detected_total",
            "Targets that stopped being restarted because they were restarted too often.",
            registry=r,
        )
        self.flapping = Counter(
            "gpupulse_remediation_flapping_alerts_total", "Alerts recognised as flapping.", registry=r
        )
        self.breaker_open = Gauge(
            "gpupulse_remediation_breaker_open",
            "1 while the safety breaker is open (every incident pages; a human must reset it).",
            registry=r,
        )
        self.paused = Gauge(
            "gpupulse_remediation_paused", "1 while automation is paused by an operator.", registry=r
        )
        self.incidents_open = Gauge(
            "gpupulse_remediation_incidents_open", "Incidents not yet resolved or closed.", registry=r
        )
        self.incidents = Counter(
            "gpupulse_remediation_incidents_total",
            "Incidents closed, by how (automated, human, unresolved).",
            ["resolution"],
            registry=r,
        )
        self.action_duration = Histogram(
            "gpupulse_remediation_action_duration_seconds",
            "How long a backend took to carry out an action, by rung.",
            ["rung"],
            registry=r,
        )
