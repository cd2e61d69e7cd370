"""Prometheus recording and alerting rules as code; rendered into alerts/*.rules.yaml."""

from __future__ import annotations

import dataclasses

from alerts.config import ConfigError, RulesConfig
from alerts.rules.controller import controller_file
from alerts.rules.hardware import hardware_file
from alerts.rules.model import Alert, Group, Record, RuleFile
from alerts.rules.observability import observability_file
from alerts.rules.placement import placements
from alerts.rules.promql import with_cluster_label
from alerts.rules.recording import recording_file
from alerts.rules.serving import serving_file
from alerts.rules.training import training_file
from alerts.rules.usage import usage_file

__all__ = ["Alert", "Group", "Record", "RuleFile", "rule_files"]


def rule_files(c: RulesConfig) -> tuple[RuleFile, ...]:
    """Every rule file gpupulse ships, rendered from one config."""
    files = (
        recording_file(c),
        hardware_file(c),
        usage_file(c),
        serving_file(c),
        training_file(c),
        observability_file(c),
        controller_file(c),
    )
    names = [a.alert for f in files for a in f.alerts()]
    unknown = set(c.for_durations) - set(names)
    if unknown:
        raise ConfigError(f"alerts/config.yaml `for:` names alerts that do not exist: {sorted(unknown)}")
    out = tuple(_keep_cluster(f, c.cluster_label) for f in files)
    placements(out)  # a group whose declared scope its PromQL contradicts fails the build here
    return out


def _keep_cluster(f: RuleFile, label: str) -> RuleFile:
    """Every aggregation and join of the file keeps the cluster label (multi-cluster rulers)."""
    groups = tuple(
        dataclasses.replace(
            g, rules=tuple(dataclasses.replace(r, expr=with_cluster_label(r.expr, label)) for r in g.rules)
        )
        for g in f.groups
    )
    return dataclasses.replace(f, groups=groups)
