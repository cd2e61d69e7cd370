"""Fake C functions: identity, memory, utilization, thermals, power, clocks and PCIe of a device."""

from __future__ import annotations

from typing import Any

import pynvml as N

from exporter.sim.registry import (
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    SUCCESS,
    VERSION_MISMATCH,
    as_int,
    device_symbol,
    out,
    write_string,
)
from exporter.sim.runtime import Device, SimGpu, SimMig, SimState

_MHZ = 1e6


@device_symbol(mig=True)
def nvmlDeviceGetUUID(state: SimState, dev: Device, t: float, buf: Any, size: Any) -> int:
    return write_string(buf, size, dev.spec.uuid)


@device_symbol(mig=True)
def nvmlDeviceGetName(state: SimState, dev: Device, t: float, buf: Any, size: Any) -> int:
    if isinstance(dev, SimMig):
        return write_string(buf, size, f"{dev.gpu.model.name} MIG {dev.spec.profile}")
    return write_string(buf, size, dev.gpu.model.name)


@device_symbol()
def nvmlDeviceGetIndex(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    out(ref).value = dev.index
    return SUCCESS


@device_symbol()
def nvmlDeviceGetMinorNumber(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    out(ref).value = dev.index
    return SUCCESS


@device_symbol()
def nvmlDeviceGetSerial(state: SimState, dev: SimGpu, t: float, buf: Any, size: Any) -> int:
    return write_string(buf, size, dev.spec.serial)


@device_symbol()
def nvmlDeviceGetVbiosVersion(state: SimState, dev: SimGpu, t: float, buf: Any, size: Any) -> int:
    return write_string(buf, size, dev.spec.vbios_version)


def fill_pci_info(info: Any, bus_id: str, device_id: int) -> None:
    """Fill an nvmlPciInfo_t from a bus id like 00000000:18:00.0."""
    domain, bus, rest = bus_id.split(":")
    dev_no, _func = rest.split(".")
    info.busId = bus_id.encode()
    info.busIdLegacy = f"{domain[-4:]}:{bus}:{rest}".encode()
    info.domain = int(domain, 16)
    info.bus = int(bus, 16)
    info.device = int(dev_no, 16)
    info.pciDeviceId = device_id
    info.pciSubSystemId = 0x16C110DE


@device_symbol("nvmlDeviceGetPciInfo_v2")
def nvmlDeviceGetPciInfo_v3(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    fill_pci_info(out(ref), dev.spec.pci_bus_id, dev.model.pci_device_id)
    return SUCCESS


@device_symbol(mig=True)
def nvmlDeviceGetArchitecture(state: SimState, dev: Device, t: float, ref: Any) -> int:
    out(ref).value = dev.gpu.model.architecture
    return SUCCESS


@device_symbol(mig=True)
def nvmlDeviceGetCudaComputeCapability(state: SimState, dev: Device, t: float, major: Any, minor: Any) -> int:
    out(major).value, out(minor).value = dev.gpu.model.compute_capability
    return SUCCESS


@device_symbol()
def nvmlDeviceGetPersistenceMode(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    out(ref).value = N.NVML_FEATURE_ENABLED
    return SUCCESS


def _memory(dev: Device, t: float) -> tuple[int, int, int, int]:
    """(total, reserved, free, used) with total == reserved + free + used."""
    if isinstance(dev, SimMig):
        total = dev.spec.memory_total_bytes
        used = dev.memory_used_bytes(t)
        return total, 0, total - used, used
    model = dev.model
    used = dev.memory_used_bytes(t)
    reserved = model.memory_reserved_bytes
    return model.memory_total_bytes, reserved, model.memory_total_bytes - reserved - used, used


@device_symbol(mig=True)
def nvmlDeviceGetMemoryInfo(state: SimState, dev: Device, t: float, ref: Any) -> int:
    total, reserved, free, used = _memory(dev, t)
    mem = out(ref)
    # v1 `used` lumps the reserved memory in, as drivers >= 510 do
    mem.total, mem.free, mem.used = total, free, used + reserved
    return SUCCESS


@device_symbol(mig=True)
def nvmlDeviceGetMemoryInfo_v2(state: SimState, dev: Device, t: float, ref: Any) -> int:
    mem = out(ref)
    if mem.version != N.nvmlMemory_v2:
        return VERSION_MISMATCH
    mem.total, mem.reserved, mem.free, mem.used = _memory(dev, t)
    return SUCCESS


@device_symbol()
def nvmlDeviceGetUtilizationRates(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    if dev.mig_enabled:
        return NOT_SUPPORTED
    util = out(ref)
    util.gpu = round(dev.spec.utilization.at(t) * 100)
    util.memory = round(dev.spec.memory_utilization.at(t) * 100)
    return SUCCESS


@device_symbol()
def nvmlDeviceGetTemperature(state: SimState, dev: SimGpu, t: float, sensor: Any, ref: Any) -> int:
    if as_int(sensor) != N.NVML_TEMPERATURE_GPU:
        return INVALID_ARGUMENT
    out(ref).value = max(0, round(dev.spec.temperature_celsius.at(t)))
    return SUCCESS


@device_symbol()
def nvmlDeviceGetTemperatureV(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    temp = out(ref)
    if temp.version != N.nvmlTemperature_v1:
        return VERSION_MISMATCH
    if temp.sensorType != N.NVML_TEMPERATURE_GPU:
        return INVALID_ARGUMENT
    temp.temperature = round(dev.spec.temperature_celsius.at(t))
    return SUCCESS


def threshold_celsius(dev: SimGpu, kind: int) -> int | None:
    """A temperature threshold of the model, None when NVML has none of that kind."""
    m = dev.model
    return {
        N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: m.shutdown_temperature_celsius,
        N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: m.slowdown_temperature_celsius,
        N.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: m.memory_max_temperature_celsius,
        N.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: m.gpu_max_temperature_celsius,
    }.get(kind)


@device_symbol()
def nvmlDeviceGetTemperatureThreshold(state: SimState, dev: SimGpu, t: float, kind: Any, ref: Any) -> int:
    value = threshold_celsius(dev, as_int(kind))
    if value is None:
        return NOT_SUPPORTED
    out(ref).value = value
    return SUCCESS


@device_symbol()
def nvmlDeviceGetMarginTemperature(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    margin = out(ref)
    if margin.version != N.nvmlMarginTemperature_v1:
        return VERSION_MISMATCH
    margin.marginTemperature = round(
        dev.model.slowdown_temperature_celsius - dev.spec.temperature_celsius.at(t)
    )
    return SUCCESS


@device_symbol()
def nvmlDeviceGetPowerUsage(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    out(ref).value = round(dev.spec.power_watts.at(t) * 1000)
    return SUCCESS


def _limit_mw(dev: SimGpu) -> int:
    return round(dev.model.power_limit_watts * 1000)


@device_symbol("nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetPowerManagementDefaultLimit")
def nvmlDeviceGetEnforcedPowerLimit(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    out(ref).value = _limit_mw(dev)
    return SUCCESS


@device_symbol()
def nvmlDeviceGetPowerManagementLimitConstraints(
    state: SimState, dev: SimGpu, t: float, low: Any, high: Any
) -> int:
    out(low).value = _limit_mw(dev) // 3
    out(high).value = _limit_mw(dev)
    return SUCCESS


@device_symbol()
def nvmlDeviceGetTotalEnergyConsumption(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    out(ref).value = dev.energy_millijoules(t)
    return SUCCESS


def clock_mhz(dev: SimGpu, kind: int, t: float) -> int | None:
    """Current clock of one NVML clock type in MHz."""
    spec = dev.spec
    if kind in (N.NVML_CLOCK_GRAPHICS, N.NVML_CLOCK_SM):
        return round(spec.sm_clock_hertz.at(t) / _MHZ)
    if kind == N.NVML_CLOCK_MEM:
        return round(spec.memory_clock_hertz.at(t) / _MHZ)
    if kind == N.NVML_CLOCK_VIDEO:
        return round(spec.sm_clock_hertz.at(t) * 0.9 / _MHZ)
    return None


@device_symbol()
def nvmlDeviceGetClockInfo(state: SimState, dev: SimGpu, t: float, kind: Any, ref: Any) -> int:
    value = clock_mhz(dev, as_int(kind), t)
    if value is None:
        return INVALID_ARGUMENT
    out(ref).value = value
    return SUCCESS


@device_symbol()
def nvmlDeviceGetMaxClockInfo(state: SimState, dev: SimGpu, t: float, kind: Any, ref: Any) -> int:
    k = as_int(kind)
    m = dev.model
    values = {
        N.NVML_CLOCK_GRAPHICS: m.sm_clock_max_hertz,
        N.NVML_CLOCK_SM: m.sm_clock_max_hertz,
        N.NVML_CLOCK_MEM: m.memory_clock_max_hertz,
        N.NVML_CLOCK_VIDEO: m.sm_clock_max_hertz * 0.9,
    }
    if k not in values:
        return INVALID_ARGUMENT
    out(ref).value = round(values[k] / _MHZ)
    return SUCCESS


@device_symbol("nvmlDeviceGetCurrentClocksThrottleReasons")
def nvmlDeviceGetCurrentClocksEventReasons(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    out(ref).value = dev.clock_event_mask(t)
    return SUCCESS


@device_symbol("nvmlDeviceGetSupportedClocksThrottleReasons")
def nvmlDeviceGetSupportedClocksEventReasons(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    out(ref).value = N.nvmlClocksEventReasonAll
    return SUCCESS


@device_symbol("nvmlDeviceGetPowerState")
def nvmlDeviceGetPerformanceState(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    out(ref).value = N.NVML_PSTATE_0 if dev.spec.utilization.at(t) > 0.0 else N.NVML_PSTATE_8
    return SUCCESS


@device_symbol()
def nvmlDeviceGetCurrPcieLinkGeneration(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    out(ref).value = round(dev.spec.pcie_link_generation.at(t))
    return SUCCESS


@device_symbol("nvmlDeviceGetGpuMaxPcieLinkGeneration")
def nvmlDeviceGetMaxPcieLinkGeneration(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    out(ref).value = dev.model.pcie_generation_max
    return SUCCESS


@device_symbol()
def nvmlDeviceGetCurrPcieLinkWidth(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    out(ref).value = round(dev.spec.pcie_link_width.at(t))
    return SUCCESS


@device_symbol()
def nvmlDeviceGetMaxPcieLinkWidth(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    out(ref).value = dev.model.pcie_width_max
    return SUCCESS


@device_symbol()
def nvmlDeviceGetPcieReplayCounter(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    out(ref).value = int(dev.spec.pcie_replay_count.at(t))
    return SUCCESS


_PCIE_SAMPLE_SECONDS = 0.02  # nvml.h: the driver reads a byte counter over a 20 ms interval


@device_symbol()
def nvmlDeviceGetPcieThroughput(state: SimState, dev: SimGpu, t: float, counter: Any, ref: Any) -> int:
    # KB/s with 1 KB granularity (nvmlPcieUtilCounter_t); the real call blocks for the 20 ms it samples
    kind = as_int(counter)
    if kind == N.NVML_PCIE_UTIL_TX_BYTES:
        curve = dev.spec.pcie_tx_bytes_per_second
    elif kind == N.NVML_PCIE_UTIL_RX_BYTES:
        curve = dev.spec.pcie_rx_bytes_per_second
    else:
        return INVALID_ARGUMENT
    out(ref).value = int(curve.mean(t - _PCIE_SAMPLE_SECONDS, t) / 1024.0)
    return SUCCESS


@device_symbol("nvmlDeviceGetFanSpeed_v2", "nvmlDeviceGetNumFans")
def nvmlDeviceGetFanSpeed(state: SimState, dev: SimGpu, t: float, *args: Any) -> int:
    # Data-center boards in the model table are passively cooled
    return NOT_SUPPORTED


@device_symbol(mig=True)
def nvmlDeviceGetBAR1MemoryInfo(state: SimState, dev: Device, t: float, ref: Any) -> int:
    bar1 = out(ref)
    # Data-center boards map the whole frame buffer through BAR1; a little of it is in use
    total = dev.gpu.model.memory_total_bytes + 2 * 1024 * 1024 * 1024
    used = 64 * 1024 * 1024
    bar1.bar1Total, bar1.bar1Free, bar1.bar1Used = total, total - used, used
    return SUCCESS


@device_symbol()
def nvmlDeviceGetComputeMode(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    out(ref).value = N.NVML_COMPUTEMODE_DEFAULT
    return SUCCESS


@device_symbol()
def nvmlDeviceGetBrand(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    # Boards named "Tesla ..." report the Tesla brand; newer data-center boards report NVIDIA
    out(ref).value = N.NVML_BRAND_TESLA if dev.model.name.startswith("Tesla") else N.NVML_BRAND_NVIDIA
    return SUCCESS


@device_symbol("nvmlDeviceGetDecoderUtilization")
def nvmlDeviceGetEncoderUtilization(state: SimState, dev: SimGpu, t: float, util: Any, period: Any) -> int:
    if dev.mig_enabled:
        return NOT_SUPPORTED
    # No media engine work in any scenario
    out(util).value = 0
    out(period).value = 167_000
    return SUCCESS
