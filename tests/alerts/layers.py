"""The test bed the sharded-layer tests share: a 2-node training job served as exporter pages, the chart's
node and fleet rules as rule files, the shards' Prometheus configuration, and polling helpers.

test_sharded_layers.py puts VictoriaMetrics and vmalert over it, test_thanos_layers.py Thanos sidecars,
Query and Ruler. The nodes are pages of exposition text served here (the series a gpupulse exporter
serves for one training rank per node), so every state is set, not simulated over time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from aiohttp import web

from tests.fakes.prometheus_process import PromHandle, free_port

if TYPE_CHECKING:
    from tests.helm.installs import Installed

NODES = ("node-a", "node-b")
JOB = "gpupulse-exporter"
FAST_FOR = {
    "TrainingJobHung": "2s",
    "TrainingRankStraggler": "2s",
    "TrainingJobNodeFault": "2s",
    "GPUTemperatureHigh": "2s",
}
TRAINING_ALERTS = {"TrainingJobHung", "TrainingRankStraggler", "TrainingJobDegraded"}

# one rank per node: (utilization, tensor active, PCIe and NVLink bytes/s, SM clock Hz, power capped)
HEALTHY = (0.95, 0.6, 1e9, 5e9, 1.98e9, 0)
HUNG = (1.0, 0.0, 0.0, 0.0, 1.98e9, 0)
CAPPED = (0.95, 0.6, 1e9, 5e9, 1.4e9, 1)


@dataclass
class Node:
    """One simulated node's exporter page."""

    name: str
    rank: int
    state: tuple[float, ...] = HEALTHY
    temperature_celsius: float = 60.0
    up: int = 1
    rank_alive: bool = True

    def page(self) -> str:
        g = f'uuid="GPU-{self.name}",gpu="0"'
        pod = f'namespace="research",pod="llama-{self.rank}"'
        rank = (
            f'{g},{pod},training_job="llama",training_job_kind="PyTorchJob.kubeflow.org",'
            f'rank="{self.rank}",local_rank="0",world_size="2"'
        )
        util, tensor, pcie, nvlink, clock, capped = (
            self.state if self.rank_alive else (0.0, 0.0, 0.0, 0.0, 1.4e9, 0)
        )
        lines = [
            f"gpu_up{{{g}}} {self.up}",
            f'gpu_up{{uuid="GPU-{self.name}-free",gpu="1"}} 1',  # a GPU no pod holds: fleet capacity
            f"gpu_temperature_celsius{{{g}}} {self.temperature_celsius}",
        ]
        if self.rank_alive:  # a dead rank's pod is gone: its series with it
            lines += [
                f"gpu_training_rank_info{{{rank}}} 1",
                f'gpu_allocation_info{{{g},{pod},container="trainer"}} 1',
            ]
        lines += [
            f"gpu_utilization_ratio{{{g}}} {util}",
            f"gpu_tensor_active_ratio{{{g}}} {tensor}",
            f'gpu_pcie_throughput_bytes_per_second{{{g},direction="tx"}} {pcie}',
            f'gpu_nvlink_throughput_bytes_per_second{{{g},direction="tx"}} {nvlink}',
            f"gpu_power_watts{{{g}}} 600",
            f"gpu_power_limit_watts{{{g}}} 700",
            f"gpu_sm_clock_hertz{{{g}}} {clock}",
            f'gpu_clock_event_active{{{g},reason="sw_power_cap"}} {capped}',
            f'gpu_clock_event_active{{{g},reason="gpu_idle"}} 0',
        ]
        return "\n".join(lines) + "\n"


def training_nodes() -> dict[str, Node]:
    """The job's two nodes, rank 0 on node-a and rank 1 on node-b, healthy."""
    return {n: Node(n, i) for i, n in enumerate(NODES)}


async def install_chart(tmp: Path, global_layer: str, **sharding: Any) -> Installed:
    """The chart installed (real Helm library, fake API server) with sharded rules for `global_layer`,
    the training alerts' `for:` shortened; `sharding` adds prometheusRule.sharding values."""
    pytest.importorskip("helm_sdkpy")
    from tests.fakes.helm_api import FakeHelmAPI
    from tests.helm.installs import Installed, effective_values, install

    values = {
        "prometheusRule": {
            "enabled": True,
            "namespaceNodeAlerts": False,
            "for": FAST_FOR,
            "sharding": {"enabled": True, "global": global_layer, **sharding},
        }
    }
    (tmp / "helm").mkdir()
    api = FakeHelmAPI(namespaces={"monitoring"})
    result = await install(api, tmp / "helm", "monitoring", values)
    return Installed(effective_values(values), result, api.chart_objects(), api)


def write_rule_file(path: Path, groups: list[dict[str, Any]]) -> Path:
    """`groups` as a Prometheus rule file at `path`."""
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


async def chart_rules(tmp: Path, global_layer: str) -> tuple[Path, Path]:
    """The chart's node PrometheusRule and its fleet rules for `global_layer` (thanosRuler: the second
    PrometheusRule; vmalert: the ConfigMap's rule file), as two rule files in `tmp`."""
    inst = await install_chart(tmp, global_layer)
    node = inst.named("PrometheusRule", "pulse-gpupulse")
    assert node is not None
    node_file = write_rule_file(tmp / "node.rules.yaml", node["spec"]["groups"])
    fleet_file = tmp / "fleet.rules.yaml"
    if global_layer == "vmalert":
        config_map = inst.named("ConfigMap", "pulse-gpupulse-fleet-rules")
        assert config_map is not None
        fleet_file.write_text(config_map["data"]["gpupulse-fleet.rules.yaml"])
    else:
        fleet = inst.named("PrometheusRule", "pulse-gpupulse-fleet")
        assert fleet is not None
        write_rule_file(fleet_file, fleet["spec"]["groups"])
    return node_file, fleet_file


def recorded_names(rule_file: Path) -> list[str]:
    """The series a rule file records."""
    groups = yaml.safe_load(rule_file.read_text())["groups"]
    return [r["record"] for g in groups for r in g["rules"] if "record" in r]


def prometheus_config(
    nodes: list[str], ports: dict[str, int], rules: list[str], extra: dict[str, Any]
) -> str:
    """A Prometheus scraping `nodes` (each with its node label, as the shards' relabeling leaves it) every
    second and evaluating `rules` every second; `extra` adds top-level keys and global settings."""
    extra = dict(extra)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", **extra.pop("global", {})},
        "scrape_configs": [
            {
                "job_name": JOB,
                "static_configs": [
                    {"targets": [f"127.0.0.1:{ports[n]}"], "labels": {"node": n}} for n in nodes
                ],
            }
        ],
        "rule_files": rules,
        **extra,
    }
    return yaml.safe_dump(config, sort_keys=False)


@asynccontextmanager
async def serve_pages(nodes: dict[str, Node]) -> AsyncIterator[dict[str, int]]:
    """Each node's page on its own 127.0.0.1 port (name -> port), rendered at every scrape."""
    runners, ports = [], {}
    try:
        for name, node in nodes.items():

            async def metrics(_: web.Request, node: Node = node) -> web.Response:
                return web.Response(text=node.page(), content_type="text/plain")

            app = web.Application()
            app.router.add_get("/metrics", metrics)
            runner = web.AppRunner(app)
            await runner.setup()
            runners.append(runner)
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            ports[name] = port
        yield ports
    finally:
        for runner in runners:
            await runner.cleanup()


async def until(check: Callable[[], Awaitable[Any]], what: str, timeout_seconds: float = 60.0) -> Any:
    """Poll `check` every 0.5 s until it returns something truthy; fails naming `what` after the timeout."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout_seconds} s")
        await asyncio.sleep(0.5)


async def only_when(got: Awaitable[Any], want: Any) -> Any:
    """`got`'s value when it equals `want`, else None (to poll until it does)."""
    value = await got
    return value if value == want else None


async def single_value(got: Awaitable[list[dict[str, Any]]]) -> float | None:
    """The value of a query result with exactly one series, else None."""
    result = await got
    return float(result[0]["value"][1]) if len(result) == 1 else None


async def shard_alerts(shard: PromHandle, names: set[str]) -> list[dict[str, Any]]:
    """The ALERTS series (pending or firing) of `names` on one Prometheus."""
    result = await shard.query("ALERTS")
    return [r for r in result if r["metric"]["alertname"] in names]


async def node_alerts_outlive_the_global_layer(
    nodes: dict[str, Node], shards: list[PromHandle], stop_global: Callable[[], Awaitable[None]]
) -> None:
    """The global layer goes away; node-b overheats and loses its GPU: its shard alone says so, and
    the other shard says nothing of it (node alerts need no global layer)."""
    await stop_global()
    nodes["node-b"].temperature_celsius = 95.0
    nodes["node-b"].up = 0
    for name in ("GPUTemperatureHigh", "TrainingJobNodeFault"):
        firing = f'ALERTS{{alertname="{name}",alertstate="firing"}}'
        got = await shards[1].wait_for(firing, timeout_seconds=60)
        assert got[0]["metric"]["node"] == "node-b"
    assert await shard_alerts(shards[0], {"GPUTemperatureHigh", "TrainingJobNodeFault"}) == []
