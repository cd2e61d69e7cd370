"""Fake C functions: event sets delivering scenario XIDs on the scenario clock."""

from __future__ import annotations

import time
from typing import Any

import pynvml as N

from exporter.sim.registry import (
    INVALID_ARGUMENT,
    SUCCESS,
    TIMEOUT,
    UNINITIALIZED,
    as_int,
    device_symbol,
    out,
    pointer_value,
    system_symbol,
    write_pointer,
    write_pointer_field,
)
from exporter.sim.runtime import EVENT_SET_BASE, EventSetState, SimGpu, SimState

_NO_INSTANCE = 0xFFFFFFFF
SUPPORTED_EVENT_TYPES = (
    N.nvmlEventTypeSingleBitEccError
    | N.nvmlEventTypeDoubleBitEccError
    | N.nvmlEventTypePState
    | N.nvmlEventTypeXidCriticalError
)


@system_symbol()
def nvmlEventSetCreate(state: SimState, ref: Any) -> int:
    if state.init_count <= 0 or state.released:
        return UNINITIALIZED
    with state.cond:
        address = EVENT_SET_BASE + state.new_id() * 0x10
        state.event_sets[address] = EventSetState()
    write_pointer(ref, address)
    return SUCCESS


@system_symbol()
def nvmlEventSetFree(state: SimState, event_set: Any) -> int:
    with state.cond:
        if state.event_sets.pop(pointer_value(event_set) or 0, None) is None:
            return INVALID_ARGUMENT
        state.cond.notify_all()
    return SUCCESS


@device_symbol()
def nvmlDeviceGetSupportedEventTypes(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    mask = SUPPORTED_EVENT_TYPES
    if dev.model.mig_supported:
        mask |= N.nvmlEventMigConfigChange
    out(ref).value = mask
    return SUCCESS


@device_symbol()
def nvmlDeviceRegisterEvents(state: SimState, dev: SimGpu, t: float, mask: Any, event_set: Any) -> int:
    wanted = as_int(mask)
    with state.cond:
        es = state.event_sets.get(pointer_value(event_set) or 0)
        if es is None:
            return INVALID_ARGUMENT
        already = es.registered.get(dev.index, 0)
        es.registered[dev.index] = already | wanted
        # Events before registration are not recorded (header); queue later XIDs in time order
        if wanted & N.nvmlEventTypeXidCriticalError and not already & N.nvmlEventTypeXidCriticalError:
            rest = es.pending[es.pos :] + state.xid_events_for(dev, t)
            es.pending = sorted(rest)
            es.pos = 0
        state.cond.notify_all()
    return SUCCESS


@system_symbol()
def nvmlEventSetWait_v2(state: SimState, event_set: Any, data_ref: Any, timeout_ms: Any) -> int:
    address = pointer_value(event_set) or 0
    deadline = time.monotonic() + as_int(timeout_ms) / 1000.0
    with state.cond:
        while True:
            if state.released or state.init_count <= 0:
                return UNINITIALIZED
            es = state.event_sets.get(address)
            if es is None:
                return INVALID_ARGUMENT
            next_at = es.pending[es.pos][0] if es.pos < len(es.pending) else None
            if next_at is not None and state.clock.monotonic() >= next_at:
                at, _seq, gpu_index, xid, pid = es.pending[es.pos]
                es.pos += 1
                if pid >= 0 and not state.process_alive(gpu_index, pid, at):
                    continue  # its process was restarted: the XID it caused stops
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return TIMEOUT
            state.wait_step(remaining, next_at)
    data = out(data_ref)
    write_pointer_field(data, "device", state.gpus[gpu_index].handle)
    data.eventType = N.nvmlEventTypeXidCriticalError
    data.eventData = xid
    data.gpuInstanceId = _NO_INSTANCE
    data.computeInstanceId = _NO_INSTANCE
    return SUCCESS
