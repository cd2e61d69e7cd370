"""Specs of the controller's own metrics (gpupulse_remediation_*), built by remediation/metrics.py."""

from __future__ import annotations

from dataclasses import replace

from gpupulse.metrics.spec import MetricSpec, counter, gauge, histogram, info

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


def _new(s: MetricSpec) -> MetricSpec:
    """A spec new in this release: its name and labels may still change."""
    return replace(s, stability="experimental")


# The on-call board (remediation/transitions/board.py): what is open, what was done to what, what
# budget is left. Per-incident series exist only while an incident is open, and for at most
# MAX_OPEN_INCIDENTS of them (the newest); the rest are counted in INCIDENTS_OPEN_UNLISTED.
INCIDENT_OPEN_INFO = _new(
    info(
        "gpupulse_remediation_incident_open_info",
        "One series per open incident (the newest, up to a cap): its signature, target, state and rung; "
        "gone when the incident closes.",
        _C,
        ("incident", "signature", "target_kind", "target", "state", "rung"),
    )
)
INCIDENT_OPENED = _new(
    gauge(
        "gpupulse_remediation_incident_opened_timestamp_seconds",
        "seconds",
        "When each incident of gpupulse_remediation_incident_open_info opened (join on incident).",
        _C,
        ("incident",),
    )
)
INCIDENTS_OPEN_UNLISTED = _new(
    gauge(
        "gpupulse_remediation_incidents_open_unlisted",
        "",
        "Open incidents beyond the cap, which have no gpupulse_remediation_incident_open_info series.",
        _C,
        (),
    )
)
ACTION_LAST = _new(
    gauge(
        "gpupulse_remediation_action_last_timestamp_seconds",
        "seconds",
        "When the controller's latest actions (restart, migrate, page; a bounded number) ended, by "
        "incident, what they were done to and their outcome (success, failed, temporary, interrupted, "
        "dry_run, skipped, blocked).",
        _C,
        ("incident", "signature", "target_kind", "target", "rung", "outcome"),
    )
)
BUDGET_REMAINING = _new(
    gauge(
        "gpupulse_remediation_budget_remaining",
        "",
        "What the global safety budgets still allow (concurrent_actions, actions_per_minute, "
        "nodes_migrated, pages_per_window); an action beyond an action budget opens the breaker.",
        _C,
        ("budget",),
    )
)
SIGNATURE_PAGES_REMAINING = _new(
    gauge(
        "gpupulse_remediation_signature_pages_remaining",
        "",
        "Pages incidents of each signature may still send one by one within the page window (its own "
        "budget, capped by the global one); at 0 its further incidents join one summary page.",
        _C,
        ("signature",),
    )
)

# The controller watched by its own alerts (alerts/rules/controller.py).
PAUSED_SINCE = _new(
    gauge(
        "gpupulse_remediation_paused_since_timestamp_seconds",
        "seconds",
        "When the current pause began (0 while not paused): how long a pause has lasted.",
        _C,
        (),
    )
)
LEADER = _new(
    gauge(
        "gpupulse_remediation_leader",
        "",
        "1 on the replica whose engine acts (a controller without leader election: always), 0 on a "
        "follower: no replica at 1 means nothing acts.",
        _C,
        (),
    )
)
DIAGNOSIS_FAILURES = _new(
    counter(
        "gpupulse_remediation_diagnosis_failures_total",
        "",
        "Diagnoses that could not read their signals, by reason (prometheus_unavailable, failed); "
        "their incidents page without naming a cause.",
        _C,
        ("reason",),
    )
)

# Drain at a boundary (remediation/drain.py): how long training jobs' drains waited for their next step.
DRAIN_WAIT = _new(
    histogram(
        "gpupulse_remediation_drain_wait_seconds",
        "seconds",
        "How long a training job's drain waited for its next step or checkpoint, by how the wait ended "
        "(boundary: a step landed; deadline; no_signal: the job has no progress series; unreachable: "
        "Prometheus could not be read).",
        _C,
        ("outcome",),
        buckets=(1.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0),
    )
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
    PAUSED_SINCE,
    LEADER,
    DIAGNOSIS_FAILURES,
    DRAIN_WAIT,
    INCIDENTS_OPEN,
    INCIDENTS,
    ACTION_DURATION,
    DIAGNOSES,
    INCIDENT_OPEN_INFO,
    INCIDENT_OPENED,
    INCIDENTS_OPEN_UNLISTED,
    ACTION_LAST,
    BUDGET_REMAINING,
    SIGNATURE_PAGES_REMAINING,
)
