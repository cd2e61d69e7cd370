"""Collector `processes`: memory and SM share per GPU process, labelled with its pod when known."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial

from prometheus_client.core import Metric

from exporter.collectors.base import GpuProcess, NodeState, PodRef
from exporter.collectors.gpus import Answers, FleetCollector, GpuFleet, GpuSlot, Read
from exporter.collectors.series import Rows, Series, SeriesTable, Values, defer, table
from exporter.nvml import Device, ProcessReading, read_processes
from gpupulse.metrics import gpu as c

_NO_POD = PodRef(namespace="", pod="", container="")


class _Row:
    """One process's series and published GpuProcess, kept while it runs: a tick with the same pod
    makes no labels, series or objects for it."""

    __slots__ = ("memory", "pod", "process", "sm")

    def __init__(self, pod: PodRef, memory: Series, sm: Series, process: GpuProcess) -> None:
        self.pod, self.memory, self.sm, self.process = pod, memory, sm, process


class _GpuRows:
    """One GPU's process rows as its listing last changed. A tick whose listing names the same PIDs
    in the same order, with the same PID -> pod map (NodeState replaces it whole when it changes),
    reuses them: no work per process but the values."""

    __slots__ = ("by_pid", "pid_pods", "pids", "processes", "rows")

    def __init__(
        self,
        pids: tuple[int, ...],
        pid_pods: Mapping[int, PodRef],
        by_pid: dict[int, _Row],
        rows: list[tuple[int, _Row]],
    ) -> None:
        self.pids, self.pid_pods, self.by_pid = pids, pid_pods, by_pid
        self.rows = rows  # (position in the listing, row): a PID listed twice once, at its first place
        self.processes = [row.process for _, row in rows]


class ProcessesCollector(FleetCollector):
    """Series exist only for processes NVML lists now, so gone processes drop out on the next tick."""

    name = "processes"

    def __init__(self, fleet: GpuFleet, sample_window_seconds: float = 1.0) -> None:
        super().__init__(fleet)
        self.window_us = int(sample_window_seconds * 1e6)
        self._gpus: dict[str, _GpuRows] = {}  # by GPU UUID, as of last tick

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
        tick: list[_GpuTick] = []
        pid_pods = state.pid_pods
        before, now = self._gpus, {}
        for slot, r in answers[0]:
            if not isinstance(r, tuple):
                continue
            procs, sm = r
            pids = tuple([p.pid for p in procs])
            gpu = before.get(slot.uuid)
            mig = slot.device.static.mig_enabled  # listed per instance, the instance in each row: anew
            if gpu is None or gpu.pids != pids or gpu.pid_pods is not pid_pods or mig:
                gpu = _rows_of_gpu(slot, procs, pids, pid_pods, gpu, memory.table, sm_util.table)
            now[slot.uuid] = gpu
            published += gpu.processes
            # Samples are sparse: a process with no kernel time in the window has none (then 0)
            measured = not mig and "putil" not in slot.device.absent
            tick.append((gpu.rows, procs, sm if measured else None))
        self._gpus = now
        state.processes = tuple(published)
        defer((memory, sm_util), partial(_rows_of, tick))
        return [memory, sm_util]


def _rows_of_gpu(
    slot: GpuSlot,
    procs: list[ProcessReading],
    pids: tuple[int, ...],
    pid_pods: Mapping[int, PodRef],
    last: _GpuRows | None,
    memory: SeriesTable,
    sm: SeriesTable,
) -> _GpuRows:
    """A GPU's rows for a listing that changed: a process keeps its series while its pod does."""
    before = last.by_pid if last is not None else {}
    by_pid: dict[int, _Row] = {}
    rows: list[tuple[int, _Row]] = []
    for position, (pid, _, mig_uuid) in enumerate(procs):
        if pid in by_pid:  # a process with compute and graphics contexts is listed once
            continue
        pod = pid_pods.get(pid, _NO_POD)
        row = before.get(pid)
        if row is None or (row.pod is not pod and row.pod != pod):
            labels = (slot.uuid, slot.index, str(pid), pod.namespace, pod.pod, pod.container)
            process = GpuProcess(slot.uuid, slot.index, pid, mig_uuid)
            row = _Row(pod, memory.series(*labels), sm.series(*labels), process)
        elif row.process.mig_uuid != mig_uuid:
            row.process = GpuProcess(slot.uuid, slot.index, pid, mig_uuid)
        by_pid[pid] = row
        rows.append((position, row))
    return _GpuRows(pids, pid_pods, by_pid, rows)


# one GPU of a tick: its rows, its listing, and its SM samples by PID (None: not measured)
_GpuTick = tuple[list[tuple[int, _Row]], list[ProcessReading], dict[int, list[float]] | None]
_NO_SAMPLES: list[float] = []  # never appended to


def _rows_of(tick: list[_GpuTick], rows: Rows, values: Values) -> None:
    memory_rows, memory_values, sm_rows, sm_values = rows[0], values[0], rows[1], values[1]
    for gpu_rows, procs, sm in tick:
        for position, row in gpu_rows:
            pid, used, _ = procs[position]
            if used is not None:
                memory_rows.append(row.memory)
                memory_values.append(float(used))
            if sm is not None:
                samples = sm.get(pid, _NO_SAMPLES)
                sm_rows.append(row.sm)
                sm_values.append(sum(samples) / len(samples) if samples else 0.0)
