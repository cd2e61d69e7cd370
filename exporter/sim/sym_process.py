"""Fake C functions: running-process lists (two-pass) and per-process utilization samples."""

from __future__ import annotations

import math
from typing import Any

import pynvml as N

from exporter.sim.registry import (
    INSUFFICIENT_SIZE,
    NOT_FOUND,
    NOT_SUPPORTED,
    SUCCESS,
    VERSION_MISMATCH,
    as_int,
    device_symbol,
    out,
)
from exporter.sim.runtime import PROCESS_SAMPLE_PERIOD_SECONDS, Device, SimGpu, SimState
from exporter.sim.scenario_types import ProcessSpec

_NO_INSTANCE = 0xFFFFFFFF


def _live(dev: Device, t: float, ptype: str) -> list[tuple[ProcessSpec, int, int]]:
    """(process, gpu instance id, compute instance id) for processes of `ptype` alive at t."""
    gpu = dev.gpu
    procs = dev.processes
    out_list = []
    for p in procs:
        if p.type != ptype or not p.start_seconds <= t < p.end_seconds:
            continue
        if p.mig_instance is None:
            out_list.append((p, _NO_INSTANCE, _NO_INSTANCE))
        else:
            inst = gpu.mig_devices[p.mig_instance].spec
            out_list.append((p, inst.gpu_instance_id, inst.compute_instance_id))
    return out_list


def _process_list(dev: Device, t: float, ptype: str, count_ref: Any, infos: Any) -> int:
    procs = _live(dev, t, ptype)
    count = out(count_ref)
    # First pass (or a too-small buffer): report the size needed, as the driver does
    if infos is None or count.value < len(procs):
        count.value = len(procs)
        return INSUFFICIENT_SIZE if procs else SUCCESS
    for i, (p, gi, ci) in enumerate(procs):
        info = infos[i]
        info.pid = p.pid
        info.usedGpuMemory = int(p.memory_bytes.at(t))
        info.gpuInstanceId = gi
        info.computeInstanceId = ci
    count.value = len(procs)
    return SUCCESS


@device_symbol("nvmlDeviceGetComputeRunningProcesses_v2", mig=True)
def nvmlDeviceGetComputeRunningProcesses_v3(
    state: SimState, dev: Device, t: float, count: Any, infos: Any
) -> int:
    return _process_list(dev, t, "compute", count, infos)


@device_symbol("nvmlDeviceGetGraphicsRunningProcesses_v2", mig=True)
def nvmlDeviceGetGraphicsRunningProcesses_v3(
    state: SimState, dev: Device, t: float, count: Any, infos: Any
) -> int:
    return _process_list(dev, t, "graphics", count, infos)


@device_symbol("nvmlDeviceGetMPSComputeRunningProcesses_v2", mig=True)
def nvmlDeviceGetMPSComputeRunningProcesses_v3(
    state: SimState, dev: Device, t: float, count: Any, infos: Any
) -> int:
    return _process_list(dev, t, "mps", count, infos)


def _utilization_samples(
    state: SimState, dev: SimGpu, t: float, last_seen: int
) -> list[tuple[int, int, int, int]]:
    """(timestamp, pid, smUtil %, memUtil %) of busy processes newer than `last_seen`."""
    # One sample per busy process, stamped with the latest tick of the driver's sampling grid
    tick = math.floor(t / PROCESS_SAMPLE_PERIOD_SECONDS) * PROCESS_SAMPLE_PERIOD_SECONDS
    stamp = state.epoch_us + round(tick * 1e6)
    if stamp <= last_seen:
        return []
    busy = [
        p for p in dev.processes if p.start_seconds <= tick < p.end_seconds and p.sm_utilization.at(tick) > 0
    ]
    mem_util = dev.spec.memory_utilization.at(tick)
    total_sm = sum(p.sm_utilization.at(tick) for p in busy) or 1.0
    out_list = []
    for p in busy:
        sm = p.sm_utilization.at(tick)
        out_list.append((stamp, p.pid, round(sm * 100), round(mem_util * 100 * sm / total_sm)))
    return out_list


@device_symbol()
def nvmlDeviceGetProcessUtilization(
    state: SimState, dev: SimGpu, t: float, samples: Any, count_ref: Any, last_seen: Any
) -> int:
    if dev.mig_enabled:
        return NOT_SUPPORTED
    busy = _utilization_samples(state, dev, t, as_int(last_seen))
    if not busy:
        return NOT_FOUND
    count = out(count_ref)
    if samples is None or count.value < len(busy):
        count.value = len(busy)
        return INSUFFICIENT_SIZE
    for i, (stamp, pid, sm, mem) in enumerate(busy):
        s = samples[i]
        s.pid, s.timeStamp, s.smUtil, s.memUtil, s.encUtil, s.decUtil = pid, stamp, sm, mem, 0, 0
    count.value = len(busy)
    return SUCCESS


@device_symbol()
def nvmlDeviceGetProcessesUtilizationInfo(state: SimState, dev: SimGpu, t: float, info_ref: Any) -> int:
    info = out(info_ref)
    if info.version != N.ProcessesUtilizationInfo_v1:
        return VERSION_MISMATCH
    if dev.mig_enabled:
        return NOT_SUPPORTED
    busy = _utilization_samples(state, dev, t, info.lastSeenTimeStamp)
    if not busy:
        return NOT_FOUND
    if not info.procUtilArray or info.processSamplesCount < len(busy):
        info.processSamplesCount = len(busy)
        return INSUFFICIENT_SIZE
    for i, (stamp, pid, sm, mem) in enumerate(busy):
        s = info.procUtilArray[i]
        s.timeStamp, s.pid, s.smUtil, s.memUtil = stamp, pid, sm, mem
        s.encUtil = s.decUtil = s.jpgUtil = s.ofaUtil = 0
    info.processSamplesCount = len(busy)
    return SUCCESS
