"""Every panel query of the committed dashboards, Grafana variables filled in, and what counts as data.

Shared by the incident replay (fleet, node and serving dashboards) and the demo run (remediation
dashboard, the only one fed by the controller).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from dashboards.build import JSON_DIR

# Dashboards whose data comes from the remediation controller; the incident replay runs none.
CONTROLLER_DASHBOARDS = frozenset({"gpupulse-remediation"})


@dataclass(frozen=True)
class PanelQuery:
    """One target of one panel."""

    uid: str
    title: str
    expr: str

    def __str__(self) -> str:
        return f"{self.uid} / {self.title}: {self.expr}"


def panel_queries(rate_interval: str, range_seconds: int = 60) -> list[PanelQuery]:
    """Every target of every dashboard in dashboards/json, `$var` filled as Grafana would with "All"."""
    fill = {
        "$__rate_interval": rate_interval,
        "$__range_s": str(range_seconds),
        "$__range": f"{range_seconds}s",
        "$cluster": ".*",
        "$node": ".*",
        "$namespace": ".*",
        "$pod": ".*",
        "$model": ".*",
    }
    out = []
    for path in sorted(JSON_DIR.glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"]
                for var, value in fill.items():
                    expr = expr.replace(var, value)
                assert "$" not in expr, f"{board['uid']} / {panel['title']}: unfilled variable in {expr}"
                out.append(PanelQuery(board["uid"], panel["title"], expr))
    return out


def has_data(result: Sequence[dict[str, Any]]) -> bool:
    """True when an instant query's vector has a value Grafana would draw (not NaN, e.g. 0/0)."""
    return any(math.isfinite(float(series["value"][1])) for series in result)


def by_uid(queries: Iterable[PanelQuery], uids: Iterable[str]) -> list[PanelQuery]:
    """The queries of these dashboards."""
    wanted = set(uids)
    return [q for q in queries if q.uid in wanted]
