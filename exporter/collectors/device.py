"""Collector `device`: identity, up, utilization, memory, thermals, power, clocks, PCIe per GPU."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import Metric

from exporter import catalog as c
from exporter.collectors.base import NodeState
from exporter.collectors.gpus import GpuFleet, Outcome
from exporter.metricspec import MetricSpec
from exporter.nvml import CLOCK_EVENT_REASONS, DeviceReading, read_device

# (spec, attribute of DeviceReading) for the plain per-GPU gauges and counters
_VALUES: tuple[tuple[MetricSpec, str], ...] = (
    (c.GPU_UTILIZATION, "utilization_ratio"),
    (c.GPU_MEMORY_UTILIZATION, "memory_utilization_ratio"),
    (c.GPU_TEMPERATURE, "temperature_celsius"),
    (c.GPU_MEMORY_TEMPERATURE, "memory_temperature_celsius"),
    (c.GPU_THERMAL_MARGIN, "thermal_margin_celsius"),
    (c.GPU_POWER, "power_watts"),
    (c.GPU_POWER_LIMIT, "power_limit_watts"),
    (c.GPU_ENERGY, "energy_joules"),
    (c.GPU_SM_CLOCK, "sm_clock_hertz"),
    (c.GPU_MEMORY_CLOCK, "memory_clock_hertz"),
    (c.GPU_PCIE_GEN, "pcie_generation"),
    (c.GPU_PCIE_WIDTH, "pcie_width"),
    (c.GPU_PCIE_REPLAYS, "pcie_replays"),
    (c.GPU_PSTATE, "performance_state"),
    (c.GPU_FAN_SPEED, "fan_speed_ratio"),
)


class DeviceCollector:
    """Reads every GPU's dynamic state; a lost or stale GPU keeps only gpu_info and gpu_up 0."""

    name = "device"
    interval_seconds: float | None = None

    def __init__(self, fleet: GpuFleet) -> None:
        self.fleet = fleet

    async def collect(self, state: NodeState) -> Sequence[Metric]:
        """Sample every live GPU and publish the GPU list to NodeState."""
        outcomes = await self.fleet.map(read_device)
        self.fleet.note_device_round([r for _, r in outcomes])
        results = dict((slot.uuid, r) for slot, r in outcomes)
        fam = {spec.name: c.family(spec) for spec in c.DEVICE_METRICS}
        answered = False
        for slot in self.fleet.slots:
            s = slot.device.static
            gpu = [s.uuid, str(s.index)]
            fam[c.GPU_INFO.name].add_metric(
                [
                    *gpu,
                    s.name,
                    s.pci_bus_id,
                    self.fleet.driver_version,
                    s.vbios_version,
                    "enabled" if s.mig_enabled else "disabled",
                ],
                1.0,
            )
            reading = results.get(s.uuid, Outcome.LOST)
            if not isinstance(reading, DeviceReading):
                fam[c.GPU_UP.name].add_metric(gpu, 0.0)
                continue
            answered = True
            fam[c.GPU_UP.name].add_metric(gpu, 1.0)
            for spec, attr in _VALUES:
                value = getattr(reading, attr)
                if value is not None:
                    fam[spec.name].add_metric(gpu, float(value))
            _static(fam, gpu, s.slowdown_temperature_celsius, c.GPU_SLOWDOWN_TEMPERATURE)
            _static(fam, gpu, s.shutdown_temperature_celsius, c.GPU_SHUTDOWN_TEMPERATURE)
            _static(fam, gpu, s.pcie_generation_max, c.GPU_PCIE_GEN_MAX)
            _static(fam, gpu, s.pcie_width_max, c.GPU_PCIE_WIDTH_MAX)
            mem = reading.memory
            if mem is not None:
                fam[c.GPU_MEMORY_TOTAL.name].add_metric(gpu, float(mem.total_bytes))
                fam[c.GPU_MEMORY_USED.name].add_metric(gpu, float(mem.used_bytes))
                fam[c.GPU_MEMORY_FREE.name].add_metric(gpu, float(mem.free_bytes))
                if mem.reserved_bytes is not None:
                    fam[c.GPU_MEMORY_RESERVED.name].add_metric(gpu, float(mem.reserved_bytes))
            if reading.clock_event_reasons is not None:
                for reason, bit in CLOCK_EVENT_REASONS:
                    active = 1.0 if reading.clock_event_reasons & bit else 0.0
                    fam[c.GPU_CLOCK_EVENT.name].add_metric([*gpu, reason], active)
        self.fleet.answered = answered or not self.fleet.slots
        live = {slot.uuid for slot in self.fleet.live()}
        migs = tuple(g for g in state.gpus if g.mig_uuid and g.uuid in live)
        state.gpus = tuple(slot.ref() for slot in self.fleet.live()) + migs
        return [f for f in fam.values() if f.samples]

    async def close(self) -> None:
        """Nothing to release: the GPU fleet is closed by the exporter."""


def _static(fam: dict[str, c.Family], gpu: list[str], value: float | None, spec: MetricSpec) -> None:
    if value is not None:
        fam[spec.name].add_metric(gpu, float(value))
