"""The chart's sharded rules on real Thanos: two Prometheus 3 shards, each scraping one node of a 2-node
training job and each with a Thanos sidecar (no object storage: the sidecar serves the shard's TSDB over
the Store API), Thanos Query over both sidecars and the ruler, and Thanos Ruler evaluating the chart's
fleet PrometheusRule (prometheusRule.sharding.global=thanosRuler) against Query and sending to a real
Alertmanager. The ruler runs what prometheus-operator makes of the chart's ThanosRuler
(sharding.thanosRuler.create): the PrometheusRules its ruleSelector picks, its interval, query and
Alertmanager endpoints and external labels.

Shown: the gang alerts fire right in the global layer and reach Alertmanager (a power-capped
straggler; a dead rank whose peer hangs in the collective; the healthy job is quiet) while the same
fleet rules put on a shard do not (the negative control: a Prometheus per shard scraping what that
shard scrapes with the fleet rules loaded, kept out of Query, since a sidecar serves every series of
its Prometheus); every fleet record of the ruler equals one Prometheus scraping both nodes; and the
node alerts fire on the shards with the global layer (ruler, Query, sidecars) stopped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from demo.neighbours import neighbour_binary
from tests.alerts.children import child_process, wait_http
from tests.alerts.layers import (
    CAPPED,
    HEALTHY,
    HUNG,
    NODES,
    TRAINING_ALERTS,
    Node,
    install_chart,
    node_alerts_outlive_the_global_layer,
    only_when,
    prometheus_config,
    recorded_names,
    serve_pages,
    shard_alerts,
    training_nodes,
    until,
    write_rule_file,
)
from tests.fakes.alertmanager_process import AlertmanagerHandle, running_alertmanager
from tests.fakes.prometheus_process import PromHandle, free_port, running_prometheus
from tests.helm.installs import JSON, Installed
from tests.helm.test_rule_sharding import _selects

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

RULER_LABEL = ("ruler", "global")  # the ruler's --label: on what it records and on the alerts it sends
REPLICA_LABEL = "thanos_ruler_replica"  # what prometheus-operator adds to each ThanosRuler pod's labels
# external labels: where a series came from, not what it is
LAYER_LABELS = {"shard", RULER_LABEL[0], REPLICA_LABEL}


@dataclass
class Bed:
    nodes: dict[str, Node]
    shards: list[PromHandle]
    shard_only: list[PromHandle]  # the fleet rules evaluated over one shard's nodes: the mistake
    single: PromHandle
    query: PromHandle  # Thanos Query's Prometheus HTTP API
    ruler: PromHandle  # Thanos Ruler's (rules and alerts)
    alertmanager: AlertmanagerHandle
    fleet_file: Path
    stop_global: Callable[[], Awaitable[None]]


def _binaries() -> tuple[Path, Path]:
    """scripts/setup builds both: a missing binary fails the test (MissingNeighbourError), never skips."""
    return neighbour_binary("prometheus"), neighbour_binary("thanos")


def _operator_rule_files(inst: Installed, ruler: JSON, tmp: Path) -> list[Path]:
    """What prometheus-operator mounts into a ThanosRuler: every PrometheusRule of its namespace that
    its ruleSelector selects, one rule file each."""
    namespace = ruler["metadata"]["namespace"]
    return [
        write_rule_file(tmp / f"ruler-{r['metadata']['name']}.rules.yaml", r["spec"]["groups"])
        for r in inst.of_kind("PrometheusRule")
        if r["metadata"]["namespace"] == namespace
        and _selects(ruler["spec"]["ruleSelector"], r["metadata"]["labels"])
    ]


def _operator_ruler_args(ruler: JSON) -> list[str]:
    """The `thanos rule` flags prometheus-operator derives from a ThanosRuler (for its pod 0)."""
    spec = ruler["spec"]
    return [
        f"--eval-interval={spec['evaluationInterval']}",
        *(f"--query={q}" for q in spec["queryEndpoints"]),
        *(f"--alertmanagers.url={u}" for u in spec.get("alertmanagersUrl", [])),
        *(f'--label={k}="{v}"' for k, v in spec.get("labels", {}).items()),
        # the operator's own replica label, dropped from alerts so that replicas' alerts are one
        f'--label={REPLICA_LABEL}="thanos-ruler-{ruler["metadata"]["name"]}-0"',
        f"--alert.label-drop={REPLICA_LABEL}",
    ]


@asynccontextmanager
async def _bed(tmp: Path) -> AsyncIterator[Bed]:
    prometheus, thanos = _binaries()
    nodes = training_nodes()
    query_http, query_grpc, ruler_http, ruler_grpc = (free_port() for _ in range(4))
    async with AsyncExitStack() as stack:
        alertmanager = await stack.enter_async_context(
            running_alertmanager({"route": {"receiver": "null"}, "receivers": [{"name": "null"}]})
        )
        # the chart renders the ThanosRuler too: the ruler below runs what the operator would make of it
        inst = await install_chart(
            tmp,
            "thanosRuler",
            thanosRuler={
                "create": True,
                "queryEndpoints": [f"127.0.0.1:{query_http}"],
                "alertmanagersUrl": [alertmanager.url],
                "labels": dict([RULER_LABEL]),
                "evaluationInterval": "1s",
            },
        )
        node_rule, ruler_obj = (
            inst.named("PrometheusRule", "pulse-gpupulse"),
            inst.named("ThanosRuler", "pulse-gpupulse-fleet"),
        )
        assert node_rule is not None and ruler_obj is not None
        node_file = write_rule_file(tmp / "node.rules.yaml", node_rule["spec"]["groups"])
        (fleet_file,) = _operator_rule_files(inst, ruler_obj, tmp)  # the fleet PrometheusRule alone
        ports = await stack.enter_async_context(serve_pages(nodes))
        shards, sidecars, grpc = [], [], []
        for i, name in enumerate(NODES):
            # the sidecar refuses a Prometheus without external labels: they tell the shards apart
            config = prometheus_config(
                [name], ports, [node_file.name], {"global": {"external_labels": {"shard": str(i)}}}
            )
            shard = await stack.enter_async_context(
                running_prometheus(config, rule_files=[node_file], binary=prometheus)
            )
            shards.append(shard)
            grpc_port, http_port = free_port(), free_port()
            sidecar = await stack.enter_async_context(
                child_process(
                    [
                        str(thanos),
                        "sidecar",
                        f"--prometheus.url={shard.url}",
                        f"--tsdb.path={shard.workdir / 'tsdb'}",
                        f"--grpc-address=127.0.0.1:{grpc_port}",
                        f"--http-address=127.0.0.1:{http_port}",
                    ],
                    tmp / f"sidecar-{i}.log",
                )
            )
            await wait_http(f"http://127.0.0.1:{http_port}/-/ready", sidecar, timeout_seconds=60)
            sidecars.append(sidecar)
            grpc.append(f"127.0.0.1:{grpc_port}")
        shard_only = [
            await stack.enter_async_context(
                running_prometheus(
                    prometheus_config([name], ports, [node_file.name, fleet_file.name], {}),
                    rule_files=[node_file, fleet_file],
                    binary=prometheus,
                )
            )
            for name in NODES
        ]
        single = await stack.enter_async_context(
            running_prometheus(
                prometheus_config(list(NODES), ports, [node_file.name, fleet_file.name], {}),
                rule_files=[node_file, fleet_file],
                binary=prometheus,
            )
        )
        # Query reads the shards through their sidecars and the ruler's own records through its Store API
        endpoints = {"endpoints": [{"address": a} for a in [*grpc, f"127.0.0.1:{ruler_grpc}"]]}
        query_proc = await stack.enter_async_context(
            child_process(
                [
                    str(thanos),
                    "query",
                    f"--http-address=127.0.0.1:{query_http}",
                    f"--grpc-address=127.0.0.1:{query_grpc}",
                    f"--endpoint.sd-config={yaml.safe_dump(endpoints)}",
                ],
                tmp / "query.log",
            )
        )
        query = PromHandle(f"http://127.0.0.1:{query_http}", tmp)
        await wait_http(f"{query.url}/-/ready", query_proc, timeout_seconds=60)
        ruler_proc = await stack.enter_async_context(
            child_process(
                [
                    str(thanos),
                    "rule",
                    f"--data-dir={tmp / 'ruler'}",
                    f"--rule-file={fleet_file}",
                    *_operator_ruler_args(ruler_obj),
                    f"--http-address=127.0.0.1:{ruler_http}",
                    f"--grpc-address=127.0.0.1:{ruler_grpc}",
                ],
                tmp / "ruler.log",
            )
        )
        ruler = PromHandle(f"http://127.0.0.1:{ruler_http}", tmp)
        await wait_http(f"{ruler.url}/-/ready", ruler_proc, timeout_seconds=60)

        async def stop_global() -> None:
            for proc in (ruler_proc, query_proc, *sidecars):
                proc.terminate()
                await proc.wait()

        yield Bed(nodes, shards, shard_only, single, query, ruler, alertmanager, fleet_file, stop_global)


async def _ruler_alerts(bed: Bed, names: set[str]) -> list[dict[str, Any]]:
    """The ruler's pending and firing alerts of `names`, from its rules API (Prometheus' shape)."""
    groups = (await bed.ruler.api("rules", type="alert"))["groups"]
    return [a for g in groups for r in g["rules"] if r["name"] in names for a in r.get("alerts", [])]


async def _ruler_firing(bed: Bed, name: str) -> list[dict[str, Any]]:
    return [a for a in await _ruler_alerts(bed, {name}) if a["state"] == "firing"]


async def _in_alertmanager(bed: Bed, name: str) -> list[dict[str, Any]]:
    return [a for a in await bed.alertmanager.alerts() if a["labels"]["alertname"] == name]


def _by_labels(result: list[dict[str, Any]]) -> dict[frozenset[tuple[str, str]], float]:
    """A query result keyed by its series' labels, less the layers' own (LAYER_LABELS)."""
    return {
        frozenset((k, v) for k, v in r["metric"].items() if k not in LAYER_LABELS): float(r["value"][1])
        for r in result
    }


async def _two_ranks(prom: PromHandle) -> dict[frozenset[tuple[str, str]], float] | None:
    ranks = _by_labels(await prom.query("training_job:gpu_training_ranks:count"))
    return ranks if list(ranks.values()) == [2.0] else None


async def _agree(bed: Bed, record: str) -> bool:
    """The ruler's `record` has the series (less the layer's labels) and values of the single server's."""
    one = _by_labels(await bed.single.query(record))
    return bool(one) and await _ruler_records(bed, record) == one


async def _ruler_records_equal(bed: Bed, record: str, want: dict[frozenset[tuple[str, str]], float]) -> Any:
    return await only_when(_ruler_records(bed, record), want)


async def _value_is(prom: PromHandle, promql: str, want: float) -> bool:
    return await prom.query_value(promql) == want


async def _records_with_values(prom: PromHandle, records: list[str], at_least: int) -> list[str] | None:
    """The records `prom` has values for, once there are at least `at_least` of them (else None)."""
    present = [record for record in records if await prom.query(record)]
    return present if len(present) >= at_least else None


async def _ruler_records(bed: Bed, record: str) -> dict[frozenset[tuple[str, str]], float]:
    return _by_labels(await bed.query.query(f'{record}{{{RULER_LABEL[0]}="{RULER_LABEL[1]}"}}'))


async def test_gang_alerts_fire_in_thanos_ruler_not_on_the_shards_and_node_alerts_outlive_it(
    tmp_path: Path,
) -> None:
    async with _bed(tmp_path) as bed:
        # Query sees both shards: every node's GPUs, each series once
        await until(
            lambda: only_when(bed.query.query_value("count(gpu_up)"), 4.0), "Query over both sidecars"
        )
        # both ranks reach the global layer: the gang's rank count is 2 there, as on one server, 1 on a shard
        ranks = await until(partial(_two_ranks, bed.single), "both ranks counted by one server")
        assert [dict(k)["training_job"] for k in ranks] == ["llama"]
        await until(
            partial(_ruler_records_equal, bed, "training_job:gpu_training_ranks:count", ranks),
            "both ranks counted by the ruler",
        )
        for shard in bed.shard_only:  # a shard counts only its own rank (once its group has run: under
            # load a shard's first round can come after the single server's)
            await until(
                partial(_value_is, shard, "training_job:gpu_training_ranks:count", 1.0), "a shard's rank"
            )

        # every fleet record the single server has, the ruler has with the same labels and value
        fleet_records = recorded_names(bed.fleet_file)
        # the single server's groups evaluate on their own schedules: under load some have not run
        # yet when the ranks are counted (5 of 39 had values once in a clean-clone run), so wait for 8
        present = await until(
            partial(_records_with_values, bed.single, fleet_records, 8),
            "8 fleet records with values on the single server",
        )
        for record in present:
            # both read again each time: records of other groups settle an evaluation or a window apart
            await until(
                partial(_agree, bed, record), f"{record}: the ruler's equal to the single server's", 30
            )
        for record, whole in ((":gpu_free:sum", 2.0), ("namespace:gpu_allocated:sum", 2.0)):
            # a round evaluated before the second node's allocation series were scraped reads half (a
            # loaded full-suite run read 1.0 once): the whole once the group runs on both nodes' data
            await until(partial(_value_is, bed.single, record, whole), f"{record} on the single server")
            for shard in bed.shard_only:  # a shard's sum is its part of the fleet
                await until(partial(_value_is, shard, record, whole / 2), f"{record} on a shard")

        # healthy: nothing of the gang's is pending or firing in the ruler
        assert await _ruler_alerts(bed, TRAINING_ALERTS) == []

        # a power-capped rank on node-b: a straggler against the job's median, seen only globally
        bed.nodes["node-b"].state = CAPPED
        (straggler,) = await until(
            lambda: _ruler_firing(bed, "TrainingRankStraggler"), "straggler in the ruler"
        )
        assert straggler["labels"]["rank"] == "1" and straggler["labels"]["node"] == "node-b"
        (sent,) = await until(
            lambda: _in_alertmanager(bed, "TrainingRankStraggler"), "the straggler in Alertmanager"
        )
        assert sent["labels"]["rank"] == "1" and sent["labels"][RULER_LABEL[0]] == RULER_LABEL[1]
        assert REPLICA_LABEL not in sent["labels"]
        firing = await bed.single.wait_for('ALERTS{alertname="TrainingRankStraggler",alertstate="firing"}')
        assert firing[0]["metric"]["rank"] == "1"
        for shard in bed.shard_only:  # one rank per shard: it is its own median
            assert await shard_alerts(shard, {"TrainingRankStraggler"}) == []

        # rank 1 dies; rank 0 spins in the collective waiting for it (no tensor work, no traffic)
        bed.nodes["node-b"].state = HEALTHY
        bed.nodes["node-b"].rank_alive = False
        bed.nodes["node-a"].state = HUNG
        (hung,) = await until(lambda: _ruler_firing(bed, "TrainingJobHung"), "hung job in the ruler")
        assert hung["labels"]["training_job"] == "llama"
        await until(lambda: _in_alertmanager(bed, "TrainingJobHung"), "the hung job in Alertmanager")
        await bed.single.wait_for('ALERTS{alertname="TrainingJobHung",alertstate="firing"}')
        # shard a sees one spinning rank, below the two ranks the rule asks for; shard b sees no rank
        for shard in bed.shard_only:
            assert await shard_alerts(shard, {"TrainingJobHung"}) == []

        # the global layer goes away; node-b overheats and loses its GPU: the shard alone says so
        await node_alerts_outlive_the_global_layer(bed.nodes, bed.shards, bed.stop_global)
