"""The demo world: pods, and how restart and migrate change the simulation."""

from __future__ import annotations

import pynvml as N
import pytest

from demo.simnode import DEFAULT_SCENARIO, load_demo_scenario
from demo.world import World, WorldError, parse_demo_spec
from exporter.collectors.base import NodeState, PodRef
from exporter.sim import ManualClock, SimulatedNvml

CHAT = "chat-7d9f8b6c5d-x2x4z"
RAG = "rag-5c8d9f7b6-k2m4p"
NODE = "demo-node-0"


def _procs(index: int) -> set[int]:
    return {p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(N.nvmlDeviceGetHandleByIndex(index))}


def _xids(es: object) -> list[tuple[int, int]]:
    out = []
    while True:
        try:
            ev = N.nvmlEventSetWait_v2(es, 0)
        except N.NVMLError_Timeout:
            return out
        out.append((N.nvmlDeviceGetIndex(ev.device), ev.eventData))


def _app_xids(es: object) -> list[tuple[int, int]]:
    return [e for e in _xids(es) if e[1] == 13]


def _event_set() -> object:
    es = N.nvmlEventSetCreate()
    for i in range(N.nvmlDeviceGetCount()):
        N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(i), N.nvmlEventTypeXidCriticalError, es)
    return es


def test_pods_are_published_to_the_node_state(world: World) -> None:
    state = NodeState()
    world.attach(state)
    assert state.pid_pods[31001] == PodRef("serving", CHAT, "server")
    assert state.allocations[world.uuid(4)] == [PodRef("research", "train-0", "trainer")]
    assert world.uuid(6) not in state.allocations


def test_restart_replaces_the_process_and_republishes(world: World, clock: ManualClock) -> None:
    state = NodeState()
    world.attach(state)
    clock.set(60)
    text = world.restart("pod", NODE, "serving", CHAT)
    assert "GPU memory back to 18 GiB" in text
    (new_pid,) = _procs(0)
    assert new_pid != 31001
    assert state.pid_pods[new_pid].pod == CHAT
    assert 31001 not in state.pid_pods


def test_migrating_a_bad_gpu_moves_its_pod_to_a_free_gpu(world: World) -> None:
    state = NodeState()
    world.attach(state)
    text = world.migrate("gpu", NODE, "", "", world.uuid(2))
    assert "embed-0 GPU 2 -> GPU 6" in text and "still needs a reset" in text
    assert _procs(2) == set()
    assert len(_procs(6)) == 1
    assert state.allocations[world.uuid(6)][0].pod == "embed-0"
    assert world.uuid(2) not in state.allocations


def test_the_bad_gpu_keeps_reporting_its_xid(world: World, clock: ManualClock) -> None:
    es = _event_set()
    for t in (7, 8, 9, 11, 12):
        clock.set(t)
        world.tick()
    assert [e for e in _xids(es) if e[1] == 48] == [(2, 48), (2, 48)]  # at 8 and 11, every 3 s
    world.migrate("gpu", NODE, "", "", world.uuid(2))
    clock.set(14)
    world.tick()
    assert (2, 48) in _xids(es)  # migration does not heal the GPU
    N.nvmlEventSetFree(es)


def test_the_application_fault_follows_every_new_process(world: World, clock: ManualClock) -> None:
    es = _event_set()
    clock.set(12)
    world.tick()
    assert (1, 13) in _app_xids(es)
    clock.set(13)
    world.restart("pod", NODE, "serving", RAG)
    clock.set(14)
    world.tick()
    assert _app_xids(es) == []  # the new process needs 2 s to hit the bug
    clock.set(15)
    world.tick()
    assert _app_xids(es) == [(1, 13)]
    clock.set(16)
    text = world.migrate("pod", NODE, "serving", RAG, "")
    assert "GPU 1 -> GPU 6" in text
    clock.set(18)
    world.tick()
    assert _app_xids(es) == [(6, 13)]
    N.nvmlEventSetFree(es)


def test_the_script_counts_from_start_script(sim: SimulatedNvml, clock: ManualClock) -> None:
    _, spec = load_demo_scenario(DEFAULT_SCENARIO)
    w = World(sim, spec)
    es = _event_set()
    clock.set(100)
    w.tick()
    assert _xids(es) == []  # nothing happens before the stack is ready
    assert w.start_script() == 100
    clock.set(107)
    w.tick()
    assert _xids(es) == []
    clock.set(108)
    w.tick()
    assert _xids(es) == [(2, 48)]
    clock.set(100 + 44)
    used = {
        p.pid: p.usedGpuMemory
        for p in N.nvmlDeviceGetComputeRunningProcesses(N.nvmlDeviceGetHandleByIndex(0))
    }
    assert used == {31001: 50 << 30}
    N.nvmlEventSetFree(es)


def test_requests_the_world_cannot_serve_are_refused(world: World) -> None:
    with pytest.raises(WorldError, match="no pod"):
        world.restart("pod", NODE, "serving", "nope")
    with pytest.raises(WorldError, match="not the simulated node"):
        world.restart("pod", "other-node", "serving", CHAT)
    with pytest.raises(WorldError, match="one-node demo"):
        world.migrate("node", NODE, "", "", "")


def test_migrate_without_a_free_gpu_is_refused(world: World) -> None:
    # fill both free GPUs; a full node has nowhere to migrate to
    world.pods[-1].gpus = [4, 5, 6, 7]
    with pytest.raises(WorldError, match="no free GPU"):
        world.migrate("pod", NODE, "serving", "llama-0", "")


def test_demo_section_errors_name_the_field() -> None:
    with pytest.raises(WorldError, match=r"x-demo.pods.ghost"):
        parse_demo_spec({"pods": [], "x-demo": {"pods": {"ghost": {}}}})
    with pytest.raises(WorldError, match="every_seconds"):
        parse_demo_spec({"x-demo": {"repeat_xids": [{"gpu": 0, "xid": 48, "every_seconds": "often"}]}})
