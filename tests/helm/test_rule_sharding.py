"""prometheusRule.sharding: the chart renders the node rules for the Prometheus shards and the fleet rules
for a global layer (a ThanosRuler's PrometheusRule, or a vmalert rule file), and with sharding off
exactly the one PrometheusRule it always rendered.

Every object here is what the real Helm library installed into the fake API server; the placement is
checked again on the rendered rules, by the PromQL analysis, so a template that mixes the sets fails.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts.rules.placement import fleet_reasons
from alerts.rules.promql import metric_names
from tests.helm.installs import JSON, Installed, install_values
from tests.helm.test_kube_prometheus_stack import _expected_rule_groups

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SHARDS_SELECT = {"release": "kps"}  # kube-prometheus-stack's default ruleSelector
RULER_SELECTS = {"ruler": "global"}
# GPUExporterDown asks each Prometheus whether it scrapes an exporter at all (Group.per_prometheus)
PER_PROMETHEUS = {"GPUExporterDown"}
NAMESPACE = "monitoring"  # one for every install: node alerts carry it (namespaceNodeAlerts)


def _values(**sharding: Any) -> JSON:
    return {"prometheusRule": {"enabled": True, "additionalLabels": SHARDS_SELECT, "sharding": sharding}}


@pytest.fixture(scope="module")
def thanos(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    pytest.importorskip("helm_sdkpy")
    values = _values(enabled=True, globalLabels=RULER_SELECTS)
    return install_values(tmp_path_factory.mktemp("thanos"), NAMESPACE, values)


@pytest.fixture(scope="module")
def vmalert(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    pytest.importorskip("helm_sdkpy")
    values = _values(enabled=True, globalLabels=RULER_SELECTS, **{"global": "vmalert"})
    return install_values(tmp_path_factory.mktemp("vmalert"), NAMESPACE, values)


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    pytest.importorskip("helm_sdkpy")
    return install_values(tmp_path_factory.mktemp("single"), NAMESPACE, _values(enabled=False))


def _selects(selector: JSON, labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels and matchExpressions, ANDed)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        present, value = e["key"] in labels, labels.get(e["key"])
        ok = {
            "In": present and value in e.get("values", []),
            "NotIn": not present or value not in e["values"],
            "Exists": present,
            "DoesNotExist": not present,
        }[e["operator"]]
        if not ok:
            return False
    return True


def _rules(groups: list[JSON]) -> list[JSON]:
    return [r for g in groups for r in g["rules"]]


def _text(rule: JSON) -> str:
    return json.dumps(rule, sort_keys=True)


def _name(rule: JSON) -> str:
    return str(rule.get("record") or rule["alert"])


def _node_and_fleet(inst: Installed) -> tuple[list[JSON], list[JSON]]:
    node = inst.named("PrometheusRule", "pulse-gpupulse")
    assert node is not None
    fleet_rule = inst.named("PrometheusRule", "pulse-gpupulse-fleet")
    if fleet_rule is not None:
        return node["spec"]["groups"], fleet_rule["spec"]["groups"]
    config_map = inst.named("ConfigMap", "pulse-gpupulse-fleet-rules")
    assert config_map is not None
    return node["spec"]["groups"], yaml.safe_load(config_map["data"]["gpupulse-fleet.rules.yaml"])["groups"]


# --- without sharding: what it always was


def test_without_sharding_one_prometheus_rule_holds_every_rule_as_before(single: Installed) -> None:
    (rule,) = single.of_kind("PrometheusRule")
    assert rule["spec"]["groups"] == _expected_rule_groups(single.values, single.result["namespace"])
    assert "gpupulse.io/rule-scope" not in rule["metadata"]["labels"]
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert [c for c in single.of_kind("ConfigMap") if "fleet" in c["metadata"]["name"]] == []


def test_sharding_settings_change_nothing_while_sharding_is_off(tmp_path: Path, single: Installed) -> None:
    other = install_values(
        tmp_path, NAMESPACE, _values(enabled=False, globalLabels={"x": "y"}, **{"global": "vmalert"})
    )
    (a,), (b,) = single.of_kind("PrometheusRule"), other.of_kind("PrometheusRule")
    assert a["spec"] == b["spec"] and a["metadata"]["labels"] == b["metadata"]["labels"]


# --- sharded: two sets that together are every rule


@pytest.mark.parametrize("layout", ["thanos", "vmalert"])
def test_the_two_sets_together_are_every_rule_once_in_order(
    layout: str, request: pytest.FixtureRequest, single: Installed
) -> None:
    inst: Installed = request.getfixturevalue(layout)
    node, fleet = _node_and_fleet(inst)
    (everything,) = single.of_kind("PrometheusRule")
    for group in everything["spec"]["groups"]:
        parts = [g for g in node + fleet if g["name"] == group["name"]]
        assert 1 <= len(parts) <= 2, group["name"]
        assert all(g.get("interval") == group.get("interval") for g in parts)
        split = [r for g in parts for r in g["rules"]]
        # each half keeps the group's order; together they are the group's rules, each once
        assert sorted(map(_text, split)) == sorted(map(_text, group["rules"]))
        for g in parts:
            positions = [group["rules"].index(r) for r in g["rules"]]
            assert positions == sorted(positions)


@pytest.mark.parametrize("layout", ["thanos", "vmalert"])
def test_no_rule_on_the_shards_aggregates_over_several_nodes(
    layout: str, request: pytest.FixtureRequest
) -> None:
    # the analysis again, on what was rendered: a template that sent a fleet rule to the shards fails here
    node, fleet = _node_and_fleet(request.getfixturevalue(layout))
    recorded = {r["record"]: "node" for r in _rules(node) if "record" in r}
    recorded.update({r["record"]: "fleet" for r in _rules(fleet) if "record" in r})
    for rule in _rules(node):
        if _name(rule) not in PER_PROMETHEUS:
            assert fleet_reasons(rule["expr"], recorded) == [], _name(rule)
    for rule in _rules(fleet):
        assert fleet_reasons(rule["expr"], recorded) != [], (
            f"{_name(rule)} needs no fleet: keep it on the shards"
        )
    # a shard rule reads only raw series and what the shards record
    shard_records = {n for n, s in recorded.items() if s == "node"}
    for rule in _rules(node):
        assert not (metric_names(rule["expr"]) & (set(recorded) - shard_records)), _name(rule)


def test_gang_rules_go_to_the_global_layer_and_hardware_alerts_stay_on_the_shards(thanos: Installed) -> None:
    node, fleet = (set(map(_name, _rules(groups))) for groups in _node_and_fleet(thanos))
    assert {"TrainingJobHung", "TrainingRankStraggler", "TrainingJobDegraded"} <= fleet
    assert {"GPUFellOffBus", "GPUXidResetRequired", "GPUExporterDown", "TrainingJobNodeFault"} <= node
    assert {"rank:gpu_training_busy_idle:bool", "uuid_namespace_pod:gpu_allocation:sole"} <= node
    assert not node & fleet


def test_the_fleet_rule_is_selected_by_the_thanos_ruler_and_never_by_the_shards(thanos: Installed) -> None:
    node = thanos.named("PrometheusRule", "pulse-gpupulse")
    fleet = thanos.named("PrometheusRule", "pulse-gpupulse-fleet")
    assert node is not None and fleet is not None
    node_labels, fleet_labels = node["metadata"]["labels"], fleet["metadata"]["labels"]
    shards = {"matchLabels": SHARDS_SELECT}
    ruler = {"matchLabels": RULER_SELECTS}
    assert _selects(shards, node_labels) and not _selects(shards, fleet_labels)
    assert _selects(ruler, fleet_labels) and not _selects(ruler, node_labels)
    # a Prometheus whose ruleSelector is empty selects every PrometheusRule: the scope label excludes it
    not_fleet = {
        "matchExpressions": [{"key": "gpupulse.io/rule-scope", "operator": "NotIn", "values": ["fleet"]}]
    }
    assert _selects({}, fleet_labels)
    assert _selects(not_fleet, node_labels) and not _selects(not_fleet, fleet_labels)
    assert node_labels["gpupulse.io/rule-scope"] == "node"


def test_vmalert_gets_a_rule_file_and_no_second_prometheus_rule(vmalert: Installed) -> None:
    assert [r["metadata"]["name"] for r in vmalert.of_kind("PrometheusRule")] == ["pulse-gpupulse"]
    config_map = vmalert.named("ConfigMap", "pulse-gpupulse-fleet-rules")
    assert config_map is not None
    assert _selects({"matchLabels": RULER_SELECTS}, config_map["metadata"]["labels"])
    assert "release" not in config_map["metadata"]["labels"]


def test_both_sets_are_rule_files_promtool_accepts(tmp_path: Path, vmalert: Installed) -> None:
    from demo.neighbours import MissingNeighbourError, neighbour_binary

    try:
        promtool = neighbour_binary("prometheus", "promtool")
    except MissingNeighbourError as e:
        pytest.skip(str(e))
    node, fleet = _node_and_fleet(vmalert)
    for name, groups in (("node", node), ("fleet", fleet)):
        path = tmp_path / f"{name}.rules.yaml"
        path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
        done = subprocess.run(
            [str(promtool), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("bad", ["thanos", "", "VMAlert"])
def test_an_unknown_global_layer_fails_the_install_with_its_name(tmp_path: Path, bad: str) -> None:
    import helm_sdkpy

    with pytest.raises(helm_sdkpy.InstallError, match="global"):
        install_values(tmp_path, "bad", _values(enabled=True, **{"global": bad}))
