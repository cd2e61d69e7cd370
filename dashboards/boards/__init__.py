"""The four gpupulse dashboards; queries sit apart from layout in each module."""

from __future__ import annotations

from alerts.config import RulesConfig
from dashboards.boards import fleet, node, remediation, serving
from dashboards.boards.filters import for_clusters
from dashboards.grafana import Dashboard


def all_dashboards(c: RulesConfig) -> tuple[Dashboard, ...]:
    """Every dashboard, built with the same thresholds as the alert rules."""
    boards = (fleet.dashboard(c), node.dashboard(c), serving.dashboard(c), remediation.dashboard())
    return tuple(for_clusters(d, c.cluster_label) for d in boards)
