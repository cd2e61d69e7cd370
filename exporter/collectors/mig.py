"""Collector `mig`: MIG instances with their memory and per-GPU-instance GPM activity."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from prometheus_client.core import Metric

from exporter.collectors.base import GpuRef, NodeState
from exporter.collectors.gpus import Answers, FleetCollector, GpuFleet, Read
from exporter.collectors.series import table
from exporter.nvml import Device, MigInstance, poll_mig_gpm, read_mig
from gpupulse.metrics import gpu as c

_GPM_SPECS = {
    "sm_active": c.GPU_MIG_SM_ACTIVE,
    "sm_occupancy": c.GPU_MIG_SM_OCCUPANCY,
    "tensor_active": c.GPU_MIG_TENSOR_ACTIVE,
    "dram_active": c.GPU_MIG_DRAM_ACTIVE,
}

MigResult = tuple[list[MigInstance], dict[int, dict[str, float]]]


class MigCollector(FleetCollector):
    """Enumerates instances every tick (handles change on reconfiguration) on MIG-enabled GPUs."""

    name = "mig"

    def __init__(self, fleet: GpuFleet) -> None:
        super().__init__(fleet)

    def _read(self, dev: Device) -> MigResult:
        instances = read_mig(dev)
        gpm = poll_mig_gpm(dev, [i.gpu_instance_id for i in instances], self.fleet.clock.monotonic)
        return instances, gpm

    def plan(self, state: NodeState) -> Sequence[Read]:
        """The instances of every live MIG-enabled GPU."""
        return [(self._read, [s for s in self.fleet.live() if s.device.static.mig_enabled])]

    def publish(self, answers: Sequence[Answers], state: NodeState) -> Sequence[Metric]:
        """Instance families; the instances to NodeState as GpuRefs with mig_uuid."""
        if not answers[0]:  # no MIG-enabled GPU answered (on most nodes, none has MIG on)
            if any(g.mig_uuid for g in state.gpus):
                state.gpus = tuple(g for g in state.gpus if not g.mig_uuid)
            return []
        fam = {spec.name: table(spec).family() for spec in c.MIG_METRICS}
        refs: list[GpuRef] = []
        for slot, r in answers[0]:
            if not isinstance(r, tuple):
                continue
            instances, gpm = r
            for inst in instances:
                base = (slot.uuid, slot.index, inst.mig_uuid)
                info = fam[c.GPU_MIG_INFO.name]
                gi, ci = str(inst.gpu_instance_id), str(inst.compute_instance_id)
                info.add(info.table.series(*base, gi, ci, inst.profile), 1.0)
                if inst.memory is not None:
                    used, total = fam[c.GPU_MIG_MEMORY_USED.name], fam[c.GPU_MIG_MEMORY_TOTAL.name]
                    used.add(used.table.series(*base), float(inst.memory.used_bytes))
                    total.add(total.table.series(*base), float(inst.memory.total_bytes))
                for metric, value in gpm.get(inst.gpu_instance_id, {}).items():
                    f = fam[_GPM_SPECS[metric].name]
                    f.add(f.table.series(*base), value)
                refs.append(replace(slot.ref(), mig_uuid=inst.mig_uuid))
        state.gpus = tuple(g for g in state.gpus if not g.mig_uuid) + tuple(refs)
        return [f for f in fam.values() if f.rows]
