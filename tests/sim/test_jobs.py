"""Training jobs in a scenario: coupled ranks read through pynvml's real wrappers, pod lifecycle (exit,
container restart, an extra process, completion), a gang restart replayed on placed GPUs, its inbox,
and strict validation of every new field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pynvml as N
import pytest

from exporter.errors import InterventionError, ScenarioError
from exporter.sim import ManualClock
from exporter.sim.jobs import place_gang, restart_count
from exporter.sim.lifecycle import MAX_LINE_BYTES, Inbox, apply_command, restart_gang
from exporter.sim.scenario import parse_scenario
from tests.sim.helpers import Installer, handles

RANKS = [{"rank": 0, "gpu": 0, "pid": 100}, {"rank": 1, "gpu": 1, "pid": 101}]


def _doc(*events: dict[str, Any], coupled: bool = True, gpus: int = 3, **job: Any) -> dict[str, Any]:
    return {
        "gpus": [{"model": "H100", "nvlink": {"switch": True}} for _ in range(gpus)],
        "jobs": [
            {
                "name": "llama",
                "world_size": 4,  # ranks 2 and 3 run on another node
                "coupled": coupled,
                "ranks": RANKS,
                "events": list(events),
                **job,
            }
        ],
    }


def _util(index: int) -> int:
    return int(N.nvmlDeviceGetUtilizationRates(handles()[index]).gpu)


def _pids(index: int) -> list[int]:
    return sorted(p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(handles()[index]))


def _tensor(clock: ManualClock, index: int) -> float:
    """GPM's tensor activity (%) over the next second, as the exporter reads it."""
    h = handles()[index]
    s1, s2 = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    try:
        N.nvmlGpmSampleGet(h, s1)
        clock.advance(1)
        N.nvmlGpmSampleGet(h, s2)
        mg = N.c_nvmlGpmMetricsGet_t()
        mg.version = N.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = 1
        mg.sample1, mg.sample2 = s1, s2
        mg.metrics[0].metricId = N.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        N.nvmlGpmMetricsGet(mg)
        return float(mg.metrics[0].value)
    finally:
        N.nvmlGpmSampleFree(s1)
        N.nvmlGpmSampleFree(s2)


def test_a_rank_on_another_node_that_dies_leaves_the_local_ranks_spinning(
    sim: Installer, clock: ManualClock
) -> None:
    sim(_doc({"at": 60, "kind": "exit", "rank": 3}))
    clock.set(30)
    assert (_util(0), _util(1)) == (99, 99) and _tensor(clock, 0) == pytest.approx(48)
    clock.set(70)
    # a kernel resident (NCCL's spin), no tensor work, no NVLink traffic: the others wait for rank 3
    assert (_util(0), _util(1)) == (97, 97)
    assert _tensor(clock, 1) == pytest.approx(0)
    rx = N.nvmlDeviceGetPcieThroughput(handles()[0], N.NVML_PCIE_UTIL_RX_BYTES)
    assert rx <= 100  # KB/s
    assert _pids(0) == [100] and _pids(1) == [101]  # both still alive
    assert _pids(2) == [] and _util(2) == 0  # the GPU no rank holds


def test_uncoupled_ranks_keep_computing_when_another_rank_dies(sim: Installer, clock: ManualClock) -> None:
    sim(_doc({"at": 60, "kind": "exit", "rank": 0}, coupled=False))
    clock.set(70)
    assert (_util(0), _util(1)) == (0, 99)
    assert _pids(0) == [] and _pids(1) == [101]


def test_a_straggler_slows_the_whole_step(sim: Installer, clock: ManualClock) -> None:
    slow = {"at": 60, "kind": "slow", "rank": 1, "ratio": 0.5, "sm_clock_hertz": 1.2e9,
            "reasons": ["sw_thermal_slowdown"], "until": 200}  # fmt: skip
    sim(_doc(slow))
    clock.set(100)
    # rank 0 computes half of each step and spins the other half; the straggler computes throughout
    assert _tensor(clock, 0) == pytest.approx(24)
    assert _tensor(clock, 1) == pytest.approx(48)
    assert N.nvmlDeviceGetClockInfo(handles()[1], N.NVML_CLOCK_SM) == 1200
    assert N.nvmlDeviceGetClockInfo(handles()[0], N.NVML_CLOCK_SM) == 1980
    assert N.nvmlDeviceGetCurrentClocksEventReasons(handles()[1]) == 0x20
    clock.set(250)  # it cooled down: the step is back to its speed
    assert _tensor(clock, 0) == pytest.approx(48)
    assert N.nvmlDeviceGetCurrentClocksEventReasons(handles()[1]) == 0


def test_a_container_restart_starts_a_new_pid_in_rendezvous_while_the_others_spin(
    sim: Installer, clock: ManualClock
) -> None:
    nv = sim(_doc({"at": 60, "kind": "container_restart", "rank": 1, "pid": 201, "after_seconds": 8}))
    clock.set(65)
    assert _pids(1) == [] and _util(0) == 97  # between the exit and the restart: no process
    clock.set(70)
    assert _pids(1) == [201] and _util(1) == 0  # a CUDA context, no kernel
    used = N.nvmlDeviceGetComputeRunningProcesses(handles()[1])[0].usedGpuMemory
    assert used == 512 << 20
    assert _util(0) == 97  # the others stay in the collective the new process never joins
    clock.set(600)
    assert _pids(1) == [201] and _util(0) == 97
    job = nv.scenario.jobs[0]
    assert (restart_count(job, 1, 59), restart_count(job, 1, 61), restart_count(job, 0, 61)) == (0, 1, 0)


def test_a_new_process_in_a_rank_pod_runs_beside_it(sim: Installer, clock: ManualClock) -> None:
    sim(_doc({"at": 30, "kind": "new_process", "rank": 0, "pid": 300, "memory_bytes": "1GiB", "until": 90}))
    clock.set(40)
    assert _pids(0) == [100, 300] and _util(1) == 99  # no effect on the job
    clock.set(95)
    assert _pids(0) == [100]


def test_a_finished_job_releases_its_gpus(sim: Installer, clock: ManualClock) -> None:
    sim(_doc({"at": 200, "kind": "complete"}))
    clock.set(100)
    assert N.nvmlDeviceGetMemoryInfo(handles()[0]).used >= 70 << 30
    clock.set(201)
    for i in (0, 1):
        assert _pids(i) == [] and _util(i) == 0
        assert N.nvmlDeviceGetMemoryInfo(handles()[i]).used < 1 << 30  # the reserved part only
        assert N.nvmlDeviceGetCurrentClocksEventReasons(handles()[i]) == 0x1  # GpuIdle


def test_a_stalled_rank_stays_alive_in_its_host_state_while_the_others_spin(
    sim: Installer, clock: ManualClock
) -> None:
    nv = sim(_doc({"at": 60, "kind": "stall", "rank": 0, "host_state": "disk_sleep", "until": 120}))
    clock.set(90)
    assert _pids(0) == [100] and (_util(0), _util(1)) == (0, 97)
    rank0 = next(p for p in nv.scenario.processes if p.pid == 100)
    assert [rank0.host_state_at(t) for t in (30, 90, 130)] == ["sleeping", "disk_sleep", "sleeping"]
    assert rank0.io_read_bytes(120) == 0
    clock.set(130)  # the mount came back
    assert (_util(0), _util(1)) == (99, 99)


def test_a_gang_restart_replays_the_next_run_on_the_placed_gpus(sim: Installer, clock: ManualClock) -> None:
    nv = sim(_doc({"at": 60, "kind": "exit", "rank": 3}, rendezvous_seconds=5))
    clock.set(100)
    energy = N.nvmlDeviceGetTotalEnergyConsumption(handles()[0])
    # rank 1 moves to the free GPU 2; rank 0 stays on GPU 0
    attempt = restart_gang(nv, "llama", 100.0, 120.0, {0: (0, 1000), 1: (2, 1001)})
    assert attempt == 1
    clock.set(110)  # deleted, not yet rescheduled
    assert [_pids(i) for i in range(3)] == [[], [], []]
    assert {_util(i) for i in range(3)} == {0}
    clock.set(122)  # the new ranks meet in rendezvous
    assert [_pids(i) for i in range(3)] == [[1000], [], [1001]]
    assert {_util(i) for i in range(3)} == {0}
    clock.set(130)  # and train: rank 3's death belonged to the run before
    assert (_util(0), _util(1), _util(2)) == (99, 0, 99)
    assert _tensor(clock, 2) == pytest.approx(48)
    assert N.nvmlDeviceGetTotalEnergyConsumption(handles()[0]) > energy  # no jump back
    assert N.nvmlSystemGetProcessName(1001)


def test_a_restart_plays_the_events_of_its_attempt(sim: Installer, clock: ManualClock) -> None:
    nv = sim(_doc({"at": 60, "kind": "exit", "rank": 3}, {"at": 30, "kind": "complete", "attempt": 1}))
    clock.set(100)
    restart_gang(nv, "llama", 100.0, 100.0, {0: (0, 1000), 1: (1, 1001)})
    clock.set(120)
    assert _pids(0) == [1000]
    clock.set(131)  # 30 s into the new run (rendezvous included) the job finishes
    assert _pids(0) == [] and _pids(1) == []


def test_a_restart_in_the_past_is_applied_now_and_bad_ones_are_refused(
    sim: Installer, clock: ManualClock
) -> None:
    nv = sim(_doc(gpus=2))
    clock.set(50)
    with pytest.raises(InterventionError, match="no job 'other'"):
        restart_gang(nv, "other", 50, 60, {})
    with pytest.raises(InterventionError, match="PID 100 is already used"):
        restart_gang(nv, "llama", 50, 60, {0: (0, 100)})
    with pytest.raises(InterventionError, match="two ranks placed on one GPU"):
        restart_gang(nv, "llama", 50, 60, {0: (0, 500), 1: (0, 501)})
    with pytest.raises(InterventionError, match="no rank 9"):
        restart_gang(nv, "llama", 50, 60, {9: (0, 500)})
    restart_gang(nv, "llama", 10.0, 10.0, {0: (0, 500), 1: (1, 501)})
    assert _pids(0) == [500]  # the old ended now, not at t=10 (what was read stays read), the new began
    pid100 = next(p for g in nv.state.gpus for p in g.processes if p.pid == 100)
    assert pid100.end_seconds == 50


def test_place_gang_takes_the_lowest_free_gpus_and_refuses_too_few() -> None:
    assert place_gang([9, 8], [5, 3, 4], 19000) == {8: (3, 19000), 9: (4, 19001)}
    with pytest.raises(ValueError, match="2 ranks to place, 1 free GPUs"):
        place_gang([8, 9], [3], 19000)


def test_the_inbox_applies_appended_commands_and_skips_malformed_lines(
    sim: Installer, clock: ManualClock, tmp_path: Path
) -> None:
    nv = sim(_doc({"at": 60, "kind": "exit", "rank": 3}))
    clock.set(100)
    path = tmp_path / "inbox.jsonl"
    inbox = Inbox(nv, str(path))
    inbox.poll()  # no file yet: nothing, no error
    good = {"op": "restart_gang", "job": "llama", "deleted_at": 100, "start_at": 100,
            "ranks": [{"rank": 0, "gpu": 0, "pid": 700}, {"rank": 1, "gpu": 1, "pid": 701}]}  # fmt: skip
    hostile = [
        b"not json",
        json.dumps([1, 2]).encode(),
        json.dumps({**good, "op": "explode"}).encode(),
        json.dumps({**good, "job": "nope"}).encode(),
        json.dumps({**good, "deleted_at": "soon"}).encode(),
        json.dumps({**good, "ranks": [{"rank": 0, "gpu": True, "pid": 1}]}).encode(),
        json.dumps(
            {**good, "ranks": [{"rank": 0, "gpu": 0, "pid": 5}, {"rank": 0, "gpu": 1, "pid": 6}]}
        ).encode(),
        b"x" * (MAX_LINE_BYTES + 10),
    ]
    path.write_bytes(
        b"\n".join(hostile) + b"\n" + json.dumps(good).encode()[:20]
    )  # the last line half-written
    inbox.poll()
    inbox.poll()
    assert (inbox.applied, inbox.rejected) == (0, len(hostile))
    with path.open("ab") as f:
        f.write(json.dumps(good).encode()[20:] + b"\n")
    inbox.poll()
    assert (inbox.applied, inbox.rejected) == (1, len(hostile))
    clock.set(110)
    assert _pids(0) == [700]


def test_apply_command_names_the_bad_field(sim: Installer) -> None:
    nv = sim(_doc())
    with pytest.raises(InterventionError, match=r"^start_at: expected scenario seconds"):
        apply_command(nv, {"op": "restart_gang", "job": "llama", "deleted_at": 1, "ranks": []})


def test_the_inbox_thread_is_started_by_install_and_stopped_by_uninstall(
    sim: Installer, tmp_path: Path
) -> None:
    doc = _doc()
    doc["scheduler"] = {"delay_seconds": 5, "inbox": str(tmp_path / "in.jsonl")}
    nv = sim(doc)
    assert nv.inbox is not None and nv.inbox._thread.is_alive()
    nv.uninstall()
    assert not nv.inbox._thread.is_alive()


def test_a_relative_inbox_is_next_to_the_scenario_file() -> None:
    doc = _doc()
    doc["scheduler"] = {"inbox": "run/in.jsonl"}
    s = parse_scenario(doc, source="/data/scenarios/node-a.yaml")
    assert (s.scheduler.inbox, s.scheduler.delay_seconds) == ("/data/scenarios/run/in.jsonl", 20.0)


def _error(doc: dict[str, Any]) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(doc, source="bad.yaml")
    return info.value


def _with_job(**changes: Any) -> dict[str, Any]:
    doc = _doc()
    doc["jobs"][0].update(changes)
    return doc


@pytest.mark.parametrize(
    ("doc", "field_path", "words"),
    [
        (_with_job(colour="red"), "jobs[0].colour", "unknown field"),
        (_with_job(world_size=0), "jobs[0].world_size", ">= 1"),
        (_with_job(ranks=[]), "jobs[0].ranks", "at least one rank"),
        (_with_job(ranks=[{"rank": 4, "gpu": 0, "pid": 1}]), "jobs[0].ranks[0].rank", "<= 3"),
        (_with_job(ranks=[{"rank": 0, "gpu": 7, "pid": 1}]), "jobs[0].ranks[0].gpu", "<= 2"),
        (_with_job(ranks=[{"rank": 0, "gpu": 0}]), "jobs[0].ranks[0].pid", "required"),
        (_with_job(ranks=[*RANKS, {"rank": 1, "gpu": 2, "pid": 9}]), "jobs[0].ranks[2].rank", "duplicates"),
        (_with_job(ranks=[*RANKS, {"rank": 2, "gpu": 1, "pid": 9}]), "jobs[0].ranks[2].gpu", "duplicates"),
        (_with_job(coupled="yes"), "jobs[0].coupled", "true or false"),
        (_with_job(compute={"tensor_active": 1.5}), "jobs[0].compute.tensor_active", "<= 1"),
        (_with_job(spin={"nvlink": 1}), "jobs[0].spin.nvlink", "unknown field"),
        (_with_job(events=[{"at": 1, "kind": "melt", "rank": 0}]), "jobs[0].events[0].kind", "exit"),
        (_with_job(events=[{"at": 1, "kind": "exit"}]), "jobs[0].events[0].rank", "needs rank"),
        (
            _with_job(events=[{"at": 1, "kind": "exit", "rank": 0, "ratio": 0.5}]),
            "jobs[0].events[0].ratio",
            "does not take ratio",
        ),
        (
            _with_job(events=[{"at": 1, "kind": "slow", "rank": 0, "ratio": 2}]),
            "jobs[0].events[0].ratio",
            "<= 1",
        ),
        (_with_job(events=[{"at": 1, "kind": "slow", "rank": 0}]), "jobs[0].events[0].ratio", "needs ratio"),
        (
            _with_job(events=[{"at": 9, "kind": "stall", "rank": 0, "until": 9}]),
            "jobs[0].events[0].until",
            "after at",
        ),
        (
            _with_job(events=[{"at": 1, "kind": "stall", "rank": 0, "host_state": "zzz"}]),
            "jobs[0].events[0].host_state",
            "disk_sleep",
        ),
        (
            _with_job(events=[{"at": 1, "kind": "slow", "rank": 0, "ratio": 0.5, "reasons": ["hot"]}]),
            "jobs[0].events[0].reasons[0]",
            "unknown reason",
        ),
        (
            _with_job(events=[{"at": 1, "kind": "container_restart", "rank": 0}]),
            "jobs[0].events[0].pid",
            "needs pid",
        ),
        (
            _with_job(events=[{"at": 1, "kind": "container_restart", "rank": 0, "pid": 101}]),
            "jobs[0]",
            "pid 101 is used twice",
        ),
        (
            _with_job(events=[{"at": 1, "kind": "complete", "rank": 0}]),
            "jobs[0].events[0].rank",
            "does not take rank",
        ),
        (_with_job(events=[{"at": -1, "kind": "complete"}]), "jobs[0].events[0].at", ">= 0"),
        (
            _with_job(events=[{"at": 1, "kind": "complete", "attempt": -1}]),
            "jobs[0].events[0].attempt",
            ">= 0",
        ),
        (_with_job(events="exit"), "jobs[0].events", "a list"),
        ({**_doc(), "jobs": [_doc()["jobs"][0]] * 2}, "jobs[1].name", "duplicates"),
        ({**_doc(), "scheduler": {"delay": 3}}, "scheduler.delay", "unknown field"),
        ({**_doc(), "scheduler": {"delay_seconds": -3}}, "scheduler.delay_seconds", ">= 0"),
        ({**_doc(), "scheduler": {"inbox": ""}}, "scheduler.inbox", "non-empty string"),
        (
            {**_doc(), "gpus": [{"model": "H100", "utilization": 0.5}, {"model": "H100"}]},
            "gpus[0].utilization",
            "rank 0 of job llama",
        ),
        (
            {**_doc(), "gpus": [{"model": "A100", "mig": {"instances": [{"profile": "1g.10gb"}]}}] * 2},
            "jobs[0].ranks[0].gpu",
            "MIG mode",
        ),
        ({**_doc(), "processes": [{"pid": 100, "gpu": 2}]}, "jobs[0]", "pid 100 is used twice"),
    ],
)
def test_job_fields_are_validated_strictly(doc: dict[str, Any], field_path: str, words: str) -> None:
    err = _error(doc)
    assert err.field_path == field_path
    assert words in err.problem
    assert str(err).startswith(f"bad.yaml: {field_path}: ")


def test_events_listed_out_of_order_play_as_sorted() -> None:
    exit_ = {"at": 60, "kind": "exit", "rank": 3}
    stall = {"at": 20, "kind": "stall", "rank": 0, "until": 40}
    ordered = parse_scenario(_doc(stall, exit_)).gpus[1].utilization.points
    assert parse_scenario(_doc(exit_, stall)).gpus[1].utilization.points == ordered
    assert [t for t, _ in ordered] == [0.0, 20.0, 20.0, 40.0, 40.0, 60.0, 60.0]


def test_the_same_restart_posted_twice_is_applied_once(
    sim: Installer, clock: ManualClock, tmp_path: Path
) -> None:
    nv = sim(_doc())
    clock.set(100)
    path = tmp_path / "inbox.jsonl"
    command = {"op": "restart_gang", "job": "llama", "deleted_at": 100, "start_at": 100,
               "ranks": [{"rank": 0, "gpu": 0, "pid": 700}, {"rank": 1, "gpu": 1, "pid": 701}]}  # fmt: skip
    path.write_text(json.dumps(command) + "\n" + json.dumps(command) + "\n")
    inbox = Inbox(nv, str(path))
    inbox.poll()
    assert (inbox.applied, inbox.rejected) == (1, 1)  # the repeat names PIDs that are in use
    assert nv.state.job_attempts == {"llama": 1}
    clock.set(110)
    assert _pids(0) == [700] and _pids(1) == [701]


def test_a_process_due_after_the_restart_never_starts(sim: Installer, clock: ManualClock) -> None:
    # rank 1's container is between its exit and its restart when the gang is deleted
    restart = {"at": 60, "kind": "container_restart", "rank": 1, "pid": 201, "after_seconds": 30}
    nv = sim(_doc(restart))
    clock.set(70)
    restart_gang(nv, "llama", 70.0, 100.0, {0: (0, 1000), 1: (1, 1001)})
    clock.set(95)
    assert _pids(1) == []  # not 201: its pod was deleted before it came back
    clock.set(110)
    assert _pids(1) == [1001]
