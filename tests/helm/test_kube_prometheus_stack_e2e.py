"""The README's install in a kube-prometheus-stack cluster, end to end, with the real programs.

The chart is installed with the real Helm library (the README's values, plus fast rule windows and
`for:` set through the chart's own values). Then, as prometheus-operator would run it
(tests/fakes/prom_operator.py, from the operator's source):

- the real Prometheus (Debian 2.42) with the scrape job the operator generates for the chart's
  ServiceMonitor and the chart's PrometheusRule as its rule file. Debian builds Prometheus without
  Kubernetes discovery, so the job's kubernetes_sd_configs (checked to be what the operator writes)
  is replaced by a file_sd file holding the targets that discovery makes (tests/fakes/kube_sd.py,
  from Prometheus' source) of the chart's Service with Endpoints and exporter pods on three nodes;
  every relabeling, honor_labels and the scrape itself are the real Prometheus';
- three simulated exporters (`gpupulse-exporter --simulate`) as those pods: an XID 79 (node alert),
  an overheating GPU (GPU alert) and a leaking workload in namespace `serving`, attributed through
  the fake kubelet (pod alert);
- the real Alertmanager with kube-prometheus-stack's base configuration and the routes the operator
  generates from the chart's AlertmanagerConfigs under its default OnNamespace strategy;
- the controller's real webhook intake, with the token of the chart's Secret.

Deviations, each outside what the chart controls: the discovery above, Alertmanager as a static
target of Prometheus (the operator discovers it), the webhook URL's host (a Service DNS name)
pointing at the local intake, pod IPs 127.0.0.x, and a scrape and evaluation every second.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import importlib.util
import json
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.attribution.helpers import ProcfsTree, procfs_from_scenario
from tests.fakes.alertmanager_process import running_alertmanager
from tests.fakes.intake import make_settings, start_harness
from tests.fakes.kube_sd import endpoints_targets
from tests.fakes.kubelet import FakeKubelet, pods_from_scenario
from tests.fakes.prom_operator import (
    alertmanager_config,
    prometheus_config,
    rule_file,
    service_monitor_scrape_configs,
)
from tests.fakes.prometheus_process import running_prometheus
from tests.helm.alert_routing import routed_to_the_controller
from tests.helm.installs import CHART, JSON, ROOT, Installed, install_values, merge

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(importlib.util.find_spec("helm_sdkpy") is None, reason="helm-sdkpy is not installed"),
]

NAMESPACE = "gpupulse"
WORKLOAD_NAMESPACE = "serving"
BIN = Path(sys.executable).parent
SCENARIOS = ROOT / "exporter" / "scenarios"
# node -> scenario: a node alert, a GPU alert, and a pod alert in another namespace
NODES = {
    "gpu-node-1": "incident-xid79",
    "gpu-node-2": "incident-overheat",
    "gpu-node-3": "incident-colocated",
}
LEAKING_POD = "small-a-7c5ddbdf54-x9z2k"
DEADLINE_SECONDS = 90.0


def _values() -> JSON:
    readme = yaml.safe_load((CHART / "ci" / "kube-prometheus-stack-values.yaml").read_text())
    fast = yaml.safe_load((ROOT / "tests" / "alerts" / "fast-overrides.yaml").read_text())
    speed = {
        "exporter": {"serviceMonitor": {"interval": "1s", "scrapeTimeout": "1s"}},
        "prometheusRule": {"windows": fast["windows"], "for": fast["for"], "thresholds": fast["thresholds"]},
        "controller": {"alertmanagerConfig": {"groupWait": "1s", "groupInterval": "1s"}},
    }
    values: JSON = merge(readme, speed)
    return values


@asynccontextmanager
async def _exporter(
    stack: AsyncExitStack, scenario: str, address: str, tmp: Path, short: Path
) -> AsyncIterator[None]:
    args = [str(BIN / "gpupulse-exporter"), "--simulate", str(SCENARIOS / f"{scenario}.yaml")]
    doc = yaml.safe_load((SCENARIOS / f"{scenario}.yaml").read_text())
    if doc.get("pods"):  # who uses which GPU: the fake kubelet's pod-resources socket and /proc
        kubelet = FakeKubelet(str(short / f"{scenario}.sock"), pods_from_scenario(doc))
        await kubelet.start()
        stack.push_async_callback(kubelet.stop)
        tree = ProcfsTree(tmp / f"{scenario}-proc")
        procfs_from_scenario(tree, tmp / f"{scenario}-pods", doc)
        args += [
            "--attribution.kubelet-socket", kubelet.socket_path,
            "--attribution.kubelet-pods-dir", str(tmp / f"{scenario}-pods"),
            "--path.procfs", str(tree.root),
            "--attribution.interval", "0.5",
            "--attribution.kubelet-refresh-interval", "1",
        ]  # fmt: skip
    args += ["--web.listen-address", address, "--sampling.interval", "0.5"]
    log = (tmp / f"{scenario}.log").open("wb")
    proc = await asyncio.create_subprocess_exec(*args, stdout=log, stderr=asyncio.subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        async with aiohttp.ClientSession() as session:
            while True:
                assert proc.returncode is None, (tmp / f"{scenario}.log").read_text()[-2000:]
                try:
                    async with session.get(f"http://{address}/metrics") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                assert time.monotonic() < deadline, f"{scenario} exporter not serving"
                await asyncio.sleep(0.1)
        yield
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
        log.close()


def _cluster(inst: Installed, addresses: dict[str, tuple[str, int]]) -> tuple[list[JSON], dict[str, str]]:
    """The chart's exporter Service with Endpoints and a pod per node, as discovery would see them:
    (file_sd target groups, node -> pod name)."""
    service = next(s for s in inst.of_kind("Service") if s["metadata"]["name"].endswith("-exporter"))
    daemonset = inst.one("DaemonSet")
    template = daemonset["spec"]["template"]
    pods, names, subsets = [], {}, []
    for i, (node, (ip, port)) in enumerate(addresses.items()):
        name = f"{daemonset['metadata']['name']}-{'bcdfg'[i]}x{i}q"
        container = copy.deepcopy(template["spec"]["containers"][0])
        container["ports"] = [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
        uid = f"00000000-0000-0000-0000-00000000000{i}"
        owner = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "name": daemonset["metadata"]["name"],
            "controller": True,
        }
        pods.append(
            {
                "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid, "ownerReferences": [owner],
                             "labels": dict(template["metadata"]["labels"])},
                "spec": {"nodeName": node, "containers": [container]},
                "status": {"phase": "Running", "podIP": ip,
                           "conditions": [{"type": "Ready", "status": "True"}]},
            }
        )  # fmt: skip
        names[node] = name
        target = {"kind": "Pod", "name": name, "namespace": NAMESPACE, "uid": uid}
        subsets.append(
            {
                "addresses": [{"ip": ip, "nodeName": node, "targetRef": target}],
                "ports": [{"name": "metrics", "port": port, "protocol": "TCP"}],
            }
        )
    endpoints = {
        "metadata": {"name": service["metadata"]["name"], "namespace": NAMESPACE,
                     "labels": dict(service["metadata"]["labels"])},
        "subsets": subsets,
    }  # fmt: skip
    return endpoints_targets(endpoints, service, pods), names


def _with_file_sd(job: JSON, path: Path) -> JSON:
    """The operator's job with its Kubernetes discovery (which Debian's build lacks) as file_sd."""
    assert job["kubernetes_sd_configs"] == [{"role": "endpoints", "namespaces": {"names": [NAMESPACE]}}]
    out = {k: v for k, v in job.items() if k != "kubernetes_sd_configs"}
    out["file_sd_configs"] = [{"files": [str(path)], "refresh_interval": "1s"}]
    return out


def _free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


async def test_readme_install_routes_node_gpu_and_pod_alerts_to_the_controller(tmp_path: Path) -> None:
    (tmp_path / "helm").mkdir()
    inst = await asyncio.to_thread(install_values, tmp_path / "helm", NAMESPACE, _values())
    (monitor,) = [m for m in inst.of_kind("ServiceMonitor") if m["metadata"]["name"].endswith("-exporter")]
    secrets = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in inst.of_kind("Secret")}
    token_secret = inst.named("Secret", f"{inst.one('Deployment')['metadata']['name']}-token")
    assert token_secret is not None
    token = base64.b64decode(token_secret["data"]["token"]).decode()
    addresses = {node: (f"127.0.0.{2 + i}", 0) for i, node in enumerate(NODES)}
    addresses = {node: (ip, _free_port(ip)) for node, (ip, _) in addresses.items()}

    async with AsyncExitStack() as stack:
        short = Path(tempfile.mkdtemp(prefix="gp-"))
        stack.callback(shutil.rmtree, short, True)
        for node, scenario in NODES.items():
            ip, port = addresses[node]
            await stack.enter_async_context(_exporter(stack, scenario, f"{ip}:{port}", tmp_path, short))
        groups, exporter_pods = _cluster(inst, addresses)
        targets = tmp_path / "exporter-targets.json"
        targets.write_text(json.dumps(groups))

        harness = await start_harness(make_settings(tmp_path, auth_token=token))
        stack.push_async_callback(harness.session.close)
        stack.push_async_callback(harness.service.stop)

        configs = copy.deepcopy(inst.of_kind("AlertmanagerConfig"))
        for amc in configs:  # the Service DNS name, resolved to the local intake
            for receiver in amc["spec"]["receivers"]:
                for hook in receiver["webhookConfigs"]:
                    assert hook["url"].endswith("/api/v1/alerts")
                    hook["url"] = f"{harness.url}/api/v1/alerts"
        base = yaml.safe_load(
            (ROOT / "tests" / "fixtures" / "kube-prometheus-stack" / "alertmanager-base.yaml").read_text()
        )
        am = await stack.enter_async_context(
            running_alertmanager(alertmanager_config(base, configs, secrets))
        )

        rules = tmp_path / "gpupulse-rules.yaml"
        rules.write_text(yaml.safe_dump(rule_file(inst.one("PrometheusRule")), sort_keys=False))
        jobs = [_with_file_sd(job, targets) for job in service_monitor_scrape_configs(monitor)]
        config = prometheus_config(
            jobs, [rules.name], am.address, scrape_interval="1s", evaluation_interval="1s"
        )
        prom = await stack.enter_async_context(running_prometheus(yaml.safe_dump(config), rule_files=[rules]))

        # the three exporter pods were discovered through the API server and are scraped
        up = await _wait(prom, 'up{job="gpupulse-exporter"} == 1', 3)
        by_node = {s["metric"]["node"]: s["metric"] for s in up}
        assert set(by_node) == set(NODES)
        for node, labels in by_node.items():
            assert labels["pod"] == exporter_pods[node] and labels["namespace"] == NAMESPACE
            assert labels["instance"] == "{}:{}".format(*addresses[node])
            assert labels["service"] == monitor["metadata"]["name"] and labels["endpoint"] == "metrics"

        # honorLabels: the workload's labels survive, nothing is renamed exported_*
        memory = await _wait(
            prom, f'namespace_workload_pod:gpu_process_memory_used_bytes:sum{{pod="{LEAKING_POD}"}}', 1
        )
        assert memory[0]["metric"]["namespace"] == WORKLOAD_NAMESPACE
        assert memory[0]["metric"]["node"] == "gpu-node-3"
        shares = await _wait(prom, 'uuid_namespace_pod:gpu_allocation:share{node="gpu-node-3"}', 3)
        assert {s["metric"]["pod"] for s in shares} <= {LEAKING_POD, "small-b-6d8f9c7b5d-q4w7p", "small-c-0"}
        assert await prom.query('{exported_pod!=""} or {exported_namespace!=""}') == []
        # series the exporter does not attribute carry the exporter pod, as every kube-prometheus-stack target
        attributed_to_exporter = await prom.query(
            f'gpu_process_memory_used_bytes{{pod=~"{exporter_pods["gpu-node-3"]}"}}'
        )
        assert attributed_to_exporter == []

        # the alerts reach the controller's webhook, each through the AlertmanagerConfig of its namespace
        want = {
            "GPUFellOffBus": ("gpu-node-1", NAMESPACE),
            "GPUTemperatureHigh": ("gpu-node-2", NAMESPACE),
            "GPUProcessMemoryAboveHardLimit": ("gpu-node-3", WORKLOAD_NAMESPACE),
        }
        amc_name = inst.of_kind("AlertmanagerConfig")[0]["metadata"]["name"]
        routed = await routed_to_the_controller(harness, prom, am, want, amc_name, DEADLINE_SECONDS)
        for name, events in routed.items():
            labels = events[0].labels
            if name == "GPUProcessMemoryAboveHardLimit":
                assert labels["pod"] == LEAKING_POD and labels["target_kind"] == "pod"
            assert labels["prometheus"] == "monitoring/kube-prometheus-stack-prometheus"
            assert "prometheus_replica" not in labels  # the operator's alert relabeling dropped it


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
