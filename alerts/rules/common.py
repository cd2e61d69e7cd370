"""Builds an Alert with its `for:` and runbook link taken from the config, never written inline."""

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
    )
