"""What prometheus-operator generates from our objects, for the fields the chart uses.

Written from the operator's source (v0.93, pkg/prometheus/promcfg.go and pkg/alertmanager/amcfg.go)
so that a real Prometheus and a real Alertmanager can run with the configuration a
kube-prometheus-stack cluster would give them:

- `service_monitor_scrape_configs`: generateServiceMonitorConfig for an endpoint with port, path,
  scheme, interval, scrapeTimeout, honorLabels, tlsConfig, relabelings and metricRelabelings, and the
  monitor's selector.matchLabels, namespaceSelector, jobLabel, targetLabels, podTargetLabels and
  sampleLimit: role endpoints (the default), the operator's own relabelings in its order, the
  user's after them, then the sharding relabelings with the SHARD the config reloader substitutes.
- `rule_file`: a PrometheusRule's spec as the rule file the operator writes (no enforced namespace).
- `prometheus_config`: the global section (external labels prometheus and prometheus_replica, the
  latter dropped from alerts by the operator's alert relabeling) around those.
- `alertmanager_config`: AddAlertmanagerConfigs with the OnNamespace,
  OnNamespaceExceptForAlertmanagerNamespace or None matcher strategy: each AlertmanagerConfig's route
  (and its child routes, a child without a receiver inheriting its parent's) with receiver names
  `<namespace>/<name>/<receiver>`, the top route's enforced `namespace="<its namespace>"`
  matcher, `continue: true`, placed before the base configuration's routes; webhook receivers with
  their bearer token read from the Secret in the AlertmanagerConfig's own namespace.

Anything else the operator supports is refused (ValueError), so a chart change that starts using
another field fails here instead of being silently ignored.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any

JSON = dict[str, Any]
SHARD = "0"  # the config reloader's envsubst of $(SHARD) on shard 0
PROMETHEUS_POD = "prometheus-kube-prometheus-stack-prometheus-0"

_ENDPOINT_FIELDS = {
    "port", "path", "scheme", "interval", "scrapeTimeout", "honorLabels", "tlsConfig", "relabelings",
    "metricRelabelings",
}  # fmt: skip
_MONITOR_FIELDS = {
    "selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels", "podTargetLabels",
    "sampleLimit",
}  # fmt: skip
_RELABEL_KEYS = {"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement", "action"}


SERVICE_LABEL = "__meta_kubernetes_service_label_"
POD_LABEL = "__meta_kubernetes_pod_label_"


def _rl(sources: Sequence[str] | None, target: str | None = None, **extra: Any) -> JSON:
    """One relabel_configs entry."""
    out: JSON = {}
    if sources:
        out["source_labels"] = list(sources)
    if target:
        out["target_label"] = target
    out.update(extra)
    return out


def _sanitize(name: str) -> str:
    """sanitizeLabelName: every character outside [a-zA-Z0-9_] becomes `_`."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _refuse_unknown(obj: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = set(obj) - known
    if unknown:
        raise ValueError(f"{where}: fields this port of the operator does not model: {sorted(unknown)}")


def relabel_configs(configs: Sequence[Mapping[str, Any]]) -> list[JSON]:
    """generateRelabelConfig: the CRD's camelCase relabelings as Prometheus' relabel_configs."""
    out = []
    for c in configs:
        _refuse_unknown(c, _RELABEL_KEYS, "relabeling")
        r: JSON = {}
        if c.get("sourceLabels"):
            r["source_labels"] = list(c["sourceLabels"])
        if "separator" in c:
            r["separator"] = c["separator"]
        if c.get("targetLabel"):
            r["target_label"] = c["targetLabel"]
        if c.get("regex"):
            r["regex"] = c["regex"]
        if c.get("modulus"):
            r["modulus"] = c["modulus"]
        if "replacement" in c:
            r["replacement"] = c["replacement"]
        if c.get("action"):
            r["action"] = str(c["action"]).lower()
        out.append(r)
    return out


def _tls(tls: Mapping[str, Any]) -> JSON:
    if set(tls) - {"insecureSkipVerify", "serverName"}:
        raise ValueError(f"tlsConfig fields this port does not model: {sorted(tls)}")
    out: JSON = {}
    if "insecureSkipVerify" in tls:
        out["insecure_skip_verify"] = tls["insecureSkipVerify"]
    if "serverName" in tls:
        out["server_name"] = tls["serverName"]
    return out


def service_monitor_scrape_configs(
    monitor: Mapping[str, Any], api_server: str | None = None, api_token: str = "", shards: int = 1
) -> list[JSON]:
    """The scrape jobs of one ServiceMonitor (one per endpoint); with the Prometheus object's
    apiserverConfig (host and bearer token) in kubernetes_sd_configs when given, in-cluster otherwise."""
    meta, spec = monitor["metadata"], monitor["spec"]
    _refuse_unknown(spec, _MONITOR_FIELDS, "ServiceMonitor spec")
    if set(spec["selector"]) - {"matchLabels"}:
        raise ValueError("only selector.matchLabels is modelled")
    namespaces = spec.get("namespaceSelector", {}).get("matchNames") or [meta["namespace"]]
    jobs = []
    for i, ep in enumerate(spec["endpoints"]):
        _refuse_unknown(ep, _ENDPOINT_FIELDS, "ServiceMonitor endpoint")
        cfg: JSON = {
            "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/{i}",
            "honor_labels": bool(ep.get("honorLabels", False)),
            "kubernetes_sd_configs": [{"role": "endpoints", "namespaces": {"names": list(namespaces)}}],
        }
        if api_server is not None:
            sd = cfg["kubernetes_sd_configs"][0]
            sd["api_server"] = api_server
            sd["authorization"] = {"type": "Bearer", "credentials": api_token}
        if ep.get("interval"):
            cfg["scrape_interval"] = ep["interval"]
        if ep.get("scrapeTimeout"):
            cfg["scrape_timeout"] = ep["scrapeTimeout"]
        if ep.get("path"):
            cfg["metrics_path"] = ep["path"]
        if ep.get("scheme"):
            cfg["scheme"] = ep["scheme"]
        if ep.get("tlsConfig"):
            cfg["tls_config"] = _tls(ep["tlsConfig"])
        relabel: list[JSON] = [_rl(["job"], "__tmp_prometheus_job_name")]
        labels = spec["selector"].get("matchLabels") or {}
        for key in sorted(labels):
            present = [
                f"{SERVICE_LABEL}{_sanitize(key)}",
                f"__meta_kubernetes_service_labelpresent_{_sanitize(key)}",
            ]
            relabel.append(_rl(present, action="keep", regex=f"({labels[key]});true"))
        if ep.get("port"):
            relabel.append(_rl(["__meta_kubernetes_endpoint_port_name"], action="keep", regex=ep["port"]))
        kind_name = [
            "__meta_kubernetes_endpoint_address_target_kind",
            "__meta_kubernetes_endpoint_address_target_name",
        ]
        relabel += [
            _rl(kind_name, "node", separator=";", regex="Node;(.*)", replacement="${1}"),
            _rl(kind_name, "pod", separator=";", regex="Pod;(.*)", replacement="${1}"),
            _rl(["__meta_kubernetes_namespace"], "namespace"),
            _rl(["__meta_kubernetes_service_name"], "service"),
            _rl(["__meta_kubernetes_pod_name"], "pod"),
            _rl(["__meta_kubernetes_pod_container_name"], "container"),
            _rl(["__meta_kubernetes_pod_phase"], action="drop", regex="(Failed|Succeeded)"),  # filterRunning
        ]
        for label in spec.get("targetLabels") or []:
            relabel.append(
                _rl([SERVICE_LABEL + _sanitize(label)], _sanitize(label), regex="(.+)", replacement="${1}")
            )
        for label in spec.get("podTargetLabels") or []:
            relabel.append(
                _rl([POD_LABEL + _sanitize(label)], _sanitize(label), regex="(.+)", replacement="${1}")
            )
        relabel.append(_rl(["__meta_kubernetes_service_name"], "job", replacement="${1}"))
        if spec.get("jobLabel"):
            job_label = SERVICE_LABEL + _sanitize(spec["jobLabel"])
            relabel.append(_rl([job_label], "job", regex="(.+)", replacement="${1}"))
        if ep.get("port"):
            relabel.append(_rl(None, "endpoint", replacement=ep["port"]))
        relabel += relabel_configs(ep.get("relabelings") or [])
        relabel += [  # sharding, with the $(SHARD) the config reloader substitutes
            _rl(
                ["__address__", "__tmp_hash"], "__tmp_hash", regex="(.+);", replacement="$1", action="replace"
            ),
            _rl(["__tmp_hash"], "__tmp_hash", modulus=shards, action="hashmod"),
            _rl(["__tmp_hash", "__tmp_disable_sharding"], regex=f"{SHARD};|.+;.+", action="keep"),
        ]
        cfg["relabel_configs"] = relabel
        if spec.get("sampleLimit"):
            cfg["sample_limit"] = spec["sampleLimit"]
        if ep.get("metricRelabelings"):
            cfg["metric_relabel_configs"] = relabel_configs(ep["metricRelabelings"])
        jobs.append(cfg)
    return jobs


def rule_file(rule: Mapping[str, Any]) -> JSON:
    """The rule file the operator writes for one PrometheusRule (its spec, unchanged)."""
    return {"groups": copy.deepcopy(rule["spec"]["groups"])}


def prometheus_config(
    scrape_configs: Sequence[JSON],
    rule_files: Sequence[str],
    alertmanager: str,
    prometheus: str = "monitoring/kube-prometheus-stack-prometheus",
    scrape_interval: str = "30s",
    evaluation_interval: str = "30s",
) -> JSON:
    """prometheus.yml around the jobs; Alertmanager as a static target (its discovery is not ours)."""
    return {
        "global": {
            "evaluation_interval": evaluation_interval,
            "scrape_interval": scrape_interval,
            "external_labels": {"prometheus": prometheus, "prometheus_replica": PROMETHEUS_POD},
        },
        "rule_files": list(rule_files),
        "scrape_configs": list(scrape_configs),
        "alerting": {
            "alert_relabel_configs": [{"action": "labeldrop", "regex": "prometheus_replica"}],
            "alertmanagers": [
                {"api_version": "v2", "path_prefix": "/", "static_configs": [{"targets": [alertmanager]}]}
            ],
        },
    }


# --- Alertmanager

_MATCH_TYPES = {"=", "!=", "=~", "!~"}


def _matcher(m: Mapping[str, Any]) -> str:
    """monitoringv1alpha1.Matcher.String(): name, match type, quoted value (OpenMetrics escapes)."""
    if m.get("matchType") not in _MATCH_TYPES:
        raise ValueError(f"matcher without a match type (the deprecated form is not modelled): {m}")
    value = str(m.get("value", "")).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return f'{m["name"]}{m["matchType"]}"{value}"'


def _route(route: Mapping[str, Any], key: tuple[str, str]) -> JSON:
    _refuse_unknown(route, {"receiver", "groupBy", "groupWait", "groupInterval", "repeatInterval", "matchers",
                            "continue", "routes"}, "route")  # fmt: skip
    # convertRoute: a child route without a receiver inherits its parent's
    out: JSON = {"receiver": "/".join((*key, route["receiver"]))} if route.get("receiver") else {}
    if route.get("groupBy"):
        out["group_by"] = list(route["groupBy"])
    if route.get("matchers"):
        out["matchers"] = [_matcher(m) for m in route["matchers"]]
    if route.get("continue"):
        out["continue"] = True
    for src, dst in (
        ("groupWait", "group_wait"),
        ("groupInterval", "group_interval"),
        ("repeatInterval", "repeat_interval"),
    ):
        if route.get(src):
            out[dst] = route[src]
    if route.get("routes"):
        # child routes keep their own matchers; only the top route gets the namespace enforced
        out["routes"] = [_route(child, key) for child in route["routes"]]
    return out


def _secret_value(secrets: Mapping[tuple[str, str], JSON], namespace: str, ref: Mapping[str, str]) -> str:
    import base64

    secret = secrets.get((namespace, ref["name"]))
    if secret is None or ref["key"] not in secret.get("data", {}):
        raise ValueError(
            f"Secret {namespace}/{ref['name']} key {ref['key']} not found (the operator rejects it)"
        )
    return base64.b64decode(secret["data"][ref["key"]]).decode()


def _receiver(
    receiver: Mapping[str, Any], key: tuple[str, str], secrets: Mapping[tuple[str, str], JSON]
) -> JSON:
    _refuse_unknown(receiver, {"name", "webhookConfigs"}, "receiver")
    hooks = []
    for hook in receiver.get("webhookConfigs") or []:
        _refuse_unknown(hook, {"url", "sendResolved", "httpConfig", "maxAlerts"}, "webhookConfig")
        out: JSON = {"url": hook["url"]}
        if "sendResolved" in hook:
            out["send_resolved"] = hook["sendResolved"]
        auth = (hook.get("httpConfig") or {}).get("authorization")
        if auth is not None:
            credentials = _secret_value(secrets, key[0], auth["credentials"])
            if credentials:
                out["http_config"] = {
                    "authorization": {"type": auth.get("type") or "Bearer", "credentials": credentials}
                }
        if hook.get("maxAlerts"):
            out["max_alerts"] = hook["maxAlerts"]
        hooks.append(out)
    return {"name": "/".join((*key, receiver["name"])), "webhook_configs": hooks}


def alertmanager_config(
    base: Mapping[str, Any],
    configs: Sequence[Mapping[str, Any]],
    secrets: Mapping[tuple[str, str], JSON],
    strategy: str = "OnNamespace",
    alertmanager_namespace: str = "monitoring",
) -> JSON:
    """The Alertmanager configuration the operator builds from the base config and AlertmanagerConfigs."""
    out = copy.deepcopy(dict(base))
    routes, receivers = [], []
    for amc in sorted(configs, key=lambda c: (c["metadata"]["namespace"], c["metadata"]["name"])):
        key = (amc["metadata"]["namespace"], amc["metadata"]["name"])
        _refuse_unknown(amc["spec"], {"route", "receivers"}, "AlertmanagerConfig spec")
        route = _route(amc["spec"]["route"], key)
        enforce = strategy == "OnNamespace" or (
            strategy == "OnNamespaceExceptForAlertmanagerNamespace" and key[0] != alertmanager_namespace
        )
        if enforce:  # namespaceEnforcer.processRoute (matchers v2, Alertmanager >= 0.22)
            route.setdefault("matchers", []).append(f'namespace="{key[0]}"')
        route["continue"] = True  # continueToNextRoute, whatever the strategy
        routes.append(route)
        receivers += [_receiver(r, key, secrets) for r in amc["spec"].get("receivers") or []]
    out["route"]["routes"] = routes + list(out["route"].get("routes") or [])
    out["receivers"] = list(out.get("receivers") or []) + receivers
    return out
