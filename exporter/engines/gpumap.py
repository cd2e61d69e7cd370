"""Which GPUs an engine runs on, from what other collectors published in NodeState."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class NodeIndex:
    """What engine_gpus looks up, made once per round: each endpoint then costs a few lookups
    instead of a pass over every process, allocation and PID's pod."""

    gpus: dict[str, str]  # gpu_indexes(state)
    pid_uuids: dict[int, set[str]] = field(default_factory=dict)  # GPU UUIDs of each process
    pod_devices: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # allocated device ids
    pod_pids: dict[tuple[str, str], set[int]] = field(default_factory=dict)


def node_index(state: NodeState) -> NodeIndex:
    """The lookups of one round's NodeState."""
    index = NodeIndex(gpu_indexes(state))
    for p in state.processes:
        index.pid_uuids.setdefault(p.pid, set()).add(p.uuid)
    for device_id, pods in state.allocations.items():
        for ref in pods:
            devices = index.pod_devices.setdefault((ref.namespace, ref.pod), [])
            if not devices or devices[-1] != device_id:
                devices.append(device_id)
    for pid, ref in state.pid_pods.items():
        index.pod_pids.setdefault((ref.namespace, ref.pod), set()).add(pid)
    return index


class NodeIndexMemo:
    """The last round's node_index, made again only when a NodeState field it is made of changed.

    NodeState's fields are replaced whole, never changed in place: the allocations and the PID -> pod
    map are the same objects while nothing changed; the GPU and process listings are new sequences
    every tick, of the same items (a comparison of a few dozen identities)."""

    def __init__(self) -> None:
        self._made: tuple[tuple[object, ...], tuple[object, ...], object, object, NodeIndex] | None = None

    def index(self, state: NodeState) -> NodeIndex:
        """node_index(state), the last one while its inputs are the same."""
        gpus, processes = tuple(state.gpus), tuple(state.processes)
        made = self._made
        if (
            made is not None
            and made[2] is state.allocations
            and made[3] is state.pid_pods
            and made[1] == processes
            and made[0] == gpus
        ):
            return made[4]
        index = node_index(state)
        self._made = (gpus, processes, state.allocations, state.pid_pods, index)
        return index


def _parent_uuid(device_id: str, state: NodeState) -> str:
    for g in state.gpus:
        if g.mig_uuid and g.mig_uuid == device_id:
            return g.uuid
    return device_id


def engine_gpus(
    target: Target, pids: Iterable[int], state: NodeState, index: Mapping[str, str] | NodeIndex | None = None
) -> list[tuple[str, str]]:
    """Sorted (gpu index, uuid) pairs; first by the engine's process tree, then by its pod.

    `index` is node_index(state) (or gpu_indexes(state)), made once per round by a caller with
    several engines."""
    node = index if isinstance(index, NodeIndex) else node_index(state)
    uuids: set[str] = set()
    for pid in set(pids):
        uuids |= node.pid_uuids.get(pid, set())
    pod = (target.namespace, target.pod)
    if not uuids and target.pod:
        uuids = {_parent_uuid(device_id, state) for device_id in node.pod_devices.get(pod, ())}
    if not uuids and target.pod:
        for pid in node.pod_pids.get(pod, ()):
            uuids |= node.pid_uuids.get(pid, set())
    gpus = index if index is not None and not isinstance(index, NodeIndex) else node.gpus
    pairs = [(gpus.get(u, ""), u) for u in uuids]
    return sorted(pairs, key=lambda iu: (int(iu[0]) if iu[0].isdigit() else 1 << 30, iu[1]))
