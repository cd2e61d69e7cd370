"""The chart's sharded rules on real engines: two Prometheus 3 shards, each scraping one node of a 2-node
training job and remote-writing to a single-node VictoriaMetrics, and vmalert evaluating the chart's
fleet rule file over both (prometheusRule.sharding.global=vmalert).

Shown: the gang alerts fire right in the global layer (a power-capped straggler; a dead rank whose
peer hangs in the collective; the healthy job is quiet) while the same fleet rules evaluated on a
shard do not (the negative control: each shard sees one rank at most), the fleet records agree with
one Prometheus scraping both nodes (a shard's sum is half), and the node alerts fire on the shards
with the global layer stopped.

The bed's pages, chart rules and shard configuration are tests/alerts/layers.py's (test_thanos_layers.py
puts Thanos over the same shards).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from demo.neighbours import MissingNeighbourError, neighbour_binary
from tests.alerts.children import child_process, wait_http
from tests.alerts.layers import (
    CAPPED,
    HEALTHY,
    HUNG,
    NODES,
    TRAINING_ALERTS,
    Node,
    chart_rules,
    node_alerts_outlive_the_global_layer,
    only_when,
    prometheus_config,
    recorded_names,
    serve_pages,
    shard_alerts,
    single_value,
    training_nodes,
    until,
)
from tests.fakes.prometheus_process import PromHandle, free_port, running_prometheus

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]


@dataclass
class Bed:
    nodes: dict[str, Node]
    shards: list[PromHandle]
    single: PromHandle
    vm_url: str
    vmalert_url: str
    stop_global: Callable[[], Awaitable[None]]
    ports: dict[str, int] = field(default_factory=dict)


def _binaries() -> tuple[Path, Path, Path]:
    try:
        return (
            neighbour_binary("prometheus"),
            neighbour_binary("victoriametrics", "victoria-metrics"),
            neighbour_binary("victoriametrics", "vmalert"),
        )
    except MissingNeighbourError as e:
        pytest.skip(str(e))


@asynccontextmanager
async def _bed(tmp: Path) -> AsyncIterator[Bed]:
    prometheus, victoria, vmalert = _binaries()
    node_file, fleet_file = await chart_rules(tmp, "vmalert")
    nodes = training_nodes()
    vm_port, vmalert_port = free_port(), free_port()
    vm = f"http://127.0.0.1:{vm_port}"
    fleet_records = recorded_names(fleet_file)
    async with AsyncExitStack() as stack:
        ports = await stack.enter_async_context(serve_pages(nodes))
        vm_proc = await stack.enter_async_context(
            child_process(
                [
                    str(victoria),
                    f"-httpListenAddr=127.0.0.1:{vm_port}",
                    f"-storageDataPath={tmp / 'vm'}",
                    "-search.latencyOffset=0s",  # default 30 s: the newest samples would be hidden
                    "-search.disableCache",
                ],
                tmp / "vm.log",
            )
        )
        await wait_http(f"{vm}/health", vm_proc)
        shards = []
        for i, name in enumerate(NODES):
            # each shard also evaluates the fleet rules (the negative control), which never leave it
            drop = "|".join(["ALERTS", "ALERTS_FOR_STATE", *fleet_records])
            extra = {
                "global": {"external_labels": {"shard": str(i)}},
                "remote_write": [
                    {
                        "url": f"{vm}/api/v1/write",
                        "queue_config": {"batch_send_deadline": "200ms"},
                        "write_relabel_configs": [
                            {"source_labels": ["__name__"], "regex": drop, "action": "drop"}
                        ],
                    }
                ],
            }
            config = prometheus_config([name], ports, [node_file.name, fleet_file.name], extra)
            shards.append(
                await stack.enter_async_context(
                    running_prometheus(config, rule_files=[node_file, fleet_file], binary=prometheus)
                )
            )
        single = await stack.enter_async_context(
            running_prometheus(
                prometheus_config(list(NODES), ports, [node_file.name, fleet_file.name], {}),
                rule_files=[node_file, fleet_file],
                binary=prometheus,
            )
        )
        alert_proc = await stack.enter_async_context(
            child_process(
                [
                    str(vmalert),
                    f"-httpListenAddr=127.0.0.1:{vmalert_port}",
                    f"-rule={fleet_file}",
                    f"-datasource.url={vm}",
                    f"-remoteWrite.url={vm}",
                    "-notifier.blackhole",
                    "-evaluationInterval=1s",
                    "-rule.evalDelay=0s",
                    "-remoteWrite.flushInterval=200ms",
                ],
                tmp / "vmalert.log",
            )
        )
        vmalert_url = f"http://127.0.0.1:{vmalert_port}"
        await wait_http(f"{vmalert_url}/health", alert_proc)

        async def stop_global() -> None:
            for proc in (alert_proc, vm_proc):
                proc.terminate()
                await proc.wait()

        yield Bed(nodes, shards, single, vm, vmalert_url, stop_global, ports)


async def _vmalert_alerts(bed: Bed) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.get(f"{bed.vmalert_url}/api/v1/alerts") as r:
        body = await r.json()
    return list(body["data"]["alerts"])


async def _vm_query(bed: Bed, promql: str) -> list[dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"{bed.vm_url}/api/v1/query", params={"query": promql}) as r,
    ):
        body = await r.json()
    return list(body["data"]["result"])


async def _global_firing(bed: Bed, name: str) -> list[dict[str, Any]]:
    return [a for a in await _vmalert_alerts(bed) if a["name"] == name and a["state"] == "firing"]


async def _records_from_vmalert(bed: Bed, record: str) -> dict[str, float]:
    # vmalert's own output: no shard label (what the shards wrote carries theirs)
    result = await _vm_query(bed, f'{record}{{shard=""}}')
    return {r["metric"].get("training_job", ""): float(r["value"][1]) for r in result}


async def test_gang_alerts_fire_in_the_global_layer_not_on_the_shards_and_node_alerts_outlive_it(
    tmp_path: Path,
) -> None:
    async with _bed(tmp_path) as bed:
        # both ranks reach the global layer: the gang's rank count is 2 there, 1 on each shard
        await until(
            lambda: _records_from_vmalert(bed, "training_job:gpu_training_ranks:count"),
            "vmalert recording the job's ranks",
        )
        ranks = await until(
            lambda: only_when(
                _records_from_vmalert(bed, "training_job:gpu_training_ranks:count"), {"llama": 2.0}
            ),
            "both ranks counted in the global layer",
        )
        assert ranks == {"llama": 2.0}
        single = await bed.single.wait_for("training_job:gpu_training_ranks:count")
        assert float(single[0]["value"][1]) == 2.0
        for shard in bed.shards:  # once its group has run (under load, after the others' first rounds)
            await until(
                lambda shard=shard: only_when(
                    shard.query_value("training_job:gpu_training_ranks:count"), 1.0
                ),
                "a shard's rank",
            )

        # fleet records agree with the single server on the same data
        for record, want in ((":gpu_free:sum", 2.0), ("namespace:gpu_allocated:sum", 2.0)):
            one = await bed.single.wait_for(record)
            assert float(one[0]["value"][1]) == want, record
            fleet = await until(
                lambda record=record, want=want: only_when(
                    single_value(_vm_query(bed, f'{record}{{shard=""}}')), want
                ),
                f"{record} in the global layer",
            )
            assert fleet == want
            for shard in bed.shards:  # a shard's sum is its part of the fleet
                await until(
                    lambda shard=shard, record=record, want=want: only_when(
                        shard.query_value(record), want / 2
                    ),
                    f"{record} on a shard",
                )

        # healthy: nothing of the gang's is pending or firing anywhere
        assert [a for a in await _vmalert_alerts(bed) if a["name"] in TRAINING_ALERTS] == []

        # a power-capped rank on node-b: a straggler against the job's median, seen only globally
        bed.nodes["node-b"].state = CAPPED
        (straggler,) = await until(
            lambda: _global_firing(bed, "TrainingRankStraggler"), "straggler in vmalert"
        )
        assert straggler["labels"]["rank"] == "1" and straggler["labels"]["node"] == "node-b"
        firing = await bed.single.wait_for('ALERTS{alertname="TrainingRankStraggler",alertstate="firing"}')
        assert firing[0]["metric"]["rank"] == "1"
        for shard in bed.shards:  # one rank per shard: it is its own median
            assert await shard_alerts(shard, {"TrainingRankStraggler"}) == []

        # rank 1 dies; rank 0 spins in the collective waiting for it (no tensor work, no traffic)
        bed.nodes["node-b"].state = HEALTHY
        bed.nodes["node-b"].rank_alive = False
        bed.nodes["node-a"].state = HUNG
        (hung,) = await until(lambda: _global_firing(bed, "TrainingJobHung"), "hung job in vmalert")
        assert hung["labels"]["training_job"] == "llama"
        await bed.single.wait_for('ALERTS{alertname="TrainingJobHung",alertstate="firing"}')
        # shard a sees one spinning rank, below the two ranks the rule asks for; shard b sees no rank
        for shard in bed.shards:
            assert await shard_alerts(shard, {"TrainingJobHung"}) == []

        # the global layer goes away; node-b overheats and loses its GPU: the shard alone says so
        await node_alerts_outlive_the_global_layer(bed.nodes, bed.shards, bed.stop_global)
