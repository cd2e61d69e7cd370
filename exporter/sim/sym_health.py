"""Fake C functions: ECC, row remapping, retired pages and batched field values."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml as N

from exporter.sim.registry import INVALID_ARGUMENT, NOT_SUPPORTED, SUCCESS, as_int, device_symbol, out
from exporter.sim.runtime import Device, SimGpu, SimState
from exporter.sim.sym_device import threshold_celsius


@device_symbol()
def nvmlDeviceGetEccMode(state: SimState, dev: SimGpu, t: float, current: Any, pending: Any) -> int:
    out(current).value = N.NVML_FEATURE_ENABLED
    out(pending).value = N.NVML_FEATURE_ENABLED
    return SUCCESS


@device_symbol()
def nvmlDeviceGetTotalEccErrors(
    state: SimState, dev: SimGpu, t: float, error_type: Any, counter_type: Any, ref: Any
) -> int:
    kind = as_int(error_type)
    if kind not in (N.NVML_MEMORY_ERROR_TYPE_CORRECTED, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
        return INVALID_ARGUMENT
    if as_int(counter_type) not in (N.NVML_VOLATILE_ECC, N.NVML_AGGREGATE_ECC):
        return INVALID_ARGUMENT
    corrected, uncorrected = dev.ecc_counts(t)
    # Volatile and aggregate counts are the same: the scenario starts with a fresh board
    out(ref).value = corrected if kind == N.NVML_MEMORY_ERROR_TYPE_CORRECTED else uncorrected
    return SUCCESS


@device_symbol()
def nvmlDeviceGetRemappedRows(
    state: SimState, dev: SimGpu, t: float, corr: Any, unc: Any, pending: Any, failure: Any
) -> int:
    # Pre-Ampere boards retire pages instead; MIG mode with instances hides the remapper
    if not dev.model.row_remap_supported or dev.mig_devices:
        return NOT_SUPPORTED
    remap = dev.remap_state(t)
    out(corr).value = remap.correctable if remap else 0
    out(unc).value = remap.uncorrectable if remap else 0
    out(pending).value = int(remap.pending) if remap else 0
    out(failure).value = int(remap.failed) if remap else 0
    return SUCCESS


@device_symbol()
def nvmlDeviceGetRetiredPages(
    state: SimState, dev: SimGpu, t: float, cause: Any, count: Any, pages: Any
) -> int:
    if dev.model.row_remap_supported:
        return NOT_SUPPORTED
    # No pages retire in the simulation; the list is always empty
    out(count).value = 0
    return SUCCESS


@device_symbol()
def nvmlDeviceGetRetiredPagesPendingStatus(state: SimState, dev: SimGpu, t: float, ref: Any) -> int:
    if dev.model.row_remap_supported:
        return NOT_SUPPORTED
    out(ref).value = N.NVML_FEATURE_DISABLED
    return SUCCESS


# ---- field values --------------------------------------------------------------------------
_U = N.NVML_VALUE_TYPE_UNSIGNED_INT
_ULL = N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_SI = N.NVML_VALUE_TYPE_SIGNED_INT
_D = N.NVML_VALUE_TYPE_DOUBLE
_VALUE_ATTR = {_U: "uiVal", _ULL: "ullVal", _SI: "siVal", _D: "dVal"}

FieldReader = Callable[[SimGpu, float, int], tuple[int, float | int] | None]


def _remap_field(attr: str) -> FieldReader:
    def read(g: SimGpu, t: float, scope: int) -> tuple[int, float | int] | None:
        if not g.model.row_remap_supported:
            return None
        r = g.remap_state(t)
        return (_U, int(getattr(r, attr)) if r else 0)

    return read


def _retired_field(g: SimGpu, t: float, scope: int) -> tuple[int, float | int] | None:
    return None if g.model.row_remap_supported else (_ULL, 0)


def _tlimit(kind: int) -> FieldReader:
    # T.Limit fields count degrees left below the threshold
    def read(g: SimGpu, t: float, scope: int) -> tuple[int, float | int] | None:
        threshold = threshold_celsius(g, kind)
        if threshold is None:
            return None
        return (_SI, round(threshold - g.spec.temperature_celsius.at(t)))

    return read


def _reason_ns(bit: int) -> FieldReader:
    return lambda g, t, scope: (_ULL, g.clock_event_time_ns(bit, t))


def _nvlink_state(g: SimGpu, t: float, scope: int) -> tuple[int, float | int] | None:
    link = g.spec.nvlink
    if link is None or scope >= link.links:
        return None
    return (_U, 0 if scope in link.down_links else 1)


def _pcie_bytes(direction: str) -> FieldReader:
    # Cumulative byte counters: the scenario's rate curve integrated since t = 0
    def read(g: SimGpu, t: float, scope: int) -> tuple[int, float | int] | None:
        curve = g.spec.pcie_tx_bytes_per_second if direction == "tx" else g.spec.pcie_rx_bytes_per_second
        return (_ULL, int(curve.integral(0.0, max(t, 0.0))))

    return read


_ALL_LINKS = 0xFFFFFFFF


def _nvlink_kib(direction: str, overhead: float) -> FieldReader:
    # KiB since t = 0, split evenly over the links that are up; scopeId UINT_MAX sums them all
    def read(g: SimGpu, t: float, scope: int) -> tuple[int, float | int] | None:
        nv = g.spec.nvlink
        if nv is None:
            return None
        curve = g.spec.nvlink_tx_bytes_per_second if direction == "tx" else g.spec.nvlink_rx_bytes_per_second
        total = curve.integral(0.0, max(t, 0.0)) * overhead / 1024.0
        up = [link for link in range(nv.links) if link not in nv.down_links]
        if scope == _ALL_LINKS:
            return (_ULL, int(total))
        if scope >= nv.links:
            return None
        return (_ULL, int(total / len(up)) if scope in up else 0)

    return read


def _nvlink_errors(g: SimGpu, t: float, scope: int) -> tuple[int, float | int] | None:
    return None if g.spec.nvlink is None else (_ULL, 0)


def _recovery_action(g: SimGpu, t: float, scope: int) -> tuple[int, float | int] | None:
    r = g.remap_state(t) if g.model.row_remap_supported else None
    if r is not None and r.failed:
        return (_U, N.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT)
    if r is not None and r.pending:
        return (_U, N.NVML_GPU_RECOVERY_ACTION_GPU_RESET)
    return (_U, N.NVML_GPU_RECOVERY_ACTION_NONE)


FIELDS: dict[int, FieldReader] = {
    N.NVML_FI_DEV_ECC_CURRENT: lambda g, t, s: (_U, 1),
    N.NVML_FI_DEV_ECC_PENDING: lambda g, t, s: (_U, 1),
    N.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: lambda g, t, s: (_ULL, g.ecc_counts(t)[0]),
    N.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: lambda g, t, s: (_ULL, g.ecc_counts(t)[1]),
    N.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: lambda g, t, s: (_ULL, g.ecc_counts(t)[0]),
    N.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: lambda g, t, s: (_ULL, g.ecc_counts(t)[1]),
    N.NVML_FI_DEV_RETIRED_SBE: _retired_field,
    N.NVML_FI_DEV_RETIRED_DBE: _retired_field,
    N.NVML_FI_DEV_RETIRED_PENDING: _retired_field,
    N.NVML_FI_DEV_MEMORY_TEMP: lambda g, t, s: (_U, round(g.spec.memory_temperature_celsius.at(t))),
    N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: lambda g, t, s: (_ULL, g.energy_millijoules(t)),
    N.NVML_FI_DEV_ENERGY: lambda g, t, s: (_ULL, g.energy_millijoules(t)),
    N.NVML_FI_DEV_NVLINK_LINK_COUNT: lambda g, t, s: (_U, g.spec.nvlink.links if g.spec.nvlink else 0),
    N.NVML_FI_DEV_NVLINK_GET_STATE: _nvlink_state,
    N.NVML_FI_DEV_PCIE_REPLAY_COUNTER: lambda g, t, s: (_ULL, int(g.spec.pcie_replay_count.at(t))),
    N.NVML_FI_DEV_REMAPPED_COR: _remap_field("correctable"),
    N.NVML_FI_DEV_REMAPPED_UNC: _remap_field("uncorrectable"),
    N.NVML_FI_DEV_REMAPPED_PENDING: _remap_field("pending"),
    N.NVML_FI_DEV_REMAPPED_FAILURE: _remap_field("failed"),
    N.NVML_FI_DEV_POWER_AVERAGE: lambda g, t, s: (_U, round(g.spec.power_watts.mean(t - 1.0, t) * 1000)),
    N.NVML_FI_DEV_POWER_INSTANT: lambda g, t, s: (_U, round(g.spec.power_watts.at(t) * 1000)),
    N.NVML_FI_DEV_POWER_CURRENT_LIMIT: lambda g, t, s: (_U, round(g.model.power_limit_watts * 1000)),
    N.NVML_FI_DEV_POWER_DEFAULT_LIMIT: lambda g, t, s: (_U, round(g.model.power_limit_watts * 1000)),
    N.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT: _tlimit(N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
    N.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT: _tlimit(N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
    N.NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT: _tlimit(N.NVML_TEMPERATURE_THRESHOLD_MEM_MAX),
    N.NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT: _tlimit(N.NVML_TEMPERATURE_THRESHOLD_GPU_MAX),
    N.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP: _reason_ns(N.nvmlClocksEventReasonSwPowerCap),
    N.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST: _reason_ns(N.nvmlClocksEventReasonSyncBoost),
    N.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: _reason_ns(N.nvmlClocksEventReasonSwThermalSlowdown),
    N.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: _reason_ns(N.nvmlClocksEventReasonHwThermalSlowdown),
    N.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: _reason_ns(
        N.nvmlClocksEventReasonHwPowerBrakeSlowdown
    ),
    N.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: _recovery_action,
    N.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: _pcie_bytes("tx"),
    N.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: _pcie_bytes("rx"),
    N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: _nvlink_kib("tx", 1.0),
    N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: _nvlink_kib("rx", 1.0),
    N.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX: _nvlink_kib("tx", 1.08),
    N.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: _nvlink_kib("rx", 1.08),
    N.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: _nvlink_errors,
    N.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: _nvlink_errors,
    N.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: _nvlink_errors,
    N.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: _nvlink_errors,
    N.NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL: _nvlink_errors,
}


# Field IDs newer than some drivers: the branch that added them (NVML API reference, change log)
FIELD_MIN_DRIVER: dict[int, int] = {
    N.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: 555,
    N.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: 555,
}


def driver_branch(version: str) -> int:
    """The branch (major number) of a driver version such as "570.133.20"; 0 when unreadable."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


@device_symbol(mig=True)
def nvmlDeviceGetFieldValues(state: SimState, dev: Device, t: float, count: Any, values_ref: Any) -> int:
    n = as_int(count)
    if n < 0:
        return INVALID_ARGUMENT
    values = out(values_ref)
    stamp = state.epoch_us + int(t * 1e6)
    driver = driver_branch(state.scenario.driver_version)
    gpu = dev.gpu
    for i in range(n):
        fv = values[i]
        fv.timestamp = stamp
        fv.latencyUsec = 0
        reader = FIELDS.get(fv.fieldId)
        if driver < FIELD_MIN_DRIVER.get(fv.fieldId, 0):
            reader = None  # an older driver does not know the field
        # Fields on a MIG handle are not simulated; the real driver answers few of them there
        result = reader(gpu, t, fv.scopeId) if reader is not None and not dev.is_mig else None
        if result is None:
            fv.nvmlReturn = NOT_SUPPORTED
            continue
        vtype, value = result
        fv.valueType = vtype
        setattr(fv.value, _VALUE_ATTR[vtype], value)
        fv.nvmlReturn = SUCCESS
    return SUCCESS


@device_symbol()
def nvmlDeviceGetMemoryErrorCounter(
    state: SimState, dev: SimGpu, t: float, error_type: Any, counter_type: Any, location: Any, ref: Any
) -> int:
    kind = as_int(error_type)
    if kind not in (N.NVML_MEMORY_ERROR_TYPE_CORRECTED, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
        return INVALID_ARGUMENT
    # Every scenario ECC error is a DRAM error
    if as_int(location) != N.NVML_MEMORY_LOCATION_DRAM:
        out(ref).value = 0
        return SUCCESS
    corrected, uncorrected = dev.ecc_counts(t)
    out(ref).value = corrected if kind == N.NVML_MEMORY_ERROR_TYPE_CORRECTED else uncorrected
    return SUCCESS
