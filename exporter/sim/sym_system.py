"""Fake C functions: init/shutdown, system queries, device enumeration and handle lookup."""

from __future__ import annotations

from typing import Any

import pynvml as N

from exporter.sim.registry import (
    GPU_IS_LOST,
    INVALID_ARGUMENT,
    NOT_FOUND,
    SUCCESS,
    UNINITIALIZED,
    as_int,
    out,
    system_symbol,
    write_pointer,
    write_string,
)
from exporter.sim.runtime import Device, SimState


@system_symbol()
def nvmlInitWithFlags(state: SimState, flags: Any) -> int:
    del flags  # NO_GPUS / NO_ATTACH change nothing here: the scenario always has GPUs
    with state.cond:
        state.init_count += 1
    return SUCCESS


@system_symbol()
def nvmlInit_v2(state: SimState) -> int:
    return nvmlInitWithFlags(state, 0)


@system_symbol()
def nvmlShutdown(state: SimState) -> int:
    # The header: no error when shutdown is called more often than init
    with state.cond:
        state.init_count = max(0, state.init_count - 1)
    return SUCCESS


@system_symbol()
def nvmlErrorString(state: SimState, result: Any) -> bytes:
    del state
    code = as_int(result)
    text = N.NVMLError._errcode_to_string.get(code)
    if text is None:
        text = {N.NVML_SUCCESS: "Success"}.get(code, f"Unknown Error ({code})")
    return str(text).encode()


def _ready(state: SimState) -> bool:
    return state.init_count > 0 and not state.released


@system_symbol()
def nvmlSystemGetDriverVersion(state: SimState, buf: Any, size: Any) -> int:
    if not _ready(state):
        return UNINITIALIZED
    return write_string(buf, size, state.scenario.driver_version)


@system_symbol()
def nvmlSystemGetNVMLVersion(state: SimState, buf: Any, size: Any) -> int:
    if not _ready(state):
        return UNINITIALIZED
    major = state.scenario.cuda_driver_version // 1000
    return write_string(buf, size, f"{major}.{state.scenario.driver_version}")


@system_symbol("nvmlSystemGetCudaDriverVersion_v2")
def nvmlSystemGetCudaDriverVersion(state: SimState, ref: Any) -> int:
    if not _ready(state):
        return UNINITIALIZED
    out(ref).value = state.scenario.cuda_driver_version
    return SUCCESS


@system_symbol()
def nvmlSystemGetProcessName(state: SimState, pid: Any, buf: Any, size: Any) -> int:
    if not _ready(state):
        return UNINITIALIZED
    name = state.process_names.get(as_int(pid))
    if name is None:
        return NOT_FOUND
    return write_string(buf, size, name)


@system_symbol()
def nvmlDeviceGetCount_v2(state: SimState, ref: Any) -> int:
    if not _ready(state):
        return UNINITIALIZED
    out(ref).value = len(state.gpus)
    return SUCCESS


def _hand_out(state: SimState, dev: Device | None, ref: Any) -> int:
    if dev is None:
        return NOT_FOUND
    if state.clock.monotonic() >= dev.gpu.lost_at:
        return GPU_IS_LOST
    write_pointer(ref, dev.handle)
    return SUCCESS


@system_symbol()
def nvmlDeviceGetHandleByIndex_v2(state: SimState, index: Any, ref: Any) -> int:
    if not _ready(state):
        return UNINITIALIZED
    i = as_int(index)
    if not 0 <= i < len(state.gpus):
        return INVALID_ARGUMENT
    return _hand_out(state, state.gpus[i], ref)


@system_symbol()
def nvmlDeviceGetHandleByUUID(state: SimState, uuid: Any, ref: Any) -> int:
    if not _ready(state):
        return UNINITIALIZED
    key = uuid.value if hasattr(uuid, "value") else uuid
    if isinstance(key, str):
        key = key.encode()
    return _hand_out(state, state.by_uuid.get(key or b""), ref)


@system_symbol()
def nvmlDeviceGetHandleByPciBusId_v2(state: SimState, bus_id: Any, ref: Any) -> int:
    if not _ready(state):
        return UNINITIALIZED
    key = bus_id.value if hasattr(bus_id, "value") else bus_id
    if isinstance(key, str):
        key = key.encode()
    return _hand_out(state, state.by_bus.get((key or b"").upper()), ref)
