"""Collector `device`: identity, up, utilization, memory, thermals, power, clocks, PCIe per GPU."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from prometheus_client.core import Metric

from exporter.collectors.base import NodeState
from exporter.collectors.gpus import Answers, FleetCollector, GpuFleet, GpuSlot, Outcome, Read, Tiered
from exporter.collectors.series import Rows, Series, Values, defer, table
from exporter.nvml import CLOCK_EVENT_REASONS, DeviceReading, SlowDeviceReading, read_device, read_device_slow
from gpupulse.metrics import gpu as c
from gpupulse.metrics.spec import MetricSpec

# (spec, attribute of DeviceReading) for the plain per-GPU gauges and counters
_VALUES: tuple[tuple[MetricSpec, str], ...] = (
    (c.GPU_UTILIZATION, "utilization_ratio"),
    (c.GPU_MEMORY_UTILIZATION, "memory_utilization_ratio"),
    (c.GPU_TEMPERATURE, "temperature_celsius"),
    (c.GPU_MEMORY_TEMPERATURE, "memory_temperature_celsius"),
    (c.GPU_THERMAL_MARGIN, "thermal_margin_celsius"),
    (c.GPU_POWER, "power_watts"),
    (c.GPU_ENERGY, "energy_joules"),
    (c.GPU_SM_CLOCK, "sm_clock_hertz"),
    (c.GPU_MEMORY_CLOCK, "memory_clock_hertz"),
    (c.GPU_PSTATE, "performance_state"),
    (c.GPU_FAN_SPEED, "fan_speed_ratio"),
)
# (spec, attribute of SlowDeviceReading): read on the slow tier, served from the last read between
_SLOW_VALUES: tuple[tuple[MetricSpec, str], ...] = (
    (c.GPU_POWER_LIMIT, "power_limit_watts"),
    (c.GPU_PCIE_GEN, "pcie_generation"),
    (c.GPU_PCIE_WIDTH, "pcie_width"),
    (c.GPU_PCIE_REPLAYS, "pcie_replays"),
)
_MEMORY = (c.GPU_MEMORY_TOTAL, c.GPU_MEMORY_USED, c.GPU_MEMORY_FREE, c.GPU_MEMORY_RESERVED)
_INDEX = {spec.name: i for i, spec in enumerate(c.DEVICE_METRICS)}  # family position per spec


@dataclass(frozen=True)
class _GpuSeries:
    """One GPU's series, made once: a tick only pairs them with values."""

    info: Series
    up: Series
    values: tuple[tuple[int, int, Series], ...]  # (DeviceReading field, family position, series)
    slow: tuple[tuple[int, int, Series], ...]  # the same for SlowDeviceReading
    statics: tuple[tuple[int, Series, float], ...]  # static facts: (family position, series, value)
    memory: tuple[Series, Series, Series, Series]  # total, used, free, reserved
    clock_events: tuple[Series, ...]  # one per CLOCK_EVENT_REASONS entry, in its order


def _series_of(slot: GpuSlot, driver_version: str) -> _GpuSeries:
    s = slot.device.static
    gpu = (s.uuid, str(s.index))
    mig = "enabled" if s.mig_enabled else "disabled"
    statics = [
        (_INDEX[spec.name], table(spec).series(*gpu), float(value))
        for spec, value in (
            (c.GPU_SLOWDOWN_TEMPERATURE, s.slowdown_temperature_celsius),
            (c.GPU_SHUTDOWN_TEMPERATURE, s.shutdown_temperature_celsius),
            (c.GPU_PCIE_GEN_MAX, s.pcie_generation_max),
            (c.GPU_PCIE_WIDTH_MAX, s.pcie_width_max),
        )
        if value is not None
    ]
    return _GpuSeries(
        info=table(c.GPU_INFO).series(*gpu, s.name, s.pci_bus_id, driver_version, s.vbios_version, mig),
        up=table(c.GPU_UP).series(*gpu),
        values=tuple(
            (DeviceReading._fields.index(attr), _INDEX[spec.name], table(spec).series(*gpu))
            for spec, attr in _VALUES
        ),
        slow=tuple(
            (SlowDeviceReading._fields.index(attr), _INDEX[spec.name], table(spec).series(*gpu))
            for spec, attr in _SLOW_VALUES
        ),
        statics=tuple(statics),
        memory=(
            table(_MEMORY[0]).series(*gpu),
            table(_MEMORY[1]).series(*gpu),
            table(_MEMORY[2]).series(*gpu),
            table(_MEMORY[3]).series(*gpu),
        ),
        clock_events=tuple(
            table(c.GPU_CLOCK_EVENT).series(*gpu, reason) for reason, _ in CLOCK_EVENT_REASONS
        ),
    )


class DeviceCollector(FleetCollector):
    """Reads every GPU's dynamic state; a lost or stale GPU keeps only gpu_info and gpu_up 0."""

    name = "device"

    def __init__(self, fleet: GpuFleet, slow_interval_seconds: float = 0.0) -> None:
        super().__init__(fleet)
        self._series: dict[str, _GpuSeries] = {}  # by GPU UUID
        self._slow = Tiered(fleet, read_device_slow, slow_interval_seconds)

    def plan(self, state: NodeState) -> Sequence[Read]:
        """Every GPU's fast fields, and the slow tier's reads."""
        return [(read_device, self.fleet.slots), *self._slow.plan()]

    def publish(self, answers: Sequence[Answers], state: NodeState) -> Sequence[Metric]:
        """Families of every GPU (their rows made when first read, see `defer`); the GPU list to
        NodeState."""
        outcomes = answers[0]
        slow = {slot.uuid: r for slot, r in self._slow.settle(answers[1:])}
        self.fleet.note_device_round([r for _, r in outcomes])
        results = {slot.uuid: r for slot, r in outcomes}
        tick: list[_GpuTick] = []
        answered = False
        for slot in self.fleet.slots:
            gs = self._series.get(slot.uuid)
            if gs is None:
                gs = self._series[slot.uuid] = _series_of(slot, self.fleet.driver_version)
            reading = results.get(slot.uuid, Outcome.LOST)
            if isinstance(reading, DeviceReading):
                answered = True
                tiered = slow.get(slot.uuid)
                tick.append((gs, reading, tiered if isinstance(tiered, SlowDeviceReading) else None))
            else:
                tick.append((gs, None, None))
        self.fleet.answered = answered or not self.fleet.slots
        live = {slot.uuid for slot in self.fleet.live()}
        migs = tuple(g for g in state.gpus if g.mig_uuid and g.uuid in live)
        state.gpus = tuple(slot.ref() for slot in self.fleet.live()) + migs
        fams = [table(spec).family() for spec in c.DEVICE_METRICS]
        defer(fams, partial(_rows_of, tick))
        return fams


# one GPU of a tick: its series, and its reading and slow-tier reading (None for a GPU not answering)
_GpuTick = tuple[_GpuSeries, DeviceReading | None, SlowDeviceReading | None]
_INFO, _UP = _INDEX[c.GPU_INFO.name], _INDEX[c.GPU_UP.name]
_TOTAL, _USED, _FREE, _RESERVED = (_INDEX[spec.name] for spec in _MEMORY)
_CLOCK_EVENT = _INDEX[c.GPU_CLOCK_EVENT.name]


def _rows_of(tick: list[_GpuTick], rows: Rows, values: Values) -> None:
    """The rows of every device family from one tick's readings (~35 per GPU): a lost or stale GPU
    has gpu_info and gpu_up 0 only."""
    for gs, reading, slow_reading in tick:
        rows[_INFO].append(gs.info)
        values[_INFO].append(1.0)
        rows[_UP].append(gs.up)
        if reading is None:
            values[_UP].append(0.0)
            continue
        values[_UP].append(1.0)
        fields: tuple[Any, ...] = reading  # by position: the fields gs.values names are numbers
        for field, position, series in gs.values:
            value = fields[field]
            if value is not None:
                rows[position].append(series)
                values[position].append(float(value))
        if slow_reading is not None:
            slow_fields: tuple[Any, ...] = slow_reading
            for field, position, series in gs.slow:
                value = slow_fields[field]
                if value is not None:
                    rows[position].append(series)
                    values[position].append(float(value))
        for position, series, static in gs.statics:
            rows[position].append(series)
            values[position].append(static)
        mem = reading.memory
        if mem is not None:
            rows[_TOTAL].append(gs.memory[0])
            values[_TOTAL].append(float(mem.total_bytes))
            rows[_USED].append(gs.memory[1])
            values[_USED].append(float(mem.used_bytes))
            rows[_FREE].append(gs.memory[2])
            values[_FREE].append(float(mem.free_bytes))
            if mem.reserved_bytes is not None:
                rows[_RESERVED].append(gs.memory[3])
                values[_RESERVED].append(float(mem.reserved_bytes))
        reasons = reading.clock_event_reasons
        if reasons is not None:
            rows[_CLOCK_EVENT].extend(gs.clock_events)
            values[_CLOCK_EVENT].extend([1.0 if reasons & bit else 0.0 for _, bit in CLOCK_EVENT_REASONS])
