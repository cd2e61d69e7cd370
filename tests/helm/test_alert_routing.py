"""Which alerts reach the controller under each of prometheus-operator's matcher strategies.

The chart's AlertmanagerConfigs and Secrets (installed with the real Helm library) become the
Alertmanager configuration the operator builds (tests/fakes/prom_operator.py) on top of
kube-prometheus-stack's base configuration; the real Alertmanager's routing (`amtool config routes
test`) then says where a node alert, a GPU alert and pod alerts from two namespaces go, with the
labels the chart's PrometheusRule gives them. The end-to-end run with real alerts is
test_kube_prometheus_stack_e2e.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from demo.neighbours import LINES, line
from tests.fakes.prom_operator import alertmanager_config, service_monitor_scrape_configs
from tests.helm.installs import JSON, ROOT, Installed, install_values

# The chart's configuration parses and routes the same under both lines' amtool (0.3x's UTF-8 matcher
# parser, the default since 0.27, and 0.25's classic one); a missing amtool fails.
ON_BOTH_LINES = pytest.mark.parametrize("line_name", LINES)

BASE = ROOT / "tests" / "fixtures" / "kube-prometheus-stack" / "alertmanager-base.yaml"
RELEASE_NS = "gpupulse"
ALERTMANAGER_NS = "monitoring"


def _labels(inst: Installed, alertname: str, **extra: str) -> dict[str, str]:
    """The labels an alert of the chart's PrometheusRule carries (rule labels plus `extra`)."""
    (rule,) = [
        r
        for g in inst.one("PrometheusRule")["spec"]["groups"]
        for r in g["rules"]
        if r.get("alert") == alertname
    ]
    return {"alertname": alertname, **rule["labels"], **extra}


def _receivers(config: JSON, labels: dict[str, str], tmp_path: Path, line_name: str) -> list[str]:
    amtool = str(line(line_name).amtool)
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    check = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    out = subprocess.run(
        [
            amtool,
            "config",
            "routes",
            "test",
            f"--config.file={path}",
            *(f"{k}={v}" for k, v in labels.items()),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.strip().split(",")


def _config(inst: Installed, strategy: str) -> JSON:
    secrets = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in inst.of_kind("Secret")}
    base = yaml.safe_load(BASE.read_text())
    return alertmanager_config(base, inst.of_kind("AlertmanagerConfig"), secrets, strategy, ALERTMANAGER_NS)


STRATEGIES = {
    # strategy -> chart values for it
    "OnNamespace": {"namespaces": ["serving"]},
    "None": {"matcherStrategy": "None"},
    "OnNamespaceExceptForAlertmanagerNamespace": {
        "matcherStrategy": "OnNamespaceExceptForAlertmanagerNamespace",
        "alertmanagerNamespace": ALERTMANAGER_NS,
    },
}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@ON_BOTH_LINES
def test_node_gpu_and_pod_alerts_reach_the_controller_once(
    strategy: str, tmp_path: Path, line_name: str
) -> None:
    amc = {"enabled": True, **STRATEGIES[strategy]}
    values = {"prometheusRule": {"enabled": True}, "controller": {"alertmanagerConfig": amc}}
    inst = install_values(tmp_path, RELEASE_NS, values)
    config = _config(inst, strategy)
    (amc_name,) = {c["metadata"]["name"] for c in inst.of_kind("AlertmanagerConfig")}

    def controller(namespace: str) -> str:
        return f"{namespace}/{amc_name}/gpupulse-remediation"

    home = ALERTMANAGER_NS if strategy == "OnNamespaceExceptForAlertmanagerNamespace" else RELEASE_NS
    node = _labels(inst, "GPUFellOffBus", node="gpu-node-1", uuid="GPU-1", gpu="0", xid="79")
    gpu = _labels(inst, "GPUTemperatureHigh", node="gpu-node-2", uuid="GPU-2", gpu="0")
    leak = _labels(inst, "GPUProcessMemoryAboveHardLimit", node="gpu-node-3", namespace="serving",
                   workload="llm", pod="llm-7c5ddbdf54-x9z2k")  # fmt: skip
    elsewhere = {**leak, "namespace": "batch", "pod": "trainer-0"}
    # node and GPU alerts carry the release namespace (prometheusRule.namespaceNodeAlerts)
    assert node["namespace"] == gpu["namespace"] == RELEASE_NS
    # each reaches the controller exactly once (continue: true lets the base routes see it too)
    assert _receivers(config, node, tmp_path, line_name) == [controller(home)]
    assert _receivers(config, gpu, tmp_path, line_name) == [controller(home)]
    assert _receivers(config, leak, tmp_path, line_name) == [
        controller("serving" if strategy == "OnNamespace" else home)
    ]
    # a pod alert of a namespace with no AlertmanagerConfig reaches it only where nothing is enforced
    want = ["null"] if strategy == "OnNamespace" else [controller(home)]
    assert _receivers(config, elsewhere, tmp_path, line_name) == want
    # info alerts and alerts without a fault class never reach it
    quiet = {**gpu, "severity": "info"}
    assert _receivers(config, quiet, tmp_path, line_name) == ["null"]
    # the controller's own alerts go past it, to the route everything else takes (a stuck controller
    # cannot page about itself)
    stuck = _labels(inst, "GPUPulseControllerBreakerOpen", namespace=home, job="gpupulse-controller")
    assert stuck["target_kind"] == "controller" and stuck["severity"] == "critical"
    assert _receivers(config, stuck, tmp_path, line_name) == ["null"]


@ON_BOTH_LINES
def test_idle_allocated_tickets_reach_the_controller_grouped_per_workload(
    tmp_path: Path, line_name: str
) -> None:
    """Issue 40: grouped by uuid and pod, a workload's idle GPUs made one notification each. The child
    route groups them per workload; every other alert keeps the per-target grouping."""
    values = {"prometheusRule": {"enabled": True}, "controller": {"alertmanagerConfig": {"enabled": True}}}
    inst = install_values(tmp_path, RELEASE_NS, values)
    config = _config(inst, "None")
    (amc_name,) = {c["metadata"]["name"] for c in inst.of_kind("AlertmanagerConfig")}
    controller = f"{RELEASE_NS}/{amc_name}/gpupulse-remediation"
    idle = _labels(inst, "GPUIdleWhileAllocated", node="gpu-node-1", uuid="GPU-1", gpu="0",
                   namespace="serving", pod="llm-7c5ddbdf54-x9z2k", workload="llm", source="gpm")  # fmt: skip
    assert idle["severity"] == "warning" and idle["fault_class"] == "idle_allocated"
    assert _receivers(config, idle, tmp_path, line_name) == [controller]
    (top,) = [r for r in config["route"]["routes"] if r.get("receiver") == controller]
    assert "uuid" in top["group_by"] and "pod" in top["group_by"]
    (child,) = top["routes"]
    assert child["matchers"] == ['fault_class="idle_allocated"']
    assert child["group_by"] == ["alertname", "cluster", "namespace", "workload"]
    assert child["receiver"] == controller and not child.get("continue")
    # an alert of another class takes the top route's per-target grouping, still to the controller
    leak = _labels(inst, "GPUProcessMemoryAboveHardLimit", node="gpu-node-3", namespace="serving",
                   workload="llm", pod="llm-7c5ddbdf54-x9z2k")  # fmt: skip
    assert _receivers(config, leak, tmp_path, line_name) == [controller]
    # and the child route can be turned off
    off = {"enabled": True, "workloadGroups": {"matchers": []}}
    (tmp_path / "off").mkdir()
    plain = install_values(
        tmp_path / "off", RELEASE_NS, {**values, "controller": {"alertmanagerConfig": off}}
    )
    (amc,) = plain.of_kind("AlertmanagerConfig")
    assert "routes" not in amc["spec"]["route"]


@ON_BOTH_LINES
def test_without_the_namespace_label_node_alerts_miss_the_controller(tmp_path: Path, line_name: str) -> None:
    """The failure the issue describes: under OnNamespace, a node alert without namespace matches nothing."""
    values = {
        "prometheusRule": {"enabled": True, "namespaceNodeAlerts": False},
        "controller": {"alertmanagerConfig": {"enabled": True}},
    }
    inst = install_values(tmp_path, RELEASE_NS, values)
    node = _labels(inst, "GPUFellOffBus", node="gpu-node-1", uuid="GPU-1", gpu="0", xid="79")
    assert "namespace" not in node
    assert _receivers(_config(inst, "OnNamespace"), node, tmp_path, line_name) == ["null"]


# --- the port of the operator, against what its source and golden files say


def test_amc_routes_are_namespaced_continued_and_placed_first() -> None:
    # pkg/alertmanager/testdata/CR_with_Webhook_Receiver_and_Timeout_Setup.golden, less the timeout
    base = {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}
    amc = {
        "metadata": {"name": "myamc", "namespace": "mynamespace"},
        "spec": {
            "route": {"receiver": "test"},
            "receivers": [{"name": "test", "webhookConfigs": [{"url": "https://example.com/"}]}],
        },
    }
    assert alertmanager_config(base, [amc], {}) == {
        "route": {
            "receiver": "null",
            "routes": [
                {
                    "receiver": "mynamespace/myamc/test",
                    "matchers": ['namespace="mynamespace"'],
                    "continue": True,
                }
            ],
        },
        "receivers": [
            {"name": "null"},
            {"name": "mynamespace/myamc/test", "webhook_configs": [{"url": "https://example.com/"}]},
        ],
    }  # fmt: skip


def test_the_port_refuses_what_it_does_not_model() -> None:
    amc = {
        "metadata": {"name": "a", "namespace": "b"},
        "spec": {"route": {"receiver": "r", "muteTimeIntervals": ["x"]}},
    }
    with pytest.raises(ValueError, match="muteTimeIntervals"):
        alertmanager_config({"route": {"receiver": "null"}}, [amc], {})
    monitor = {
        "metadata": {"name": "m", "namespace": "n"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "endpoints": [{"port": "metrics", "bearerTokenFile": "/t"}],
        },
    }
    with pytest.raises(ValueError, match="bearerTokenFile"):
        service_monitor_scrape_configs(monitor)


def test_service_monitor_job_follows_the_operators_relabeling_order(installs: dict[str, Installed]) -> None:
    inst = installs["full-values.yaml"]
    (monitor,) = [m for m in inst.of_kind("ServiceMonitor") if m["metadata"]["name"].endswith("-exporter")]
    (job,) = service_monitor_scrape_configs(monitor)
    assert (
        job["job_name"]
        == f"serviceMonitor/{monitor['metadata']['namespace']}/{monitor['metadata']['name']}/0"
    )
    assert job["honor_labels"] is True and job["scrape_interval"] == "30s" and job["sample_limit"] == 20000
    targets = [r.get("target_label") for r in job["relabel_configs"]]
    # the operator's target labels, then job, endpoint, the chart's node relabel, the user's, sharding
    order = ["namespace", "service", "pod", "container", "job", "endpoint", "node", "cluster", "__tmp_hash"]
    positions = [max(i for i, t in enumerate(targets) if t == label) for label in order]
    assert positions == sorted(positions), targets
    assert job["metric_relabel_configs"] == [
        {"source_labels": ["__name__"], "regex": "gpu_nvlink_peer_info", "action": "drop"}
    ]
