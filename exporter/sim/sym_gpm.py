"""Fake C functions: GPM sample buffers and metrics averaged from curves between two samples."""

from __future__ import annotations

from typing import Any

import pynvml as N

from exporter.sim.curve import Curve
from exporter.sim.registry import (
    INVALID_ARGUMENT,
    NOT_FOUND,
    NOT_SUPPORTED,
    SUCCESS,
    VERSION_MISMATCH,
    as_int,
    device_symbol,
    out,
    pointer_value,
    system_symbol,
    write_pointer,
)
from exporter.sim.runtime import GPM_SAMPLE_BASE, Device, GpmSampleState, SimGpu, SimMig, SimState

# The driver refreshes GPM counters every 100 ms; closer samples give per-metric errors
MIN_INTERVAL_SECONDS = 0.1

_MIB = 1024.0 * 1024.0
# metric id -> (curve source, scale from curve units to the metric's units)
_METRICS: dict[int, tuple[str, float]] = {
    N.NVML_GPM_METRIC_GRAPHICS_UTIL: ("graphics", 100.0),
    N.NVML_GPM_METRIC_SM_UTIL: ("sm_active", 100.0),
    N.NVML_GPM_METRIC_SM_OCCUPANCY: ("sm_occupancy", 100.0),
    N.NVML_GPM_METRIC_ANY_TENSOR_UTIL: ("tensor_active", 100.0),
    N.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: ("tensor_active", 100.0),
    N.NVML_GPM_METRIC_DRAM_BW_UTIL: ("dram_active", 100.0),
    N.NVML_GPM_METRIC_PCIE_TX_PER_SEC: ("pcie_tx", 1.0 / _MIB),
    N.NVML_GPM_METRIC_PCIE_RX_PER_SEC: ("pcie_rx", 1.0 / _MIB),
    N.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: ("nvlink_tx", 1.0 / _MIB),
    N.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: ("nvlink_rx", 1.0 / _MIB),
}


@device_symbol(mig=True)
def nvmlGpmQueryDeviceSupport(state: SimState, dev: Device, t: float, ref: Any) -> int:
    support = out(ref)
    if support.version != N.NVML_GPM_SUPPORT_VERSION:
        return VERSION_MISMATCH
    support.isSupportedDevice = int(dev.gpu.model.gpm_supported)
    return SUCCESS


@system_symbol()
def nvmlGpmSampleAlloc(state: SimState, ref: Any) -> int:
    with state.cond:
        address = GPM_SAMPLE_BASE + state.new_id() * 0x10
        state.gpm_samples[address] = None
    write_pointer(ref, address)
    return SUCCESS


@system_symbol()
def nvmlGpmSampleFree(state: SimState, sample: Any) -> int:
    with state.cond:
        if state.gpm_samples.pop(pointer_value(sample) or 0, "missing") == "missing":
            return INVALID_ARGUMENT
    return SUCCESS


def _store(state: SimState, sample: Any, record: GpmSampleState) -> int:
    address = pointer_value(sample) or 0
    with state.cond:
        if address not in state.gpm_samples:
            return INVALID_ARGUMENT
        state.gpm_samples[address] = record
    return SUCCESS


def _gpu_record(gpu: SimGpu, t: float) -> GpmSampleState:
    s = gpu.spec
    curves: dict[str, tuple[Curve, ...]] = {
        "graphics": (s.utilization,),
        "sm_active": (s.sm_active,),
        "sm_occupancy": (s.sm_occupancy,),
        "tensor_active": (s.tensor_active,),
        "dram_active": (s.dram_active,),
        "pcie_tx": (s.pcie_tx_bytes_per_second,),
        "pcie_rx": (s.pcie_rx_bytes_per_second,),
    }
    if s.nvlink is not None:
        curves["nvlink_tx"] = (s.nvlink_tx_bytes_per_second,)
        curves["nvlink_rx"] = (s.nvlink_rx_bytes_per_second,)
    return GpmSampleState((gpu.index, None), t, curves)


def _mig_record(gpu: SimGpu, gi: int, migs: list[SimMig], t: float) -> GpmSampleState:
    # Per-instance PCIe and NVLink traffic is not simulated: those metrics answer NOT_SUPPORTED
    specs = [m.spec for m in migs]
    sm = tuple(s.sm_active for s in specs)
    curves = {
        "graphics": sm,
        "sm_active": sm,
        "sm_occupancy": tuple(s.sm_occupancy for s in specs),
        "tensor_active": tuple(s.tensor_active for s in specs),
        "dram_active": tuple(s.dram_active for s in specs),
    }
    return GpmSampleState((gpu.index, gi), t, curves)


@device_symbol(mig=True)
def nvmlGpmSampleGet(state: SimState, dev: Device, t: float, sample: Any) -> int:
    gpu = dev.gpu
    if not gpu.model.gpm_supported:
        return NOT_SUPPORTED
    if isinstance(dev, SimMig):
        gi = dev.spec.gpu_instance_id
        return _store(state, sample, _mig_record(gpu, gi, [dev], t))
    return _store(state, sample, _gpu_record(gpu, t))


@device_symbol()
def nvmlGpmMigSampleGet(state: SimState, dev: SimGpu, t: float, gpu_instance_id: Any, sample: Any) -> int:
    if not dev.model.gpm_supported:
        return NOT_SUPPORTED
    if not dev.mig_devices:
        return INVALID_ARGUMENT
    gi = as_int(gpu_instance_id)
    # A GPU instance's metrics are the mean over its compute instances
    migs = [m for m in dev.mig_devices if m.spec.gpu_instance_id == gi]
    if not migs:
        return NOT_FOUND
    return _store(state, sample, _mig_record(dev, gi, migs, t))


def _mean(curves: tuple[Curve, ...], t0: float, t1: float) -> float:
    return sum(c.mean(t0, t1) for c in curves) / len(curves)


@system_symbol()
def nvmlGpmMetricsGet(state: SimState, ref: Any) -> int:
    mg = out(ref)
    if mg.version != N.NVML_GPM_METRICS_GET_VERSION:
        return VERSION_MISMATCH
    if not 0 <= mg.numMetrics <= N.NVML_GPM_METRIC_MAX:
        return INVALID_ARGUMENT
    with state.cond:
        first = state.gpm_samples.get(pointer_value(mg.sample1) or 0)
        second = state.gpm_samples.get(pointer_value(mg.sample2) or 0)
    if first is None or second is None or first.owner != second.owner:
        return INVALID_ARGUMENT
    t0, t1 = first.t, second.t
    too_close = t1 - t0 < MIN_INTERVAL_SECONDS
    for i in range(mg.numMetrics):
        metric = mg.metrics[i]
        source, scale = _METRICS.get(metric.metricId, ("", 0.0))
        curves = second.curves.get(source)
        if too_close:
            metric.nvmlReturn = INVALID_ARGUMENT
        elif not curves:
            metric.nvmlReturn = NOT_SUPPORTED
        else:
            metric.value = scale * _mean(curves, t0, t1)
            metric.nvmlReturn = SUCCESS
    return SUCCESS
