"""prometheusRule.sharding.thanosRuler: the chart renders a ThanosRuler (prometheus-operator) for the fleet
rules on request, whose ruleSelector picks exactly the fleet PrometheusRule, and nothing without it.

Every object is what the real Helm library installed into the fake API server; the ThanosRuler is also
checked against the operator's CRD model (ci/sharded-thanos-values.yaml runs through test_schemas).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.installs import CHART, JSON, Installed, install_values
from tests.helm.test_rule_sharding import _selects

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

NAMESPACE = "monitoring"
CI = CHART / "ci" / "sharded-thanos-values.yaml"


def _values(**ruler: Any) -> JSON:
    return {
        "monitoringLabels": {"release": "kps"},
        "prometheusRule": {
            "enabled": True,
            "sharding": {"enabled": True, "globalLabels": {"team": "fleet"}, "thanosRuler": ruler},
        },
    }


@pytest.fixture(scope="module")
def created(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    pytest.importorskip("helm_sdkpy")
    values = yaml.safe_load(CI.read_text())
    return install_values(tmp_path_factory.mktemp("thanos-ruler"), NAMESPACE, values)


def _ruler(inst: Installed) -> JSON:
    ruler = inst.named("ThanosRuler", "pulse-gpupulse-fleet")
    assert ruler is not None, [o["kind"] for o in inst.objects]
    return ruler


def test_the_ruler_selects_the_fleet_rules_and_not_the_node_rules(created: Installed) -> None:
    selector = _ruler(created)["spec"]["ruleSelector"]
    fleet = created.named("PrometheusRule", "pulse-gpupulse-fleet")
    node = created.named("PrometheusRule", "pulse-gpupulse")
    assert fleet is not None and node is not None
    assert _selects(selector, fleet["metadata"]["labels"])
    assert not _selects(selector, node["metadata"]["labels"])
    # every PrometheusRule of the install: it picks one
    picked = [
        r["metadata"]["name"]
        for r in created.of_kind("PrometheusRule")
        if _selects(selector, r["metadata"]["labels"])
    ]
    assert picked == ["pulse-gpupulse-fleet"]


def test_the_ruler_carries_the_values_it_was_given(created: Installed) -> None:
    spec = _ruler(created)["spec"]
    given = yaml.safe_load(CI.read_text())["prometheusRule"]["sharding"]["thanosRuler"]
    assert spec["queryEndpoints"] == given["queryEndpoints"]
    assert spec["alertmanagersUrl"] == given["alertmanagersUrl"]
    assert spec["labels"] == given["labels"]
    assert spec["evaluationInterval"] == "15s"
    assert spec["replicas"] == 1
    # the operator looks for rules in the ruler's own namespace: the fleet PrometheusRule's
    assert "ruleNamespaceSelector" not in spec
    assert _ruler(created)["metadata"]["namespace"] == NAMESPACE


def test_the_ruler_is_valid_against_the_operator_crd(created: Installed) -> None:
    v1 = pytest.importorskip("cloudcoil.models.prometheus_operator.v1")
    obj = _ruler(created)
    parsed = v1.ThanosRuler.model_validate(copy.deepcopy(obj))
    kept = json.loads(parsed.model_dump_json(by_alias=True, exclude_unset=True))
    assert kept["spec"] == obj["spec"]  # no field the CRD does not know, none changed


def test_no_ruler_unless_asked(tmp_path: Path) -> None:
    pytest.importorskip("helm_sdkpy")
    inst = install_values(tmp_path, NAMESPACE, _values())
    assert inst.of_kind("ThanosRuler") == []
    assert inst.named("PrometheusRule", "pulse-gpupulse-fleet") is not None


@pytest.mark.parametrize(
    ("ruler", "sharding", "says"),
    [
        ({"create": True}, {}, "queryEndpoints"),
        ({"create": True, "queryEndpoints": ["q:10902"]}, {"global": "vmalert"}, "global"),
    ],
    ids=["no-query", "vmalert"],
)
def test_a_ruler_that_cannot_work_fails_the_install_saying_why(
    tmp_path: Path, ruler: JSON, sharding: JSON, says: str
) -> None:
    helm_sdkpy = pytest.importorskip("helm_sdkpy")
    values = _values(**ruler)
    values["prometheusRule"]["sharding"].update(sharding)
    with pytest.raises(helm_sdkpy.InstallError, match=says):
        install_values(tmp_path, NAMESPACE, values)


def test_the_values_schema_refuses_an_unknown_ruler_field(tmp_path: Path) -> None:
    helm_sdkpy = pytest.importorskip("helm_sdkpy")
    with pytest.raises(helm_sdkpy.InstallError, match="queryEndpoint"):
        install_values(tmp_path, NAMESPACE, _values(create=True, queryEndpoint="q:10902"))
