"""Builds an Alert with its `for:` and runbook link taken from the config, never written inline, and
reads a gauge so that a missed scrape does not reset it."""

from __future__ import annotations

from alerts.config import RulesConfig
from alerts.rules.model import Alert
from gpupulse.contract import Layer, Severity, TargetKind


def alert(
    c: RulesConfig,
    name: str,
    *,
    expr: str,
    severity: Severity,
    layer: Layer,
    fault_class: str,
    target_kind: TargetKind,
    summary: str,
    description: str,
    keep_firing_for: str = "",
) -> Alert:
    """An alerting rule whose `for:` and runbook_url come from alerts/config.yaml."""
    return Alert(
        alert=name,
        expr=expr,
        for_=c.for_(name),
        severity=severity,
        layer=layer,
        fault_class=fault_class,
        target_kind=target_kind,
        summary=summary,
        description=description,
        runbook_url=c.runbook_url(name),
        keep_firing_for=keep_firing_for,
    )


def held(c: RulesConfig, selector: str) -> str:
    """A gauge read as its last sample within `stale_hold`: one missed scrape or an exporter restart
    (its series stale for an evaluation or two) neither empties the alert reading it nor restarts its
    `for:`, while a new value counts at once, so the alert fires and resolves as fast as before. Only
    a series gone for longer than `stale_hold` (a deleted pod, a lost node) is let go."""
    return f"last_over_time({selector}[{c.windows.stale_hold}])"
