"""The engine drains a training job at its next step: a degrading fault's migrate waits for the progress
gauge to move (recorded as "waiting for checkpoint until T" in the incident and the page), a fatal
one migrates at once, and an unreadable progress source drains at once with the reason recorded."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from unittest.mock import MagicMock

from remediation.drain import BoundaryWaiter, iso
from remediation.effects import Act
from remediation.engine import RemediationEngine, build_engine
from remediation.incidents_cli import for_reading, rfc3339
from remediation.metrics import RemediationMetrics
from remediation.model import ActionResult, Target
from remediation.runner import EffectRunner
from remediation.settings import BudgetSettings, EngineDrainSettings, ScopeSettings
from tests.fakes.clock import FakeClock
from tests.fakes.pager_sink import RecordingPager
from tests.fakes.progress import LandsAt, Unreachable
from tests.remediation.test_engine_support import Rig, ScriptedBackend, engine_settings, events

MINUTE = 60.0
JOB = {
    "alertname": "TrainingRankStraggler",
    "severity": "warning",
    "layer": "training",
    "fault_class": "training_straggler",
    "target_kind": "job",
    "namespace": "train",
    "training_job": "llama",
    "training_job_kind": "JobSet.jobset.x-k8s.io",
    "node": "gpu-b",
    "uuid": "GPU-b3",
    "pod": "llama-workers-1-3-x",
    "rank": "11",
}
LOST_GPU = {
    **JOB,
    "alertname": "TrainingRankGPULost",
    "severity": "critical",
    "fault_class": "training_node_fault",
}


class TimedBackend(ScriptedBackend):
    """Records when (on the fake clock) each rung reached the backend."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.at: list[float] = []

    async def migrate(self, target: Target, reason: str) -> ActionResult:
        self.at.append(self.clock.time())
        return await super().migrate(target, reason)


@dataclass
class DrainRig(Rig):
    progress: Any = None
    opened: float = field(init=False, default=0.0)

    def build(self) -> RemediationEngine:
        self.engine = cast(
            RemediationEngine,
            build_engine(
                self.settings,
                self.db_path,
                self.metrics,
                clock=self.clock,
                backend=self.backend,
                pager=self.pager,
                tracer_provider=None,
                library=self.library,
                progress=self.progress,
            ),
        )
        return self.engine


def rig(tmp_path: Path, progress_after: float | None, unreachable: bool = False) -> DrainRig:
    clock = FakeClock()
    source = (
        Unreachable()
        if unreachable
        else LandsAt(
            clock, None if progress_after is None else clock.time() + progress_after, clock.time() - 600
        )
    )
    settings = engine_settings(
        scope=ScopeSettings(namespaces=("train",)),
        drain=EngineDrainSettings(checkpoint_wait_max_seconds=30 * MINUTE, poll_seconds=30),
    )
    r = DrainRig(tmp_path, settings, clock=clock, backend=TimedBackend(clock), progress=source)
    r.build()
    r.opened = clock.time()
    return r


async def test_a_straggler_is_drained_right_after_the_step_four_minutes_out(tmp_path: Path) -> None:
    r = rig(tmp_path, progress_after=4 * MINUTE)
    await r.fire(JOB)
    backend = cast(TimedBackend, r.backend)
    assert backend.rungs == ["migrate"] and backend.at == [r.opened + 4 * MINUTE]  # not at 0
    assert r.metric("gpupulse_remediation_drain_wait_seconds_sum", outcome="boundary") == 4 * MINUTE
    inc = r.only_incident()
    waits = [h for h in inc["history"] if h["status"] == "waiting_for_checkpoint"]
    assert len(waits) == 1 and "waiting for checkpoint" in waits[0]["summary"]
    assert waits[0]["details"]["deadline_at"] == r.opened + 30 * MINUTE
    # `incidents get` shows when the wait ends, in RFC 3339 like every other time
    shown = for_reading(inc)
    [wait_shown] = [h for h in shown["history"] if h["status"] == "waiting_for_checkpoint"]
    assert wait_shown["details"]["deadline_at"] == rfc3339(r.opened + 30 * MINUTE)
    assert iso(r.opened + 30 * MINUTE) in wait_shown["summary"]
    assert events(inc).index("waiting_for_checkpoint") < events(inc).index("drain_boundary")
    # the straggler's node needs a human after the migrate: the page says how the drain met the step
    page = r.pager.firing[-1]
    assert "drain: the job's next step landed at" in page.summary
    await r.engine.aclose(grace_seconds=0)


async def test_a_lost_gpu_is_drained_at_once(tmp_path: Path) -> None:
    r = rig(tmp_path, progress_after=4 * MINUTE)
    await r.fire(LOST_GPU)
    backend = cast(TimedBackend, r.backend)
    assert backend.at == [r.opened]
    assert "waiting_for_checkpoint" not in events(r.only_incident())
    await r.engine.aclose(grace_seconds=0)


async def test_no_step_within_the_tunable_drains_at_the_deadline(tmp_path: Path) -> None:
    r = rig(tmp_path, progress_after=None)
    await r.fire(JOB)
    assert cast(TimedBackend, r.backend).at == [r.opened + 30 * MINUTE]
    assert "drain_deadline" in events(r.only_incident())
    await r.engine.aclose(grace_seconds=0)


async def test_an_unreachable_progress_source_drains_at_once_with_the_reason(tmp_path: Path) -> None:
    r = rig(tmp_path, progress_after=None, unreachable=True)
    await r.fire(JOB)
    assert cast(TimedBackend, r.backend).at == [r.opened]
    inc = r.only_incident()
    [done] = [h for h in inc["history"] if h["status"] == "drain_unreachable"]
    assert "connection refused" in done["summary"] and "at once" in done["summary"]
    await r.engine.aclose(grace_seconds=0)


class Blocked:
    """A progress read that does not answer until released: the drain is caught mid-wait."""

    def __init__(self) -> None:
        self.reading = asyncio.Event()
        self.release = asyncio.Event()

    async def last_progress_at(self, target: Target) -> float | None:
        self.reading.set()
        await self.release.wait()
        return None


async def test_a_restart_mid_wait_drains_once_and_never_claims_the_work_moved(tmp_path: Path) -> None:
    r = rig(tmp_path, progress_after=None)
    blocked = Blocked()
    r.progress = blocked
    r.build()
    await r.engine.handle(r.event(JOB))
    await blocked.reading.wait()
    r.clock.advance(3 * MINUTE)
    r.progress = LandsAt(r.clock, r.clock.time() - MINUTE, before=0.0)  # a step landed meanwhile
    await r.restart_controller(TimedBackend(r.clock))
    await r.advance(1)
    backend = cast(TimedBackend, r.backend)
    assert backend.rungs == ["migrate"] and backend.at == [r.opened + 3 * MINUTE + 1]
    inc = r.only_incident()
    actions = [
        (h["rung"], h["status"]) for h in inc["history"] if h["kind"] == "action" and h["rung"] != "page"
    ]
    assert actions == [("migrate", "skipped"), ("migrate", "success")]  # never "interrupted"
    assert events(inc).count("drain_boundary") == 1
    await r.engine.aclose(grace_seconds=0)


async def test_jobs_waiting_for_their_checkpoints_hold_no_concurrency_slot(tmp_path: Path) -> None:
    clock = FakeClock()
    blocked = Blocked()
    settings = engine_settings(
        scope=ScopeSettings(namespaces=("train",)),
        budgets=BudgetSettings(max_concurrent_actions=1, max_nodes_migrated_fraction=0),
    )
    r = DrainRig(tmp_path, settings, clock=clock, backend=TimedBackend(clock), progress=blocked)
    r.build()
    await r.engine.handle(r.event(JOB))
    await blocked.reading.wait()
    other = {**LOST_GPU, "training_job": "mixtral", "node": "gpu-c"}
    await r.engine.handle(r.event(other))
    await asyncio.wait_for(r.backend.entered.wait(), 10)
    assert [t.training_job for _, t in r.backend.calls] == ["mixtral"]
    assert r.metric("gpupulse_remediation_breaker_open") == 0
    blocked.release.set()
    await r.engine.wait_idle()
    await r.engine.aclose(grace_seconds=0)


async def test_a_replica_fenced_mid_wait_neither_drains_nor_ends_the_wait() -> None:
    clock = FakeClock()
    leader = [True]
    recorded: list[str] = []

    class Recorder:
        def __getattr__(self, name: str) -> Any:
            recorded.append(name)
            return MagicMock(return_value=[])

    async def record(fn: Any) -> None:
        fn(Recorder())

    class LoseLeaseOnRead:
        async def last_progress_at(self, target: Target) -> float | None:
            leader[0] = False  # the lease lapses while the drain waits
            return clock.time() + 1

    backend = TimedBackend(clock)
    runner = EffectRunner(
        backend,
        RecordingPager(),
        None,
        RemediationMetrics(),
        60.0,
        record,
        may_act=lambda: leader[0],
        boundary=BoundaryWaiter(LoseLeaseOnRead(), clock, 30),
    )
    target = Target(kind="job", namespace="train", training_job_kind="k", training_job="j")
    act = Act(1, 1, "migrate", target, "why", boundary_wait_seconds=1800, decided_at=clock.time())
    runner.dispatch([act])
    await runner.wait_idle()
    assert backend.calls == [] and recorded == ["on_boundary_wait"]  # the next leader resumes it


async def test_a_dry_run_says_it_would_wait_for_the_step_and_waits_for_nothing(tmp_path: Path) -> None:
    clock = FakeClock()
    source = LandsAt(clock, None, before=clock.time() - 600)
    settings = engine_settings(scope=ScopeSettings(namespaces=("train",)), dry_run=True)
    r = DrainRig(tmp_path, settings, clock=clock, backend=TimedBackend(clock), progress=source)
    r.build()
    opened = clock.time()
    await r.fire(JOB)
    [entry] = [h for h in r.only_incident()["history"] if h["status"] == "dry_run"]
    assert "after the job's next step (at most 1800 s)" in entry["summary"]
    assert source.reads == 0 and clock.time() == opened  # not one read, not one second
    await r.engine.aclose(grace_seconds=0)
