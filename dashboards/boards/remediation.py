"""Remediation: actions by rung and outcome, loops, breaker state (metrics of remediation/metrics.py)."""

from __future__ import annotations

from alerts.rules.promql import histogram_quantile_of
from dashboards.boards.annotations import ACTIONS, DIAGNOSES
from dashboards.boards.filters import UIDS
from dashboards.grafana import Dashboard, Panel, Row, Target, Threshold


def _rate(metric: str, by: str) -> str:
    return f"sum by ({by}) (increase({metric}[$__rate_interval]))"


def dashboard() -> Dashboard:
    """The remediation controller dashboard (the controller has no node/namespace/pod dimension)."""
    state = Row(
        "State",
        (
            Panel(
                "Safety breaker open",
                "stat",
                "bool_yes_no",
                (Target("max(gpupulse_remediation_breaker_open)"),),
                width=6,
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
                width=6,
                height=4,
                thresholds=(Threshold(1, "orange"),),
            ),
            Panel(
                "Open incidents",
                "stat",
                "none",
                (Target("sum(gpupulse_remediation_incidents_open)"),),
                width=6,
                height=4,
            ),
            Panel(
                "Queue depth",
                "stat",
                "none",
                (Target("sum(gpupulse_remediation_queue_depth)"),),
                width=6,
                height=4,
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
        description="What the controller did: actions by rung and outcome, loops, breaker and pause state.",
        rows=(state, actions, intake),
        links=tuple(UIDS.values()),
        annotations=(DIAGNOSES, ACTIONS),
    )
