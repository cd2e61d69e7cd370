"""Which GPUs an engine runs on, from what other collectors published in NodeState."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from exporter.collectors.base import NodeState
from exporter.engines.targets import Target


def gpu_indexes(state: NodeState) -> dict[str, str]:
    """GPU UUID -> NVML index, also resolving MIG UUIDs to their parent GPU's UUID key."""
    out: dict[str, str] = {}
    for g in state.gpus:
        out.setdefault(g.uuid, g.index)
    for p in state.processes:
        out.setdefault(p.uuid, p.index)
    return out


def _parent_uuid(device_id: str, state: NodeState) -> str:
    for g in state.gpus:
        if g.mig_uuid and g.mig_uuid == device_id:
            return g.uuid
    return device_id


def engine_gpus(
    target: Target, pids: Iterable[int], state: NodeState, index: Mapping[str, str] | None = None
) -> list[tuple[str, str]]:
    """Sorted (gpu index, uuid) pairs; first by the engine's process tree, then by its pod.

    `index` is gpu_indexes(state), made once per round by a caller with several engines."""
    pidset = set(pids)
    uuids = {p.uuid for p in state.processes if p.pid in pidset}
    if not uuids and target.pod:
        for device_id, pods in state.allocations.items():
            if any(p.namespace == target.namespace and p.pod == target.pod for p in pods):
                uuids.add(_parent_uuid(device_id, state))
    if not uuids and target.pod:
        pod_pids = {
            pid
            for pid, p in state.pid_pods.items()
            if p.namespace == target.namespace and p.pod == target.pod
        }
        uuids = {p.uuid for p in state.processes if p.pid in pod_pids}
    if index is None:
        index = gpu_indexes(state)
    pairs = [(index.get(u, ""), u) for u in uuids]
    return sorted(pairs, key=lambda iu: (int(iu[0]) if iu[0].isdigit() else 1 << 30, iu[1]))
