"""Training-job replays: a 2 x 8 PyTorchJob per case, one real exporter per node, the real Prometheus
with our rules (the fast profile: fast-overrides.yaml with training-fast-overrides.yaml over it), the
real Alertmanager and the real controller with the Kubernetes backend on the in-process API server.
tests/alerts/training_rig.py says how the pieces are wired and what is played rather than real.

Per case: the alert that must fire (and its labels), every other alert that must not (pending or
firing, over the whole run, read back from ALERTS), and what the controller did through the API: one
job restart through the owner (16 pod deletes, one ledger action), the suspect node cordoned before a
migrate's restart, no second restart while the fault persists. Detection latency is measured from the
fault's onset in scenario time (the scenarios play 5x fast; the rules are scaled to match) and held
to the issue's targets: a hang within 2 minutes, a straggler named within 3.

The four cases run in one replay (8 exporters of 8 simulated GPUs, one Prometheus, Alertmanager and
controller): about 80 s on the shared 2 cores, where two replays of two cases took 150 s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest

from tests.alerts.training_rig import CASES, NAMESPACE, STALLED, Case, Replay, fast_profile, running_replay

pytestmark = [
    pytest.mark.integration,
    # start-up (~15 s on a busy machine), the 300 s scenarios at 5x (60 s), then the checks: ~90 s
    pytest.mark.timeout(240),
]

SCENARIO_SECONDS = 300.0
# scenario seconds after the onset that the controller's actions are watched for a second restart
SETTLE_SCENARIO_SECONDS = 150.0
# TrainingRankStalled: training_stalled_rank_evidence (2m) + for (1m) + a scrape and an evaluation
TARGET_SECONDS = {
    "TrainingJobHung": 120.0,
    "TrainingRankStraggler": 180.0,
    "TrainingJobNodeFault": 120.0,
    "TrainingRankStalled": 240.0,
}


async def _run_until_settled(
    replay: Replay,
    scenario_seconds: float = SCENARIO_SECONDS,
    settle_seconds: float = SETTLE_SCENARIO_SECONDS,
) -> None:
    """Until every case's scenario has played out, and every faulty case has acted and settled."""
    profile = replay.profile
    end = max(e.started_unix for e in replay.exporters) + scenario_seconds / profile.speed
    for case in replay.cases:
        if case.fault_at is not None:
            end = max(end, replay.onset(case) + settle_seconds / profile.speed)
    # scenario time has to pass: the healthy job's phases, and the watch for a second restart
    await asyncio.sleep(max(0.0, end - time.time()))


async def _check_case(replay: Replay, case: Case, report: list[str]) -> None:
    speed = replay.profile.speed
    quiet = await replay.quiet(case)
    if quiet.firing or quiet.too_long:
        timeline = await replay.timeline(case)
        assert not quiet.firing, f"{case.name}: firing that should not: {quiet.firing}\n{timeline}"
        assert not quiet.too_long, f"{case.name}: pending over half their for: {quiet.too_long}\n{timeline}"
    if case.fault_at is None:
        assert not replay.pod_deletes(case), f"{case.name}: the controller touched the healthy job"
        assert not any(replay.cordoned(n) for n in case.nodes)
        report.append(f"{case.name}: over {SCENARIO_SECONDS:.0f} s, {quiet.describe()}")
        return
    report.append(f"{case.name}: besides {', '.join(sorted(case.expected))}, {quiet.describe()}")

    onset = replay.onset(case)
    for name in case.expected:
        first = await replay.first_firing(case, name)
        assert first is not None, f"{case.name}: {name} never fired"
        latency = (first - onset) * speed
        report.append(f"{case.name}: {name} firing {latency:.0f} s (scenario) after the onset")
        assert 0 < latency <= TARGET_SECONDS[name], f"{case.name}: {name} {latency:.0f} s after the onset"
        series = await replay.firing_since(case, name)
        for key, value in case.suspect.items():
            assert {s["metric"].get(key) for s in series} == {value}, f"{case.name}: {name} names {key}"

    # one job restart through the owner: every rank's pod deleted once, one action in the ledger
    deletes = replay.pod_deletes(case)
    assert len(deletes) == 16 and len(set(deletes)) == 16, f"{case.name}: pod deletes {deletes}"
    actions = await replay.actions(case)
    assert [a for a in actions if a[0] in ("restart", "migrate")] == [(case.action, "success")], actions
    if case.action == "migrate":  # the straggler's or lost GPU's node stays cordoned for a human
        assert ("page", "success") in actions, actions
    if case.cordon is not None:
        cordon, first_delete = replay.cordon_index(case.cordon), replay.first_delete_index(case)
        assert cordon is not None and first_delete is not None and cordon < first_delete
        other = next(n for n in case.nodes if n != case.cordon)
        assert not replay.cordoned(other), f"{case.name}: the healthy node {other} was cordoned"
    # nothing was evicted pod by pod (GPUFellOffBus's and the thermal ladders' way)
    assert not [r for r in replay.api.requests if r.path.endswith("/eviction")]
    report.append(f"{case.name}: {case.action} x1, {len(deletes)} pod deletes, no second restart")


async def _replay(cases: tuple[Case, ...], tmp_path: Path) -> list[str]:
    report: list[str] = []
    async with running_replay(cases, fast_profile(), tmp_path) as replay:
        await _run_until_settled(replay)
        for case in cases:
            await _check_case(replay, case, report)
        if CASES["hang"] in cases:
            await _check_dead_rank_has_no_series_and_the_survivors_still_hang(replay, CASES["hang"])
    print("\n".join(report))
    return report


async def _check_dead_rank_has_no_series_and_the_survivors_still_hang(replay: Replay, case: Case) -> None:
    """Rank 11's process is gone, so is its rank_info series: the job counts 15 ranks, all busy-idle."""
    first = await replay.first_firing(case, "TrainingJobHung")
    assert first is not None
    selector = f'namespace="{NAMESPACE}", training_job="{case.job}"'
    ranks = await replay.prom.api("query", query=f"gpu_training_rank_info{{{selector}}}", time=str(first))
    assert sorted(int(s["metric"]["rank"]) for s in ranks["result"]) == [r for r in range(16) if r != 11]
    count = await replay.prom.api(
        "query", query=f"training_job:gpu_training_ranks:count{{{selector}}}", time=str(first)
    )
    assert [float(s["value"][1]) for s in count["result"]] == [15.0]


async def test_training_jobs_hang_straggle_and_lose_a_gpu_and_are_each_restarted_once_healthy_stays_quiet(
    tmp_path: Path,
) -> None:
    await _replay(tuple(CASES.values()), tmp_path)


async def test_a_job_hung_on_one_rank_stuck_on_a_mount_names_it_and_is_restarted_once(tmp_path: Path) -> None:
    """Rank 11 stays alive in state D with no I/O while the other 15 spin: TrainingRankStalled names
    it (evidence disk_sleep) within 4 minutes, TrainingJobHung stays quiet, one gang restart."""
    report: list[str] = []
    async with running_replay((STALLED,), fast_profile(), tmp_path) as replay:
        # detection takes up to 240 s after the onset at 60 s; then the watch for a second restart
        await _run_until_settled(replay, scenario_seconds=400.0, settle_seconds=330.0)
        await _check_case(replay, STALLED, report)
        first = await replay.first_firing(STALLED, "TrainingRankStalled")
        assert first is not None
        selector = f'namespace="{NAMESPACE}", training_job="{STALLED.job}"'
        # the suspect's process as the exporter read it from /proc: in D, no bytes moving
        state = await replay.prom.api(
            "query",
            query=f'gpu_process_state{{pod=~"{STALLED.job}-.*", pid="9011", state="disk_sleep"}}',
            time=str(first),
        )
        assert [float(s["value"][1]) for s in state["result"]] == [1.0]
        io = await replay.prom.api(
            "query", query=f'rank:gpu_process_io:bytes_per_second{{{selector}, rank="11"}}', time=str(first)
        )
        assert [float(s["value"][1]) for s in io["result"]] == [0.0]
    print("\n".join(report))


async def test_a_hung_job_that_logs_its_steps_is_named_once_its_steps_stopped(tmp_path: Path) -> None:
    """The hang case with a progress signal: rank 0 prints DeepSpeed's step line every 5 s (scenario)
    until rank 11 dies. TrainingJobHung waits for the steps to stop (5 update intervals), then its 1m:
    one gang restart, TrainingJobNoProgress stays out of it."""
    case = dataclasses.replace(CASES["hang"], progress_step_seconds=5.0)
    report: list[str] = []
    async with running_replay((case,), fast_profile(), tmp_path) as replay:
        await _run_until_settled(replay)
        await _check_case(replay, case, report)
        first = await replay.first_firing(case, "TrainingJobHung")
        assert first is not None
        selector = f'namespace="{NAMESPACE}", training_job="{case.job}"'
        steps = await replay.prom.api(
            "query",
            query=f"max_over_time(gpu_training_progress_steps_total{{{selector}}}[5m])",
            time=str(first),
        )
        assert [float(s["value"][1]) for s in steps["result"]] == [11.0], steps  # steps 0-11 before 60 s
        moving = await replay.prom.api(
            "query", query=f"training_job:gpu_training_progress_moving:bool{{{selector}}}", time=str(first)
        )
        assert [float(s["value"][1]) for s in moving["result"]] == [0.0]
        assert await replay.first_firing(case, "TrainingJobNoProgress") is None
    print("\n".join(report))


async def test_a_straggling_job_is_drained_right_after_its_next_step(tmp_path: Path) -> None:
    """The straggler case with a progress signal that goes on through the fault (a throttled rank slows
    the job, it does not stop it): rank 0 prints a step every 30 s (scenario). The migrate is decided
    when TrainingRankStraggler fires, then waits, reading the job's last-step time from Prometheus,
    until a step lands after the decision: the suspect node is cordoned and the gang restarted right
    after it, never mid-step, and the incident and its page say so."""
    case = dataclasses.replace(CASES["straggler"], progress_step_seconds=30.0, steps_through_fault=True)
    report: list[str] = []
    async with running_replay((case,), fast_profile(), tmp_path) as replay:
        await _run_until_settled(replay)
        await _check_case(replay, case, report)
        [incident] = [i for i in await replay.incidents(case) if i["alertname"] == "TrainingRankStraggler"]
        history = incident["history"]
        [wait] = [h for h in history if h["status"] == "waiting_for_checkpoint"]
        [landed] = [h for h in history if h["status"].startswith("drain_")]
        assert landed["status"] == "drain_boundary", landed
        decided, progress = wait["details"]["decided_at"], landed["details"]["progress_at"]
        # the step landed after the decision, the drain followed it, within one step of scenario time
        assert decided < progress <= landed["at"], (decided, progress, landed["at"])
        assert 0 < landed["details"]["waited_seconds"] <= 30.0 / replay.profile.speed + 10.0
        migrate = next(h for h in history if h["kind"] == "action" and h["rung"] == "migrate")
        assert migrate["finished_at"] >= landed["at"]
        report.append(
            f"{case.name}: decided, then drained {landed['details']['waited_seconds']:.1f} s (wall) "
            "later, right after the job's next step"
        )
    print("\n".join(report))
