"""Collector `processes`: memory and SM share per GPU process, labelled with its pod when known."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from prometheus_client.core import Metric

from exporter.collectors.base import GpuProcess, NodeState, PodRef
from exporter.collectors.gpus import Answers, FleetCollector, GpuFleet, Read
from exporter.collectors.series import Rows, Series, Values, defer, table
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
        """Process series per GPU (their rows made when first read, see `defer`); the processes to
        NodeState."""
        memory, sm_util = (table(spec).family() for spec in c.PROCESS_METRICS)
        published: list[GpuProcess] = []
        tick: list[_ProcessTick] = []
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
                # Samples are sparse: a process with no kernel time in the window has none (then 0)
                tick.append((row.memory, row.sm, used, sm.get(pid, _NO_SAMPLES) if measured else None))
        self._rows = now
        state.processes = tuple(published)
        defer((memory, sm_util), partial(_rows_of, tick))
        return [memory, sm_util]


_NO_SAMPLES: list[float] = []  # never appended to
# one process of a tick: its memory and SM series, its memory, and its SM samples (None: not measured)
_ProcessTick = tuple[Series, Series, int | None, list[float] | None]


def _rows_of(tick: list[_ProcessTick], rows: Rows, values: Values) -> None:
    for memory, sm, used, samples in tick:
        if used is not None:
            rows[0].append(memory)
            values[0].append(float(used))
        if samples is not None:
            rows[1].append(sm)
            values[1].append(sum(samples) / len(samples) if samples else 0.0)
