"""prometheus-operator itself on the real control plane, with the chart installed as kube-prometheus-stack
users install it, and the real Prometheus 3 and Alertmanager on exactly the files the operator writes.

Real: etcd, kube-apiserver and kube-controller-manager (tests/kube/realapi.py), the operator at its pin
with its CRDs and ClusterRole (tests/kube/operator_plane.py), the chart as Helm renders it (the README's
kube-prometheus-stack values; the exporter scraped through the chart's PodMonitor, the controller through
its ServiceMonitor), the operator's Prometheus configuration, rule files and merged Alertmanager
configuration, Prometheus 3's Kubernetes discovery of the exporter pods against the API server, three
simulated exporters, the controller's webhook intake and /metrics.

Rewritten to run on 127.0.0.1 (operator_plane.localize_prometheus_config says each): the reloader's
$(POD_NAME)/$(SHARD), the rule files' mount folder, the API server address and mounted token of the
pod discovery, the discovery of the controller's and the Alertmanager's Endpoints (the API server
refuses 127.0.0.0/8 endpoint addresses: test_the_api_server_refuses_loopback_endpoint_addresses), the
webhook URL's host (a Service DNS name) and the exporter pods' IP (the stand-in kubelet gives every pod
one address; the test sets 127.0.0.x, which pod status accepts). Scrape and evaluation every second.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import importlib.util
import json
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from demo.neighbours import pins
from tests.fakes.alertmanager_process import running_alertmanager
from tests.fakes.intake import make_settings, start_harness
from tests.fakes.kube_sd import endpoints_targets
from tests.fakes.prometheus_process import running_prometheus
from tests.helm.alert_routing import routed_to_the_controller
from tests.kube.operator_plane import (
    ALERTMANAGER,
    MONITORING,
    PROMETHEUS,
    GeneratedPrometheus,
    Operator,
    apply_crds,
    create,
    generated_alertmanager,
    generated_prometheus,
    kube_prometheus_stack,
    localize_prometheus_config,
    running_operator,
    wait_for_generated,
)
from tests.kube.realapi import (
    JSON,
    KubeHTTPError,
    RealCluster,
    add_node,
    ensure_namespace,
    real_cluster,
    service_account_token,
    wait_for,
)

pytestmark = [
    pytest.mark.real_apiserver,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(420),
    pytest.mark.skipif(importlib.util.find_spec("helm_sdkpy") is None, reason="helm-sdkpy is not installed"),
]
__all__ = ["real_cluster"]  # the session fixture, imported so that pytest finds it here

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "gpupulse-po"  # the release's (test_real_apiserver installs another release in gpupulse)
WORKLOAD_NAMESPACE = "serving"  # the leaking workload's, in incident-colocated.yaml
# node -> scenario: a node alert, a GPU alert, and a pod alert in another namespace
NODES = {
    "po-gpu-node-1": "incident-xid79",
    "po-gpu-node-2": "incident-overheat",
    "po-gpu-node-3": "incident-colocated",
}
NAMESPACES = (MONITORING, NAMESPACE, WORKLOAD_NAMESPACE)
# a neighbour's PrometheusRule that does not parse, selected by the same Prometheus
BROKEN_RULE = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "PrometheusRule",
    "metadata": {
        "name": "broken",
        "namespace": WORKLOAD_NAMESPACE,
        "labels": {"release": "kube-prometheus-stack"},
    },
    "spec": {"groups": [{"name": "broken", "rules": [{"alert": "Broken", "expr": "sum(rate(x[5m]) by"}]}]},
}
LEAKING_POD = "small-a-7c5ddbdf54-x9z2k"
DEADLINE_SECONDS = 120.0
PROMETHEUS_VERSION = "v3.{}.{}".format(*pins()["prometheus"].version.removeprefix("v0.").split("."))
ALERTMANAGER_VERSION = pins()["alertmanager"].version


def _values() -> JSON:
    """The README's kube-prometheus-stack install, fast windows, the exporter through its PodMonitor."""
    from tests.helm.installs import merge
    from tests.helm.test_kube_prometheus_stack_e2e import _values as readme_fast_values

    fast = {"interval": "1s", "scrapeTimeout": "1s"}
    pod_monitor = {"serviceMonitor": {"enabled": False}, "podMonitor": {"enabled": True, **fast}}
    # the controller's pod on a node of this module (the stand-in scheduler honours the hostname
    # selector), not on another test's node that a drain there would find it on
    controller = {"serviceMonitor": fast, "nodeSelector": {"kubernetes.io/hostname": next(iter(NODES))}}
    values: JSON = merge(readme_fast_values(), {"exporter": pod_monitor, "controller": controller})
    return values


@dataclass
class Stack:
    """The operator running over the installed chart, and what it wrote."""

    cluster: RealCluster
    operator: Operator
    chart: list[JSON]
    prometheus: GeneratedPrometheus
    alertmanager: JSON
    workdir: Path

    def of_kind(self, kind: str) -> list[JSON]:
        return [o for o in self.chart if o["kind"] == kind]


def _chart_objects(tmp: Path) -> list[JSON]:
    from tests.helm.installs import install_values  # helm-sdkpy, which scripts/setup installs

    return install_values(tmp, NAMESPACE, _values()).objects


def _receivers(config: JSON) -> set[str]:
    return {str(r["name"]) for r in config.get("receivers") or []}


@pytest.fixture(scope="module")
def stack(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    kube = real_cluster.kube
    workdir = tmp_path_factory.mktemp("prometheus-operator")
    for namespace in NAMESPACES:
        ensure_namespace(kube, namespace)
    for node in NODES:
        add_node(kube, node)
    apply_crds(kube)
    base = yaml.safe_load(
        (ROOT / "tests" / "fixtures" / "kube-prometheus-stack" / "alertmanager-base.yaml").read_text()
    )
    for obj in kube_prometheus_stack(PROMETHEUS_VERSION, ALERTMANAGER_VERSION, base):
        create(kube, obj)
    chart = _chart_objects(tmp_path_factory.mktemp("helm"))
    # the namespaced objects, in the release namespace as `helm install -n` puts them; not the
    # ClusterRoles and bindings, whose names (release "pulse") test_real_apiserver's release holds
    for obj in chart:
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            namespace = obj["metadata"].get("namespace", NAMESPACE)
            create(kube, {**obj, "metadata": {**obj["metadata"], "namespace": namespace}})
    create(kube, BROKEN_RULE)
    with running_operator(kube, real_cluster.plane.url, real_cluster.plane.ca_file, workdir) as operator:
        rules = [r for r in chart if r["kind"] == "PrometheusRule"]
        monitors = [m for m in chart if m["kind"] in ("PodMonitor", "ServiceMonitor")]
        amcs = [a for a in chart if a["kind"] == "AlertmanagerConfig"]

        def prometheus_written() -> bool:
            out = generated_prometheus(kube)
            jobs = {j["job_name"] for j in out.config.get("scrape_configs") or []}
            wanted_jobs = {
                f"{m['kind'][0].lower()}{m['kind'][1:]}/{NAMESPACE}/{m['metadata']['name']}/0"
                for m in monitors
            }
            files = {name for data in out.rule_files.values() for name in data}
            wanted_files = {f"{NAMESPACE}-{r['metadata']['name']}-" for r in rules}
            return wanted_jobs <= jobs and all(any(f.startswith(w) for f in files) for w in wanted_files)

        def alertmanager_written() -> bool:
            names = _receivers(generated_alertmanager(kube))
            return all(
                f"{a['metadata']['namespace']}/{a['metadata']['name']}/gpupulse-remediation" in names
                for a in amcs
            )

        try:
            wait_for_generated(
                kube, prometheus_written, 90, "the operator to write the Prometheus configuration"
            )
            wait_for_generated(
                kube, alertmanager_written, 90, "the operator to write the Alertmanager configuration"
            )
        except Exception as e:
            raise AssertionError(f"{e}\n--- operator log\n{operator.tail()}") from None
        yield Stack(
            real_cluster, operator, chart, generated_prometheus(kube), generated_alertmanager(kube), workdir
        )
    # the next modules on this control plane see none of it (the CRDs and ClusterRoles stay: unused)
    for namespace in NAMESPACES:
        with contextlib.suppress(KubeHTTPError):
            kube.delete(f"/api/v1/namespaces/{namespace}")
    for node in NODES:
        with contextlib.suppress(KubeHTTPError):
            kube.delete(f"/api/v1/nodes/{node}")


def test_the_operator_writes_a_job_per_monitor_with_honor_labels_and_a_rule_file_per_prometheusrule(
    stack: Stack,
) -> None:
    jobs = {j["job_name"]: j for j in stack.prometheus.config["scrape_configs"]}
    (pod_monitor,) = stack.of_kind("PodMonitor")
    exporter_job = jobs[f"podMonitor/{NAMESPACE}/{pod_monitor['metadata']['name']}/0"]
    assert exporter_job["honor_labels"] is True
    assert [sd["role"] for sd in exporter_job["kubernetes_sd_configs"]] == ["pod"]
    (controller_monitor,) = stack.of_kind("ServiceMonitor")
    controller_job = jobs[f"serviceMonitor/{NAMESPACE}/{controller_monitor['metadata']['name']}/0"]
    assert [sd["role"] for sd in controller_job["kubernetes_sd_configs"]] == ["endpoints"]
    # every group of every PrometheusRule, in a file of its own, as the chart wrote it
    files = {
        name: yaml.safe_load(text)
        for data in stack.prometheus.rule_files.values()
        for name, text in data.items()
    }
    for rule in stack.of_kind("PrometheusRule"):
        (name,) = [n for n in files if n.startswith(f"{NAMESPACE}-{rule['metadata']['name']}-")]
        assert [g["name"] for g in files[name]["groups"]] == [g["name"] for g in rule["spec"]["groups"]]
    # the one that does not parse is left out by the operator, and takes none of ours with it
    assert not [n for n in files if n.startswith(f"{WORKLOAD_NAMESPACE}-broken-")]
    refusals = [line for line in stack.operator.tail(10_000).splitlines() if 'msg="invalid rule"' in line]
    assert any("prometheusrule=broken" in line and "could not parse expression" in line for line in refusals)


def test_every_alertmanagerconfig_is_routed_with_the_namespace_matcher_the_operator_adds(
    stack: Stack,
) -> None:
    routes = stack.alertmanager["route"]["routes"]
    for amc in stack.of_kind("AlertmanagerConfig"):
        namespace, name = amc["metadata"]["namespace"], amc["metadata"]["name"]
        receiver = f"{namespace}/{name}/gpupulse-remediation"
        (route,) = [r for r in routes if r.get("receiver") == receiver]
        # the OnNamespace strategy: this object only ever sees alerts of its own namespace
        assert f'namespace="{namespace}"' in route["matchers"], route
    namespaces = {a["metadata"]["namespace"] for a in stack.of_kind("AlertmanagerConfig")}
    assert namespaces == {NAMESPACE, WORKLOAD_NAMESPACE}


def test_the_api_server_refuses_loopback_endpoint_addresses(stack: Stack) -> None:
    """Why the ServiceMonitor's and the Alertmanager's discovery is a file_sd stand-in: an endpoints
    controller could not store the 127.0.0.1 address the controller listens on."""
    kube = stack.cluster.kube
    slice_ = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "loopback", "namespace": NAMESPACE},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.0.0.1"]}],
        "ports": [{"name": "http", "port": 9836, "protocol": "TCP"}],
    }
    with pytest.raises(KubeHTTPError) as refused:
        kube.post(f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices", slice_)
    assert refused.value.status == 422 and "loopback" in str(refused.value)


def _free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def _exporter_pods(stack: Stack, addresses: dict[str, tuple[str, int]]) -> dict[str, str]:
    """The DaemonSet's pods as its controller (not run here) would create them, one per node, Running
    with a 127.0.0.x IP and the exporter's port: node -> pod name."""
    kube = stack.cluster.kube
    (daemonset,) = stack.of_kind("DaemonSet")
    template = daemonset["spec"]["template"]
    daemonset_path = f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{daemonset['metadata']['name']}"
    daemonset_uid = kube.get(daemonset_path)["metadata"]["uid"]
    names = {}
    for i, (node, (ip, port)) in enumerate(addresses.items()):
        name = f"{daemonset['metadata']['name']}-po{i}"
        spec = copy.deepcopy(template["spec"])
        spec["nodeName"] = node
        spec["containers"][0]["ports"] = [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
        owner = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "name": daemonset["metadata"]["name"],
            "uid": daemonset_uid,
            "controller": True,
        }
        labels = dict(template["metadata"]["labels"])
        meta = {"name": name, "namespace": NAMESPACE, "labels": labels, "ownerReferences": [owner]}
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
        kube.post(f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
        path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"

        def running(path: str = path) -> bool:
            return bool(kube.get(path)["status"].get("phase") == "Running")

        wait_for(running, 30, f"{name} Running")
        # the stand-in kubelet has reported it Running (and will not write its status again)
        kube.merge_patch(f"{path}/status", {"status": {"podIP": ip, "podIPs": [{"ip": ip}]}})
        names[node] = name
    return names


def _controller_targets(stack: Stack, address: str) -> list[JSON]:
    """The controller's Service with the Endpoints an endpoints controller would write for its pod,
    at the intake's address: what role endpoints discovery would hand the ServiceMonitor's job."""
    kube = stack.cluster.kube
    (monitor,) = stack.of_kind("ServiceMonitor")
    service = kube.get(f"/api/v1/namespaces/{NAMESPACE}/services/{monitor['metadata']['name']}")
    selector = ",".join(f"{k}={v}" for k, v in service["spec"]["selector"].items())
    pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={selector}"
    node = next(iter(NODES))
    wait_for(
        lambda: [p["spec"].get("nodeName") for p in kube.get(pods_path)["items"]] == [node],
        60,
        f"the controller Deployment's pod on {node}",
    )
    pods = kube.get(pods_path)["items"]
    ip, port = address.rsplit(":", 1)
    port_name = service["spec"]["ports"][0]["name"]
    addresses = [
        {
            "ip": ip,
            "nodeName": p["spec"].get("nodeName"),
            "targetRef": {"kind": "Pod", "name": p["metadata"]["name"], "namespace": NAMESPACE},
        }
        for p in pods[:1]
    ]
    endpoints = {
        "metadata": {
            "name": service["metadata"]["name"],
            "namespace": NAMESPACE,
            "labels": dict(service["metadata"].get("labels") or {}),
        },
        "subsets": [
            {"addresses": addresses, "ports": [{"name": port_name, "port": int(port), "protocol": "TCP"}]}
        ],
    }
    return endpoints_targets(endpoints, service, pods)


def _alertmanager_targets(stack: Stack, address: str) -> list[JSON]:
    """kube-prometheus-stack's Alertmanager Service, at the real Alertmanager's address."""
    service = stack.cluster.kube.get(f"/api/v1/namespaces/{MONITORING}/services/{ALERTMANAGER}")
    ip, port = address.rsplit(":", 1)
    endpoints = {
        "metadata": {
            "name": ALERTMANAGER,
            "namespace": MONITORING,
            "labels": dict(service["metadata"]["labels"]),
        },
        "subsets": [
            {"addresses": [{"ip": ip}], "ports": [{"name": "http-web", "port": int(port), "protocol": "TCP"}]}
        ],
    }
    return endpoints_targets(endpoints, service, [])


def _localize_alertmanager(config: JSON, intake_url: str) -> JSON:
    """The operator's merged configuration with each webhook's Service DNS host pointed at the intake."""
    out = copy.deepcopy(config)
    for receiver in out.get("receivers") or []:
        for hook in receiver.get("webhook_configs") or []:
            assert hook["url"].endswith("/api/v1/alerts"), hook["url"]
            hook["url"] = f"{intake_url}/api/v1/alerts"
    return out


async def test_prometheus_and_alertmanager_on_the_operators_files_scrape_and_route_to_the_controller(
    stack: Stack, tmp_path: Path
) -> None:
    from tests.helm.test_kube_prometheus_stack_e2e import _exporter

    kube = stack.cluster.kube
    plane = stack.cluster.plane
    (token_secret,) = [s for s in stack.of_kind("Secret") if s["metadata"]["name"].endswith("-token")
                       and s["metadata"].get("namespace", NAMESPACE) == NAMESPACE]  # fmt: skip
    token = base64.b64decode(token_secret["data"]["token"]).decode()
    addresses = {node: (f"127.0.0.{2 + i}", 0) for i, node in enumerate(NODES)}
    addresses = {node: (ip, _free_port(ip)) for node, (ip, _) in addresses.items()}
    exporter_pods = await asyncio.to_thread(_exporter_pods, stack, addresses)

    async with AsyncExitStack() as stack_:
        short = Path(tempfile.mkdtemp(prefix="gp-"))
        stack_.callback(shutil.rmtree, short, True)
        for node, scenario in NODES.items():
            ip, port = addresses[node]
            await stack_.enter_async_context(_exporter(stack_, scenario, f"{ip}:{port}", tmp_path, short))
        harness = await start_harness(make_settings(tmp_path, auth_token=token))
        stack_.push_async_callback(harness.session.close)
        stack_.push_async_callback(harness.service.stop)
        am = await stack_.enter_async_context(
            running_alertmanager(_localize_alertmanager(stack.alertmanager, harness.url))
        )

        controller_sd = tmp_path / "controller-targets.json"
        controller_sd.write_text(json.dumps(_controller_targets(stack, harness.url.removeprefix("http://"))))
        am_sd = tmp_path / "alertmanager-targets.json"
        am_sd.write_text(json.dumps(_alertmanager_targets(stack, am.address)))
        token_file = tmp_path / "prometheus-token"
        token_file.write_text(await asyncio.to_thread(service_account_token, kube, MONITORING, PROMETHEUS))
        (controller_monitor,) = stack.of_kind("ServiceMonitor")
        controller_job = f"serviceMonitor/{NAMESPACE}/{controller_monitor['metadata']['name']}/0"
        config = localize_prometheus_config(
            stack.prometheus.config, plane.url, plane.ca_file, token_file,
            {controller_job: controller_sd, "alertmanagers": am_sd},
        )  # fmt: skip
        rules_dir = tmp_path / "rules"
        rules_dir.mkdir()
        rule_paths = []
        for data in stack.prometheus.rule_files.values():
            for name, text in data.items():
                (rules_dir / name).write_text(text)
                rule_paths.append(rules_dir / name)
        prom = await stack_.enter_async_context(
            running_prometheus(yaml.safe_dump(config), rule_files=rule_paths)
        )

        # Kubernetes discovery of the PodMonitor's pods through the real API server
        from tests.helm.installs import effective_values

        values = effective_values(_values())
        up = await _wait(prom, "up == 1", len(NODES) + 1)
        by_node = {s["metric"]["node"]: s["metric"] for s in up if s["metric"].get("node") in NODES}
        assert set(by_node) == set(NODES), up
        for node, labels in by_node.items():
            assert labels["pod"] == exporter_pods[node] and labels["namespace"] == NAMESPACE
            assert labels["instance"] == "{}:{}".format(*addresses[node])
            # the job the exporter-health alerts select (the pods' jobLabel label, not the PodMonitor's name)
            assert labels["job"] == values["exporter"]["jobName"]
        # the controller, scraped through its ServiceMonitor's job
        controller_up = [
            s for s in up if s["metric"].get("service") == controller_monitor["metadata"]["name"]
        ]
        assert controller_up and controller_up[0]["metric"]["endpoint"] == "http", up
        assert controller_up[0]["metric"]["job"] == values["controller"]["jobName"]
        assert await _wait(
            prom, f'gpupulse_remediation_queue_depth{{service="{controller_monitor["metadata"]["name"]}"}}', 1
        )

        # honorLabels: the workload's labels survive, nothing is renamed exported_*
        memory = await _wait(
            prom, f'namespace_workload_pod:gpu_process_memory_used_bytes:sum{{pod="{LEAKING_POD}"}}', 1
        )
        assert memory[0]["metric"]["namespace"] == WORKLOAD_NAMESPACE
        assert memory[0]["metric"]["node"] == "po-gpu-node-3"
        assert await prom.query('{exported_pod!=""} or {exported_namespace!=""}') == []

        # every group of every PrometheusRule loaded and evaluated without error
        wanted = {g["name"] for r in stack.of_kind("PrometheusRule") for g in r["spec"]["groups"]}
        groups = await _rule_groups(prom, wanted)
        assert {g["name"] for g in groups} == wanted
        broken = [
            (g["name"], r["name"], r.get("lastError"))
            for g in groups
            for r in g["rules"]
            if r.get("health") == "err"
        ]
        assert broken == []

        # node, GPU and pod alerts reach the controller, each through the AlertmanagerConfig of its namespace
        want = {
            "GPUFellOffBus": ("po-gpu-node-1", NAMESPACE),
            "GPUTemperatureHigh": ("po-gpu-node-2", NAMESPACE),
            "GPUProcessMemoryAboveHardLimit": ("po-gpu-node-3", WORKLOAD_NAMESPACE),
        }
        amc_name = stack.of_kind("AlertmanagerConfig")[0]["metadata"]["name"]
        arrived = await routed_to_the_controller(harness, prom, am, want, amc_name, DEADLINE_SECONDS)
        for events in arrived.values():
            assert events[0].labels["prometheus"] == f"{MONITORING}/{PROMETHEUS}"
            assert "prometheus_replica" not in events[0].labels  # the operator's alert relabeling

        # the OnNamespace limit, as the real Alertmanager routes it: a pod alert from a namespace
        # without an AlertmanagerConfig goes to kube-prometheus-stack's null receiver, not the controller
        leak = {
            "alertname": "GPUProcessMemoryAboveHardLimit",
            "fault_class": "memory_leak",
            "severity": "critical",
        }
        assert await _route(am, {**leak, "namespace": "elsewhere", "pod": "p-0"}) == ["null"]
        routed = await _route(am, {**leak, "namespace": WORKLOAD_NAMESPACE, "pod": "p-1"})
        assert routed == [f"{WORKLOAD_NAMESPACE}/{amc_name}/gpupulse-remediation"]


async def _route(am: Any, labels: dict[str, str]) -> list[str]:
    """Post one alert to Alertmanager; the receivers it routed it to, as its API reports them."""
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{am.url}/api/v2/alerts", json=[{"labels": labels}]) as resp:
            assert resp.status == 200, await resp.text()
    deadline = time.monotonic() + 30
    while True:
        for alert in await am.alerts():
            if alert["labels"] == labels:
                return sorted(r["name"] for r in alert["receivers"])
        assert time.monotonic() < deadline, f"Alertmanager never listed {labels}"
        await asyncio.sleep(0.2)


async def _rule_groups(prom: Any, wanted: set[str]) -> list[dict[str, Any]]:
    """Prometheus's rule groups once each wanted group has been evaluated once."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        data = await prom.api("rules")
        groups: list[dict[str, Any]] = data["groups"]
        evaluated = {g["name"] for g in groups if g.get("lastEvaluation", "").startswith("2")}
        if wanted <= evaluated:
            return groups
        assert time.monotonic() < deadline, f"rule groups not evaluated: {sorted(wanted - evaluated)}"
        await asyncio.sleep(0.5)


async def _wait(prom: Any, promql: str, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        result: list[dict[str, Any]] = await prom.query(promql)
        if len(result) >= count:
            return result
        assert time.monotonic() < deadline, (
            f"{promql}: {len(result)} of {count} series after {DEADLINE_SECONDS} s"
        )
        await asyncio.sleep(0.5)
