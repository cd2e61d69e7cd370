"""prometheus-operator on the real control plane: its CRDs, its process, the kube-prometheus-stack
objects it reconciles, and what it generates, read back from the API server and readied to run on
127.0.0.1.

The operator (built by scripts/neighbours at the pin in scripts/neighbours.pins) runs with a
ServiceAccount token of its own and the ClusterRole shipped in its module
(tests/fixtures/crds/prometheus-operator-<version>/). No StatefulSet controller runs, so the
Prometheus and Alertmanager it would start stay objects: the test runs the real binaries on the files
the operator wrote. `localize_*` are the only rewrites, each named where it is made.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from demo.neighbours import neighbour_binary, pins
from tests.kube.realapi import (
    JSON,
    KubeHTTPError,
    RealKube,
    free_port,
    service_account_token,
    wait_for,
    write_kubeconfig,
)

OPERATOR_VERSION = pins()["prometheus-operator"].version
CRD_DIR = (
    Path(__file__).resolve().parents[1] / "fixtures" / "crds" / f"prometheus-operator-{OPERATOR_VERSION}"
)
MONITORING = "monitoring"  # kube-prometheus-stack's namespace, its release name below
STACK = "kube-prometheus-stack"
PROMETHEUS = f"{STACK}-prometheus"
ALERTMANAGER = f"{STACK}-alertmanager"
OPERATOR_SA = f"{STACK}-operator"
# what the config reloader substitutes from the Prometheus pod's environment on shard 0 of replica 0
POD_NAME = f"prometheus-{PROMETHEUS}-0"
SHARD = "0"

_PLURALS = {
    "ServiceMonitor": "servicemonitors",
    "PodMonitor": "podmonitors",
    "PrometheusRule": "prometheusrules",
    "AlertmanagerConfig": "alertmanagerconfigs",
    "Prometheus": "prometheuses",
    "Alertmanager": "alertmanagers",
    "Service": "services",
    "Secret": "secrets",
    "ConfigMap": "configmaps",
    "ServiceAccount": "serviceaccounts",
    "DaemonSet": "daemonsets",
    "Deployment": "deployments",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "NetworkPolicy": "networkpolicies",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "Pod": "pods",
}
_CLUSTER_KINDS = {
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "CustomResourceDefinition": "customresourcedefinitions",
    "Namespace": "namespaces",
}


def object_path(obj: Mapping[str, Any]) -> str:
    """The REST collection an object of any kind we create lives in."""
    api_version, kind = str(obj["apiVersion"]), str(obj["kind"])
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if kind in _CLUSTER_KINDS:
        return f"{prefix}/{_CLUSTER_KINDS[kind]}"
    return f"{prefix}/namespaces/{obj['metadata']['namespace']}/{_PLURALS[kind]}"


def create(kube: RealKube, obj: Mapping[str, Any]) -> None:
    """Create `obj` as `kubectl create` would send it (no status, server-set metadata dropped); an
    object already there (409) is kept."""
    clean = {k: v for k, v in obj.items() if k != "status"}
    clean["metadata"] = {
        k: v for k, v in obj["metadata"].items() if k in ("name", "namespace", "labels", "annotations")
    }
    try:
        kube.post(object_path(clean), clean)
    except KubeHTTPError as e:
        if e.status != 409:
            raise


class _CRDLoader(yaml.CSafeLoader):
    """PyYAML reads a bare `=` (an enum value in the CRDs' schemas) as YAML 1.1's `value` type, which
    it has no constructor for; Kubernetes (YAML 1.2) reads it as the string "="."""


def _value_as_string(loader: yaml.SafeLoader, node: yaml.Node) -> str:
    assert isinstance(node, yaml.ScalarNode)
    return str(loader.construct_scalar(node))


_CRDLoader.add_constructor("tag:yaml.org,2002:value", _value_as_string)


def apply_crds(kube: RealKube) -> list[str]:
    """The operator's CRDs of its pinned version, created and Established; their names."""
    names = []
    for path in sorted(CRD_DIR.glob("monitoring.coreos.com_*.yaml")):
        for crd in yaml.load_all(path.read_text(), Loader=_CRDLoader):
            if crd:
                create(kube, crd)
                names.append(str(crd["metadata"]["name"]))

    def established() -> bool:
        for name in names:
            crd = kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conditions = (crd.get("status") or {}).get("conditions") or []
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                return False
        return True

    wait_for(established, 60, "the monitoring.coreos.com CRDs to be established")
    return names


def _operator_rbac(kube: RealKube) -> None:
    role = yaml.safe_load((CRD_DIR / "prometheus-operator-cluster-role.yaml").read_text())
    role["metadata"]["name"] = OPERATOR_SA
    create(kube, role)
    create(kube, _service_account(OPERATOR_SA))
    create(kube, _cluster_binding(OPERATOR_SA, OPERATOR_SA))


@dataclass
class Operator:
    """The running operator process (stopped by PID on exit)."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    url: str

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def running_operator(kube: RealKube, server: str, ca_file: Path, workdir: Path) -> Iterator[Operator]:
    """The real operator against the API server with its own ServiceAccount's token (client-go reads
    the kubeconfig of $KUBECONFIG); ready once its /healthz answers."""
    binary = neighbour_binary("prometheus-operator", "operator")
    _operator_rbac(kube)
    token = service_account_token(kube, MONITORING, OPERATOR_SA)
    kubeconfig = write_kubeconfig(workdir / "operator.kubeconfig", server, ca_file, token, MONITORING)
    port = free_port()
    log_path = workdir / "operator.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                str(binary),
                f"--web.listen-address=127.0.0.1:{port}",
                "--log-level=debug",
                # kube-prometheus-stack's operator flags that matter here: no kubelet Service (no
                # kubelets), and the reloader image it would put into the StatefulSets (never run)
                f"--prometheus-config-reloader=quay.io/prometheus-operator/prometheus-config-reloader:{OPERATOR_VERSION}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        )
    operator = Operator(proc, log_path, f"http://127.0.0.1:{port}")

    def healthy() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the operator exited with {proc.returncode}:\n{operator.tail()}")
        try:
            with urllib.request.urlopen(f"{operator.url}/healthz", timeout=2) as r:
                return int(r.status) == 200
        except (OSError, urllib.error.URLError):
            return False

    try:
        wait_for(healthy, 60, "the operator's /healthz")
        yield operator
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _service_account(name: str) -> JSON:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": MONITORING}}


def _cluster_binding(name: str, role: str) -> JSON:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": MONITORING}],
    }


def kube_prometheus_stack(
    prometheus_version: str, alertmanager_version: str, alertmanager_base: Mapping[str, Any]
) -> list[JSON]:
    """What kube-prometheus-stack (release `kube-prometheus-stack` in `monitoring`, default values)
    creates around the operator: the Prometheus and Alertmanager objects with its selectors, the
    Alertmanager's base configuration Secret and Service, Prometheus's ServiceAccount and discovery
    ClusterRole. The scrape and evaluation interval are 1 s (30 s by default) to keep the test short."""
    release = {"release": STACK}
    prometheus = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Prometheus",
        "metadata": {"name": PROMETHEUS, "namespace": MONITORING, "labels": {"app": PROMETHEUS, **release}},
        "spec": {
            "version": prometheus_version,
            "replicas": 1,
            "shards": 1,
            "serviceAccountName": PROMETHEUS,
            "portName": "http-web",
            "externalUrl": f"http://{PROMETHEUS}.{MONITORING}:9090",
            "scrapeInterval": "1s",
            "evaluationInterval": "1s",
            "alerting": {
                "alertmanagers": [
                    {"namespace": MONITORING, "name": ALERTMANAGER, "port": "http-web", "pathPrefix": "/",
                     "apiVersion": "v2"}
                ]
            },
            # serviceMonitorSelectorNilUsesHelmValues and its siblings (true): the release label
            "serviceMonitorSelector": {"matchLabels": release},
            "serviceMonitorNamespaceSelector": {},
            "podMonitorSelector": {"matchLabels": release},
            "podMonitorNamespaceSelector": {},
            "probeSelector": {"matchLabels": release},
            "probeNamespaceSelector": {},
            "ruleSelector": {"matchLabels": release},
            "ruleNamespaceSelector": {},
        },
    }  # fmt: skip
    alertmanager = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Alertmanager",
        "metadata": {"name": ALERTMANAGER, "namespace": MONITORING,
                     "labels": {"app": ALERTMANAGER, **release}},
        "spec": {
            "version": alertmanager_version,
            "replicas": 1,
            "serviceAccountName": ALERTMANAGER,
            "portName": "http-web",
            "externalUrl": f"http://{ALERTMANAGER}.{MONITORING}:9093",
            # kube-prometheus-stack's defaults: every AlertmanagerConfig of every namespace, under the
            # operator's default matcher strategy (OnNamespace)
            "alertmanagerConfigSelector": {},
            "alertmanagerConfigNamespaceSelector": {},
        },
    }  # fmt: skip
    base_secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"alertmanager-{ALERTMANAGER}", "namespace": MONITORING, "labels": release},
        "type": "Opaque",
        "stringData": {"alertmanager.yaml": yaml.safe_dump(dict(alertmanager_base), sort_keys=False)},
    }
    am_service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": ALERTMANAGER, "namespace": MONITORING,
                     "labels": {"app": ALERTMANAGER, **release}},
        "spec": {
            "selector": {"app.kubernetes.io/name": "alertmanager", "alertmanager": ALERTMANAGER},
            "ports": [{"name": "http-web", "port": 9093, "targetPort": 9093, "protocol": "TCP"}],
        },
    }  # fmt: skip
    discovery_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": PROMETHEUS},
        "rules": [
            {"apiGroups": [""], "resources": ["nodes", "nodes/metrics", "services", "endpoints", "pods"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses"],
             "verbs": ["get", "list", "watch"]},
            {"nonResourceURLs": ["/metrics", "/metrics/cadvisor"], "verbs": ["get"]},
        ],
    }  # fmt: skip
    return [
        _service_account(PROMETHEUS),
        _service_account(ALERTMANAGER),
        discovery_role,
        _cluster_binding(PROMETHEUS, PROMETHEUS),
        base_secret,
        am_service,
        prometheus,
        alertmanager,
    ]


def _gunzip_yaml(secret: Mapping[str, Any], key: str) -> JSON:
    out = yaml.safe_load(gzip.decompress(base64.b64decode(secret["data"][key])))
    assert isinstance(out, dict), f"{key} is not a mapping"
    return out


@dataclass
class GeneratedPrometheus:
    """What the operator wrote for the Prometheus object: its configuration (Secret
    prometheus-<name>, key prometheus.yaml.gz) and its rule files (ConfigMaps
    prometheus-<name>-rulefiles-N, one file per PrometheusRule), by the folder they are mounted at."""

    config: JSON
    rule_files: dict[str, dict[str, str]]


def generated_prometheus(kube: RealKube) -> GeneratedPrometheus:
    """The operator's current output for our Prometheus (KubeHTTPError 404 until it wrote it)."""
    secret = kube.get(f"/api/v1/namespaces/{MONITORING}/secrets/prometheus-{PROMETHEUS}")
    config = _gunzip_yaml(secret, "prometheus.yaml.gz")
    maps = (
        kube.get(
            f"/api/v1/namespaces/{MONITORING}/configmaps?labelSelector=prometheus-name%3D{PROMETHEUS}"
        ).get("items")
        or []
    )
    rule_files = {str(m["metadata"]["name"]): dict(m.get("data") or {}) for m in maps}
    return GeneratedPrometheus(config, rule_files)


def generated_alertmanager(kube: RealKube) -> JSON:
    """The operator's merged Alertmanager configuration (Secret alertmanager-<name>-generated)."""
    secret = kube.get(f"/api/v1/namespaces/{MONITORING}/secrets/alertmanager-{ALERTMANAGER}-generated")
    return _gunzip_yaml(secret, "alertmanager.yaml.gz")


def wait_for_generated(kube: RealKube, ready: Any, within_seconds: float, what: str) -> None:
    """Wait until `ready()` holds over the operator's output (a 404 or a partial output: not yet)."""

    def check() -> bool:
        try:
            return bool(ready())
        except KubeHTTPError as e:
            if e.status == 404:
                return False
            raise
        except (KeyError, StopIteration):
            return False

    wait_for(check, within_seconds, what, every=0.5)


def _substitute_reloader_env(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("$(POD_NAME)", POD_NAME).replace("$(SHARD)", SHARD)
    if isinstance(value, list):
        return [_substitute_reloader_env(v) for v in value]
    if isinstance(value, dict):
        return {k: _substitute_reloader_env(v) for k, v in value.items()}
    return value


def localize_prometheus_config(
    config: Mapping[str, Any],
    api_server: str,
    ca_file: Path,
    token_file: Path,
    file_sd: Mapping[str, Path],
) -> JSON:
    """The operator's Prometheus configuration, as the real binary can run it on 127.0.0.1. Rewritten:

    - `$(POD_NAME)` and `$(SHARD)`: substituted as the config reloader does from the pod's environment;
    - rule_files: the mount folder /etc/prometheus/rules/<configmap>/ becomes the working folder
      (running_prometheus copies the files there);
    - kubernetes_sd_configs of role pod: in a pod Prometheus finds the API server by
      $KUBERNETES_SERVICE_HOST and the mounted ServiceAccount token and CA; here api_server,
      the token file and the CA file say so;
    - kubernetes_sd_configs of role endpoints (a ServiceMonitor's, the Alertmanager's): replaced by
      the file_sd file given for the job (or "alertmanagers"), because the API server refuses to
      store Endpoints or EndpointSlices with 127.0.0.0/8 addresses (the test shows the 422).

    Every relabeling, honor_labels, interval and the rest are the operator's, unchanged."""
    out: JSON = _substitute_reloader_env(dict(config))
    out["rule_files"] = sorted({Path(p).name for p in out.get("rule_files") or []})

    def localize_sd(section: JSON, name: str) -> None:
        sds = section.pop("kubernetes_sd_configs", None)
        if sds is None:
            return
        roles = {sd["role"] for sd in sds}
        if roles == {"pod"}:
            section["kubernetes_sd_configs"] = [
                {**sd, "api_server": api_server, "tls_config": {"ca_file": str(ca_file)},
                 "authorization": {"credentials_file": str(token_file)}}
                for sd in sds
            ]  # fmt: skip
        elif roles <= {"endpoints", "endpointslice"}:
            assert name in file_sd, f"no file_sd stand-in for {name} ({roles})"
            section["file_sd_configs"] = [{"files": [str(file_sd[name])], "refresh_interval": "1s"}]
        else:
            raise AssertionError(f"{name}: kubernetes_sd roles {roles} are not localized")

    for job in out.get("scrape_configs") or []:
        localize_sd(job, str(job["job_name"]))
    for am in (out.get("alerting") or {}).get("alertmanagers") or []:
        localize_sd(am, "alertmanagers")
    return out
