"""Changing a running simulation from outside: restart, move, end or start a process, deliver an extra
XID, change what a GPU does.

The demo (`gpupulse-demo`) uses these to make remediation actions visible in the simulated world.
Each function swaps whole lists (never mutates one in place), so the sampler thread reading the
simulation at the same time sees either the old world or the new one.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any

import pynvml as N

from exporter.errors import InterventionError
from exporter.sim.curve import Curve
from exporter.sim.library import SimulatedNvml
from exporter.sim.runtime import SimGpu
from exporter.sim.scenario_types import ProcessSpec

# Sequence numbers of injected events sort after the scenario's own at the same instant
_injected_seq = itertools.count(1 << 40)


def _gpu(sim: SimulatedNvml, index: int) -> SimGpu:
    gpus = sim.state.gpus
    if not 0 <= index < len(gpus):
        raise InterventionError(f"no GPU {index} (the scenario has {len(gpus)})")
    gpu = gpus[index]
    if gpu.mig_enabled:
        raise InterventionError(f"GPU {index} is in MIG mode; processes there cannot be changed")
    return gpu


def _find(sim: SimulatedNvml, pid: int) -> SimGpu:
    now = sim.clock.monotonic()
    for gpu in sim.state.gpus:
        if any(p.pid == pid and p.start_seconds <= now < p.end_seconds for p in gpu.processes):
            return gpu
    raise InterventionError(f"no live process {pid}")


def restart_process(sim: SimulatedNvml, pid: int, new_pid: int, memory_bytes: float | None = None) -> None:
    """End `pid` now and start `new_pid` in its place on the same GPU.

    The new process keeps the old one's name and SM curve; its memory is `memory_bytes` (held
    constant) or, when None, the old process's memory curve shifted to start now.
    """
    gpu = _find(sim, pid)
    if new_pid != pid and any(p.pid == new_pid for g in sim.state.gpus for p in g.processes):
        raise InterventionError(f"PID {new_pid} is already used")
    now = sim.clock.monotonic()
    old = next(p for p in gpu.processes if p.pid == pid and p.start_seconds <= now < p.end_seconds)
    memory = (
        Curve.constant(memory_bytes)
        if memory_bytes is not None
        else Curve([(t + now, v) for t, v in old.memory_bytes.points])
    )
    ended = dataclasses.replace(old, end_seconds=now)
    fresh = dataclasses.replace(
        old, pid=new_pid, start_seconds=now, end_seconds=float("inf"), memory_bytes=memory
    )
    sim.state.process_names = {**sim.state.process_names, new_pid: old.name}
    gpu.processes = [ended if p is old else p for p in gpu.processes] + [fresh]


def move_process(sim: SimulatedNvml, pid: int, gpu_index: int) -> None:
    """Move a live process to another GPU (same PID, same curves)."""
    source = _find(sim, pid)
    target = _gpu(sim, gpu_index)
    if target is source:
        return
    now = sim.clock.monotonic()
    old = next(p for p in source.processes if p.pid == pid and p.start_seconds <= now < p.end_seconds)
    moved = dataclasses.replace(old, gpu=gpu_index)
    # Add first, then remove: a reader in between sees the process twice rather than not at all
    target.processes = [*target.processes, moved]
    source.processes = [p for p in source.processes if p is not old]


def inject_xid(sim: SimulatedNvml, gpu_index: int, xid: int, at_seconds: float | None = None) -> None:
    """Deliver XID `xid` on a GPU at scenario time `at_seconds` (default now) to every event set."""
    _gpu(sim, gpu_index)
    at = sim.clock.monotonic() if at_seconds is None else at_seconds
    state = sim.state
    with state.cond:
        for es in state.event_sets.values():
            if not es.registered.get(gpu_index, 0) & N.nvmlEventTypeXidCriticalError:
                continue
            es.pending = sorted([*es.pending[es.pos :], (at, next(_injected_seq), gpu_index, xid, -1)])
            es.pos = 0
        state.cond.notify_all()


# Curves that describe the work on a GPU (not its power history: energy integrates power from t=0,
# so swapping power curves would make the energy counter jump)
ACTIVITY_CURVES = (
    "utilization",
    "memory_utilization",
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "dram_active",
    "temperature_celsius",
    "memory_temperature_celsius",
)


def swap_activity(sim: SimulatedNvml, gpu_a: int, gpu_b: int) -> None:
    """Exchange the activity curves of two GPUs, as when the work on one moves to the other."""
    a, b = _gpu(sim, gpu_a), _gpu(sim, gpu_b)
    if a is b:
        return
    a_spec, b_spec = a.spec, b.spec
    a.spec = dataclasses.replace(a_spec, **{k: getattr(b_spec, k) for k in ACTIVITY_CURVES})
    b.spec = dataclasses.replace(b_spec, **{k: getattr(a_spec, k) for k in ACTIVITY_CURVES})


def _shifted(curve: Curve, offset: float) -> Curve:
    if curve.const is not None:
        return curve
    return Curve([(t + offset, v) for t, v in curve.points])


def delay_processes(sim: SimulatedNvml, offset_seconds: float) -> None:
    """Let every process's curves (and later starts and ends) happen `offset_seconds` later.

    For a script that should count from a moment after the simulation was installed: a curve's
    first value holds before its first point, so a process that is flat at the start does not change
    when it is delayed. GPUs in MIG mode are left as they are.
    """
    if offset_seconds < 0:
        raise InterventionError(f"cannot delay by a negative time ({offset_seconds})")

    def later(t: float) -> float:
        return t + offset_seconds if 0 < t < float("inf") else t

    for gpu in sim.state.gpus:
        if gpu.mig_enabled:
            continue
        gpu.processes = [
            dataclasses.replace(
                p,
                start_seconds=later(p.start_seconds),
                end_seconds=later(p.end_seconds),
                memory_bytes=_shifted(p.memory_bytes, offset_seconds),
                sm_utilization=_shifted(p.sm_utilization, offset_seconds),
            )
            for p in gpu.processes
        ]


def end_process(sim: SimulatedNvml, pid: int) -> ProcessSpec:
    """End a live process now (it exited or was killed); returns it as it was, to start a like one later."""
    gpu = _find(sim, pid)
    now = sim.clock.monotonic()
    old = next(p for p in gpu.processes if p.pid == pid and p.start_seconds <= now < p.end_seconds)
    ended = dataclasses.replace(old, end_seconds=now)
    gpu.processes = [ended if p is old else p for p in gpu.processes]
    return old


def start_process(
    sim: SimulatedNvml, like: ProcessSpec, new_pid: int, memory_bytes: float | None = None
) -> None:
    """Start `new_pid` now on `like`'s GPU with its name and SM curve (a process that ended comes back).

    Its memory is `memory_bytes` (held constant) or, when None, `like`'s memory curve shifted to now.
    """
    gpu = _gpu(sim, like.gpu)
    if any(p.pid == new_pid for g in sim.state.gpus for p in g.processes):
        raise InterventionError(f"PID {new_pid} is already used")
    now = sim.clock.monotonic()
    memory = (
        Curve.constant(memory_bytes)
        if memory_bytes is not None
        else Curve([(t + now, v) for t, v in like.memory_bytes.points])
    )
    fresh = dataclasses.replace(
        like, pid=new_pid, start_seconds=now, end_seconds=float("inf"), memory_bytes=memory
    )
    sim.state.process_names = {**sim.state.process_names, new_pid: like.name}
    gpu.processes = [*gpu.processes, fresh]


# What a GPU does, as the per-GPU curves set_curves may replace (a hung collective, a dead rank)
WORK_CURVES = (
    *ACTIVITY_CURVES,
    "pcie_tx_bytes_per_second",
    "pcie_rx_bytes_per_second",
    "nvlink_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
)


def set_curves(sim: SimulatedNvml, gpu_index: int, curves: Mapping[str, Curve]) -> dict[str, Curve]:
    """Replace some of a GPU's WORK_CURVES from now on; returns the curves replaced (to put them back)."""
    gpu = _gpu(sim, gpu_index)
    unknown = sorted(set(curves) - set(WORK_CURVES))
    if unknown:
        raise InterventionError(f"not a curve of a GPU's work: {', '.join(unknown)}")
    before = {name: getattr(gpu.spec, name) for name in curves}
    changes: dict[str, Any] = dict(curves)
    gpu.spec = dataclasses.replace(gpu.spec, **changes)
    return before
