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
    assert state.allocations[world.uuid(4)] == [PodRef("research", "llama-train-master-0", "pytorch")]
    assert world.uuid(7) not in state.allocations


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
    assert "embed-0 GPU 2 -> GPU 7" in text and "still needs a reset" in text
    assert _procs(2) == set()
    assert len(_procs(7)) == 1
    assert state.allocations[world.uuid(7)][0].pod == "embed-0"
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
    assert "GPU 1 -> GPU 7" in text
    clock.set(18)
    world.tick()
    assert _app_xids(es) == [(7, 13)]
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
    # fill the free GPU; a full node has nowhere to migrate to
    world.pods[-1].gpus = [6, 7]
    with pytest.raises(WorldError, match="no free GPU"):
        world.migrate("pod", NODE, "serving", "llama-0", "")


def test_demo_section_errors_name_the_field() -> None:
    with pytest.raises(WorldError, match=r"x-demo.pods.ghost"):
        parse_demo_spec({"pods": [], "x-demo": {"pods": {"ghost": {}}}})
    with pytest.raises(WorldError, match="every_seconds"):
        parse_demo_spec({"x-demo": {"repeat_xids": [{"gpu": 0, "xid": 48, "every_seconds": "often"}]}})


JOB_KIND = "PyTorchJob.kubeflow.org"
JOB = "llama-train"
RANK_PODS = ("llama-train-master-0", "llama-train-worker-0", "llama-train-worker-1")  # ranks 0, 1, 2


def _ranks(world: World) -> dict[str, tuple[str, int, str, str]]:
    """rank -> (pod, GPU, job, world size) of every rank gpu_training_rank_info would show."""
    return {
        r.rank: (r.pod, int(r.gpu), f"{r.training_job_kind}/{r.training_job}", r.world_size)
        for r in world.rank_rows()
    }


def _util(index: int) -> int:
    return int(N.nvmlDeviceGetUtilizationRates(N.nvmlDeviceGetHandleByIndex(index)).gpu)


def _moves_data(world: World, index: int, t: float) -> bool:
    spec = world.sim.state.gpus[index].spec
    return (
        spec.tensor_active.at(t) > 0.1
        and spec.pcie_tx_bytes_per_second.at(t) > 1e7
        and (spec.nvlink_tx_bytes_per_second.at(t) > 1e7)
    )


def test_the_training_job_is_a_gang_of_ranks_named_as_the_exporter_names_them(world: World) -> None:
    job = f"{JOB_KIND}/{JOB}"
    assert _ranks(world) == {
        "0": ("llama-train-master-0", 4, job, "3"),
        "1": ("llama-train-worker-0", 5, job, "3"),
        "2": ("llama-train-worker-1", 6, job, "3"),
    }
    assert [p.name for p in world.job_pods("research", JOB_KIND, JOB)] == list(RANK_PODS)


def test_a_dead_rank_hangs_the_others_until_the_whole_job_restarts(world: World, clock: ManualClock) -> None:
    state = NodeState()
    world.attach(state)
    clock.set(19.9)
    world.tick()
    assert set(_ranks(world)) == {"0", "1", "2"} and _moves_data(world, 4, 19.9)
    clock.set(20)
    world.tick()
    # rank 1's process is gone (and with it its rank series); ranks 0 and 2 spin in the collective
    assert _procs(5) == set() and 32002 not in state.pid_pods
    assert set(_ranks(world)) == {"0", "2"}
    assert (_util(4), _util(5), _util(6)) == (99, 0, 99)
    assert not _moves_data(world, 4, 20) and not _moves_data(world, 6, 20)
    assert world.sim.state.gpus[4].spec.tensor_active.at(20) == 0.0
    clock.set(30)
    text = world.restart("job", NODE, "research", "", JOB_KIND, JOB)
    assert f"restarted training job {JOB_KIND} research/{JOB}, all 3 ranks together" in text
    assert "PID 32002 (exited) ->" in text
    new = [_procs(i) for i in (4, 5, 6)]
    assert all(len(pids) == 1 and min(pids) >= 40001 for pids in new)  # a fresh process on every rank
    assert {state.pid_pods[min(pids)].pod for pids in new} == set(RANK_PODS)
    assert set(_ranks(world)) == {"0", "1", "2"}
    assert all(_moves_data(world, i, 30) for i in (4, 5, 6)) and (_util(4), _util(5), _util(6)) == (
        99,
        99,
        99,
    )
    clock.set(60)
    world.tick()
    assert len(_procs(5)) == 1  # the rank died once: the restarted job runs on


def test_restarting_one_rank_pod_leaves_the_job_hung(world: World, clock: ManualClock) -> None:
    clock.set(20)
    world.tick()
    clock.set(25)
    text = world.restart("pod", NODE, "research", "llama-train-worker-0")
    assert "stays hung" in text
    assert len(_procs(5)) == 1 and set(_ranks(world)) == {"0", "1", "2"}
    # the new rank 1 cannot join the collective ranks 0 and 2 wait in: all three spin, none works
    assert (_util(4), _util(5), _util(6)) == (99, 99, 99)
    assert not any(_moves_data(world, i, 25) for i in (4, 5, 6))


def test_a_job_restart_for_a_job_the_world_lacks_is_refused(world: World) -> None:
    for namespace, kind, job in (
        ("research", JOB_KIND, "other-train"),
        ("serving", JOB_KIND, JOB),
        ("research", "JobSet.jobset.x-k8s.io", JOB),
        ("research", JOB_KIND, ""),
    ):
        with pytest.raises(WorldError, match="no training job"):
            world.restart("job", NODE, namespace, "", kind, job)
    with pytest.raises(WorldError, match="not the simulated node"):
        world.restart("job", "other-node", "research", "", JOB_KIND, JOB)
    with pytest.raises(WorldError, match="pod or job target"):
        world.restart("gpu", NODE, "", "", "", "")
    assert world.actions == []


def test_training_sections_errors_name_the_field() -> None:
    owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "t", "uid": "u"}
    rank0 = {
        "name": "t-master-0",
        "namespace": "ns",
        "owner": owner,
        "containers": [{"name": "c", "gpus": [4], "pids": [1], "env": {"RANK": "0", "WORLD_SIZE": "2"}}],
    }
    with pytest.raises(WorldError, match=r"pods\[0\].labels"):
        parse_demo_spec({"pods": [{**rank0, "labels": {"replica-index": 0}}]})
    with pytest.raises(WorldError, match=r"pods\[0\].owner: needs uid"):
        parse_demo_spec({"pods": [{**rank0, "owner": {**owner, "uid": ""}}]})
    with pytest.raises(WorldError, match=r"containers\[0\].env"):
        parse_demo_spec({"pods": [{**rank0, "containers": [{"name": "c", "env": {"RANK": 0}}]}]})
    with pytest.raises(WorldError, match=r"x-demo.jobs.ns/ghost: no pods"):
        parse_demo_spec(
            {"pods": [rank0], "x-demo": {"jobs": {"ns/ghost": {"rank_dies": {"rank": 0, "at": 1}}}}}
        )
    with pytest.raises(WorldError, match=r"rank_dies.rank: '5' is not one of the job's ranks"):
        parse_demo_spec({"pods": [rank0], "x-demo": {"jobs": {"ns/t": {"rank_dies": {"rank": 5, "at": 1}}}}})
    with pytest.raises(WorldError, match=r"x-demo.jobs.ns/t.hung"):
        parse_demo_spec(
            {
                "pods": [rank0],
                "x-demo": {"jobs": {"ns/t": {"rank_dies": {"rank": 0, "at": 1}, "hung": {"power": 1}}}},
            }
        )
    spec = parse_demo_spec(
        {"pods": [rank0], "x-demo": {"jobs": {"ns/t": {"rank_dies": {"rank": 0, "at": 7}}}}}
    )
    assert (spec.hangs[0].key, spec.hangs[0].rank, spec.hangs[0].at_seconds) == ("ns/t", "0", 7.0)
