"""Remediation: what is open now, what was done to what, breaker, pause and budgets left, then actions by
rung and outcome, loops and intake over time (metrics of remediation/metrics.py)."""

from __future__ import annotations

from alerts.rules.promql import histogram_quantile_of
from dashboards.boards.annotations import ACTIONS, DIAGNOSES
from dashboards.boards.filters import UIDS
from dashboards.grafana import Column, Dashboard, Panel, Row, Target, Threshold

_INCIDENT = "incident, signature, target_kind, target, state, rung"
_ACTION = "incident, signature, target_kind, target, rung, outcome"
# the open incidents with their facts, valued at when each opened (Grafana's times are in ms); max
# keeps one row per incident where two replicas of the controller both export it
OPEN_INCIDENTS = (
    f"1000 * max by ({_INCIDENT}) ("
    "gpupulse_remediation_incident_opened_timestamp_seconds"
    " * on(instance, incident) group_left(signature, target_kind, target, state, rung)"
    " gpupulse_remediation_incident_open_info)"
)
LAST_ACTIONS = f"1000 * max by ({_ACTION}) (gpupulse_remediation_action_last_timestamp_seconds)"


def _rate(metric: str, by: str) -> str:
    return f"sum by ({by}) (increase({metric}[$__rate_interval]))"


def _columns(labels: str, value: str) -> tuple[Column, ...]:
    return (*(Column(label) for label in labels.split(", ")), Column("Value", value))


def dashboard() -> Dashboard:
    """The remediation controller dashboard (the controller has no node/namespace/pod dimension)."""
    state = Row(
        "Now",
        (
            Panel(
                "Safety breaker open",
                "stat",
                "bool_yes_no",
                (Target("max(gpupulse_remediation_breaker_open)"),),
                width=4,
                height=4,
                description="While open every incident pages; a human must reset it "
                "(gpupulse-remediation breaker reset).",
                thresholds=(Threshold(1),),
            ),
            Panel(
                "Automation paused",
                "stat",
                "bool_yes_no",
                (Target("max(gpupulse_remediation_paused)"),),
                width=4,
                height=4,
                description="An operator paused it (gpupulse-remediation pause); resume with "
                "gpupulse-remediation resume.",
                thresholds=(Threshold(1, "orange"),),
            ),
            Panel(
                "Open incidents",
                "stat",
                "none",
                (Target("sum(gpupulse_remediation_incidents_open)"),),
                width=4,
                height=4,
            ),
            Panel(
                "Open incidents not listed",
                "stat",
                "none",
                (Target("sum(gpupulse_remediation_incidents_open_unlisted)"),),
                width=4,
                height=4,
                description="Open incidents beyond the newest 100 the table lists "
                "(all of them: gpupulse-remediation incidents list).",
                thresholds=(Threshold(1, "orange"),),
            ),
            Panel(
                "Pages by outcome",
                "stat",
                "none",
                (
                    Target(
                        "sum by (outcome) ("
                        'increase(gpupulse_remediation_actions_total{rung="page"}[$__range]))',
                        "{{outcome}}",
                    ),
                ),
                width=4,
                height=4,
                description="Pages over the dashboard's time range: success = delivered (resolve pages "
                "included), failed = a delivery attempt failed, dry_run = would have paged.",
            ),
            Panel(
                "Queue depth",
                "stat",
                "none",
                (Target("sum(gpupulse_remediation_queue_depth)"),),
                width=4,
                height=4,
            ),
        ),
    )
    board = Row(
        "Open incidents and what was done",
        (
            Panel(
                "Open incidents, newest first",
                "table",
                "dateTimeFromNow",
                (Target(OPEN_INCIDENTS),),
                width=24,
                height=8,
                description="Every open incident (the newest 100): signature, target, state, the rung it "
                "is on and when it opened. Its history: gpupulse-remediation incidents get <incident>.",
                columns=_columns(_INCIDENT, "opened"),
                sort_by="opened",
            ),
            Panel(
                "Last actions",
                "table",
                "dateTimeFromNow",
                (Target(LAST_ACTIONS),),
                width=12,
                height=9,
                description="The controller's latest 20 actions and pages, closed incidents' too: what was "
                "done to what and how it ended (dry_run: what it would have done).",
                columns=_columns(_ACTION, "ended"),
                sort_by="ended",
            ),
            Panel(
                "Budgets left",
                "bargauge",
                "none",
                (Target("min by (budget) (gpupulse_remediation_budget_remaining)", "{{budget}}"),),
                width=6,
                height=9,
                description="What the safety budgets still allow; an action beyond an action budget "
                "opens the breaker, a page beyond the page budget joins a summary page.",
                base_color="red",
                thresholds=(Threshold(1, "green"),),
                min_value=0,
            ),
            Panel(
                "Pages left per signature",
                "bargauge",
                "none",
                (
                    Target(
                        "min by (signature) (gpupulse_remediation_signature_pages_remaining)", "{{signature}}"
                    ),
                ),
                width=6,
                height=9,
                description="Pages each signature's incidents may still send one by one in the page "
                "window; at 0 its further incidents join one summary page.",
                base_color="red",
                thresholds=(Threshold(1, "green"),),
                min_value=0,
            ),
        ),
    )
    actions = Row(
        "Actions",
        (
            Panel(
                "Actions by rung and outcome",
                "timeseries",
                "none",
                (
                    Target(
                        _rate("gpupulse_remediation_actions_total", "rung, outcome"), "{{rung}} {{outcome}}"
                    ),
                ),
                stacked=True,
            ),
            Panel(
                "Action duration p99 by rung",
                "timeseries",
                "s",
                (
                    Target(
                        histogram_quantile_of(
                            0.99, "gpupulse_remediation_action_duration_seconds", "rung", "$__rate_interval"
                        ),
                        "{{rung}}",
                    ),
                ),
            ),
            Panel(
                "Restart loops detected",
                "timeseries",
                "none",
                (
                    Target(
                        "sum(increase(gpupulse_remediation_loops_detected_total[$__rate_interval]))", "loops"
                    ),
                    Target(
                        "sum(increase(gpupulse_remediation_flapping_alerts_total[$__rate_interval]))",
                        "flapping alerts",
                    ),
                ),
            ),
            Panel(
                "Incidents closed by resolution",
                "timeseries",
                "none",
                (Target(_rate("gpupulse_remediation_incidents_total", "resolution"), "{{resolution}}"),),
                stacked=True,
            ),
        ),
    )
    intake = Row(
        "Intake",
        (
            Panel(
                "Alerts received",
                "timeseries",
                "none",
                (Target(_rate("gpupulse_remediation_alerts_received_total", "status"), "{{status}}"),),
            ),
            Panel(
                "Webhook requests rejected",
                "timeseries",
                "none",
                (Target(_rate("gpupulse_remediation_alerts_rejected_total", "reason"), "{{reason}}"),),
            ),
            Panel(
                "Ingest latency p99",
                "timeseries",
                "s",
                (
                    Target(
                        histogram_quantile_of(
                            0.99, "gpupulse_remediation_ingest_latency_seconds", "", "$__rate_interval"
                        ),
                        "p99",
                    ),
                ),
            ),
        ),
    )
    return Dashboard(
        uid=UIDS["remediation"],
        title="gpupulse / Remediation",
        description="What is open now and what the controller did to what: open incidents, last actions, "
        "breaker, pause and budgets left; actions by rung and outcome, loops and intake over time.",
        rows=(state, board, actions, intake),
        links=tuple(UIDS.values()),
        annotations=(DIAGNOSES, ACTIONS),
    )
