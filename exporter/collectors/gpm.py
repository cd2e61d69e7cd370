"""Collector `gpm`: true SM, tensor and DRAM activity from GPM (Hopper and newer; absent elsewhere)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from prometheus_client.core import Metric

from exporter.collectors.base import NodeState
from exporter.collectors.gpus import GpuFleet
from exporter.collectors.series import table
from exporter.nvml import poll_gpm
from gpupulse.metrics import gpu as c

SPEC_BY_METRIC = {
    "sm_active": c.GPU_SM_ACTIVE,
    "sm_occupancy": c.GPU_SM_OCCUPANCY,
    "tensor_active": c.GPU_TENSOR_ACTIVE,
    "dram_active": c.GPU_DRAM_ACTIVE,
}


class GpmCollector:
    """One GPM sample per GPU per tick; ratios over the interval since the previous tick."""

    name = "gpm"
    interval_seconds: float | None = None

    def __init__(self, fleet: GpuFleet) -> None:
        self.fleet = fleet

    async def collect(self, state: NodeState) -> Sequence[Metric]:
        """Poll every GPU that supports GPM; the first poll only sets the baseline."""
        supported = [
            s for s in self.fleet.live() if s.device.static.gpm_supported and not s.device.static.mig_enabled
        ]
        fam = {spec.name: table(spec).family() for spec in c.GPM_METRICS}
        poll = partial(poll_gpm, monotonic=self.fleet.clock.monotonic)
        results = await self.fleet.map(poll, supported)
        for slot, values in results:
            if not isinstance(values, dict):
                continue
            for metric, value in values.items():
                f = fam[SPEC_BY_METRIC[metric].name]
                f.add(f.table.series(slot.uuid, slot.index), value)
        return [f for f in fam.values() if f.rows]

    async def close(self) -> None:
        """Nothing to release: the GPU fleet is closed by the exporter."""
