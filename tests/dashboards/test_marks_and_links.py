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


def test_the_open_incidents_table_shows_signature_target_state_rung_and_age() -> None:
    panel = _panel("gpupulse-remediation.json", "Open incidents, newest first")
    (target,) = panel["targets"]
    assert metric_names(target["expr"]) == {
        "gpupulse_remediation_incident_open_info",
        "gpupulse_remediation_incident_opened_timestamp_seconds",
    }
    assert target["instant"] and target["format"] == "table"
    assert _column_titles(panel) == [
        "incident",
        "signature",
        "target_kind",
        "target",
        "state",
        "rung",
        "opened",
    ]
    # the opened time reads "5 minutes ago"; Grafana's times are milliseconds
    assert panel["fieldConfig"]["defaults"]["unit"] == "dateTimeFromNow"
    assert target["expr"].startswith("1000 * ")
    assert panel["options"]["sortBy"] == [{"displayName": "opened", "desc": True}]


def test_the_last_actions_table_says_what_was_done_to_what_and_how_it_ended() -> None:
    panel = _panel("gpupulse-remediation.json", "Last actions")
    (target,) = panel["targets"]
    assert metric_names(target["expr"]) == {"gpupulse_remediation_action_last_timestamp_seconds"}
    assert _column_titles(panel) == [
        "incident",
        "signature",
        "target_kind",
        "target",
        "rung",
        "outcome",
        "ended",
    ]
    assert panel["options"]["sortBy"] == [{"displayName": "ended", "desc": True}]


def test_every_table_column_is_a_label_its_query_keeps() -> None:
    tables = [(b, p) for b in BOARDS.values() for p in panels(b) if p["type"] == "table"]
    assert len(tables) >= 2
    for _, panel in tables:
        steps = {t["id"]: t["options"] for t in panel["transformations"]}
        if "filterFieldsByName" not in steps:
            continue
        (target,) = panel["targets"]
        # the outermost aggregation's `by` list: the labels each row of an instant query keeps
        outer = re.search(r"\bby \(([^)]*)\)", target["expr"])
        assert outer is not None, target["expr"]
        kept = set(outer[1].split(", "))
        assert set(steps["filterFieldsByName"]["include"]["names"]) - {"Value"} <= kept, panel["title"]


@pytest.mark.parametrize("title", ["Budgets left", "Pages left per signature"])
def test_a_spent_budget_turns_its_bar_red(title: str) -> None:
    panel = _panel("gpupulse-remediation.json", title)
    assert _steps(panel) == [(None, "red"), (1, "green")]
    assert panel["fieldConfig"]["defaults"]["color"] == {"mode": "thresholds"}
    assert panel["fieldConfig"]["defaults"]["min"] == 0


def test_incidents_the_table_cannot_list_turn_their_stat_orange() -> None:
    panel = _panel("gpupulse-remediation.json", "Open incidents not listed")
    assert _steps(panel) == [(None, "green"), (1, "orange")]
    (target,) = panel["targets"]
    assert metric_names(target["expr"]) == {"gpupulse_remediation_incidents_open_unlisted"}


def _column_titles(panel: dict[str, Any]) -> list[str]:
    steps = {t["id"]: t["options"] for t in panel["transformations"]}
    names = steps["filterFieldsByName"]["include"]["names"]
    order = steps["organize"]["indexByName"]
    renamed = steps["organize"]["renameByName"]
    return [renamed.get(n, n) for n in sorted(names, key=lambda n: order[n])]
