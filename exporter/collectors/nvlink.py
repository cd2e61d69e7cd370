"""Collector `nvlink`: state of each NVLink link and which GPU pairs NVLink joins."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import Metric

from exporter.collectors.base import NodeState
from exporter.collectors.gpus import Answers, FleetCollector, GpuFleet, GpuSlot, Read, Tiered
from exporter.collectors.series import Series, table
from exporter.nvml import NvLinkState, nvlink_pairs, read_nvlink
from gpupulse.metrics import gpu as c


class NvLinkCollector(FleetCollector):
    """Link states on the slow tier; the peer topology once all GPUs have answered (it is static)."""

    name = "nvlink"

    def __init__(self, fleet: GpuFleet, slow_interval_seconds: float = 0.0) -> None:
        super().__init__(fleet)
        # Link states change rarely (a link trains down or fails): read on the slow tier; one call
        # per link, 18 per H100, was the largest share of a tick's NVML calls.
        self._reads = Tiered(fleet, read_nvlink, slow_interval_seconds)
        self._pairs: list[tuple[int, int, str, int]] | None = None
        # Both are static between changes, so a tick reuses them: the link series per GPU (keyed by
        # the link numbers read), and the peer-info rows per set of live GPUs.
        self._link_series: dict[str, tuple[tuple[int, ...], list[Series]]] = {}
        # per GPU: the link list last turned into values (the slow tier hands back the same list
        # between reads), and those values
        self._link_values: dict[str, tuple[list[NvLinkState], list[float]]] = {}
        self._peer_rows: tuple[tuple[str, ...], list[Series]] | None = None

    def _series_for(self, slot: GpuSlot, links: list[NvLinkState]) -> list[Series]:
        numbers = tuple(link.link for link in links)
        cached = self._link_series.get(slot.uuid)
        if cached is None or cached[0] != numbers:
            series = table(c.GPU_NVLINK_UP).series
            cached = self._link_series[slot.uuid] = (
                numbers,
                [series(slot.uuid, slot.index, str(n)) for n in numbers],
            )
        return cached[1]

    def _peer_series(self) -> list[Series]:
        live = self.fleet.live()
        key = tuple(s.uuid for s in live)
        if self._peer_rows is None or self._peer_rows[0] != key:
            series = table(c.GPU_NVLINK_PEER_INFO).series
            by_index = {s.device.static.index: s for s in live}
            rows: list[Series] = []
            for a, b, via, count in self._pairs or []:
                if a in by_index and b in by_index:
                    for x, y in ((by_index[a], by_index[b]), (by_index[b], by_index[a])):
                        rows.append(series(x.uuid, x.index, y.uuid, y.index, via, str(count)))
            self._peer_rows = (key, rows)
        return self._peer_rows[1]

    def plan(self, state: NodeState) -> Sequence[Read]:
        """The slow tier's reads."""
        return self._reads.plan()

    def publish(self, answers: Sequence[Answers], state: NodeState) -> Sequence[Metric]:
        """Link states and the peer info."""
        up, peers = (table(spec).family() for spec in c.NVLINK_METRICS)
        links: dict[int, list[NvLinkState]] = {}
        complete = True
        for slot, r in self._reads.settle(answers):
            if not isinstance(r, list):
                complete = False
                continue
            links[slot.device.static.index] = r
            done = self._link_values.get(slot.uuid)
            if done is None or done[0] is not r:
                done = self._link_values[slot.uuid] = (r, [1.0 if link.up else 0.0 for link in r])
                up.rows.extend(self._series_for(slot, r))
            else:
                up.rows.extend(self._link_series[slot.uuid][1])
            up.values.extend(done[1])
        if self._pairs is None and complete:
            self._pairs = nvlink_pairs([s.device for s in self.fleet.slots], links)
            self._peer_rows = None
        rows = self._peer_series()
        peers.rows.extend(rows)
        peers.values.extend([1.0] * len(rows))
        return [f for f in (up, peers) if f.rows]
