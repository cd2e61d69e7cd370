"""Every object the chart installs, for every ci/ values set, is valid against the real schemas: the
Kubernetes OpenAPI schemas (kubernetes-validate, strict: unknown fields are violations) and the
prometheus-operator CRD schemas (cloudcoil-models-prometheus-operator, models generated from the
operator's CRDs and versioned with it; a field the model does not know is a violation too). The
values schema agrees with the CRDs where values flow into them (durations, enums)."""

from __future__ import annotations

import copy
import itertools
import json
import re
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from gpupulse.durations import DURATION_PATTERN
from tests.helm.installs import CHART, JSON, Installed

kubernetes_validate = pytest.importorskip("kubernetes_validate")
v1 = pytest.importorskip("cloudcoil.models.prometheus_operator.v1")
v1alpha1 = pytest.importorskip("cloudcoil.models.prometheus_operator.v1alpha1")

from kubernetes_validate.utils import all_versions  # noqa: E402

# the chart's kubeVersion floor and the newest Kubernetes the package has schemas for
K8S_VERSIONS = ("1.25.0", all_versions()[-1])
# objects the chart renders only where the cluster serves their API (.Capabilities), by the first
# Kubernetes that does: validated against that version instead of the floor
SERVED_SINCE = {"flowcontrol.apiserver.k8s.io/v1": "1.29.0"}
OPERATOR_VERSION = version("cloudcoil-models-prometheus-operator")
CRD_MODELS: dict[tuple[str, str], type[BaseModel]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): v1.ServiceMonitor,
    ("monitoring.coreos.com/v1", "PodMonitor"): v1.PodMonitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): v1.PrometheusRule,
    ("monitoring.coreos.com/v1", "ThanosRuler"): v1.ThanosRuler,
    ("monitoring.coreos.com/v1alpha1", "AlertmanagerConfig"): v1alpha1.AlertmanagerConfig,
}


def _dropped(given: Any, kept: Any, path: str = "") -> list[str]:
    """Paths present in `given` that validation did not keep (fields the schema does not know)."""
    if isinstance(given, dict) and isinstance(kept, dict):
        out = []
        for key, value in given.items():
            if key not in kept:
                out.append(f"{path}.{key}")
            else:
                out += _dropped(value, kept[key], f"{path}.{key}")
        return out
    if isinstance(given, list) and isinstance(kept, list):
        return [
            p
            for i, (g, k) in enumerate(zip(given, kept, strict=False))
            for p in _dropped(g, k, f"{path}[{i}]")
        ]
    return []


def violations(obj: JSON) -> list[str]:
    """Every schema violation of one object, as `kind/name: message` lines."""
    where = f"{obj['kind']}/{obj['metadata']['name']}"
    model = CRD_MODELS.get((obj["apiVersion"], obj["kind"]))
    if model is not None:
        try:
            parsed = model.model_validate(copy.deepcopy(obj))
        except ValidationError as err:
            return [f"{where}: {e['loc']}: {e['msg']}" for e in err.errors()]
        kept = json.loads(parsed.model_dump_json(by_alias=True, exclude_unset=True))
        return [f"{where}: unknown field {p}" for p in _dropped(obj, kept)]
    out = []
    since = SERVED_SINCE.get(obj["apiVersion"])
    for k8s in (since or K8S_VERSIONS[0], *K8S_VERSIONS[1:]):
        try:
            kubernetes_validate.validate(copy.deepcopy(obj), k8s, strict=True)
        except kubernetes_validate.ValidationError as err:
            out.append(f"{where} (Kubernetes {k8s}): {err.message} at {'/'.join(map(str, err.path))}")
    return out


def test_every_object_of_every_ci_values_set_is_valid(installs: dict[str, Installed]) -> None:
    found = {name: [v for o in inst.objects for v in violations(o)] for name, inst in installs.items()}
    kinds = {o["kind"] for inst in installs.values() for o in inst.objects}
    # every kind the chart can create was checked by one of the two validators
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule", "AlertmanagerConfig", "DaemonSet"} <= kinds
    assert found == {name: [] for name in installs}, f"prometheus-operator models {OPERATOR_VERSION}"


def test_the_validators_report_what_is_wrong(installs: dict[str, Installed]) -> None:
    # not vacuous: one mistake of each kind is found
    inst = installs["full-values.yaml"]
    wrong_type = copy.deepcopy(inst.one("DaemonSet"))
    wrong_type["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 7
    typo = copy.deepcopy(inst.one("DaemonSet"))
    typo["spec"]["template"]["spec"]["hostNetwrk"] = True
    exporter_sm = next(
        o for o in inst.of_kind("ServiceMonitor") if o["metadata"]["name"].endswith("-exporter")
    )
    bad_interval, sm_typo = copy.deepcopy(exporter_sm), copy.deepcopy(exporter_sm)
    bad_interval["spec"]["endpoints"][0]["interval"] = "15 seconds"
    sm_typo["spec"]["endpoints"][0]["honorlabels"] = True
    rule = copy.deepcopy(inst.one("PrometheusRule"))
    rule["spec"]["groups"][0]["rules"][0]["for"] = "ten minutes"
    amc = copy.deepcopy(inst.of_kind("AlertmanagerConfig")[0])
    amc["spec"]["route"]["matchers"][0]["matchType"] = "=="
    assert len(violations(wrong_type)) == len(violations(typo)) == len(K8S_VERSIONS)
    assert "hostNetwrk" in violations(typo)[0]
    (interval,) = violations(bad_interval)
    assert "interval" in interval and "pattern" in interval
    assert violations(sm_typo) == [
        f"ServiceMonitor/{exporter_sm['metadata']['name']}: unknown field .spec.endpoints[0].honorlabels"
    ]
    assert violations(rule) and violations(amc)
    flowschema = copy.deepcopy(installs["cluster-values.yaml"].one("FlowSchema"))
    flowschema["spec"]["rules"][0]["resourceRules"][0]["namespace"] = ["gpupulse"]
    assert len(violations(flowschema)) == len(K8S_VERSIONS)


# --- the values schema agrees with the CRDs where values flow into them


def _values_schema() -> JSON:
    schema: JSON = json.loads((CHART / "values.schema.json").read_text())
    return schema


def _at(schema: JSON, path: str) -> JSON:
    node = schema
    for part in path.split("."):
        node = node["properties"][part]
    return node


def _crd_pattern(model: type[BaseModel], field: str) -> str:
    (meta,) = [m for m in model.model_fields[field].metadata if getattr(m, "pattern", None)]
    return str(meta.pattern)


@pytest.mark.parametrize(
    ("values_path", "model", "field"),
    [
        ("exporter.serviceMonitor.interval", "Endpoint", "interval"),
        ("exporter.serviceMonitor.scrapeTimeout", "Endpoint", "scrape_timeout"),
        ("exporter.podMonitor.interval", "PodMetricsEndpoint", "interval"),
        ("exporter.podMonitor.scrapeTimeout", "PodMetricsEndpoint", "scrape_timeout"),
        ("controller.serviceMonitor.interval", "Endpoint", "interval"),
        ("controller.serviceMonitor.scrapeTimeout", "Endpoint", "scrape_timeout"),
        ("prometheusRule.windows.memory_history_interval", "Group", "interval"),
    ],
)
def test_values_durations_use_the_crd_duration_pattern(values_path: str, model: str, field: str) -> None:
    # the one grammar (gpupulse.durations), which is the CRD's except that it refuses ""
    assert _at(_values_schema(), values_path)["pattern"] == DURATION_PATTERN
    _assert_same_language_but_empty(DURATION_PATTERN, _crd_pattern(getattr(v1, model), field))


def test_every_for_value_uses_the_crd_pattern_of_a_rules_for() -> None:
    durations = _at(_values_schema(), "prometheusRule.for")["properties"]
    assert durations and {d["pattern"] for d in durations.values()} == {DURATION_PATTERN}
    _assert_same_language_but_empty(DURATION_PATTERN, _crd_pattern(v1.Rule, "for_"))


def _assert_same_language_but_empty(ours: str, crd: str) -> None:
    """Every string of durations-like characters up to 4 long (and longer samples) means the same to both."""
    samples = ["".join(p) for n in range(5) for p in itertools.product("01ywdhms.", repeat=n)]
    samples += ["1y2w3d4h5m6s7ms", "1h30m", "30m1h", "1m1m", "1.5h", " 1s", "-1s", "0"]
    differ = [t for t in samples if bool(re.fullmatch(ours, t)) != bool(re.fullmatch(crd, t))]
    assert differ == [""]


def test_values_enums_are_within_the_crd_enums() -> None:
    schema = _values_schema()
    scheme = v1.Endpoint.model_fields["scheme"].annotation
    allowed = set(scheme.__args__[0].__args__)  # Optional[Literal[...]]
    for path in ("exporter.serviceMonitor.scheme", "exporter.podMonitor.scheme"):
        assert set(_at(schema, path)["enum"]) <= allowed, path
    match_type = v1alpha1.Matcher.model_fields["match_type"].annotation
    amc_enum = set(match_type.__args__[0].__args__)
    matcher = _at(schema, "controller.alertmanagerConfig.matchers")["items"]["properties"]["matchType"]
    assert set(matcher["enum"]) <= amc_enum


def test_validators_are_versioned(tmp_path: Path) -> None:
    # the versions the proof ran against, as docs/helm.md states them
    assert OPERATOR_VERSION.startswith("0.")
    assert K8S_VERSIONS[0] == "1.25.0"
