"""Pods that live and die, replayed through the training rig on the shipped rules (the fast profile, on
Prometheus 3): the ranks are played by the scenarios' `jobs` sections (coupled: the others wait on the
slowest), and the scheduler stand-in (tests/alerts/training_rig.py, StandIn) re-creates a restarted
gang's pods on free GPUs with new UIDs and PIDs after the scenario's `scheduler.delay_seconds`, so the
world answers the controller's restart.

One replay, three jobs (6 exporters, one Prometheus, Alertmanager and controller):
- llama-restart: rank 11 exits at t=60; TrainingJobHung fires, the controller restarts the gang once,
  the new ranks train, the alert stays resolved and the incident closes automated;
- llama-finish: every rank exits at t=120 (the job is done): its GPUs are released, nothing fires, its
  rank and allocation series are gone, GPUIdleWhileAllocated never holds on its GPUs;
- llama-rendezvous: rank 11's container restarts at t=60 and its new process waits in rendezvous (a
  CUDA context, no kernel, asleep with no I/O) while the other 15 spin: TrainingRankStalled names it
  (evidence `blocked`, the long window), then one gang restart fixes it.

The measured times go to docs/design/training.md ("Measured"). The rendezvous case sets the length:
the shipped 15-minute window for a rank asleep with no I/O (3 minutes at 5x) is the detection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from remediation.signatures import load_builtin
from tests.alerts.training_rig import (
    FINISHED,
    FINISHED_AT,
    LIFECYCLE,
    NAMESPACE,
    REJOINED,
    RESTARTED,
    Case,
    Profile,
    Replay,
    fast_profile,
    running_replay,
)

pytestmark = [
    pytest.mark.integration,
    # start-up (~15 s), the rendezvous case's 180 s window + for + the restart and close (~230 s), checks
    pytest.mark.timeout(420),
]

# wall seconds the incident watches for a recurrence before it closes (shipped: 30 minutes): short, so
# that the close is seen; the restart, the alert and the ladder are the shipped ones
COOLDOWN_SECONDS = 15.0
# scenario seconds after the new ranks start in which the fault must not come back
PROGRESS_SCENARIO_SECONDS = 60.0
# TrainingRankStalled asleep with no I/O: its 15m window + for 1m + up to a minute of scrapes and evaluations
TARGET_SECONDS = {"TrainingJobHung": 120.0, "TrainingRankStalled": 17 * 60.0}


def _profile() -> Profile:
    """The fast profile, with GPUCollectorFailing's `for:` scaled like the training alerts' (5m / 5):
    fast-overrides.yaml's 2 s makes a stall of two seconds of this shared machine a pending alert that
    the shipped rules (5 minutes) would not come near."""
    fast = fast_profile()
    assert fast.overrides is not None
    overrides = {**fast.overrides, "for": {**fast.overrides["for"], "GPUCollectorFailing": "60s"}}
    return dataclasses.replace(fast, overrides=overrides)


def _signatures() -> list[dict[str, Any]]:
    hung = next(s for s in load_builtin() if s.name == "training-job-hung").to_dict()
    ladder = {**hung["ladder"], "cooldown_seconds": COOLDOWN_SECONDS}
    return [{**hung, "ladder": ladder, "source": "test_training_lifecycle: shipped, shorter cooldown"}]


async def _until(predicate: Any, timeout_seconds: float, what: str, step: float = 0.5) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_seconds:.0f} s: {what}")
        await asyncio.sleep(step)


async def _restarted(replay: Replay, case: Case) -> bool:
    assert replay.stand_in is not None
    return len({r.node for r in replay.stand_in.restarts if r.job == case.job}) == 2


async def _started(replay: Replay, case: Case) -> bool:
    assert replay.stand_in is not None
    mine = [r for r in replay.stand_in.restarts if r.job == case.job]
    return bool(mine) and all(r.started_unix > 0 for r in mine)


async def _closed(replay: Replay, case: Case) -> dict[str, Any] | None:
    for inc in await replay.incidents(case):
        if inc.get("closed_at") is not None:
            return inc
    return None


async def _fixed_by_the_restart(replay: Replay, case: Case, alertname: str, report: list[str]) -> None:
    """The alert fired, one gang restart, the new pods on the free GPUs, the fault gone, closed."""
    speed = replay.profile.speed
    onset = replay.onset(case)
    # the target, then up to three scrapes and evaluations for the sample to be queryable
    deadline = onset + TARGET_SECONDS[alertname] / speed + 3 * replay.profile.interval_seconds - time.time()
    await _until(
        lambda: replay.first_firing(case, alertname), max(deadline, 1.0), f"{case.name}: {alertname}"
    )
    first = await replay.first_firing(case, alertname)
    assert first is not None
    latency = (first - onset) * speed
    assert 0 < latency <= TARGET_SECONDS[alertname], (
        f"{case.name}: {alertname} {latency:.0f} s after the onset"
    )
    series = await replay.firing_since(case, alertname)
    for key, value in case.suspect.items():
        assert {s["metric"].get(key) for s in series} == {value}, f"{case.name}: {alertname} names {key}"
    assert replay.stand_in is not None
    await _until(lambda: _restarted(replay, case), 30.0, f"{case.name}: the controller restarted the job")
    await asyncio.sleep(1.0)  # a second batch of deletions would be a second restart: let it show
    restarts = [r for r in replay.stand_in.restarts if r.job == case.job]
    assert sorted(r.node for r in restarts) == sorted(case.nodes), restarts  # one per node, not per pod
    assert all(r.attempt == 1 and len(r.placements) == 8 for r in restarts), restarts
    delay = 20.0 / speed + 5.0  # the scheduler stand-in's delay, and some slack on a busy machine
    await _until(lambda: _started(replay, case), delay + 10.0, f"{case.name}: the new pods started")
    restarts = [r for r in replay.stand_in.restarts if r.job == case.job]
    started = max(r.started_unix for r in restarts)
    # the new ranks train: their series come back, 16 ranks, and the fault stays away
    await asyncio.sleep(max(0.0, started + PROGRESS_SCENARIO_SECONDS / speed - time.time()))
    selector = f'namespace="{NAMESPACE}", training_job="{case.job}"'
    ranks = await replay.prom.query(f"count(gpu_training_rank_info{{{selector}}})")
    assert [float(r["value"][1]) for r in ranks] == [16.0], ranks
    busy = await replay.prom.query(f"min(rank:gpu_tensor_active:ratio{{{selector}}})")
    assert busy and float(busy[0]["value"][1]) > 0.4, busy  # every rank computes again
    stamps = [float(ts) for s in await replay.firing_since(case, alertname) for ts, _ in s["values"]]
    last_firing = max(stamps)
    assert last_firing < started, f"{case.name}: {alertname} still fired after the new ranks started"
    # the new pods are new: recreated under the same names with new UIDs, their processes new PIDs
    pids = await replay.prom.query(
        f'count(gpu_process_memory_used_bytes{{pod=~"{case.job}-.*", pid=~"19.*"}})'
    )
    assert [float(p["value"][1]) for p in pids] == [16.0], pids
    actions = await replay.actions(case)
    assert [a for a in actions if a[0] in ("restart", "migrate")] == [("restart", "success")], actions
    assert len(replay.pod_deletes(case)) == 16
    await _until(lambda: _closed(replay, case), COOLDOWN_SECONDS + 30, f"{case.name}: incident closed")
    closed = await _closed(replay, case)
    assert closed is not None and closed["resolution"] == "automated", closed
    deleted = min(r.deleted_unix for r in restarts)
    report.append(
        f"{case.name}: {alertname} firing {latency:.0f} s after the onset; restart (first pod delete) "
        f"{(deleted - first) * speed:.0f} s after the firing; new ranks started "
        f"{(started - deleted) * speed:.0f} s after the delete (delay 20 s); last firing sample "
        f"{(last_firing - deleted) * speed:+.0f} s from the delete; closed automated "
        f"{closed['closed_at'] - deleted:.0f} s (wall, cooldown {COOLDOWN_SECONDS:.0f} s) after the delete; "
        f"1 restart, 16 pod deletes"
    )


async def _finished_and_released(replay: Replay, report: list[str]) -> None:
    case = FINISHED
    speed = replay.profile.speed
    done = max(e.started_unix for e in replay.exporters if e.case == case) + FINISHED_AT / speed
    window = int(time.time() - replay.t_start) + 5
    selector = f'namespace="{NAMESPACE}", training_job="{case.job}"'
    info = await replay.prom.query(f"gpu_training_rank_info{{{selector}}}[{window}s]")
    last_rank = max(float(ts) for s in info for ts, _ in s["values"])
    assert last_rank < done + 3 * replay.profile.interval_seconds, "rank series outlived the job"
    assert not await replay.prom.query(f"gpu_training_rank_info{{{selector}}}")
    alloc = await replay.prom.query(f'gpu_allocation_info{{pod=~"{case.job}-.*"}}')
    assert not alloc, f"the finished job's GPUs are still allocated: {alloc}"
    idle = await replay.prom.query(
        f'ALERTS{{alertname="GPUIdleWhileAllocated", node=~"{"|".join(case.nodes)}"}}[{window}s]'
    )
    late = [
        s
        for s in idle
        if max(float(ts) for ts, _ in s["values"]) > done + 3 * replay.profile.interval_seconds
    ]
    assert not late, f"GPUIdleWhileAllocated on released GPUs: {[s['metric'] for s in late]}"
    assert not replay.pod_deletes(case), "the controller touched the finished job"
    pods = [p for (ns, name), p in replay.api.pods.items() if name.startswith(case.job + "-")]
    assert len(pods) == 16 and {p["status"]["phase"] for p in pods} == {"Succeeded"}
    report.append(
        f"{case.name}: rank series gone {(last_rank - done) * speed:.0f} s (scenario) after the last rank "
        "exited; allocations released; no alert"
    )


async def test_pods_that_live_and_die_a_restart_that_fixes_a_hang_a_finished_job_a_rank_in_rendezvous(
    tmp_path: Path,
) -> None:
    report: list[str] = []
    async with running_replay(LIFECYCLE, _profile(), tmp_path, signatures=_signatures()) as replay:
        # the first two cases settle while the rendezvous case's long window runs
        await _fixed_by_the_restart(replay, RESTARTED, "TrainingJobHung", report)
        await _finished_and_released(replay, report)
        await _fixed_by_the_restart(replay, REJOINED, "TrainingRankStalled", report)
        for case in LIFECYCLE:
            quiet = await replay.quiet(case)
            assert not quiet.firing, f"{case.name}: alerts firing that should not: {quiet.firing}"
            assert not quiet.too_long, f"{case.name}: pending for more than half their for: {quiet.too_long}"
            report.append(
                f"{case.name}: besides {', '.join(sorted(case.expected)) or 'nothing'}, {quiet.describe()}"
            )
        held = await replay.pending_runs(lambda labels: REJOINED.owns(labels))
        report.append(
            "rendezvous: held pending (never firing): "
            + ", ".join(
                f"{n} {held[n] * replay.profile.speed:.0f} s" for n in sorted(REJOINED.may_pend & set(held))
            )
        )
        # the container restart counted in its pod's status; its new process was the same pod's rank
        assert replay.stand_in is not None
        assert not replay.stand_in.errors, replay.stand_in.errors
        assert replay.stand_in.restart_counts == {f"{REJOINED.job}-worker-10": 1}
        first = await replay.first_firing(REJOINED, "TrainingRankStalled")
        fresh = await replay.prom.api(
            "query", query='gpu_process_memory_used_bytes{pid="9111"}', time=str(first)
        )
        assert [s["metric"]["pod"] for s in fresh["result"]] == [f"{REJOINED.job}-worker-10"], fresh
    print("\n".join(report))
