"""The chart as a kube-prometheus-stack cluster runs it: monitors that keep the workloads' labels and
carry the selector labels, a scraped controller, AlertmanagerConfigs that match under the operator's
matcher strategies, and rules whose tunables reach the same places the generator puts them.

Every object here is what the real Helm library installed into the fake API server.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts.config import load_config
from alerts.generate import render_rule_templates, render_rules
from alerts.tunables import substitute
from tests.helm.installs import CHART, JSON, ROOT, Installed, install_values, watches_pods

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

NODE_KINDS = {"node", "gpu", "exporter"}


def _service(inst: Installed, component: str) -> JSON:
    (service,) = [
        s
        for s in inst.of_kind("Service")
        if s["metadata"]["labels"]["app.kubernetes.io/component"] == component
        and s["spec"].get("clusterIP") != "None"  # cluster mode's per-replica names: not scraped, not routed
    ]
    return service


def _walk(node: Any, fn: Callable[[str], str]) -> Any:
    if isinstance(node, dict):
        return {k: _walk(v, fn) for k, v in node.items()}
    if isinstance(node, list):
        return [_walk(v, fn) for v in node]
    return fn(node) if isinstance(node, str) else node


# --- the README's one command


def _readme_values() -> JSON:
    """The --set flags of the README's `helm install` command as a values mapping."""
    text = (CHART / "README.md").read_text()
    (command,) = re.findall(r"```console\n(helm install .*?)\n```", text, flags=re.DOTALL)
    words = shlex.split(command.replace("\\\n", " "))
    values: JSON = {}
    for i, word in enumerate(words):
        if word != "--set":
            continue
        key, value = words[i + 1].split("=", 1)
        parsed: Any = value
        if value.startswith("{") and value.endswith("}"):
            parsed = [v for v in value[1:-1].split(",") if v]
        elif value in ("true", "false"):
            parsed = value == "true"
        node = values
        *path, leaf = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = parsed
    return values


def test_readme_install_command_is_the_kube_prometheus_stack_ci_values() -> None:
    ci = yaml.safe_load((CHART / "ci" / "kube-prometheus-stack-values.yaml").read_text())
    assert _readme_values() == ci


# --- the exporter's monitor


def _exporter_monitor(inst: Installed) -> tuple[JSON, JSON, JSON] | None:
    """(monitor, its endpoint, its values) or None when neither monitor is enabled."""
    exporter = inst.values["exporter"]
    if exporter["serviceMonitor"]["enabled"]:
        (sm,) = [m for m in inst.of_kind("ServiceMonitor") if m["metadata"]["name"].endswith("-exporter")]
        (endpoint,) = sm["spec"]["endpoints"]
        return sm, endpoint, exporter["serviceMonitor"]
    if exporter["podMonitor"]["enabled"]:
        pm = inst.one("PodMonitor")
        (endpoint,) = pm["spec"]["podMetricsEndpoints"]
        return pm, endpoint, exporter["podMonitor"]
    assert [m for m in inst.of_kind("ServiceMonitor") if m["metadata"]["name"].endswith("-exporter")] == []
    assert inst.of_kind("PodMonitor") == []
    return None


def test_exporter_monitor_keeps_the_workloads_labels_and_passes_every_field_through(inst: Installed) -> None:
    found = _exporter_monitor(inst)
    if found is None:
        pytest.skip("no exporter monitor in this values file")
    monitor, endpoint, values = found
    # without honor_labels the operator's target labels rename ours to exported_namespace/_pod
    assert endpoint["honorLabels"] is values["honorLabels"] is True
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    for key in ("interval", "scrapeTimeout", "scheme"):
        assert endpoint[key] == values[key], key
    assert endpoint.get("tlsConfig", {}) == values["tlsConfig"]
    assert endpoint.get("metricRelabelings", []) == values["metricRelabelings"]
    node_relabel = {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
    assert endpoint["relabelings"] == [node_relabel, *values["relabelings"]]
    spec = monitor["spec"]
    assert spec.get("sampleLimit", 0) == values["sampleLimit"]
    assert spec.get("podTargetLabels", []) == values["podTargetLabels"]
    if monitor["kind"] == "ServiceMonitor":
        assert spec.get("targetLabels", []) == values["targetLabels"]
        selected = _service(inst, "exporter")["metadata"]["labels"]
    else:
        selected = inst.one("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= selected.items()
    assert spec["namespaceSelector"] == {"matchNames": [inst.result["namespace"]]}
    # the job label comes from a label of the Service (pod) whose value is exporter.jobName
    assert spec["jobLabel"] == (values["jobLabel"] or "jobLabel")
    assert selected[spec["jobLabel"]] == inst.values["exporter"]["jobName"]
    labels = monitor["metadata"]["labels"]
    assert {**inst.values["monitoringLabels"], **values["additionalLabels"]}.items() <= labels.items()


def test_both_monitors_at_once_are_refused(tmp_path: Path) -> None:
    import helm_sdkpy

    values = {"exporter": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}}
    with pytest.raises(helm_sdkpy.InstallError, match="enable one of them"):
        install_values(tmp_path, "both", values)


def test_the_controller_is_scraped_on_its_public_metrics_path_under_its_own_job(inst: Installed) -> None:
    from remediation.auth import PUBLIC_PATHS

    controller = inst.values["controller"]
    monitors = [m for m in inst.of_kind("ServiceMonitor") if m["metadata"]["name"].endswith("-controller")]
    if not (controller["enabled"] and controller["serviceMonitor"]["enabled"]):
        assert monitors == []
        return
    (sm,) = monitors
    (endpoint,) = sm["spec"]["endpoints"]
    service = _service(inst, "controller")
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics" and "/metrics" in PUBLIC_PATHS  # no token needed
    job = service["metadata"]["labels"][sm["spec"]["jobLabel"]]
    assert job == controller["jobName"]
    # the exporter-health alerts must not count the controller as an exporter
    assert f'job="{job}"' != _exporter_selector(inst.values)
    assert inst.values["monitoringLabels"].items() <= sm["metadata"]["labels"].items()


def test_monitors_and_rules_carry_the_kube_prometheus_stack_release_label(
    installs: dict[str, Installed],
) -> None:
    inst = installs["kube-prometheus-stack-values.yaml"]
    selected = inst.of_kind("ServiceMonitor") + inst.of_kind("PrometheusRule")
    assert len(selected) == 3
    for obj in selected:
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack", obj["metadata"]["name"]


# --- AlertmanagerConfigs under the operator's matcher strategies


def _expected_amc_namespaces(inst: Installed) -> list[str]:
    amc = inst.values["controller"]["alertmanagerConfig"]
    own = inst.result["namespace"]
    if amc["matcherStrategy"] == "OnNamespaceExceptForAlertmanagerNamespace":
        return [amc["alertmanagerNamespace"]]
    if amc["matcherStrategy"] == "None":
        return [own]
    out = [own]
    for ns in amc["namespaces"] or inst.values["controller"]["scope"]["namespaces"]:
        if ns not in out and ns != "*":  # "*" (every namespace) is no namespace to live in
            out.append(ns)
    return out


def test_alertmanager_configs_follow_the_matcher_strategy_and_reach_the_controller(inst: Installed) -> None:
    configs = inst.of_kind("AlertmanagerConfig")
    amc_values = inst.values["controller"]["alertmanagerConfig"]
    if not (inst.values["controller"]["enabled"] and amc_values["enabled"]):
        assert configs == []
        return
    assert sorted(c["metadata"]["namespace"] for c in configs) == sorted(_expected_amc_namespaces(inst))
    service = _service(inst, "controller")
    (port,) = service["spec"]["ports"]
    own = inst.result["namespace"]
    url = f"http://{service['metadata']['name']}.{own}.svc:{port['port']}/api/v1/alerts"
    volumes = {v["name"]: v for v in _controller_workload(inst)["spec"]["template"]["spec"]["volumes"]}
    mounted = volumes["token"]["secret"]["secretName"]
    main = inst.named("Secret", mounted)
    for amc in configs:
        route = amc["spec"]["route"]
        (receiver,) = amc["spec"]["receivers"]
        assert route["receiver"] == receiver["name"]
        assert route["matchers"] == amc_values["matchers"]
        assert route["groupBy"] == amc_values["groupBy"]
        (hook,) = receiver["webhookConfigs"]
        assert hook["url"] == url and hook["sendResolved"] is True
        credentials = hook["httpConfig"]["authorization"]["credentials"]
        assert credentials["name"] == mounted
        if inst.values["controller"]["auth"]["existingSecret"]:
            continue  # the user provides it in each namespace (NOTES says so)
        # an AlertmanagerConfig reads Secrets of its own namespace: a copy with the same token is there
        copy = inst.named("Secret", credentials["name"], amc["metadata"]["namespace"])
        assert copy is not None and main is not None
        assert base64.b64decode(copy["data"][credentials["key"]]) == base64.b64decode(main["data"]["token"])


def test_except_for_alertmanager_namespace_without_that_namespace_is_refused(tmp_path: Path) -> None:
    import helm_sdkpy

    values = {
        "controller": {
            "alertmanagerConfig": {
                "enabled": True,
                "matcherStrategy": "OnNamespaceExceptForAlertmanagerNamespace",
            }
        }
    }
    with pytest.raises(
        helm_sdkpy.InstallError, match=r"needs controller\.alertmanagerConfig\.alertmanagerNamespace"
    ):
        install_values(tmp_path, "amc", values)


# --- rules: the tunables of values.yaml land where the generator puts them


def _exporter_selector(values: JSON) -> str:
    return str(values["prometheusRule"]["exporterSelector"] or f'job="{values["exporter"]["jobName"]}"')


def _expected_rule_groups(values: JSON, namespace: str) -> list[JSON]:
    """What templates/prometheusrule.yaml must produce, computed from the generator's templates."""
    pr = values["prometheusRule"]
    base = (
        pr["runbookUrl"] or "https://github.com/gpupulse/gpupulse/blob/main/docs/runbooks/"
    )
    tokens = {
        "thresholds": pr["thresholds"],
        "windows": pr["windows"],
        "for": pr["for"],
        "cost": pr["cost"],
        "selectors": {"exporter": _exporter_selector(values)},
        "runbook": {"url_base": base},
    }
    groups = []
    for _, text in sorted(render_rule_templates().items()):
        for group in yaml.safe_load(text)["groups"]:
            group = _walk(group, lambda s: substitute(s, tokens))
            group.pop("scope")  # where the group runs under prometheusRule.sharding, not a Prometheus field
            rules = []
            for rule in group["rules"]:
                rule.pop("scope")
                if "alert" in rule:
                    if pr["disabled"].get(rule["alert"]):
                        continue
                    if pr["namespaceNodeAlerts"] and rule["labels"]["target_kind"] in NODE_KINDS:
                        rule["labels"]["namespace"] = namespace
                    rule["labels"] = {**pr["additionalRuleLabels"], **rule["labels"]}
                    rule["annotations"] = {**pr["additionalRuleAnnotations"], **rule["annotations"]}
                rules.append(rule)
            if rules:
                groups.append({**group, "rules": rules})
    return groups


def _rejoined(parts: list[JSON], expected: list[JSON]) -> list[JSON]:
    """Groups split across PrometheusRules put back together: each expected group's rules from every
    part of its name, in the group's order; parts of no expected group are kept, to fail the match."""
    out = []
    for group in expected:
        mine = [g for g in parts if g["name"] == group["name"]]
        if not mine:
            continue
        joined = [r for g in mine for r in g["rules"]]
        order = {json.dumps(r, sort_keys=True): i for i, r in enumerate(group["rules"])}
        joined.sort(key=lambda r: order.get(json.dumps(r, sort_keys=True), len(order)))
        out.append({**mine[0], "rules": joined})
    names = {g["name"] for g in expected}
    return out + [g for g in parts if g["name"] not in names]


def test_prometheus_rule_is_the_generator_with_this_releases_settings(inst: Installed) -> None:
    rules = inst.of_kind("PrometheusRule")
    if not inst.values["prometheusRule"]["enabled"]:
        assert rules == []
        return
    expected = _expected_rule_groups(inst.values, inst.result["namespace"])
    if inst.values["prometheusRule"]["sharding"]["enabled"]:
        # the node and fleet halves (tests/helm/test_rule_sharding.py checks the split): together, these
        groups = _rejoined([g for r in rules for g in r["spec"]["groups"]], expected)
    else:
        (rule,) = rules
        groups = rule["spec"]["groups"]
    assert groups == expected
    alerts = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    for name in inst.values["prometheusRule"]["disabled"]:
        assert name not in alerts
    # the main branch's runbooks unless the values say otherwise
    base = inst.values["prometheusRule"]["runbookUrl"] or "/blob/main/docs/runbooks/"
    assert all(base in a["annotations"]["runbook_url"] for a in alerts.values())


def _neutral(values: JSON) -> JSON:
    """Chart settings under which the PrometheusRule must equal alerts/*.rules.yaml."""
    config = load_config()
    rule = {
        "enabled": True,
        "runbookUrl": config.runbook_url_base,
        "exporterSelector": config.exporter_selector,
        "namespaceNodeAlerts": False,
    }
    return {"prometheusRule": {**rule, **values}}


def _installed_groups(tmp_path: Path, values: JSON) -> list[JSON]:
    inst = install_values(tmp_path, "rules", values)
    groups: list[JSON] = inst.one("PrometheusRule")["spec"]["groups"]
    return groups


def _generated_groups(rendered: dict[str, str]) -> list[JSON]:
    return [g for _, text in sorted(rendered.items()) for g in yaml.safe_load(text)["groups"]]


def test_chart_rules_with_neutral_settings_are_exactly_alerts(tmp_path: Path) -> None:
    want = [
        g
        for p in sorted((ROOT / "alerts").glob("*.rules.yaml"))
        for g in yaml.safe_load(p.read_text())["groups"]
    ]
    assert _installed_groups(tmp_path, _neutral({})) == want


def test_install_time_tunables_reach_the_rules_as_the_generator_puts_them(tmp_path: Path) -> None:
    # the incident-replay profile (every window, every `for:`) plus thresholds and the price
    fast = yaml.safe_load((ROOT / "tests" / "alerts" / "fast-overrides.yaml").read_text())
    overrides = {
        "windows": fast["windows"],
        "for": fast["for"],
        "thresholds": {**fast["thresholds"], "temperature_celsius": 91.5, "gang_size_gpus": 4},
        "cost": {"price_per_gpu_hour": 1.75, "currency": "EUR"},
    }
    installed = _installed_groups(tmp_path, _neutral(overrides))
    assert installed == _generated_groups(render_rules(overrides=overrides))
    # and they did change something: the shipped rules differ from these
    assert installed != _generated_groups(render_rules())


def test_a_tunable_set_to_null_fails_the_install_before_anything_is_created(tmp_path: Path) -> None:
    import helm_sdkpy

    with pytest.raises(helm_sdkpy.InstallError, match="temperature_celsius"):
        install_values(
            tmp_path,
            "null",
            {"prometheusRule": {"enabled": True, "thresholds": {"temperature_celsius": None}}},
        )


# --- the other values users expect


def test_controller_pdb_selects_the_controller_pods(inst: Installed) -> None:
    pdbs = inst.of_kind("PodDisruptionBudget")
    values = inst.values["controller"]
    if not (values["enabled"] and values["podDisruptionBudget"]["enabled"]):
        assert pdbs == []
        return
    (pdb,) = pdbs
    pods = _controller_workload(inst)["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pods.items()
    budget = values["podDisruptionBudget"]
    if budget["minAvailable"] is not None:
        assert pdb["spec"] == {**pdb["spec"], "minAvailable": budget["minAvailable"]}
        assert "maxUnavailable" not in pdb["spec"]
    else:
        assert pdb["spec"]["maxUnavailable"] == budget["maxUnavailable"]


def _controller_workload(inst: Installed) -> JSON:
    """The controller's Deployment, or its StatefulSet in cluster mode."""
    return inst.one("StatefulSet" if inst.values["controller"]["cluster"]["enabled"] else "Deployment")


def test_images_use_the_global_registry_and_every_pull_secret(inst: Installed) -> None:
    registry = inst.values["global"]["imageRegistry"] or inst.values["image"]["registry"]
    want_secrets = inst.values["global"]["imagePullSecrets"] + inst.values["imagePullSecrets"]
    for workload in inst.of_kind("DaemonSet") + inst.of_kind("Deployment") + inst.of_kind("StatefulSet"):
        spec = workload["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        assert container["image"] == f"{registry}/{inst.values['image']['repository']}:0.1.0"
        assert spec.get("imagePullSecrets", []) == want_secrets


def test_probes_resources_volumes_and_annotations_come_from_values(inst: Installed) -> None:
    for kind, key in (("DaemonSet", "exporter"), ("Deployment", "controller")):
        values = inst.values[key]
        if not values["enabled"]:
            continue
        workload = _controller_workload(inst) if key == "controller" else inst.one(kind)
        pod = workload["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        assert container["livenessProbe"] == values["livenessProbe"]
        assert container["readinessProbe"] == values["readinessProbe"]
        assert container["resources"] == values["resources"]
        assert container["resources"]["requests"], "requests are set by default"
        mounts = container["volumeMounts"]
        assert mounts[len(mounts) - len(values["extraVolumeMounts"]) :] == values["extraVolumeMounts"]
        volumes = pod["spec"]["volumes"]
        assert volumes[len(volumes) - len(values["extraVolumes"]) :] == values["extraVolumes"]
        annotations = {
            k: v
            for k, v in (workload["metadata"].get("annotations") or {}).items()
            if not k.startswith("meta.helm.sh/")
        }
        assert annotations == values["annotations"]
        assert values["podLabels"].items() <= pod["metadata"]["labels"].items()


def test_host_network_keeps_cluster_dns(inst: Installed) -> None:
    exporter = inst.values["exporter"]
    if not exporter["enabled"]:
        pytest.skip("exporter disabled")
    spec = inst.one("DaemonSet")["spec"]["template"]["spec"]
    assert spec.get("hostNetwork", False) is exporter["hostNetwork"]
    want = exporter["dnsPolicy"] or ("ClusterFirstWithHostNet" if exporter["hostNetwork"] else None)
    assert spec.get("dnsPolicy") == want


def test_the_training_pod_watch_switch_reaches_the_exporter(inst: Installed) -> None:
    exporter = inst.values["exporter"]
    if not exporter["enabled"]:
        pytest.skip("exporter disabled")
    spec = inst.one("DaemonSet")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    off = "--no-attribution.pod-watch" in container["args"]
    assert off is not exporter["trainingRanks"]["podWatch"]
    if exporter["trainingRanks"]["podWatch"]:
        assert spec["automountServiceAccountToken"] is True  # the watch needs the token


def test_training_progress_reads_the_node_pod_logs_read_only(inst: Installed) -> None:
    exporter = inst.values["exporter"]
    if not exporter["enabled"]:
        pytest.skip("exporter disabled")
    spec = inst.one("DaemonSet")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    if not exporter["trainingProgress"]["enabled"]:
        assert "--no-collector.progress" in container["args"]
        assert "pod-logs" not in mounts and "pod-logs" not in volumes
        return
    assert "--progress.pod-logs-dir=/var/log/pods" in container["args"]
    assert mounts["pod-logs"] == {"name": "pod-logs", "mountPath": "/var/log/pods", "readOnly": True}
    assert volumes["pod-logs"]["hostPath"] == {
        "path": exporter["trainingProgress"]["podLogsHostPath"],
        "type": "Directory",
    }
    assert spec["automountServiceAccountToken"] is True  # its pod watch needs the token


def test_otlp_values_become_flags_and_a_secret_header(inst: Installed) -> None:
    otlp = inst.values["exporter"]["otlp"]
    if not inst.values["exporter"]["enabled"]:
        pytest.skip("exporter disabled")
    (container,) = inst.one("DaemonSet")["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    env = {e["name"]: e for e in container["env"]}
    if not otlp["endpoint"]:
        assert not [a for a in args if a.startswith("--otlp.")]
        return
    assert f"--otlp.endpoint={otlp['endpoint']}" in args
    assert f"--otlp.interval={otlp['interval']}" in args
    # the node from the Downward API (the flag's default), the pod for k8s.pod.name
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    if otlp["resourceAttributes"]:
        pairs = dict(p.split("=", 1) for p in env["OTEL_RESOURCE_ATTRIBUTES"]["value"].split(","))
        assert pairs == {k: str(v) for k, v in otlp["resourceAttributes"].items()}
    if otlp["headersSecret"]:
        ref = env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": otlp["headersSecret"]["name"], "key": otlp["headersSecret"]["key"]}
        assert not [a for a in args if a.startswith("--otlp.headers")]  # never in an argument


def test_extra_manifests_are_rendered_with_tpl_and_installed(installs: dict[str, Installed]) -> None:
    inst = installs["full-values.yaml"]
    assert inst.named("RuntimeClass", "nvidia") is not None
    engines = inst.named("ConfigMap", "pulse-engines")
    assert engines is not None and engines["data"] == {"engines.yaml": "engines: []"}


def test_exporter_may_list_and_watch_pods_and_resource_slices_and_nothing_else(inst: Installed) -> None:
    exporter = inst.values["exporter"]
    roles = [r for r in inst.of_kind("ClusterRole") if r["metadata"]["name"].endswith("-exporter")]
    want = []
    if watches_pods(exporter):
        # exporter/kube/pods.py, the one store engines, attribution and progress read: one LIST, then
        # WATCHes, of its node's pods
        want.append({"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]})
    if exporter["dra"]["enabled"]:
        # exporter/attribution/slices.py: the same for its node's ResourceSlices, in any served version
        want.append(
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list", "watch"]}
        )
    if not (exporter["enabled"] and want):
        assert roles == []
        return
    (role,) = roles
    assert role["rules"] == want
