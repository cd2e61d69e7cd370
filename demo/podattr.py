"""Pod attribution for the simulated node, from the demo world instead of the kubelet and /proc.

It publishes the same things the real attribution collector does (NodeState.pid_pods and
.allocations, `gpu_allocation_info` and `gpu_training_rank_info`), so the processes collector labels
PIDs with their pods, and the allocation and training rules work as on a Kubernetes node.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from types import ModuleType

from prometheus_client.core import Metric

from demo.world import World
from exporter.attribution.ranks import rank_info_family
from exporter.collectors.base import NodeState
from exporter.collectors.series import family
from gpupulse.metrics.attribution import GPU_ALLOCATION_INFO

RESOURCE = "nvidia.com/gpu"


class DemoPodCollector:
    """Collector `demo_pods`: the world's pods as the kubelet would report them."""

    name = "demo_pods"
    interval_seconds: float | None = None

    def __init__(self, world: World) -> None:
        self.world = world

    async def collect(self, state: NodeState) -> Sequence[Metric]:
        """Attach the world to this NodeState and export one allocation row per pod and GPU."""
        self.world.attach(state)
        fam = family(GPU_ALLOCATION_INFO)
        for pod in self.world.pods:
            for gpu in pod.gpus:
                fam.add_metric(
                    [self.world.uuid(gpu), str(gpu), "", pod.namespace, pod.name, pod.container, RESOURCE],
                    1.0,
                )
        # the exporter's own rows and family, over the world's processes, pods and environments
        ranks = rank_info_family(self.world.rank_rows())
        return [fam, ranks]

    async def close(self) -> None:
        """Nothing to release."""


def as_plugin(world: World) -> ModuleType:
    """The collector in the exporter's plug-in shape (add_arguments / from_args)."""
    mod = ModuleType("demo.podattr.plugin")
    collector = DemoPodCollector(world)

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """The demo's pods take no flags."""

    def from_args(args: argparse.Namespace, ctx: object) -> DemoPodCollector:
        """Always on in the demo; the shared pod store in `ctx` is not used (the world knows its pods)."""
        return collector

    setattr(mod, "add_arguments", add_arguments)  # noqa: B010 - a module object built at run time
    setattr(mod, "from_args", from_args)  # noqa: B010
    return mod
