"""The one seam to NVML: the only module that imports pynvml.

Everything above this module receives plain dataclasses. Blocking NVML calls run off the event loop
with a deadline per GPU: a tick's calls GPU after GPU on a RoundRunner thread, and on each GPU's own
daemon thread (GpuWorker) once one GPU hangs or is slow; XID events arrive from one dedicated thread
(XidWatcher). The simulated NVML replaces pynvml's C function lookups, so this code runs in tests.

Why one module of ~900 lines: it is the seam itself, the only importer of pynvml (a boundary test
holds that). Its sections (error classification, readings, MIG, GPM, init and enumeration, the
per-GPU worker, the XID thread) each translate pynvml for the layers above; splitting them would
make several modules import pynvml and widen the seam the simulation has to cover.
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib.metadata
import logging
import math
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, TypeVar

import pynvml

from exporter.errors import (
    DeadlineExceededError,
    GpuLostError,
    GpuStaleError,
    NotSupportedError,
    NvmlError,
    NvmlInitError,
    NvmlUnavailableError,
    NvmlUnknownError,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
Monotonic = Callable[[], float]


def _binding_version() -> str:
    try:
        return importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - pynvml installed another way
        return "unknown"


# The installed nvidia-ml-py (a range in pyproject.toml, pinned by requirements.lock).
BINDING_VERSION: Final = _binding_version()


# --- errors -------------------------------------------------------------------------------------


_NOT_SUPPORTED_CODES = {
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_NO_PERMISSION,
}
_UNAVAILABLE_CODES = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
}


def classify(exc: BaseException, call: str = "") -> Exception:
    """Map a pynvml exception to ours; anything else is returned unchanged."""
    if isinstance(exc, pynvml.NVMLLibraryMismatchError):
        return NotSupportedError(f"{call}: {exc}")
    if not isinstance(exc, pynvml.NVMLError):
        return exc if isinstance(exc, Exception) else RuntimeError(str(exc))
    code = int(exc.value)
    message = f"{call}: {_error_text(exc)}"
    if code == pynvml.NVML_ERROR_GPU_IS_LOST:
        return GpuLostError(message, code)
    if code in _NOT_SUPPORTED_CODES:
        return NotSupportedError(message, code)
    if code == pynvml.NVML_ERROR_UNKNOWN:
        return NvmlUnknownError(message, code)
    if code in _UNAVAILABLE_CODES:
        return NvmlUnavailableError(message, code)
    return NvmlError(message, code)


def _error_text(exc: Any) -> str:
    try:
        return str(exc)
    except Exception:  # str() calls nvmlErrorString, which needs the library
        return f"NVML error {exc.value}"


def call(fn: Callable[..., T], *args: Any) -> T:
    """Run one pynvml function, raising our error types."""
    try:
        return fn(*args)
    except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as exc:
        raise classify(exc, getattr(fn, "__name__", "nvml")) from None


# --- data ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuStatic:
    """Facts read once at startup."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    vbios_version: str
    mig_enabled: bool
    slowdown_temperature_celsius: float | None
    shutdown_temperature_celsius: float | None
    pcie_generation_max: int | None
    pcie_width_max: int | None
    gpm_supported: bool


class MemoryInfo(NamedTuple):
    """A GPU's (or MIG instance's) memory (a tuple: one per GPU per tick, made cheaply)."""

    total_bytes: int
    used_bytes: int
    free_bytes: int
    reserved_bytes: int | None  # None on drivers without memory v2


class DeviceReading(NamedTuple):
    """One sample of a GPU's dynamic state; None means absent on this GPU or this round (a tuple, made
    once per GPU per tick: a frozen dataclass of 13 fields cost three times as much to build)."""

    memory: MemoryInfo | None = None
    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    thermal_margin_celsius: float | None = None
    power_watts: float | None = None
    energy_joules: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    clock_event_reasons: int | None = None
    performance_state: int | None = None
    fan_speed_ratio: float | None = None


@dataclass(frozen=True)
class HealthReading:
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    remapped_correctable: int | None = None
    remapped_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None


class ProcessReading(NamedTuple):
    """One process NVML lists on a GPU (a tuple: ~64 per node per tick, made cheaply)."""

    pid: int
    used_memory_bytes: int | None
    mig_uuid: str = ""


@dataclass(frozen=True)
class NvLinkState:
    link: int
    up: bool
    remote_is_switch: bool
    remote_pci_bus_id: str | None


@dataclass(frozen=True)
class MigInstance:
    mig_uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    memory: MemoryInfo | None


# Clock event reason label -> bit, in the order of the metric contract.
CLOCK_EVENT_REASONS: Final[tuple[tuple[str, int], ...]] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)

GPM_METRICS: Final[dict[str, int]] = {
    "sm_active": pynvml.NVML_GPM_METRIC_SM_UTIL,
    "sm_occupancy": pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    "tensor_active": pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    "dram_active": pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
}
# Device-level GPM traffic rates, in MiB/s (nvml.h); GPU instances have no per-instance PCIe/NVLink
GPM_RATE_METRICS: Final[dict[str, int]] = {
    "pcie_tx": pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
    "pcie_rx": pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
    "nvlink_tx": pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
    "nvlink_rx": pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
}
GPM_MIN_INTERVAL_SECONDS: Final = 0.1  # nvml.h: the two samples must be more than 100 ms apart
_MIB: Final = 1024.0 * 1024.0


# --- a device and its per-call bookkeeping -------------------------------------------------------
@dataclass
class Device:
    """A GPU handle plus what we learned about it; touched only from its own GpuWorker thread."""

    static: GpuStatic
    handle: Any
    absent: set[str] = field(default_factory=set)
    last_process_sample_us: int = 0
    gpm: GpmSampler | None = None
    mig_gpm: dict[int, GpmSampler] = field(default_factory=dict)
    nvlink_count: int | None = None
    nvlink_remote: dict[int, tuple[bool, str | None]] = field(default_factory=dict)  # link -> (switch, bus)
    nvlink_states: dict[tuple[int, bool], NvLinkState] = field(default_factory=dict)  # (link, up) -> state
    # "pcie" / "nvlink" -> (field timestamp in µs, tx, rx): the previous traffic counter reading
    counters: dict[str, tuple[int, float | None, float | None]] = field(default_factory=dict)
    # the process listings' C buffers, kept between ticks (see _ProcessBuffer)
    buffers: dict[str, Any] = field(default_factory=dict)
    # C function pointers by symbol, looked up once per GPU (the driver's, or the simulation's)
    functions: dict[str, Any] = field(default_factory=dict)

    def optional(self, key: str, fn: Callable[..., T], *args: Any) -> T | None:
        """Call fn; None when the feature is absent (remembered) or failed this round. Lost GPUs raise."""
        if key in self.absent:
            return None
        try:
            return fn(*args)  # not through call(): this runs ~40 times per GPU per tick
        except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as raw:
            self._failed(key, classify(raw, getattr(fn, "__name__", "nvml")))
        return None

    def c_call(self, key: str, symbol: str, *args: Any) -> bool:
        """Call C function `symbol` on this GPU's handle with outputs the caller keeps; False when the
        feature is absent (remembered) or failed this round, as `optional`. Lost GPUs raise."""
        if key in self.absent:
            return False
        fn = self.functions.get(symbol)
        try:
            if fn is None:
                fn = self.functions[symbol] = pynvml._nvmlGetFunctionPointer(symbol)
            ret = fn(self.handle, *args)
            if ret == _SUCCESS:
                return True
            raise pynvml.NVMLError(ret)
        except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as raw:
            self._failed(key, classify(raw, symbol))
        return False

    def c_check(self, symbol: str, *args: Any) -> None:
        """Call C function `symbol` as c_call does, raising our error types (as call() does)."""
        fn = self.functions.get(symbol)
        try:
            if fn is None:
                fn = self.functions[symbol] = pynvml._nvmlGetFunctionPointer(symbol)
            ret = fn(self.handle, *args)
            if ret != _SUCCESS:
                raise pynvml.NVMLError(ret)
        except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as raw:
            raise classify(raw, symbol) from None

    def _failed(self, key: str, exc: Exception) -> None:
        if isinstance(exc, NotSupportedError):
            self.absent.add(key)
        elif isinstance(exc, GpuLostError):
            raise exc from None
        elif isinstance(exc, NvmlError):
            log.debug("gpu %s: %s failed: %s", self.static.index, key, exc)
        else:
            raise exc from None


_SUCCESS: Final = pynvml.NVML_SUCCESS
_FIELD_VALUE_ATTRS: Final = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


def _field_value(fv: Any) -> float | None:
    if fv.nvmlReturn != pynvml.NVML_SUCCESS:
        return None
    attr = _FIELD_VALUE_ATTRS.get(fv.valueType)
    return float(getattr(fv.value, attr)) if attr else None


def _memory(dev: Device, handle: Any, key: str) -> MemoryInfo | None:
    if key + ":v2" not in dev.absent:
        try:
            m = call(pynvml.nvmlDeviceGetMemoryInfo, handle, pynvml.nvmlMemory_v2)
            return MemoryInfo(int(m.total), int(m.used), int(m.free), int(m.reserved))
        except NotSupportedError:
            dev.absent.add(key + ":v2")  # driver < 510: fall back to v1 (used includes reserved)
    m1 = dev.optional(key, pynvml.nvmlDeviceGetMemoryInfo, handle)
    return None if m1 is None else MemoryInfo(int(m1.total), int(m1.used), int(m1.free), None)


class SlowDeviceReading(NamedTuple):
    """Device fields that change rarely, read on the slow tier (power limit, PCIe link, replays)."""

    power_limit_watts: float | None = None
    pcie_generation: int | None = None
    pcie_width: int | None = None
    pcie_replays: int | None = None


def read_device_slow(dev: Device) -> SlowDeviceReading:
    """The slow-tier device fields (runs on the GPU's worker thread)."""
    h, opt = dev.handle, dev.optional
    limit = opt("powerlimit", pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
    return SlowDeviceReading(
        power_limit_watts=None if limit is None else limit / 1000.0,
        pcie_generation=_int(opt("pciegen", pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h)),
        pcie_width=_int(opt("pciewidth", pynvml.nvmlDeviceGetCurrPcieLinkWidth, h)),
        pcie_replays=_int(opt("replay", pynvml.nvmlDeviceGetPcieReplayCounter, h)),
    )


def _plain(structure: type[ctypes.Structure]) -> type[ctypes.Structure]:
    """pynvml's structure layout without its Python-level __getattribute__/__setattr__, which convert
    strings on every field access: for reading the fields of an output through a view of its memory."""
    return type(structure.__name__ + "View", (ctypes.Structure,), {"_fields_": structure._fields_})


_UtilizationView = _plain(pynvml.c_nvmlUtilization_t)
_TemperatureView = _plain(pynvml.c_nvmlTemperature_v1_t)
_MarginView = _plain(pynvml.c_nvmlMarginTemperature_v1_t)
_MemoryView = _plain(pynvml.c_nvmlMemory_v2_t)
_FieldValueView = _plain(pynvml.c_nvmlFieldValue_t)


class _DeviceOutputs:
    """read_device's C arguments and outputs for one GPU, made once: a tick passes the same objects.

    pynvml's wrapper of each getter allocates its output, looks up the function and checks the return
    code around the one C call; the driver writes every output on success, so reusing them is safe.
    The outputs the driver writes are pynvml's own structures (the simulation writes them as it writes
    the wrappers' ones); read_device reads them through plain views of the same memory.
    """

    def __init__(self) -> None:
        byref = ctypes.byref
        util = pynvml.c_nvmlUtilization_t()
        self.util: Any = _UtilizationView.from_buffer(util)
        self.util_ref = byref(util)
        temp = pynvml.c_nvmlTemperature_v1_t()
        temp.version = pynvml.nvmlTemperature_v1
        temp.sensorType = pynvml.NVML_TEMPERATURE_GPU
        self.temp: Any = _TemperatureView.from_buffer(temp)
        self.temp_ref = byref(temp)
        self.sensor = ctypes.c_uint(pynvml.NVML_TEMPERATURE_GPU)
        self.temp_v1 = ctypes.c_uint()  # nvmlDeviceGetTemperature, for drivers without the V call
        self.temp_v1_ref = byref(self.temp_v1)
        fields = (pynvml.c_nvmlFieldValue_t * 1)()
        fields[0].fieldId = pynvml.NVML_FI_DEV_MEMORY_TEMP
        self.field: Any = _FieldValueView.from_buffer(fields)
        self.fields_ref = byref(fields)
        self.field_count = ctypes.c_int32(1)
        self.power = ctypes.c_uint()
        self.power_ref = byref(self.power)
        self.energy = ctypes.c_uint64()
        self.energy_ref = byref(self.energy)
        self.sm_kind = ctypes.c_uint(pynvml.NVML_CLOCK_SM)
        self.sm_clock = ctypes.c_uint()
        self.sm_clock_ref = byref(self.sm_clock)
        self.mem_kind = ctypes.c_uint(pynvml.NVML_CLOCK_MEM)
        self.mem_clock = ctypes.c_uint()
        self.mem_clock_ref = byref(self.mem_clock)
        self.fan = ctypes.c_uint()
        self.fan_ref = byref(self.fan)
        self.pstate = ctypes.c_uint()
        self.pstate_ref = byref(self.pstate)
        margin = pynvml.c_nvmlMarginTemperature_v1_t()
        margin.version = pynvml.nvmlMarginTemperature_v1
        self.margin: Any = _MarginView.from_buffer(margin)
        self.margin_ref = byref(margin)
        self.reasons = ctypes.c_ulonglong()
        self.reasons_ref = byref(self.reasons)
        memory = pynvml.c_nvmlMemory_v2_t()
        memory.version = pynvml.nvmlMemory_v2
        self.memory: Any = _MemoryView.from_buffer(memory)
        self.memory_ref = byref(memory)


def _device_outputs(dev: Device) -> _DeviceOutputs:
    found = dev.buffers.get("device")
    if found is None:
        found = dev.buffers["device"] = _DeviceOutputs()
    return found


def read_device(dev: Device) -> DeviceReading:
    """Sample a GPU's fast-changing state (runs on the GPU's worker thread); see read_device_slow."""
    o, c = _device_outputs(dev), dev.c_call
    util = None
    if not dev.static.mig_enabled and c("util", "nvmlDeviceGetUtilizationRates", o.util_ref):
        util = o.util
    temp: float | None = None
    if c("tempv", "nvmlDeviceGetTemperatureV", o.temp_ref):
        temp = float(o.temp.temperature)
    elif "tempv" in dev.absent and c("temp", "nvmlDeviceGetTemperature", o.sensor, o.temp_v1_ref):
        temp = float(o.temp_v1.value)
    mem_temp = None
    if c("memtemp", "nvmlDeviceGetFieldValues", o.field_count, o.fields_ref):
        mem_temp = _field_value(o.field)
    power = o.power.value if c("power", "nvmlDeviceGetPowerUsage", o.power_ref) else None
    energy = o.energy.value if c("energy", "nvmlDeviceGetTotalEnergyConsumption", o.energy_ref) else None
    sm_clock = o.sm_clock.value if c("smclock", "nvmlDeviceGetClockInfo", o.sm_kind, o.sm_clock_ref) else None
    mem_clock = (
        o.mem_clock.value if c("memclock", "nvmlDeviceGetClockInfo", o.mem_kind, o.mem_clock_ref) else None
    )
    fan = o.fan.value if c("fan", "nvmlDeviceGetFanSpeed", o.fan_ref) else None
    pstate = o.pstate.value if c("pstate", "nvmlDeviceGetPerformanceState", o.pstate_ref) else None
    margin = (
        o.margin.marginTemperature if c("margin", "nvmlDeviceGetMarginTemperature", o.margin_ref) else None
    )
    reasons = (
        o.reasons.value if c("reasons", "nvmlDeviceGetCurrentClocksEventReasons", o.reasons_ref) else None
    )
    return DeviceReading(
        _device_memory(dev, o),
        None if util is None else util.gpu / 100.0,
        None if util is None else util.memory / 100.0,
        temp,
        mem_temp,
        None if margin is None else float(margin),
        None if power is None else power / 1000.0,
        None if energy is None else energy / 1000.0,
        None if sm_clock is None else sm_clock * 1e6,
        None if mem_clock is None else mem_clock * 1e6,
        reasons,
        None if pstate is None or pstate > 15 else int(pstate),
        None if fan is None else fan / 100.0,
    )


def _device_memory(dev: Device, o: _DeviceOutputs) -> MemoryInfo | None:
    # _memory's v2 read into the kept structure; a driver without v2 falls back to _memory's v1
    if "memory:v2" not in dev.absent:
        try:
            dev.c_check("nvmlDeviceGetMemoryInfo_v2", o.memory_ref)
            m = o.memory
            return MemoryInfo(m.total, m.used, m.free, m.reserved)
        except NotSupportedError:
            dev.absent.add("memory:v2")  # driver < 510: v1 (used includes reserved)
    return _memory(dev, dev.handle, "memory")


def _float(v: Any) -> float | None:
    return None if v is None else float(v)


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def read_health(dev: Device) -> HealthReading:
    """ECC (volatile) and row-remapping state."""
    h, opt = dev.handle, dev.optional
    corrected = opt(
        "ecc_c",
        pynvml.nvmlDeviceGetTotalEccErrors,
        h,
        pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
        pynvml.NVML_VOLATILE_ECC,
    )
    uncorrected = opt(
        "ecc_u",
        pynvml.nvmlDeviceGetTotalEccErrors,
        h,
        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        pynvml.NVML_VOLATILE_ECC,
    )
    rows = opt("remap", pynvml.nvmlDeviceGetRemappedRows, h)
    return HealthReading(
        ecc_corrected=_int(corrected),
        ecc_uncorrected=_int(uncorrected),
        remapped_correctable=None if rows is None else int(rows[0]),
        remapped_uncorrectable=None if rows is None else int(rows[1]),
        remap_pending=None if rows is None else bool(rows[2]),
        remap_failed=None if rows is None else bool(rows[3]),
    )


class _ProcessInfo(ctypes.Structure):
    """pynvml's c_nvmlProcessInfo_v3_t layout, read without its Python-level attribute hooks."""

    _fields_ = pynvml.c_nvmlProcessInfo_v3_t._fields_


class _UtilizationSample(ctypes.Structure):
    """pynvml's c_nvmlProcessUtilizationSample_t layout, likewise."""

    _fields_ = pynvml.c_nvmlProcessUtilizationSample_t._fields_


_NOT_AVAILABLE: Final = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
_INITIAL_ENTRIES: Final = 32


class _ProcessBuffer:
    """One process listing (nvmlDevice{Compute,Graphics}RunningProcesses_v3) into a C array kept between
    ticks. pynvml's wrapper asks for the size, then calls again to fill a fresh array and turns every
    entry into a Python object; this makes one call while the array is big enough (and grows it when the
    driver answers INSUFFICIENT_SIZE, as the wrapper does: twice the count plus 5)."""

    def __init__(self, symbol: str) -> None:
        self.__name__ = symbol  # for error messages (Device.optional)
        self._array: Any = (_ProcessInfo * _INITIAL_ENTRIES)()
        self._count = ctypes.c_uint()
        self._count_ref = ctypes.byref(self._count)
        self._fn: Any = None

    def __call__(self, handle: Any, mig_uuid: str = "") -> list[ProcessReading]:
        fn = self._fn
        if fn is None:
            fn = self._fn = pynvml._nvmlGetFunctionPointer(self.__name__)
        count = self._count
        for _ in range(4):  # processes may appear between the calls
            count.value = len(self._array)
            ret = fn(handle, self._count_ref, self._array)
            if ret == pynvml.NVML_SUCCESS:
                absent = _NOT_AVAILABLE
                return [
                    ProcessReading(p.pid, None if p.usedGpuMemory == absent else p.usedGpuMemory, mig_uuid)
                    for p in self._array[: count.value]
                ]
            if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
                raise pynvml.NVMLError(ret)
            self._array = (_ProcessInfo * (count.value * 2 + 5))()
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)


class _UtilizationBuffer:
    """nvmlDeviceGetProcessUtilization into a C array kept between ticks: one call where pynvml's
    wrapper makes two (size, then samples)."""

    __name__ = "nvmlDeviceGetProcessUtilization"

    def __init__(self) -> None:
        self._array: Any = (_UtilizationSample * _INITIAL_ENTRIES)()
        self._count = ctypes.c_uint()
        self._count_ref = ctypes.byref(self._count)
        self._since = ctypes.c_ulonglong()
        self._fn: Any = None

    def __call__(self, handle: Any, since_us: int) -> list[Any]:
        fn = self._fn
        if fn is None:
            fn = self._fn = pynvml._nvmlGetFunctionPointer(self.__name__)
        count, since = self._count, self._since
        since.value = since_us
        for _ in range(4):
            count.value = len(self._array)
            ret = fn(handle, self._array, self._count_ref, since)
            if ret == pynvml.NVML_SUCCESS:
                return self._array[: count.value]  # type: ignore[no-any-return]
            if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
                raise pynvml.NVMLError(ret)  # NOT_FOUND: no sample since `since_us`
            self._array = (_UtilizationSample * (count.value * 2 + 5))()
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)


def _buffers(dev: Device) -> tuple[_ProcessBuffer, _ProcessBuffer, _UtilizationBuffer]:
    found = dev.buffers.get("processes")
    if found is None:
        found = dev.buffers["processes"] = (
            _ProcessBuffer("nvmlDeviceGetComputeRunningProcesses_v3"),
            _ProcessBuffer("nvmlDeviceGetGraphicsRunningProcesses_v3"),
            _UtilizationBuffer(),
        )
    return found


def read_processes(
    dev: Device, now_us: int, window_us: int
) -> tuple[list[ProcessReading], dict[int, list[float]]]:
    """Compute processes with their memory, plus the SM ratios (0..1) of each PID's process-utilization
    samples newer than the last seen (a PID with no kernel time in the window has none)."""
    h = dev.handle
    procs: list[ProcessReading] = []
    handles = [(h, "")]
    if dev.static.mig_enabled:
        handles = [(mh, uuid) for mh, uuid in _mig_handles(dev)]
    compute, graphics, utilization = _buffers(dev)
    for handle, mig_uuid in handles:
        procs += dev.optional("procs", compute, handle, mig_uuid) or ()
        procs += dev.optional("gprocs", graphics, handle, mig_uuid) or ()
    sm: dict[int, list[float]] = {}
    if not dev.static.mig_enabled and "putil" not in dev.absent:
        since = dev.last_process_sample_us or max(0, now_us - window_us)
        try:
            raw = call(utilization, h, since)
        except NotSupportedError:
            dev.absent.add("putil")
            raw = []
        except GpuLostError:
            raise
        except NvmlError:  # NOT_FOUND: no process had a sample since `since`
            raw = []
        newest = 0
        for s in raw:
            ts = int(s.timeStamp)
            if ts > since:
                newest = max(newest, ts)
                ratio = float(s.smUtil) / 100.0
                found = sm.get(pid := int(s.pid))
                if found is None:
                    sm[pid] = [ratio]
                else:
                    found.append(ratio)
        dev.last_process_sample_us = newest if newest else max(since, now_us - window_us)
    return procs, sm


def read_nvlink(dev: Device) -> list[NvLinkState]:
    """State of every NVLink link the GPU has (empty when it has none).

    The link count and each link's far end are static until a reset, so they are read once; a tick
    reads only the link states.
    """
    h = dev.handle
    if "nvlink" in dev.absent:
        return []
    if dev.nvlink_count is None:
        count = pynvml.NVML_NVLINK_MAX_LINKS
        fields = dev.optional(
            "nvlinkcount", pynvml.nvmlDeviceGetFieldValues, h, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT]
        )
        if fields is not None and (n := _field_value(fields[0])) is not None:
            count = int(n)
        dev.nvlink_count = count
    links: list[NvLinkState] = []
    get_state, enabled, known = (
        pynvml.nvmlDeviceGetNvLinkState,
        pynvml.NVML_FEATURE_ENABLED,
        dev.nvlink_states,
    )
    for link in range(dev.nvlink_count):
        try:
            up = get_state(h, link) == enabled  # not through call(): 18 links per H100
        except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as raw:
            if isinstance(classify(raw), GpuLostError):
                raise classify(raw, "nvmlDeviceGetNvLinkState") from None
            continue  # link absent on this board
        cached = known.get((link, up))  # the far end is static, so each (link, up) state is made once
        if cached is not None:
            links.append(cached)
            continue
        if up and link not in dev.nvlink_remote:
            rtype = dev.optional("nvlinkrtype", pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
            is_switch, remote = rtype == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH, None
            if not is_switch:
                pci = dev.optional("nvlinkremote", pynvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
                remote = None if pci is None else str(pci.busId).upper()
            dev.nvlink_remote[link] = (is_switch, remote)
            known.pop((link, False), None)  # made before the far end was known
        is_switch, remote = dev.nvlink_remote.get(link, (False, None))
        state = known[(link, up)] = NvLinkState(link, up, is_switch, remote)
        links.append(state)
    if not links:
        dev.absent.add("nvlink")
    return links


@dataclass(frozen=True)
class InterconnectReading:
    """PCIe and NVLink traffic in bytes/s, per direction; None where the GPU cannot tell."""

    pcie_tx: float | None = None
    pcie_rx: float | None = None
    nvlink_tx: float | None = None
    nvlink_rx: float | None = None


_KIB: Final = 1024.0
_ALL_LINKS: Final = 0xFFFFFFFF  # nvml.h: a scopeId of UINT_MAX sums the throughput field over all links
# Cumulative traffic counters read as field values: (tx field, rx field, bytes per count).
# PCIe: bytes, driver 555 and newer ("value can be wrapped"); NVLink: data KiB summed over the links.
_COUNTERS: Final = {
    "pcie": (
        (pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0),
        (pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 0),
        1.0,
    ),
    "nvlink": (
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS),
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS),
        _KIB,
    ),
}
# what a driver answers for a field it does not have (older drivers do not know the newer IDs)
_FIELD_ABSENT: Final = {pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT}


def _counter_rate(now: float | None, before: float | None, per_second: float) -> float | None:
    # a counter that went down was reset (driver reload, GPU reset) or wrapped: no rate this round
    if now is None or before is None or now < before:
        return None
    return (now - before) * per_second


def _counter_rates(
    dev: Device, group: str, tx_field: Any, rx_field: Any, now_us: int
) -> tuple[float | None, float | None]:
    """Bytes/s per direction from one group's counters, over the interval since its last reading."""
    tx, rx = _field_value(tx_field), _field_value(rx_field)
    if tx is None and rx is None:
        if tx_field.nvmlReturn in _FIELD_ABSENT and rx_field.nvmlReturn in _FIELD_ABSENT:
            dev.absent.add("counters:" + group)  # no NVLink, or a driver without these counters
        dev.counters.pop(group, None)
        return None, None
    # µs since 1970 when the driver read the counters; our own clock if a driver leaves it unset
    stamp = int(max(tx_field.timestamp, rx_field.timestamp)) or now_us
    before = dev.counters.get(group)
    if before is not None and stamp <= before[0]:
        return None, None  # the same cached reading again: keep the older baseline
    dev.counters[group] = (stamp, tx, rx)
    if before is None:
        return None, None  # first reading: only the baseline
    per_second = _COUNTERS[group][2] * 1e6 / (stamp - before[0])
    return _counter_rate(tx, before[1], per_second), _counter_rate(rx, before[2], per_second)


def _field_buffer(dev: Device, ids: tuple[tuple[int, int], ...]) -> tuple[Any, Any, Any]:
    """A field-value array for these (field id, scope id) pairs kept between ticks, ready for a call:
    (array, count, byref).

    pynvml's wrapper makes a new ctypes array type on every call (a class: garbage only the cyclic
    collector frees). The timestamps are cleared first: a driver that leaves one unset must not pass
    the previous tick's off as new (read_interconnect then uses its own clock, as with a new array).
    """
    key = f"fields:{ids}"
    found: tuple[Any, Any, Any] | None = dev.buffers.get(key)
    if found is None:
        array = (pynvml.c_nvmlFieldValue_t * len(ids))()
        for entry, (field_id, scope_id) in zip(array, ids, strict=True):
            entry.fieldId, entry.scopeId = field_id, scope_id
        found = dev.buffers[key] = (array, ctypes.c_int32(len(ids)), ctypes.byref(array))
    for entry in found[0]:
        entry.timestamp = 0
    return found


def read_interconnect(dev: Device, monotonic: Monotonic) -> InterconnectReading:
    """PCIe and NVLink traffic without GPM (before Hopper, or a GPU in MIG mode).

    Both come from cumulative counters (field values, one call) turned into a rate between two reads,
    so the first read gives none. A driver older than 555 has no PCIe byte counters: then
    nvmlDeviceGetPcieThroughput, which samples the traffic for 20 ms per direction while it blocks the
    GPU's worker, in KB/s of 1 KB granularity (read as KiB). `monotonic` stands in for a field
    timestamp the driver did not set.
    """
    h = dev.handle
    groups = [g for g in _COUNTERS if "counters:" + g not in dev.absent]
    rates: dict[str, tuple[float | None, float | None]] = {}
    if groups:
        ids = tuple(f for g in groups for f in _COUNTERS[g][:2])
        now_us = int(monotonic() * 1e6)
        fields, count, ref = _field_buffer(dev, ids)
        read = dev.c_call("counters", "nvmlDeviceGetFieldValues", count, ref)
        if "counters" in dev.absent:  # no field values at all
            dev.absent.update("counters:" + g for g in _COUNTERS)
        elif read:
            for i, g in enumerate(groups):
                rates[g] = _counter_rates(dev, g, fields[2 * i], fields[2 * i + 1], now_us)
    pcie_tx, pcie_rx = rates.get("pcie", (None, None))
    if "counters:pcie" in dev.absent:
        tx = dev.optional("pcietx", pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = dev.optional("pcierx", pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        pcie_tx = None if tx is None else tx * _KIB
        pcie_rx = None if rx is None else rx * _KIB
    nvlink_tx, nvlink_rx = rates.get("nvlink", (None, None))
    return InterconnectReading(pcie_tx=pcie_tx, pcie_rx=pcie_rx, nvlink_tx=nvlink_tx, nvlink_rx=nvlink_rx)


def _mig_handles(dev: Device) -> list[tuple[Any, str]]:
    h = dev.handle
    count = dev.optional("migcount", pynvml.nvmlDeviceGetMaxMigDeviceCount, h) or 0
    out: list[tuple[Any, str]] = []
    for i in range(int(count)):
        try:
            mh = call(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, i)
            out.append((mh, str(call(pynvml.nvmlDeviceGetUUID, mh))))
        except GpuLostError:
            raise
        except NvmlError:
            continue  # NOT_FOUND: no MIG device at this index
    return out


def _mig_profile(name: str, attrs: Any) -> str:
    if " MIG " in name:
        return name.rsplit(" MIG ", 1)[1].strip()
    if attrs is not None:
        return f"{int(attrs.gpuInstanceSliceCount)}g.{round(int(attrs.memorySizeMB) / 1024)}gb"
    return ""


def read_mig(dev: Device) -> list[MigInstance]:
    """MIG instances of a GPU with their memory (empty when MIG is off)."""
    if not dev.static.mig_enabled:
        return []
    out: list[MigInstance] = []
    for mh, mig_uuid in _mig_handles(dev):
        gi = dev.optional("mig_gi", pynvml.nvmlDeviceGetGpuInstanceId, mh)
        ci = dev.optional("mig_ci", pynvml.nvmlDeviceGetComputeInstanceId, mh)
        name = dev.optional("mig_name", pynvml.nvmlDeviceGetName, mh) or ""
        attrs = None if " MIG " in name else dev.optional("mig_attrs", pynvml.nvmlDeviceGetAttributes, mh)
        out.append(
            MigInstance(
                mig_uuid=mig_uuid,
                gpu_instance_id=-1 if gi is None else int(gi),
                compute_instance_id=-1 if ci is None else int(ci),
                profile=_mig_profile(str(name), attrs),
                memory=_memory(dev, mh, "mig_memory"),
            )
        )
    return out


# --- GPM ------------------------------------------------------------------------------------------
class _GpmMetricCell(ctypes.Structure):
    """pynvml's c_nvmlGpmMetric_t layout without its Python-level __getattribute__/__setattr__ (which
    convert strings on every field access): the poll reads and resets these fields 24 times per GPU."""

    _fields_ = pynvml.c_nvmlGpmMetric_t._fields_


_GpmMetricsGetView = _plain(pynvml.c_nvmlGpmMetricsGet_t)


class GpmSampler:
    """One rolling pair of GPM samples: each poll takes one sample and reports over (previous, current)."""

    def __init__(self, handle: Any, monotonic: Monotonic, gpu_instance_id: int | None = None) -> None:
        self._handle, self._gi, self._monotonic = handle, gpu_instance_id, monotonic
        # (name, metric id, ratio?): ratios arrive in percent; the device's traffic rates in MiB/s,
        # read from the same sample pair at no extra sampling cost
        self._wanted = [(name, mid, True) for name, mid in GPM_METRICS.items()]
        if gpu_instance_id is None:
            self._wanted += [(name, mid, False) for name, mid in GPM_RATE_METRICS.items()]
        self._ids = [mid for _, mid, _ in self._wanted]
        self._prev = call(pynvml.nvmlGpmSampleAlloc)
        self._cur = call(pynvml.nvmlGpmSampleAlloc)
        self._prev_t: float | None = None
        self._mg = pynvml.c_nvmlGpmMetricsGet_t()  # about 19 KB: allocate once
        self._mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        self._mg.numMetrics = len(self._ids)
        # The metric array of _mg, seen through plain ctypes structures: one object per wanted metric,
        # made once, each pointing into _mg's memory (kept alive by self._mg)
        metrics = (_GpmMetricCell * len(self._ids)).from_address(ctypes.addressof(self._mg.metrics))
        self._cells = [metrics[i] for i in range(len(self._ids))]
        for cell, metric_id in zip(self._cells, self._ids, strict=True):
            cell.metricId = metric_id
        self._head: Any = _GpmMetricsGetView.from_buffer(self._mg)  # sample1, sample2 without pynvml's hooks
        self._mg_ref = ctypes.byref(self._mg)
        self._functions: dict[str, Any] = {}

    def _c(self, symbol: str, *args: Any) -> None:
        # the C function straight (pynvml's wrapper looks it up under a lock on every call)
        fn = self._functions.get(symbol)
        if fn is None:
            fn = self._functions[symbol] = pynvml._nvmlGetFunctionPointer(symbol)
        ret = fn(*args)
        if ret != _SUCCESS:
            raise classify(pynvml.NVMLError(ret), symbol)

    def _take(self, sample: Any) -> None:
        if self._gi is None:
            self._c("nvmlGpmSampleGet", self._handle, sample)
        else:
            self._c("nvmlGpmMigSampleGet", self._handle, self._gi, sample)

    def poll(self) -> dict[str, float] | None:
        """Ratios (0..1), and for a whole GPU traffic rates in bytes/s, per metric name; None on the first
        poll or when polled too soon. A metric the GPU does not support is left out."""
        now = self._monotonic()
        if self._prev_t is None:
            self._take(self._prev)
            self._prev_t = now
            return None
        if now - self._prev_t < GPM_MIN_INTERVAL_SECONDS:
            return None  # keep the old baseline
        try:
            self._take(self._cur)
            head = self._head
            head.sample1, head.sample2 = self._prev, self._cur
            for cell in self._cells:
                cell.nvmlReturn = pynvml.NVML_ERROR_UNKNOWN  # don't trust stale outputs
            self._c("nvmlGpmMetricsGet", self._mg_ref)
        finally:
            self._prev, self._cur = self._cur, self._prev  # rotate even on failure
            self._prev_t = now
        out: dict[str, float] = {}
        for cell, (name, _, ratio) in zip(self._cells, self._wanted, strict=True):
            if cell.nvmlReturn == pynvml.NVML_SUCCESS:
                value = cell.value
                if math.isfinite(value):
                    out[name] = min(max(value / 100.0, 0.0), 1.0) if ratio else max(value * _MIB, 0.0)
        return out

    def close(self) -> None:
        """Free both sample buffers."""
        for sample in (self._prev, self._cur):
            try:
                call(pynvml.nvmlGpmSampleFree, sample)
            except NvmlError:
                pass


def poll_gpm(dev: Device, monotonic: Monotonic) -> dict[str, float] | None:
    """Device-level GPM ratios; None on the first poll, raises NotSupportedError when GPM is absent."""
    if not dev.static.gpm_supported or dev.static.mig_enabled:
        raise NotSupportedError("GPM is not supported on this GPU")
    if dev.gpm is None:
        dev.gpm = GpmSampler(dev.handle, monotonic)
    return dev.gpm.poll()


def poll_mig_gpm(
    dev: Device, gpu_instance_ids: Sequence[int], monotonic: Monotonic
) -> dict[int, dict[str, float]]:
    """GPM ratios per GPU instance (parent handle + GI id); instances on their first poll are left out."""
    out: dict[int, dict[str, float]] = {}
    if not dev.static.gpm_supported or "mig_gpm" in dev.absent:
        return out
    for gi in sorted(set(gpu_instance_ids) - {-1}):
        sampler = dev.mig_gpm.get(gi)
        try:
            if sampler is None:
                sampler = dev.mig_gpm[gi] = GpmSampler(dev.handle, monotonic, gi)
            values = sampler.poll()
        except NotSupportedError:
            dev.absent.add("mig_gpm")
            return {}
        except GpuLostError:
            raise
        except NvmlError as exc:
            log.debug("gpu %s gi %s: GPM failed: %s", dev.static.index, gi, exc)
            continue
        if values is not None:
            out[gi] = values
    for gone in set(dev.mig_gpm) - set(gpu_instance_ids):
        dev.mig_gpm.pop(gone).close()
    return out


# --- init and enumeration ------------------------------------------------------------------------
class Nvml:
    """NVML initialised once for this process, with its devices."""

    def __init__(self) -> None:
        self.devices: list[Device] = []
        self.driver_version = ""
        self._initialised = False

    def init(self) -> None:
        """nvmlInit once; raises NvmlInitError."""
        try:
            # NO_GPUS: a DaemonSet on a node without GPUs still starts and reports nothing.
            call(pynvml.nvmlInitWithFlags, pynvml.NVML_INIT_FLAG_NO_GPUS)
        except NvmlUnknownError as exc:
            raise NvmlInitError(str(exc), unavailable=False, unknown=True) from None
        except NvmlError as exc:
            raise NvmlInitError(
                str(exc), unavailable=isinstance(exc, NvmlUnavailableError), unknown=False
            ) from None
        self._initialised = True
        try:
            self.driver_version = str(call(pynvml.nvmlSystemGetDriverVersion))
        except NvmlError:
            self.driver_version = ""

    def discover(self) -> list[Device]:
        """Open every GPU we may access and read its static facts (the slow first handle lookup)."""
        count = int(call(pynvml.nvmlDeviceGetCount))
        devices: list[Device] = []
        for index in range(count):
            try:
                handle = call(pynvml.nvmlDeviceGetHandleByIndex, index)
            except NvmlError as exc:  # NO_PERMISSION: counted but not ours
                log.warning("skipping GPU %d: %s", index, exc)
                continue
            try:
                devices.append(Device(static=read_static(index, handle), handle=handle))
            except NvmlError as exc:
                log.warning("skipping GPU %d: %s", index, exc)
        self.devices = devices
        return devices

    def shutdown(self) -> None:
        """nvmlShutdown; call only after every worker and the XID thread have stopped."""
        if not self._initialised:
            return
        for dev in self.devices:
            for sampler in [dev.gpm, *dev.mig_gpm.values()]:
                if sampler is not None:
                    sampler.close()
        try:
            call(pynvml.nvmlShutdown)
        except NvmlError as exc:
            log.warning("nvmlShutdown: %s", exc)
        self._initialised = False


def read_static(index: int, handle: Any) -> GpuStatic:
    """Identity and limits of one GPU."""
    probe = Device(static=_placeholder(index), handle=handle)
    opt = probe.optional
    pci = call(pynvml.nvmlDeviceGetPciInfo, handle)
    mig = opt("migmode", pynvml.nvmlDeviceGetMigMode, handle)
    gpm = opt("gpm", pynvml.nvmlGpmQueryDeviceSupport, handle)
    slowdown = opt(
        "slowdown",
        pynvml.nvmlDeviceGetTemperatureThreshold,
        handle,
        pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    )
    shutdown = opt(
        "shutdown",
        pynvml.nvmlDeviceGetTemperatureThreshold,
        handle,
        pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
    )
    return GpuStatic(
        index=index,
        uuid=str(call(pynvml.nvmlDeviceGetUUID, handle)),
        name=str(call(pynvml.nvmlDeviceGetName, handle)),
        pci_bus_id=str(pci.busId).upper(),
        vbios_version=str(opt("vbios", pynvml.nvmlDeviceGetVbiosVersion, handle) or ""),
        mig_enabled=bool(mig is not None and mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE),
        slowdown_temperature_celsius=_float(slowdown),
        shutdown_temperature_celsius=_float(shutdown),
        pcie_generation_max=_int(opt("pciegenmax", pynvml.nvmlDeviceGetMaxPcieLinkGeneration, handle)),
        pcie_width_max=_int(opt("pciewidthmax", pynvml.nvmlDeviceGetMaxPcieLinkWidth, handle)),
        gpm_supported=bool(gpm is not None and gpm.isSupportedDevice),
    )


def _placeholder(index: int) -> GpuStatic:
    return GpuStatic(index, "", "", "", "", False, None, None, None, None, False)


def nvlink_pairs(
    devices: Sequence[Device], links: dict[int, list[NvLinkState]]
) -> list[tuple[int, int, str, int]]:
    """GPU pairs joined by NVLink as (index_a, index_b, via, links), each pair once with a < b."""
    by_bus = {d.static.pci_bus_id.upper(): d.static.index for d in devices}
    direct: dict[tuple[int, int], int] = {}
    to_switch: dict[int, int] = {}
    for dev in devices:
        i = dev.static.index
        for state in links.get(i, []):
            if not state.up:
                continue
            if state.remote_is_switch:
                to_switch[i] = to_switch.get(i, 0) + 1
                continue
            j = by_bus.get(state.remote_pci_bus_id or "")
            if j is not None and j != i:
                key = (min(i, j), max(i, j))
                direct[key] = direct.get(key, 0) + 1
    pairs: list[tuple[int, int, str, int]] = []
    indices = sorted(d.static.index for d in devices)
    for a_pos, a in enumerate(indices):
        for b in indices[a_pos + 1 :]:
            n = direct.get((a, b), 0)
            if n:
                pairs.append((a, b, "direct", n // 2 or n))  # both ends report the same link
            elif to_switch.get(a) and to_switch.get(b):
                # NVSwitch systems report the switch as remote, never the peer (HAMi #2103).
                pairs.append((a, b, "nvswitch", min(to_switch[a], to_switch[b])))
    return pairs


# --- per-GPU worker threads with deadlines -------------------------------------------------------
class WorkerJob:
    """One unit of work handed to a GpuWorker; `finished` turns True on the worker thread when it returns."""

    __slots__ = ("finished", "fn", "on_done")

    def __init__(self, fn: Callable[[], Any], on_done: Callable[[bool, Any], None]) -> None:
        self.fn, self.on_done = fn, on_done
        self.finished = False


class GpuWorker:
    """A daemon thread that runs one GPU's NVML calls in order, each awaited with a deadline.

    ctypes calls cannot be cancelled, so a call past its deadline keeps the thread; until it returns
    the GPU is stale and new calls fail at once (no queue or thread pile-up behind a wedged call).
    Daemon threads let the process exit even when a call never returns.
    """

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[WorkerJob | None] = queue.SimpleQueue()
        self._stuck: WorkerJob | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def stuck(self) -> bool:
        """True while a call that missed its deadline has not returned."""
        return self._stuck is not None and not self._stuck.finished

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            execute(job)

    def start(self, fn: Callable[[], Any], on_done: Callable[[bool, Any], None]) -> WorkerJob:
        """Queue fn; the worker thread calls on_done(ok, result or exception) when it returns."""
        job = WorkerJob(fn, on_done)
        self._queue.put(job)
        return job

    def put(self, job: WorkerJob) -> None:
        """Queue a job made beforehand (from any thread); `abandon` and `stuck` follow it wherever it
        runs, on this thread or on a RoundRunner's."""
        self._queue.put(job)

    def abandon(self, job: WorkerJob) -> None:
        """The job missed its deadline: while it has not returned, the worker is stuck."""
        if not job.finished:
            self._stuck = job

    async def run(self, fn: Callable[[], T], timeout_seconds: float) -> T:
        """Run fn on this GPU's thread; DeadlineExceededError past the deadline, GpuStaleError while stuck."""
        if self.stuck:
            raise GpuStaleError("a previous call on this GPU has not returned")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()

        def on_done(ok: bool, value: Any) -> None:
            wake_loop(loop, _settle, fut, ok, value)

        job = self.start(fn, on_done)
        try:
            return await asyncio.wait_for(fut, timeout_seconds)
        except TimeoutError:
            self.abandon(job)
            raise DeadlineExceededError(f"no answer within {timeout_seconds:g} s") from None

    def stop(self) -> None:
        """Ask the thread to exit after its current call."""
        self._queue.put(None)

    def join(self, timeout_seconds: float) -> bool:
        """Wait for the thread; False when it is still inside a call."""
        self._thread.join(timeout_seconds)
        return not self._thread.is_alive()


def run_job(job: WorkerJob) -> tuple[bool, Any]:
    """Run a job's fn on the calling thread and mark it finished: (True, result) or (False, exception)."""
    try:
        ok, result = True, job.fn()
    except BaseException as exc:
        ok, result = False, exc
    job.finished = True
    return ok, result


def execute(job: WorkerJob) -> None:
    """Run a job on the calling thread: its fn, then `finished`, then on_done(ok, result or exception)."""
    ok, result = run_job(job)
    try:
        job.on_done(ok, result)
    except Exception:
        log.exception("handing a GPU result back failed")


class RoundRunner:
    """Daemon threads that each run a whole round of GPU jobs one after another (`submit(fn)`).

    One thread for every GPU of a round: 16 GPU threads woken at once queue for the GIL and switch
    between each other (with the real driver, at every C call, which releases the GIL). A thread that
    stays inside a hung call is not waited for: the next round gets another thread, up to
    `max_threads` (one per GPU that can hang, plus one); past that, submit refuses.

    A round calls `release()` once its GPU calls are done and before it hands its results back: the
    thread counts as idle from then, so the next round, submitted by whoever the hand-over wakes,
    waits for this thread instead of starting another. Without it, a woken event loop that preempted
    the thread on its CPU submitted the next round before the thread was back, and back-to-back
    rounds spread over up to four threads, each one running cold.
    """

    def __init__(self, name: str, max_threads: int) -> None:
        self.name, self.max_threads = name, max_threads
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting on the queue, or about to, and not yet promised a round
        self._threads: list[threading.Thread] = []
        self._round = threading.local()  # on a runner thread: .released, for the round it runs

    def submit(self, fn: Callable[[], None]) -> bool:
        """Run fn on an idle thread (or a new one); False when every allowed thread is busy."""
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._queue.put(fn)
                return True
            if len(self._threads) >= self.max_threads:
                return False
            thread = threading.Thread(
                target=self._loop, args=(fn,), name=f"{self.name}-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
        thread.start()
        return True

    def _loop(self, fn: Callable[[], None] | None) -> None:
        while fn is not None:
            self._round.released = False
            try:
                fn()
            except Exception:
                log.exception("a GPU round failed")
            self.release()
            fn = self._queue.get()

    def release(self) -> None:
        """On a runner thread, inside its round: this thread takes the next round from now (it makes
        no more GPU call in this one). Once per round; nothing on any other thread."""
        if getattr(self._round, "released", True):
            return
        self._round.released = True
        with self._lock:
            self._idle += 1

    @property
    def threads(self) -> int:
        """Threads started so far (each idle, running a round, or inside a hung call)."""
        return len(self._threads)

    @property
    def idle(self) -> int:
        """Threads waiting for a round."""
        return self._idle

    def stop(self) -> None:
        """Ask every thread to exit after its current round."""
        with self._lock:
            for _ in self._threads:
                self._queue.put(None)

    def join(self, timeout_seconds: float) -> bool:
        """Wait for the threads; False when one is still inside a call."""
        for thread in list(self._threads):
            thread.join(timeout_seconds)
        return not any(t.is_alive() for t in self._threads)


def _settle(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if not fut.done():
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


def wake_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    """Schedule fn(*args) on the loop from another thread; nothing when the loop is already closed."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop closed while the call was out (shutdown, or a late hung call)
        pass


# --- XID events ----------------------------------------------------------------------------------
XID_EVENT_MASK: Final = pynvml.nvmlEventTypeXidCriticalError
XidCallback = Callable[[str, int], None]


class XidWatcher:
    """One thread blocking in nvmlEventSetWait_v2 (ctypes drops the GIL) that reports (uuid, xid)."""

    def __init__(
        self,
        devices: Sequence[Device],
        on_xid: XidCallback,
        loop: asyncio.AbstractEventLoop,
        wait_timeout_ms: int = 500,
    ) -> None:
        self._handles = [d.handle for d in devices]
        self._uuid_by_addr = {_addr(d.handle): d.static.uuid for d in devices}
        self._on_xid, self._loop, self._timeout_ms = on_xid, loop, wait_timeout_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-xid-events", daemon=True)
        self.registered = 0

    def start(self) -> None:
        """Create the event set, register the GPUs and start waiting."""
        self._thread.start()

    def _run(self) -> None:
        try:
            event_set = call(pynvml.nvmlEventSetCreate)
        except NvmlError as exc:
            log.warning("XID events unavailable: %s", exc)
            return
        try:
            for handle in self._handles:
                try:
                    mask = XID_EVENT_MASK & int(call(pynvml.nvmlDeviceGetSupportedEventTypes, handle))
                    if mask:
                        call(pynvml.nvmlDeviceRegisterEvents, handle, mask, event_set)
                        self.registered += 1
                except NvmlError as exc:  # NOT_SUPPORTED leaves the set usable
                    log.info("XID events not registered for a GPU: %s", exc)
            while not self._stop.is_set():
                self._wait_once(event_set)
        finally:
            try:
                call(pynvml.nvmlEventSetFree, event_set)  # before any nvmlShutdown
            except NvmlError:
                pass

    def _wait_once(self, event_set: Any) -> None:
        try:
            data = pynvml.nvmlEventSetWait_v2(event_set, self._timeout_ms)
        except pynvml.NVMLError as exc:
            if int(exc.value) != pynvml.NVML_ERROR_TIMEOUT:
                log.debug("event wait: %s", _error_text(exc))
                self._stop.wait(self._timeout_ms / 1000.0)  # GPU lost etc.: don't spin
            return
        if not int(data.eventType) & XID_EVENT_MASK:
            return
        uuid = self._uuid_by_addr.get(_addr(data.device))
        if uuid is None:
            try:
                uuid = str(call(pynvml.nvmlDeviceGetUUID, data.device))
            except NvmlError:
                return
        try:
            self._loop.call_soon_threadsafe(self._on_xid, uuid, int(data.eventData))
        except RuntimeError:  # loop closed during shutdown
            self._stop.set()

    def stop(self, timeout_seconds: float = 2.0) -> bool:
        """Stop waiting and free the event set; False if the thread is still inside the driver."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_seconds)
        return not self._thread.is_alive()


def _addr(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
