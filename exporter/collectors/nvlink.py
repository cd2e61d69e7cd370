"""Collector `nvlink`: state of each NVLink link and which GPU pairs NVLink joins."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import Metric

from exporter import catalog as c
from exporter.collectors.base import NodeState
from exporter.collectors.gpus import GpuFleet
from exporter.nvml import NvLinkState, nvlink_pairs, read_nvlink


class NvLinkCollector:
    """Link states every tick; the peer topology once all GPUs have answered (it is static)."""

    name = "nvlink"
    interval_seconds: float | None = None

    def __init__(self, fleet: GpuFleet) -> None:
        self.fleet = fleet
        self._pairs: list[tuple[int, int, str, int]] | None = None

    async def collect(self, state: NodeState) -> Sequence[Metric]:
        """Read link states and emit the peer info."""
        fam = {spec.name: c.family(spec) for spec in c.NVLINK_METRICS}
        links: dict[int, list[NvLinkState]] = {}
        complete = True
        for slot, r in await self.fleet.map(read_nvlink):
            if not isinstance(r, list):
                complete = False
                continue
            links[slot.device.static.index] = r
            for link in r:
                fam[c.GPU_NVLINK_UP.name].add_metric([slot.uuid, slot.index, str(link.link)], float(link.up))
        if self._pairs is None and complete:
            self._pairs = nvlink_pairs([s.device for s in self.fleet.slots], links)
        by_index = {s.device.static.index: s for s in self.fleet.live()}
        for a, b, via, count in self._pairs or []:
            if a in by_index and b in by_index:
                for x, y in ((by_index[a], by_index[b]), (by_index[b], by_index[a])):
                    fam[c.GPU_NVLINK_PEER_INFO.name].add_metric(
                        [x.uuid, x.index, y.uuid, y.index, via, str(count)], 1.0
                    )
        return [f for f in fam.values() if f.samples]

    async def close(self) -> None:
        """Nothing to release: the GPU fleet is closed by the exporter."""
