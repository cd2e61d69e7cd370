"""What a person reads off the committed dashboards beyond the lines: thresholds where an alert or a
failure starts, data links from the fleet to the node board, and annotations of the controller's
diagnoses and actions limited to the cluster in view."""

from __future__ import annotations

import re
from typing import Any

import pytest

from alerts.config import load_config
from alerts.rules.promql import metric_names
from tests.dashboards.test_dashboards_lint import committed, panels

BOARDS = committed()


def _panel(board: str, title: str) -> dict[str, Any]:
    [found] = [p for p in panels(BOARDS[board]) if p["title"] == title]
    return found


def _steps(panel: dict[str, Any]) -> list[tuple[float | None, str]]:
    return [(s["value"], s["color"]) for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]]


@pytest.mark.parametrize(
    ("board", "title"),
    [("gpupulse-node.json", "Temperature"), ("gpupulse-fleet.json", "Hottest GPU per node")],
)
def test_temperature_panels_mark_the_alerts_threshold(board: str, title: str) -> None:
    limit = float(load_config().thresholds.temperature_celsius)
    panel = _panel(board, title)
    assert _steps(panel) == [(None, "green"), (limit, "red")]
    assert panel["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"] == {"mode": "dashed"}


@pytest.mark.parametrize(
    ("board", "title", "color"),
    [
        ("gpupulse-fleet.json", "GPUs lost", "red"),
        ("gpupulse-node.json", "NVLink links down", "red"),
        ("gpupulse-remediation.json", "Safety breaker open", "red"),
        ("gpupulse-remediation.json", "Automation paused", "orange"),
    ],
)
def test_a_failure_count_turns_its_stat_red_from_one(board: str, title: str, color: str) -> None:
    panel = _panel(board, title)
    assert _steps(panel) == [(None, "green"), (1, color)]
    assert panel["options"]["colorMode"] == "background"


def test_fleet_links_open_the_node_board_for_the_series_node() -> None:
    node_board = BOARDS["gpupulse-node.json"]
    node_vars = {v["name"] for v in node_board["templating"]["list"]}
    linked = 0
    for panel in panels(BOARDS["gpupulse-fleet.json"]):
        for link in panel["fieldConfig"]["defaults"].get("links", []):
            linked += 1
            assert link["url"].startswith(f"/d/{node_board['uid']}?"), link
            assert set(re.findall(r"var-(\w+)=", link["url"])) <= node_vars
            assert "${__field.labels.node}" in link["url"] and "${__url_time_range}" in link["url"]
            # the link reads the series' node label: every query of the panel must keep it
            for target in panel["targets"]:
                assert "{{node}}" in target["legendFormat"], (panel["title"], target)
    assert linked >= 2


@pytest.mark.parametrize(
    "board", ["gpupulse-node.json", "gpupulse-serving.json", "gpupulse-remediation.json"]
)
def test_diagnoses_and_actions_are_annotated_within_the_cluster_in_view(board: str) -> None:
    annotations = {a["name"]: a for a in BOARDS[board]["annotations"]["list"]}
    assert {"Diagnoses", "Remediation actions"} <= set(annotations)
    actions = annotations["Remediation actions"]
    assert metric_names(actions["expr"]) == {"gpupulse_remediation_actions_total"}
    assert 'rung!="page"' in actions["expr"]
    assert actions["titleFormat"] == "gpupulse {{rung}}: {{outcome}}"
    for a in annotations.values():
        assert 'cluster=~"$cluster"' in a["expr"], (board, a["name"])
