"""Specs of the controller's own metrics (gpupulse_remediation_*), built by remediation/metrics.py."""

from __future__ import annotations

from gpupulse.metrics.spec import MetricSpec, counter, gauge, histogram

_C = "controller"

ALERTS_RECEIVED = counter(
    "gpupulse_remediation_alerts_received_total",
    "",
    "Alerts accepted from Alertmanager, by status.",
    _C,
    ("status",),
)
ALERTS_REJECTED = counter(
    "gpupulse_remediation_alerts_rejected_total",
    "",
    "Webhook requests rejected, by reason (auth, size, invalid, overloaded, storage).",
    _C,
    ("reason",),
)
INGEST_LATENCY = histogram(
    "gpupulse_remediation_ingest_latency_seconds",
    "seconds",
    "Time from request received to durable acknowledgement.",
    _C,
    (),
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
INBOX_WRITABLE = gauge(
    "gpupulse_remediation_inbox_writable",
    "",
    "1 while the inbox commits (0 after a failed transaction, e.g. disk full, until one succeeds).",
    _C,
    (),
)
INBOX_RECREATED = counter(
    "gpupulse_remediation_inbox_recreated_total",
    "",
    "Corrupt inboxes set aside and replaced by an empty one (--storage.on-corrupt=recreate).",
    _C,
    (),
)
INBOX_ALERTS_LOST = counter(
    "gpupulse_remediation_inbox_alerts_lost_total",
    "",
    "Unprocessed alerts the set-aside corrupt inboxes still showed (a lower bound of the loss).",
    _C,
    (),
)
QUEUE_DEPTH = gauge(
    "gpupulse_remediation_queue_depth", "", "Accepted alerts not yet processed by the engine.", _C, ()
)
ACTIONS = counter(
    "gpupulse_remediation_actions_total",
    "",
    "Ladder actions, by rung (restart, migrate, page) and outcome "
    "(success, failed, skipped, dry_run, blocked).",
    _C,
    ("rung", "outcome"),
)
STALE_ALERTS = counter(
    "gpupulse_remediation_stale_alerts_total",
    "",
    "Alerts recorded but never acted on because their evidence was stale, by reason "
    "(out_of_order, expired, too_old).",
    _C,
    ("reason",),
)
LOOPS_DETECTED = counter(
    "gpupulse_remediation_loops_detected_total",
    "",
    "Targets that stopped being restarted because they were restarted too often.",
    _C,
    (),
)
FLAPPING_ALERTS = counter(
    "gpupulse_remediation_flapping_alerts_total", "", "Alerts recognised as flapping.", _C, ()
)
BREAKER_OPEN = gauge(
    "gpupulse_remediation_breaker_open",
    "",
    "1 while the safety breaker is open (every incident pages; a human must reset it).",
    _C,
    (),
)
PAUSED = gauge("gpupulse_remediation_paused", "", "1 while automation is paused by an operator.", _C, ())
INCIDENTS_OPEN = gauge(
    "gpupulse_remediation_incidents_open", "", "Incidents not yet resolved or closed.", _C, ()
)
INCIDENTS = counter(
    "gpupulse_remediation_incidents_total",
    "",
    "Incidents closed, by how (automated, human, unresolved).",
    _C,
    ("resolution",),
)
ACTION_DURATION = histogram(
    "gpupulse_remediation_action_duration_seconds",
    "seconds",
    "How long a backend took to carry out an action, by rung.",
    _C,
    ("rung",),
)

DIAGNOSES = counter(
    "gpupulse_remediation_diagnoses_total",
    "",
    "Incident diagnoses, by the layer and cause they name (none: no diagnosis) and whether they were "
    "confident; the dashboards' diagnosis annotations read it.",
    _C,
    ("layer", "cause", "confident"),
)

CONTROLLER_METRICS: tuple[MetricSpec, ...] = (
    ALERTS_RECEIVED,
    ALERTS_REJECTED,
    INGEST_LATENCY,
    INBOX_WRITABLE,
    INBOX_RECREATED,
    INBOX_ALERTS_LOST,
    QUEUE_DEPTH,
    ACTIONS,
    STALE_ALERTS,
    LOOPS_DETECTED,
    FLAPPING_ALERTS,
    BREAKER_OPEN,
    PAUSED,
    INCIDENTS_OPEN,
    INCIDENTS,
    ACTION_DURATION,
    DIAGNOSES,
)
