"""The contract between the sampler and every collector.

A collector is sampled by the sampler (never by a scrape) and returns prometheus_client metric
families built from catalog specs (exporter.collectors.series.family). Collectors share what they
learn about the node through NodeState: the device collector publishes the GPUs and their processes,
the attribution collector publishes which pod owns which GPU and PID, and the engine collector reads
both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.core import Metric


@dataclass(frozen=True)
class GpuRef:
    """A GPU or MIG instance as NVML names it."""

    uuid: str  # GPU UUID; for a MIG instance the parent GPU's UUID
    index: str  # NVML index of the (parent) GPU, as the `gpu` label
    name: str
    pci_bus_id: str
    mig_uuid: str = ""  # set for MIG instances only


@dataclass(frozen=True)
class GpuProcess:
    """One process NVML reports on a GPU (host PID namespace): which process, not how much memory it
    holds (that is a metric, and would make a new object every tick)."""

    uuid: str
    index: str
    pid: int
    mig_uuid: str = ""


@dataclass(frozen=True)
class PodRef:
    namespace: str
    pod: str
    container: str


@dataclass
class NodeState:
    """What collectors know about this node; each field is replaced whole, never mutated in place."""

    gpus: Sequence[GpuRef] = ()
    processes: Sequence[GpuProcess] = ()
    # device id (GPU UUID or MIG UUID) -> pods the kubelet allocated it to
    allocations: Mapping[str, Sequence[PodRef]] = field(default_factory=dict)
    # host PID -> pod that owns it (from /proc/<pid>/cgroup and pod-resources)
    pid_pods: Mapping[int, PodRef] = field(default_factory=dict)


class Collector(Protocol):
    """One family of metrics, enabled by --collector.<name>."""

    name: str
    # None: run on every sampling tick; otherwise on its own slower interval.
    interval_seconds: float | None

    async def collect(self, state: NodeState) -> Sequence[Metric]:
        """Sample and return complete families; raise CollectorError when the round failed.

        Families are new objects each round and never changed once returned: the sampler and the
        snapshot keep what they made of an object (its rendered text, a family two collectors share
        joined) for as long as the same object is served again."""
        ...

    async def close(self) -> None:
        """Release threads, sockets and NVML resources."""
        ...
