"""Collector `health`: XID counters, ECC error counters and row-remapping state."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from prometheus_client.core import Metric

from exporter.collectors.base import NodeState
from exporter.collectors.gpus import Answers, FleetCollector, GpuFleet, Read, Tiered
from exporter.collectors.series import Rows, Series, Values, defer, table
from exporter.collectors.xid import XidCounter
from exporter.nvml import HealthReading, read_health
from gpupulse.metrics import gpu as c


class HealthCollector(FleetCollector):
    """ECC and remapped rows from NVML on the slow tier; XIDs as counted by the event thread.

    XID counters stay for lost GPUs: XID 79 with gpu_up 0 is how a GPU that fell off the bus shows.
    """

    name = "health"

    def __init__(self, fleet: GpuFleet, xids: XidCounter, slow_interval_seconds: float = 0.0) -> None:
        super().__init__(fleet)
        self.xids = xids
        # ECC and remap counters change rarely: read on the slow tier, XIDs come from the event thread
        self._reads = Tiered(fleet, read_health, slow_interval_seconds)
        self._series: dict[str, _GpuSeries] = {}

    def plan(self, state: NodeState) -> Sequence[Read]:
        """The slow tier's reads."""
        return self._reads.plan()

    def publish(self, answers: Sequence[Answers], state: NodeState) -> Sequence[Metric]:
        """Health counters (their rows made when first read, see `defer`) with the XID counts."""
        xid, ecc, rows, pending, failed = (table(spec).family() for spec in c.HEALTH_METRICS)
        tick: list[tuple[_GpuSeries, HealthReading]] = []
        for slot, r in self._reads.settle(answers):
            if not isinstance(r, HealthReading):
                continue
            gs = self._series.get(slot.uuid)
            if gs is None:
                u, i = slot.uuid, slot.index
                gs = self._series[slot.uuid] = (
                    ecc.table.series(u, i, "corrected"),
                    ecc.table.series(u, i, "uncorrected"),
                    rows.table.series(u, i, "correctable"),
                    rows.table.series(u, i, "uncorrectable"),
                    pending.table.series(u, i),
                    failed.table.series(u, i),
                )
            tick.append((gs, r))
        defer((ecc, rows, pending, failed), partial(_rows_of, tick))
        index_by_uuid = {slot.uuid: slot.index for slot in self.fleet.slots}
        known = [
            (int(index_by_uuid[u]), code, u, n)
            for (u, code), n in self.xids.counts().items()
            if u in index_by_uuid
        ]
        for index, code, uuid, count in sorted(known):
            xid.add(xid.table.series(uuid, str(index), str(code)), float(count))
        return [f for f in (xid,) if f.rows] + [ecc, rows, pending, failed]


# per GPU: ECC corrected, uncorrected, remapped correctable, uncorrectable, pending, failed
_GpuSeries = tuple[Series, Series, Series, Series, Series, Series]


def _rows_of(tick: list[tuple[_GpuSeries, HealthReading]], rows: Rows, values: Values) -> None:
    ecc, remapped, pending, failed = 0, 1, 2, 3  # positions of the deferred families
    for gs, r in tick:
        if r.ecc_corrected is not None:
            rows[ecc].append(gs[0])
            values[ecc].append(float(r.ecc_corrected))
        if r.ecc_uncorrected is not None:
            rows[ecc].append(gs[1])
            values[ecc].append(float(r.ecc_uncorrected))
        if r.remapped_correctable is not None and r.remapped_uncorrectable is not None:
            rows[remapped] += (gs[2], gs[3])
            values[remapped] += (float(r.remapped_correctable), float(r.remapped_uncorrectable))
        if r.remap_pending is not None:
            rows[pending].append(gs[4])
            values[pending].append(float(r.remap_pending))
        if r.remap_failed is not None:
            rows[failed].append(gs[5])
            values[failed].append(float(r.remap_failed))
