"""Collector `gpm`: SM, tensor and DRAM activity from GPM (Hopper and newer), and PCIe and NVLink
traffic per GPU (GPM where it exists, else NVML's PCIe sample and NVLink counters)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from prometheus_client.core import Metric

from exporter.collectors.base import NodeState
from exporter.collectors.gpus import Answers, FleetCollector, GpuFleet, GpuSlot, Read
from exporter.collectors.series import Rows, Series, Values, defer, table
from exporter.nvml import Device, InterconnectReading, poll_gpm, read_interconnect
from gpupulse.metrics import gpu as c
from gpupulse.metrics.spec import MetricSpec

SPEC_BY_METRIC: dict[str, tuple[MetricSpec, str]] = {
    "sm_active": (c.GPU_SM_ACTIVE, ""),
    "sm_occupancy": (c.GPU_SM_OCCUPANCY, ""),
    "tensor_active": (c.GPU_TENSOR_ACTIVE, ""),
    "dram_active": (c.GPU_DRAM_ACTIVE, ""),
    "pcie_tx": (c.GPU_PCIE_THROUGHPUT, "tx"),
    "pcie_rx": (c.GPU_PCIE_THROUGHPUT, "rx"),
    "nvlink_tx": (c.GPU_NVLINK_THROUGHPUT, "tx"),
    "nvlink_rx": (c.GPU_NVLINK_THROUGHPUT, "rx"),
}
_SPECS = c.GPM_METRICS + c.INTERCONNECT_METRICS
_POSITION = {spec.name: i for i, spec in enumerate(_SPECS)}


class GpmCollector(FleetCollector):
    """One GPM sample per GPU per tick; ratios and rates over the interval since the previous tick.

    A GPU without GPM (or in MIG mode, where only per-instance GPM is read) reports its PCIe and
    NVLink traffic from NVML's own counters instead; what a GPU cannot measure has no series.
    """

    name = "gpm"

    def __init__(self, fleet: GpuFleet) -> None:
        super().__init__(fleet)
        self._series: dict[str, dict[str, tuple[int, Series]]] = {}  # by GPU UUID

    def _read(self, dev: Device) -> dict[str, float] | InterconnectReading | None:
        monotonic = self.fleet.clock.monotonic
        s = dev.static
        if s.gpm_supported and not s.mig_enabled:
            return poll_gpm(dev, monotonic)
        return read_interconnect(dev, monotonic)

    def _series_of(self, slot: GpuSlot) -> dict[str, tuple[int, Series]]:
        # metric -> (family position, series): a GPU's labels are made once, not per tick
        found = self._series.get(slot.uuid)
        if found is None:
            found = self._series[slot.uuid] = {}
            for metric, (spec, direction) in SPEC_BY_METRIC.items():
                labels = (slot.uuid, slot.index, direction) if direction else (slot.uuid, slot.index)
                found[metric] = (_POSITION[spec.name], table(spec).series(*labels))
        return found

    def plan(self, state: NodeState) -> Sequence[Read]:
        """One poll of every live GPU."""
        return [(self._read, self.fleet.live())]

    def publish(self, answers: Sequence[Answers], state: NodeState) -> Sequence[Metric]:
        """GPM where supported (the first poll only sets the baseline), else NVML's counters; the rows
        are made when first read (see `defer`)."""
        tick: list[tuple[dict[str, tuple[int, Series]], dict[str, float] | InterconnectReading]] = []
        for slot, result in answers[0]:
            if isinstance(result, (dict, InterconnectReading)):
                tick.append((self._series_of(slot), result))
        fams = [table(spec).family() for spec in _SPECS]
        defer(fams, partial(_rows_of, tick))
        return fams


_INTERCONNECT = ("pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx")


def _rows_of(
    tick: list[tuple[dict[str, tuple[int, Series]], dict[str, float] | InterconnectReading]],
    rows: Rows,
    values: Values,
) -> None:
    for series, result in tick:
        if isinstance(result, dict):
            for metric, value in result.items():
                position, one = series[metric]
                rows[position].append(one)
                values[position].append(value)
        else:
            for metric in _INTERCONNECT:
                value = getattr(result, metric)
                if value is not None:
                    position, one = series[metric]
                    rows[position].append(one)
                    values[position].append(value)
