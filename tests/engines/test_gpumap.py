"""An engine's GPUs through the round's NodeIndex are what a pass over the whole NodeState gives: by
its process tree, else by its pod's allocations (MIG devices named by their parent GPU), else by its
pod's processes; on random nodes, including MIG, shared GPUs, unknown PIDs and pod-less engines."""

from __future__ import annotations

import random
from collections.abc import Iterable

import pytest

from exporter.collectors.base import GpuProcess, GpuRef, NodeState, PodRef
from exporter.engines.gpumap import NodeIndexMemo, engine_gpus, gpu_indexes, node_index
from exporter.engines.targets import Target


def _by_passes(target: Target, pids: Iterable[int], state: NodeState) -> list[tuple[str, str]]:
    """The reading before the index: one pass over processes, allocations and PID pods per engine."""
    pidset = set(pids)
    uuids = {p.uuid for p in state.processes if p.pid in pidset}
    if not uuids and target.pod:
        for device_id, pods in state.allocations.items():
            if any(p.namespace == target.namespace and p.pod == target.pod for p in pods):
                parent = next(
                    (g.uuid for g in state.gpus if g.mig_uuid and g.mig_uuid == device_id), device_id
                )
                uuids.add(parent)
    if not uuids and target.pod:
        pod_pids = {
            pid
            for pid, p in state.pid_pods.items()
            if p.namespace == target.namespace and p.pod == target.pod
        }
        uuids = {p.uuid for p in state.processes if p.pid in pod_pids}
    index = gpu_indexes(state)
    pairs = [(index.get(u, ""), u) for u in uuids]
    return sorted(pairs, key=lambda iu: (int(iu[0]) if iu[0].isdigit() else 1 << 30, iu[1]))


def _node(rng: random.Random) -> NodeState:
    gpus = [GpuRef(f"GPU-{i}", str(i), "H100", f"b{i}") for i in range(rng.randint(0, 8))]
    gpus += [
        GpuRef(g.uuid, g.index, g.name, g.pci_bus_id, f"MIG-{g.index}-{k}")
        for g in gpus[:2]
        for k in range(2)
    ]
    devices = [g.mig_uuid or g.uuid for g in gpus] + ["GPU-gone", "MIG-gone"]
    pods = [
        PodRef(f"ns{rng.randint(0, 2)}", f"p{rng.randint(0, 5)}", f"c{rng.randint(0, 1)}") for _ in range(8)
    ]
    allocations = {
        d: [rng.choice(pods) for _ in range(rng.randint(1, 3))]
        for d in rng.sample(devices, k=len(devices) // 2)
    }
    processes = [
        GpuProcess(
            rng.choice(devices[: len(gpus)] or ["GPU-x"]), str(rng.randint(0, 9)), rng.randint(1, 40)
        )
        for _ in range(rng.randint(0, 20))
    ]
    pid_pods = {rng.randint(1, 40): rng.choice(pods) for _ in range(rng.randint(0, 15))}
    return NodeState(gpus=gpus, processes=processes, allocations=allocations, pid_pods=pid_pods)


@pytest.mark.parametrize("seed", range(40))
def test_engine_gpus_through_the_round_index_match_a_pass_over_the_node(seed: int) -> None:
    rng = random.Random(seed)
    state = _node(rng)
    index = node_index(state)
    for _ in range(10):
        target = Target(
            "http://e:1/metrics", namespace=f"ns{rng.randint(0, 2)}", pod=rng.choice(["", "p1", "p2", "p9"])
        )
        tree = {rng.randint(1, 40) for _ in range(rng.randint(0, 4))}
        expected = _by_passes(target, tree, state)
        assert engine_gpus(target, tree, state, index) == expected
        assert engine_gpus(target, tree, state, gpu_indexes(state)) == expected
        assert engine_gpus(target, tree, state) == expected


def test_the_index_is_kept_while_the_node_is_the_same_and_made_anew_when_a_field_is_replaced() -> None:
    # NodeState's fields are replaced whole when they change; the processes listing is a new sequence
    # every tick. Each replacement with other content must give the index of the new node.
    rng = random.Random(7)
    memo = NodeIndexMemo()
    state = _node(rng)
    while not state.processes or not state.pid_pods or not state.allocations:
        state = _node(rng)
    first = memo.index(state)
    state.processes = list(state.processes)  # a new listing of the same processes
    assert memo.index(state) is first
    other = _node(random.Random(8))
    for name in ("processes", "pid_pods", "allocations", "gpus"):
        before = memo.index(state)
        setattr(state, name, getattr(other, name))
        index = memo.index(state)
        assert index is not before and index == node_index(state), name
    state.pid_pods = dict(state.pid_pods)  # an equal map, but another object: made again
    assert memo.index(state) == node_index(state)
