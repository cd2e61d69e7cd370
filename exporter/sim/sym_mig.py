"""Fake C functions: MIG mode, MIG device enumeration and instance ids."""

from __future__ import annotations

from typing import Any

from exporter.sim.registry import (
    INVALID_ARGUMENT,
    NOT_FOUND,
    NOT_SUPPORTED,
    SUCCESS,
    as_int,
    device_symbol,
    out,
    write_pointer,
)
from exporter.sim.runtime import Device, SimGpu, SimMig, SimState


@device_symbol()
def nvmlDeviceGetMigMode(state: SimState, dev: SimGpu, t: float, current: Any, pending: Any) -> int:
    if not dev.model.mig_supported:
        return NOT_SUPPORTED
    out(current).value = out(pending).value = int(dev.mig_enabled)
    return SUCCESS


@device_symbol()
def nvmlDeviceGetMaxMigDeviceCount(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    out(ref).value = dev.model.mig_max_devices if dev.mig_enabled else 0
    return SUCCESS


@device_symbol()
def nvmlDeviceGetMigDeviceHandleByIndex(state: SimState, dev: SimGpu, t: float, index: Any, ref: Any) -> int:
    if not dev.mig_enabled:
        return NOT_SUPPORTED
    i = as_int(index)
    if not 0 <= i < dev.model.mig_max_devices:
        return INVALID_ARGUMENT
    if i >= len(dev.mig_devices):
        return NOT_FOUND
    write_pointer(ref, dev.mig_devices[i].handle)
    return SUCCESS


@device_symbol(mig=True)
def nvmlDeviceIsMigDeviceHandle(state: SimState, dev: Device, t: float, ref: Any) -> int:
    out(ref).value = int(dev.is_mig)
    return SUCCESS


@device_symbol(mig=True)
def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(state: SimState, dev: Device, t: float, ref: Any) -> int:
    if not dev.is_mig:
        return INVALID_ARGUMENT
    write_pointer(ref, dev.gpu.handle)
    return SUCCESS


@device_symbol(mig=True)
def nvmlDeviceGetGpuInstanceId(state: SimState, dev: Device, t: float, ref: Any) -> int:
    if not isinstance(dev, SimMig):
        return INVALID_ARGUMENT
    out(ref).value = dev.spec.gpu_instance_id
    return SUCCESS


@device_symbol(mig=True)
def nvmlDeviceGetComputeInstanceId(state: SimState, dev: Device, t: float, ref: Any) -> int:
    if not isinstance(dev, SimMig):
        return INVALID_ARGUMENT
    out(ref).value = dev.spec.compute_instance_id
    return SUCCESS


# Streaming multiprocessors of the full board, by GPU generation (for MIG attributes)
_SM_COUNT = {7: 108, 9: 132, 10: 148}


@device_symbol(mig=True)
def nvmlDeviceGetAttributes_v2(state: SimState, dev: Device, t: float, ref: Any) -> int:
    # The header: "currently only supports MIG device handles"
    if not isinstance(dev, SimMig):
        return NOT_SUPPORTED
    model = dev.gpu.model
    profile = next(p for p in model.mig_profiles if p.name == dev.spec.profile)
    attrs = out(ref)
    attrs.multiprocessorCount = _SM_COUNT.get(model.architecture, 98) * profile.slices // 7
    attrs.sharedCopyEngineCount = max(1, profile.slices)
    attrs.sharedDecoderCount = profile.slices // 2
    attrs.sharedEncoderCount = 0
    attrs.sharedJpegCount = 1 if profile.slices == 7 else 0
    attrs.sharedOfaCount = 1 if profile.slices == 7 else 0
    attrs.gpuInstanceSliceCount = profile.slices
    attrs.computeInstanceSliceCount = profile.slices
    attrs.memorySizeMB = dev.spec.memory_total_bytes // (1024 * 1024)
    return SUCCESS
