"""Training jobs of a scenario as GPU curves and processes: the ranks' states over time, coupled.

A `jobs` entry (docs/design/nvml-sim.md) says which rank runs on which GPU and what happens to the job;
this module turns one run of it (an attempt: the scenario's start, or the n-th gang restart) into the
per-GPU curves and processes the simulation plays. Pure: the parser calls it for attempt 0 and
exporter/sim/lifecycle.py for the runs after a restart.

Coupled ranks wait on the slowest: while any rank is gone (exited, between a container's exit and its
restart) or alive with no GPU work (stalled, in rendezvous), every computing rank spins in the
collective: a kernel resident, no tensor work, no traffic. A straggler stepping at `ratio` of the others'
speed makes the others compute `ratio` of each step and spin the rest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from exporter.sim.curve import Curve
from exporter.sim.models import GpuModel
from exporter.sim.scenario_types import (
    INF,
    ClockEventWindow,
    JobEvent,
    JobSpec,
    ProcessSpec,
    WorkShape,
)

# The GPU curves a job makes for the GPUs of its ranks (a GPU entry may not give them too)
JOB_CURVES = (
    "utilization",
    "memory_utilization",
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "dram_active",
    "temperature_celsius",
    "memory_temperature_celsius",
    "power_watts",
    "sm_clock_hertz",
    "pcie_tx_bytes_per_second",
    "pcie_rx_bytes_per_second",
    "nvlink_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
)

COMPUTE = "compute"  # alive, GPU work
NO_KERNEL = "no_kernel"  # alive, nothing on the GPU (stalled, rendezvous)
GONE = "gone"  # no process

# what a rank process shows on the host while it trains (no I/O: the rules never suspect a busy rank)
_TRAINING_CPU_CORES = 0.4
_RENDEZVOUS_CPU_CORES = 0.01
_SM_UTILIZATION = 0.95


@dataclass(frozen=True)
class GpuPlan:
    """A rank GPU's curves (JOB_CURVES) and clock-event windows over one run of the job."""

    curves: dict[str, Curve]
    clock_windows: tuple[ClockEventWindow, ...]


@dataclass(frozen=True)
class AttemptPlan:
    """One run of a job on this node: curves per GPU index and the processes it starts."""

    gpus: dict[int, GpuPlan]
    processes: tuple[ProcessSpec, ...]


def idle_shape(model: GpuModel) -> WorkShape:
    """A GPU with no kernel: idle power, no traffic."""
    return WorkShape(0.0, 0.0, 0.0, model.power_idle_watts, 0.0, 0.0, 0.0)


def rank_state(job: JobSpec, events: tuple[JobEvent, ...], rank: int, t: float, start: float) -> str:
    """COMPUTE, NO_KERNEL or GONE for `rank` at time t of a run that began at `start`."""
    if start > 0 and t < start + job.rendezvous_seconds:
        return NO_KERNEL  # a restarted gang meets in rendezvous before its first step
    state = COMPUTE
    for e in events:
        if e.at_seconds > t:
            continue
        if e.kind == "complete":
            return GONE
        if e.rank != rank:
            continue
        if e.kind == "exit":
            return GONE
        if e.kind == "container_restart":
            state = GONE if t < e.at_seconds + e.after_seconds else NO_KERNEL
        elif e.kind == "stall" and t < e.until_seconds and state == COMPUTE:
            state = NO_KERNEL
    return state


def _slow(events: tuple[JobEvent, ...], t: float) -> tuple[float, int | None]:
    """(the slowest rank's step ratio, that rank) at t; (1.0, None) when none is slow."""
    ratio, rank = 1.0, None
    for e in events:
        if e.kind == "slow" and e.at_seconds <= t < e.until_seconds and e.ratio < ratio:
            ratio, rank = e.ratio, e.rank
    return ratio, rank


def _absolute(events: Iterable[JobEvent], start: float) -> tuple[JobEvent, ...]:
    """A run's events with their times counted from the scenario's start."""
    if start == 0:
        return tuple(events)
    return tuple(
        replace(e, at_seconds=e.at_seconds + start, until_seconds=e.until_seconds + start) for e in events
    )


def _steps(bounds: list[float], values: list[float]) -> Curve:
    """A step curve: values[i] from bounds[i] on (bounds[0] is the run's start)."""
    points = [(bounds[0], values[0])]
    for b, before, after in zip(bounds[1:], values, values[1:], strict=False):
        if after != before:
            points += [(b, before), (b, after)]
    return Curve(points) if len(points) > 1 else Curve.constant(values[0])


def plan_attempt(
    job: JobSpec,
    attempt: int,
    start: float,
    placements: Mapping[int, tuple[int, int]],
    models: Mapping[int, GpuModel],
) -> AttemptPlan:
    """Curves and processes of run `attempt` of `job`, begun at `start`, its local ranks placed as
    rank -> (GPU index, pid). Run 0 starts training at once; a later run meets in rendezvous first."""
    events = _absolute(job.events_of(attempt), start)
    bounds = {start}
    for e in events:
        bounds |= {e.at_seconds, e.until_seconds, e.at_seconds + e.after_seconds}
    if attempt > 0:
        bounds.add(start + job.rendezvous_seconds)
    times = sorted(b for b in bounds if start <= b < INF)
    ranks = range(job.world_size)

    def states(t: float) -> dict[int, str]:
        return {r: rank_state(job, events, r, t, start) for r in ranks}

    snapshots = [(t, states(t), _slow(events, t)) for t in times]
    gpus: dict[int, GpuPlan] = {}
    processes: list[ProcessSpec] = []
    for rank, (gpu, pid) in sorted(placements.items()):
        model = models[gpu]
        idle = idle_shape(model)
        shapes: list[WorkShape] = []
        clocks: list[float] = []
        sm_util: list[float] = []
        for _, now, (ratio, slowest) in snapshots:
            mine = now[rank]
            blocked = job.coupled and any(s != COMPUTE for r, s in now.items() if r != rank)
            if mine != COMPUTE:
                shapes.append(idle)
                clocks.append(model.sm_clock_idle_hertz)
            elif blocked:
                shapes.append(job.spin)
                clocks.append(model.sm_clock_max_hertz)
            elif slowest == rank or not job.coupled:
                shapes.append(job.compute)
                clocks.append(model.sm_clock_max_hertz)
            else:  # waits for the straggler for the rest of each step
                shapes.append(job.compute.mix(job.spin, ratio))
                clocks.append(model.sm_clock_max_hertz)
            sm_util.append(_SM_UTILIZATION if mine == COMPUTE else 0.0)
        windows: list[ClockEventWindow] = []
        for e in events:
            if e.kind == "slow" and e.rank == rank:
                for i, t in enumerate(times):
                    if e.at_seconds <= t < e.until_seconds and e.sm_clock_hertz is not None:
                        clocks[i] = e.sm_clock_hertz
                if e.reasons:
                    windows.append(_window(e))
        gpus[gpu] = GpuPlan(_curves(times, shapes, clocks), tuple(windows))
        processes += _processes(job, events, rank, gpu, pid, start, times, sm_util)
    return AttemptPlan(gpus, tuple(processes))


def _window(e: JobEvent) -> ClockEventWindow:
    return ClockEventWindow(e.at_seconds, e.until_seconds, e.reasons, e.reasons_mask)


def _curves(times: list[float], shapes: list[WorkShape], clocks: list[float]) -> dict[str, Curve]:
    def of(name: str, scale: float = 1.0, offset: float = 0.0) -> Curve:
        return _steps(times, [offset + scale * getattr(s, name) for s in shapes])

    util = of("utilization")
    sm = of("sm_active")
    nvlink = of("nvlink_bytes_per_second")
    return {
        "utilization": util,
        "memory_utilization": of("utilization", 0.45),
        "sm_active": sm,
        "sm_occupancy": of("sm_active", 0.55),
        "tensor_active": of("tensor_active"),
        "dram_active": of("utilization", 0.45),
        "temperature_celsius": of("utilization", 38.0, 32.0),
        "memory_temperature_celsius": of("utilization", 38.0, 36.0),
        "power_watts": of("power_watts"),
        "sm_clock_hertz": _steps(times, clocks),
        "pcie_tx_bytes_per_second": of("pcie_tx_bytes_per_second"),
        "pcie_rx_bytes_per_second": of("pcie_rx_bytes_per_second"),
        "nvlink_tx_bytes_per_second": nvlink,
        "nvlink_rx_bytes_per_second": nvlink,
    }


def _processes(
    job: JobSpec,
    events: tuple[JobEvent, ...],
    rank: int,
    gpu: int,
    pid: int,
    start: float,
    times: list[float],
    sm_util: list[float],
) -> list[ProcessSpec]:
    """The rank's process, the one a container restart starts, and any started beside them."""
    complete = min((e.at_seconds for e in events if e.kind == "complete"), default=INF)
    mine = [e for e in events if e.rank == rank]
    end = min([complete, *(e.at_seconds for e in mine if e.kind in ("exit", "container_restart"))])
    states: list[tuple[float, str]] = []
    cpu: list[tuple[float, float]] = [(start, _TRAINING_CPU_CORES)]
    io: list[tuple[float, float]] = [(start, 0.0)]
    for e in mine:
        if e.kind == "stall":
            states += [(e.at_seconds, e.host_state)]
            cpu += [(e.at_seconds, cpu[-1][1]), (e.at_seconds, e.host_cpu_cores)]
            io += [(e.at_seconds, io[-1][1]), (e.at_seconds, e.io_bytes_per_second)]
            if e.until_seconds < INF:
                states += [(e.until_seconds, "sleeping")]
                cpu += [(e.until_seconds, e.host_cpu_cores), (e.until_seconds, _TRAINING_CPU_CORES)]
                io += [(e.until_seconds, e.io_bytes_per_second), (e.until_seconds, 0.0)]
    main = ProcessSpec(
        pid=pid, gpu=gpu, mig_instance=None, name=job.process_name, start_seconds=start, end_seconds=end,
        memory_bytes=Curve.constant(job.memory_bytes), sm_utilization=_steps(times, sm_util),
        type="compute", host_cpu_cores=Curve(cpu), io_read_bytes_per_second=Curve(io),
        host_state=tuple(states), job=job.name, rank=rank,
    )  # fmt: skip
    out = [main]
    for e in mine:
        if e.kind == "container_restart" and e.pid is not None:
            begin = e.at_seconds + e.after_seconds
            if begin < complete:
                out.append(
                    ProcessSpec(
                        pid=e.pid,
                        gpu=gpu,
                        mig_instance=None,
                        name=job.process_name,
                        start_seconds=begin,
                        end_seconds=complete,
                        memory_bytes=Curve.constant(job.rendezvous_memory_bytes),
                        sm_utilization=Curve.constant(0.0),
                        type="compute",
                        host_cpu_cores=Curve.constant(_RENDEZVOUS_CPU_CORES),
                        job=job.name,
                        rank=rank,
                    )
                )
        elif e.kind == "new_process" and e.pid is not None:
            until = min(e.until_seconds, complete)
            if e.at_seconds < until:
                out.append(
                    ProcessSpec(
                        pid=e.pid,
                        gpu=gpu,
                        mig_instance=None,
                        name=job.process_name,
                        start_seconds=e.at_seconds,
                        end_seconds=until,
                        memory_bytes=Curve.constant(e.memory_bytes),
                        sm_utilization=Curve.constant(0.0),
                        type="compute",
                        host_cpu_cores=Curve.constant(e.host_cpu_cores),
                        job=job.name,
                        rank=rank,
                    )
                )
    return out


def restart_count(job: JobSpec, rank: int, t: float) -> int:
    """How often the rank's container was restarted in place by time t of the scenario's first run."""
    return sum(
        1 for e in job.events_of(0) if e.kind == "container_restart" and e.rank == rank and e.at_seconds <= t
    )


def place_gang(ranks: Iterable[int], free_gpus: Iterable[int], first_pid: int) -> dict[int, tuple[int, int]]:
    """The scheduler stand-in: each rank (in order) on the lowest free GPU, with pids from `first_pid`;
    raises ValueError when there are fewer free GPUs than ranks (the pods would stay Pending)."""
    ordered, free = sorted(ranks), sorted(free_gpus)
    if len(free) < len(ordered):
        raise ValueError(f"{len(ordered)} ranks to place, {len(free)} free GPUs")
    return {rank: (gpu, first_pid + i) for i, (rank, gpu) in enumerate(zip(ordered, free, strict=False))}
