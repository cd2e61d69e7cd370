"""Collector `processes`: memory and SM share per GPU process, labelled with its pod when known."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from prometheus_client.core import Metric

from exporter.collectors.base import GpuProcess, NodeState, PodRef
from exporter.collectors.gpus import GpuFleet
from exporter.collectors.series import table
from exporter.nvml import Device, ProcessReading, ProcessSample, read_processes
from gpupulse.metrics import gpu as c

_NO_POD = PodRef(namespace="", pod="", container="")


class ProcessesCollector:
    """Series exist only for processes NVML lists now, so gone processes drop out on the next tick."""

    name = "processes"
    interval_seconds: float | None = None

    def __init__(self, fleet: GpuFleet, sample_window_seconds: float = 1.0) -> None:
        self.fleet = fleet
        self.window_us = int(sample_window_seconds * 1e6)

    def _read(self, dev: Device) -> tuple[list[ProcessReading], list[ProcessSample]]:
        return read_processes(dev, int(self.fleet.clock.time() * 1e6), self.window_us)

    async def collect(self, state: NodeState) -> Sequence[Metric]:
        """List processes per GPU and publish them to NodeState."""
        memory, sm_util = (table(spec).family() for spec in c.PROCESS_METRICS)
        published: list[GpuProcess] = []
        pid_pods = state.pid_pods
        for slot, r in await self.fleet.map(self._read):
            if not isinstance(r, tuple):
                continue
            procs, samples = r
            # Samples are sparse: a process with no kernel time in the window has none, so it reads 0.
            sm: dict[int, list[float]] = defaultdict(list)
            for s in samples:
                sm[s.pid].append(s.sm_ratio)
            measured = not slot.device.static.mig_enabled and "putil" not in slot.device.absent
            seen: set[int] = set()
            for p in procs:
                if p.pid in seen:  # a process with compute and graphics contexts is listed once
                    continue
                seen.add(p.pid)
                published.append(GpuProcess(slot.uuid, slot.index, p.pid, p.used_memory_bytes, p.mig_uuid))
                pod = pid_pods.get(p.pid, _NO_POD)
                labels = (slot.uuid, slot.index, str(p.pid), pod.namespace, pod.pod, pod.container)
                if p.used_memory_bytes is not None:
                    memory.add(memory.table.series(*labels), float(p.used_memory_bytes))
                if measured:
                    values = sm.get(p.pid)
                    ratio = sum(values) / len(values) if values else 0.0
                    sm_util.add(sm_util.table.series(*labels), ratio)
        state.processes = tuple(published)
        return [f for f in (memory, sm_util) if f.rows]

    async def close(self) -> None:
        """Nothing to release: the GPU fleet is closed by the exporter."""
