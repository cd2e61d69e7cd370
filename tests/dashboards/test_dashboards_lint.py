"""The committed dashboards (tests/test_generated.py: what the code builds) follow the kubernetes-mixin
dashboard rules: a datasource variable, $__rate_interval in every rate, a unit on every panel, fixed uids,
filters."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts.rules.promql import base_metric, metric_names
from dashboards.build import JSON_DIR
from tests.alerts.ruleset import known_metrics

ROOT = Path(__file__).resolve().parents[2]
UIDS = {"gpupulse-fleet", "gpupulse-node", "gpupulse-serving", "gpupulse-remediation"}
# The controller's metrics have no node/namespace/pod dimension, so filters there would select nothing.
NO_FILTERS = {"gpupulse-remediation": "controller metrics carry no node/namespace/pod labels"}
RATE_CALL = re.compile(r"\b(?:rate|irate|increase)\(")
RATE_WINDOW = re.compile(r"\b(?:rate|irate|increase)\((?:[^()\[\]{}]|\{[^{}]*\})*\[([^\]]+)\]")


def committed() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(JSON_DIR.glob("*.json"))}


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(dashboard) for t in p["targets"]]


@pytest.fixture(scope="module")
def boards() -> dict[str, dict[str, Any]]:
    return committed()


def test_uids_are_fixed_and_files_named_after_them(boards: dict[str, dict[str, Any]]) -> None:
    assert {d["uid"] for d in boards.values()} == UIDS
    for name, dashboard in boards.items():
        assert name == f"{dashboard['uid']}.json"


def test_every_dashboard_has_a_datasource_variable_used_by_every_panel_and_query(
    boards: dict[str, dict[str, Any]],
) -> None:
    for dashboard in boards.values():
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        for panel in panels(dashboard):
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_panel_has_a_unit_and_queries_and_no_deprecated_type(boards: dict[str, dict[str, Any]]) -> None:
    for dashboard in boards.values():
        titles = [p["title"] for p in panels(dashboard)]
        assert len(titles) == len(set(titles)), dashboard["uid"]
        for panel in panels(dashboard):
            assert panel["fieldConfig"]["defaults"].get("unit"), f"{dashboard['uid']}: {panel['title']}"
            assert panel["targets"], panel["title"]
            assert panel["type"] not in {"graph", "singlestat", "table-old"}, panel["title"]


# A single number for the time in view (a stat: "pages sent") counts over the whole range; a line over
# time uses $__rate_interval, which Grafana keeps at least four scrape intervals at every zoom.
RANGE_PANELS = {"stat"}


def test_every_rate_uses_rate_interval(boards: dict[str, dict[str, Any]]) -> None:
    for dashboard in boards.values():
        for panel in panels(dashboard):
            allowed = {"$__rate_interval"} | ({"$__range"} if panel["type"] in RANGE_PANELS else set())
            for expr in (t["expr"] for t in panel["targets"]):
                windows = RATE_WINDOW.findall(expr)
                assert len(windows) == len(RATE_CALL.findall(expr)), f"unparsed rate() in {expr}"
                assert set(windows) <= allowed, (panel["title"], expr)


def test_gpu_dashboards_filter_by_node_namespace_and_pod(boards: dict[str, dict[str, Any]]) -> None:
    for dashboard in boards.values():
        names = {v["name"] for v in dashboard["templating"]["list"]}
        if dashboard["uid"] in NO_FILTERS:
            continue
        assert {"node", "namespace", "pod"} <= names, dashboard["uid"]
        used = " ".join(exprs(dashboard))
        for var in ("node", "namespace", "pod"):
            assert f"${var}" in used, f"{dashboard['uid']} never uses ${var}"


def test_queries_use_only_defined_variables(boards: dict[str, dict[str, Any]]) -> None:
    builtin = {"__rate_interval", "__range", "__range_s", "__interval"}
    for dashboard in boards.values():
        names = {v["name"] for v in dashboard["templating"]["list"]} | builtin
        for expr in exprs(dashboard):
            for var in re.findall(r"\$\{?(\w+)", expr):
                assert var in names, f"{dashboard['uid']}: ${var} in {expr}"


def test_queries_select_only_known_metrics(boards: dict[str, dict[str, Any]]) -> None:
    records = set()
    for path in (ROOT / "alerts").glob("*.rules.yaml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            records |= {r["record"] for r in group["rules"] if "record" in r}
    allowed = known_metrics() | records | {"up", "ALERTS"}
    for dashboard in boards.values():
        for expr in exprs(dashboard):
            unknown = {base_metric(n) for n in metric_names(expr) if n not in allowed} - allowed
            assert not unknown, f"{dashboard['uid']}: {unknown} in {expr}"


def test_panels_do_not_overlap(boards: dict[str, dict[str, Any]]) -> None:
    for dashboard in boards.values():
        taken: set[tuple[int, int]] = set()
        for panel in dashboard["panels"]:
            g = panel["gridPos"]
            assert g["x"] + g["w"] <= 24
            cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not cells & taken, panel["title"]
            taken |= cells


NEEDLES = {
    "gpupulse-fleet": "uuid:gpu_sm_activity:ratio namespace:gpu_allocated:sum cost_per_hour "
    ":gpu_gang_slots:sum "
    "gpu_xid_errors_total gpu_up",
    "gpupulse-node": "gpu_process_memory_used_bytes gpu_clock_event_active gpu_xid_errors_total "
    "model_weights_page_cache_resident_ratio gpu_process_host_cpu_seconds_total",
    "gpupulse-serving": "inference_kv_cache_hits_total inference_batch_latency_seconds "
    "inference_time_to_first_token_seconds inference_inter_token_latency_seconds inference_requests_waiting "
    "inference_engine_gpu_info",
    "gpupulse-remediation": "gpupulse_remediation_actions_total gpupulse_remediation_loops_detected_total "
    "gpupulse_remediation_breaker_open gpupulse_remediation_incident_open_info "
    "gpupulse_remediation_action_last_timestamp_seconds gpupulse_remediation_budget_remaining "
    "gpupulse_remediation_signature_pages_remaining gpupulse_remediation_incidents_open_unlisted",
}


@pytest.mark.parametrize(("uid", "needles"), [(uid, text.split()) for uid, text in NEEDLES.items()])
def test_each_dashboard_shows_what_it_is_for(
    boards: dict[str, dict[str, Any]], uid: str, needles: list[str]
) -> None:
    (dashboard,) = [d for d in boards.values() if d["uid"] == uid]
    text = " ".join(exprs(dashboard))
    for needle in needles:
        assert needle in text, f"{uid} lacks {needle}"
