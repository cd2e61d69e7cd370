"""exporter.sim.interventions: a running simulation changed from outside, seen through pynvml."""

from __future__ import annotations

import pynvml as N
import pytest

from exporter.errors import InterventionError
from exporter.sim import ManualClock, SimulatedNvml
from exporter.sim.curve import Curve
from exporter.sim.interventions import (
    delay_processes,
    end_process,
    inject_xid,
    move_process,
    restart_process,
    set_curves,
    start_process,
    swap_activity,
)

GIB = 1 << 30


def _procs(index: int) -> dict[int, int]:
    h = N.nvmlDeviceGetHandleByIndex(index)
    return {p.pid: p.usedGpuMemory for p in N.nvmlDeviceGetComputeRunningProcesses(h)}


def test_restart_gives_a_new_pid_and_a_fresh_memory_curve(sim: SimulatedNvml, clock: ManualClock) -> None:
    clock.set(60)
    assert _procs(0) == {31001: 50 * GIB}
    restart_process(sim, 31001, 50001, memory_bytes=18 * GIB)
    assert _procs(0) == {50001: 18 * GIB}
    clock.set(120)
    assert _procs(0) == {50001: 18 * GIB}
    assert N.nvmlSystemGetProcessName(50001) == N.nvmlSystemGetProcessName(31001)


def test_restart_without_memory_replays_the_curve_from_now(sim: SimulatedNvml, clock: ManualClock) -> None:
    clock.set(100)
    restart_process(sim, 31001, 50001)
    assert _procs(0) == {50001: 18 * GIB}
    clock.set(100 + 44)
    assert _procs(0) == {50001: 50 * GIB}


def test_move_keeps_the_pid_and_changes_the_gpu(sim: SimulatedNvml) -> None:
    move_process(sim, 31003, 7)
    assert 31003 not in _procs(2)
    assert _procs(7) == {31003: 22 * GIB}
    assert N.nvmlDeviceGetMemoryInfo(N.nvmlDeviceGetHandleByIndex(7)).used >= 22 * GIB


def test_swap_activity_moves_utilization_but_not_energy(sim: SimulatedNvml, clock: ManualClock) -> None:
    clock.set(10)
    h2, h7 = N.nvmlDeviceGetHandleByIndex(2), N.nvmlDeviceGetHandleByIndex(7)
    energy = N.nvmlDeviceGetTotalEnergyConsumption(h2)
    assert (N.nvmlDeviceGetUtilizationRates(h2).gpu, N.nvmlDeviceGetUtilizationRates(h7).gpu) == (85, 0)
    swap_activity(sim, 2, 7)
    assert (N.nvmlDeviceGetUtilizationRates(h2).gpu, N.nvmlDeviceGetUtilizationRates(h7).gpu) == (0, 85)
    assert N.nvmlDeviceGetTotalEnergyConsumption(h2) == energy


def test_an_ended_process_is_gone_and_one_like_it_can_start(sim: SimulatedNvml, clock: ManualClock) -> None:
    clock.set(10)
    like = end_process(sim, 32002)
    assert _procs(5) == {}
    with pytest.raises(InterventionError):
        end_process(sim, 32002)  # it is no longer live
    clock.set(12)
    start_process(sim, like, 50002)
    assert _procs(5) == {50002: 70 * GIB}
    assert N.nvmlSystemGetProcessName(50002) == like.name
    with pytest.raises(InterventionError):
        start_process(sim, like, 50002)  # the PID is taken


def test_set_curves_changes_what_a_gpu_does_and_gives_back_the_old_curves(
    sim: SimulatedNvml, clock: ManualClock
) -> None:
    clock.set(10)
    h4 = N.nvmlDeviceGetHandleByIndex(4)
    energy = N.nvmlDeviceGetTotalEnergyConsumption(h4)
    before = set_curves(
        sim, 4, {"utilization": Curve.constant(0.5), "pcie_tx_bytes_per_second": Curve.constant(0)}
    )
    assert N.nvmlDeviceGetUtilizationRates(h4).gpu == 50
    assert sim.state.gpus[4].spec.pcie_tx_bytes_per_second.at(10) == 0
    assert N.nvmlDeviceGetTotalEnergyConsumption(h4) == energy
    set_curves(sim, 4, before)
    assert N.nvmlDeviceGetUtilizationRates(h4).gpu == 99
    with pytest.raises(InterventionError, match="power_watts"):
        set_curves(sim, 4, {"power_watts": Curve.constant(0)})  # energy integrates power: not swappable


def test_injected_xid_reaches_registered_event_sets_at_its_time(
    sim: SimulatedNvml, clock: ManualClock
) -> None:
    es = N.nvmlEventSetCreate()
    h = N.nvmlDeviceGetHandleByIndex(1)
    N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError, es)
    inject_xid(sim, 1, 13, at_seconds=5)
    with pytest.raises(N.NVMLError_Timeout):
        N.nvmlEventSetWait_v2(es, 0)
    clock.set(5)
    ev = N.nvmlEventSetWait_v2(es, 0)
    assert (N.nvmlDeviceGetIndex(ev.device), ev.eventData) == (1, 13)
    N.nvmlEventSetFree(es)


def test_delay_moves_changing_curves_and_keeps_constant_ones(sim: SimulatedNvml, clock: ManualClock) -> None:
    delay_processes(sim, 30)
    clock.set(44)
    assert _procs(0) == {31001: 18 * GIB}  # the leak now starts at 14 + 30
    assert _procs(1) == {31002: 30 * GIB}
    clock.set(74)
    assert _procs(0) == {31001: 50 * GIB}
    with pytest.raises(InterventionError):
        delay_processes(sim, -1)


def test_unknown_targets_are_refused(sim: SimulatedNvml) -> None:
    with pytest.raises(InterventionError):
        restart_process(sim, 99999, 50001)
    with pytest.raises(InterventionError):
        move_process(sim, 31001, 42)
    with pytest.raises(InterventionError):
        restart_process(sim, 31001, 31002)  # a PID that is already taken
    with pytest.raises(InterventionError):
        inject_xid(sim, 8, 13)
