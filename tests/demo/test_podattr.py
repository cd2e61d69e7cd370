"""The demo's pod attribution: allocations and the training job's rank series, as the exporter's."""

from __future__ import annotations

from prometheus_client.core import Metric

from demo.podattr import DemoPodCollector
from demo.world import World
from exporter.collectors.base import NodeState
from exporter.sim import ManualClock

NODE = "demo-node-0"
JOB_KIND = "PyTorchJob.kubeflow.org"


async def _rank_series(world: World) -> list[dict[str, str]]:
    families: list[Metric] = list(await DemoPodCollector(world).collect(NodeState()))
    (ranks,) = [f for f in families if f.name == "gpu_training_rank_info"]
    return sorted(
        (dict(s.labels) for s in ranks.samples if s.value == 1.0), key=lambda labels: labels["rank"]
    )


async def test_every_live_rank_has_one_series_and_a_dead_rank_none(world: World, clock: ManualClock) -> None:
    series = await _rank_series(world)
    assert series == [
        {
            "uuid": world.uuid(gpu),
            "gpu": str(gpu),
            "namespace": "research",
            "pod": pod,
            "training_job_kind": JOB_KIND,
            "training_job": "llama-train",
            "rank": rank,
            "local_rank": "0",
            "world_size": "3",
        }
        for gpu, pod, rank in (
            (4, "llama-train-master-0", "0"),
            (5, "llama-train-worker-0", "1"),
            (6, "llama-train-worker-1", "2"),
        )
    ]
    clock.set(20)
    world.tick()
    assert [s["rank"] for s in await _rank_series(world)] == ["0", "2"]
    clock.set(30)
    world.restart("job", NODE, "research", "", JOB_KIND, "llama-train")
    assert [s["rank"] for s in await _rank_series(world)] == ["0", "1", "2"]
