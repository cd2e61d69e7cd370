"""Collector `processes`: memory and SM share per GPU process, labelled with its pod when known."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import Metric

from exporter.collectors.base import GpuProcess, NodeState, PodRef
from exporter.collectors.gpus import Answers, FleetCollector, GpuFleet, Read
from exporter.collectors.series import Series, table
from exporter.nvml import Device, ProcessReading, read_processes
from gpupulse.metrics import gpu as c

_NO_POD = PodRef(namespace="", pod="", container="")


class _Row:
    """One process's series and published GpuProcess, kept while it runs: a tick with the same pod
    and memory makes no labels, series or objects for it."""

    __slots__ = ("memory", "pod", "process", "sm")

    def __init__(self, pod: PodRef, memory: Series, sm: Series, process: GpuProcess) -> None:
        self.pod, self.memory, self.sm, self.process = pod, memory, sm, process


class ProcessesCollector(FleetCollector):
    """Series exist only for processes NVML lists now, so gone processes drop out on the next tick."""

    name = "processes"

    def __init__(self, fleet: GpuFleet, sample_window_seconds: float = 1.0) -> None:
        super().__init__(fleet)
        self.window_us = int(sample_window_seconds * 1e6)
        self._rows: dict[tuple[str, int], _Row] = {}  # (GPU UUID, PID) -> its row, as of last tick

    def _read(self, dev: Device) -> tuple[list[ProcessReading], dict[int, list[float]]]:
        return read_processes(dev, int(self.fleet.clock.time() * 1e6), self.window_us)

    def plan(self, state: NodeState) -> Sequence[Read]:
        """One process listing of every GPU."""
        return [(self._read, self.fleet.slots)]

    def publish(self, answers: Sequence[Answers], state: NodeState) -> Sequence[Metric]:
        """Process series per GPU; the processes to NodeState."""
        memory, sm_util = (table(spec).family() for spec in c.PROCESS_METRICS)
        published: list[GpuProcess] = []
        pid_pods = state.pid_pods
        before, now = self._rows, {}
        for slot, r in answers[0]:
            if not isinstance(r, tuple):
                continue
            procs, sm = r
            measured = not slot.device.static.mig_enabled and "putil" not in slot.device.absent
            uuid = slot.uuid
            for pid, used, mig_uuid in procs:
                key = (uuid, pid)
                if key in now:  # a process with compute and graphics contexts is listed once
                    continue
                pod = pid_pods.get(pid, _NO_POD)
                row = before.get(key)
                if row is None or (row.pod is not pod and row.pod != pod):
                    labels = (uuid, slot.index, str(pid), pod.namespace, pod.pod, pod.container)
                    process = GpuProcess(uuid, slot.index, pid, used, mig_uuid)
                    row = _Row(pod, memory.table.series(*labels), sm_util.table.series(*labels), process)
                elif row.process.used_memory_bytes != used or row.process.mig_uuid != mig_uuid:
                    row.process = GpuProcess(uuid, slot.index, pid, used, mig_uuid)
                now[key] = row
                published.append(row.process)
                if used is not None:
                    memory.add(row.memory, float(used))
                if measured:
                    # Samples are sparse: a process with no kernel time in the window has none: 0
                    values = sm.get(pid)
                    sm_util.add(row.sm, sum(values) / len(values) if values else 0.0)
        self._rows = now
        state.processes = tuple(published)
        return [f for f in (memory, sm_util) if f.rows]
