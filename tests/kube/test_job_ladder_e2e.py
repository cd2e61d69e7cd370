"""The real engine with the Kubernetes backend, for a 2 x 8 PyTorchJob: a hang restarts the whole job
once (one action, 16 ranks), a straggler cordons its node before the job restarts and then pages with
the evidence, loop detection counts every job restart whichever rung made it, and budgets count a
gang restart as one action."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

from remediation.backends.kubernetes import KubernetesBackend
from remediation.engine import RemediationEngine, build_engine
from remediation.kube.client import KubeClient
from remediation.metrics import RemediationMetrics
from remediation.model import AlertEvent
from remediation.settings import BudgetSettings, EngineSettings, LoopSettings, ScopeSettings
from tests.fakes.clock import FakeClock
from tests.fakes.kube_api import FakeKubeAPI
from tests.fakes.pager_sink import RecordingPager
from tests.kube.conftest import StepClock, backend_settings
from tests.kube.test_job_restart import NODES, pytorchjob

JOB = {
    "target_kind": "job",
    "namespace": "train",
    "training_job": "llama",
    "training_job_kind": "PyTorchJob.kubeflow.org",
}
SCOPE = ScopeSettings(namespaces=(JOB["namespace"],))
HUNG = {
    "alertname": "TrainingJobHung",
    "severity": "critical",
    "layer": "training",
    "fault_class": "training_hang",
    **JOB,
}
STRAGGLER = {
    "alertname": "TrainingRankStraggler",
    "severity": "warning",
    "layer": "training",
    "fault_class": "training_straggler",
    **JOB,
    "node": "gpu-b",
    "uuid": "GPU-b3",
    "gpu": "3",
    "rank": "11",
    "pod": "llama-worker-11",
    "signal": "sm_clock",
}


def _event(clock: FakeClock, labels: dict[str, str], fp: str, status: str = "firing") -> AlertEvent:
    return AlertEvent(
        fingerprint=fp,
        status="firing" if status == "firing" else "resolved",
        labels=dict(labels),
        annotations={"summary": f"{labels['alertname']} summary"},
        starts_at=datetime.fromtimestamp(clock.time(), tz=UTC),
        ends_at=None,
        generator_url="http://prometheus/graph",
        receiver="gpupulse",
        group_key="{}:{}",
        received_at=clock.utcnow(),
    )


class Rig:
    def __init__(self, api: FakeKubeAPI, client: KubeClient, clock: StepClock, tmp: Path, **settings: object):
        self.api = api
        self.clock = FakeClock()
        self.pager = RecordingPager()
        self.engine = cast(
            RemediationEngine,
            build_engine(
                replace(EngineSettings(scope=SCOPE), **settings),  # type: ignore[arg-type]
                tmp / "ledger.db",
                RemediationMetrics(),
                clock=self.clock,
                backend=KubernetesBackend(client, backend_settings(), clock),
                pager=self.pager,
            ),
        )

    async def send(self, event: AlertEvent) -> None:
        await self.engine.handle(event)
        await self.engine.wait_idle()

    def writes(self) -> int:
        return len([r for r in self.api.requests if r.method in ("DELETE", "POST", "PATCH")])

    def actions(self) -> list[tuple[str, str]]:
        out = []
        for inc in self.engine.list_incidents(limit=100):
            full = self.engine.get_incident(int(inc["id"]))
            assert full is not None
            out += [(h["rung"], h["status"]) for h in full["history"] if h["kind"] == "action"]
        return out


def _play_operator(api: FakeKubeAPI) -> None:
    """What training-operator does after the restart: every replica pod comes back."""
    if not api.pods:
        (job,) = api.objects_of("kubeflow.org/v1", "pytorchjobs")
        for rank in range(16):
            api.add_pod(
                "train",
                f"llama-worker-{rank}",
                NODES[rank // 8],
                labels={"training.kubeflow.org/job-name": "llama"},
                gpus=1,
                controller=job,
            )


async def test_a_hang_restarts_the_whole_job_once_and_a_hang_that_returns_pages(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock, tmp_path: Path
) -> None:
    pytorchjob(kube_api)
    rig = Rig(kube_api, kube_client, clock, tmp_path)
    hung = _event(rig.clock, HUNG, "fp-hung")
    await rig.send(hung)
    assert len(kube_api.deleted) == 16, "the gang restarts together"
    assert rig.actions() == [("restart", "success")], "one job restart is one action"
    _play_operator(kube_api)
    rig.clock.advance(300)
    await rig.send(replace(hung, status="resolved", received_at=rig.clock.utcnow()))
    # the hang comes back within the cooldown: the restart did not hold, a human is paged
    rig.clock.advance(600)
    writes = rig.writes()
    await rig.send(_event(rig.clock, HUNG, "fp-hung-2"))
    assert rig.writes() == writes
    assert len(rig.pager.firing) == 1
    assert "TrainingJobHung summary on job:train/PyTorchJob.kubeflow.org/llama" in rig.pager.firing[0].summary
    await rig.engine.aclose()


async def test_a_straggler_cordons_its_node_then_restarts_the_job_then_pages_with_the_evidence(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock, tmp_path: Path
) -> None:
    for node in NODES:
        kube_api.add_node(node)
    pytorchjob(kube_api)
    rig = Rig(kube_api, kube_client, clock, tmp_path)
    await rig.send(_event(rig.clock, STRAGGLER, "fp-straggler"))
    assert kube_api.nodes["gpu-b"]["spec"]["unschedulable"] is True
    assert len(kube_api.deleted) == 16
    assert not kube_api.calls("POST", "/eviction")
    assert rig.actions()[0] == ("migrate", "success")
    (page,) = rig.pager.firing
    for evidence in (
        "rank 11",
        "pod train/llama-worker-11",
        "GPU 3 (GPU-b3)",
        "node gpu-b",
        "signal sm_clock",
    ):
        assert evidence in page.summary, (evidence, page.summary)
    assert page.target.training_job == "llama"
    await rig.engine.aclose()


async def _hang_restarted_and_closed(rig: Rig, fp: str) -> None:
    hung = _event(rig.clock, HUNG, fp)
    await rig.send(hung)
    _play_operator(rig.api)
    rig.clock.advance(300)
    await rig.send(replace(hung, status="resolved", received_at=rig.clock.utcnow()))
    rig.clock.advance(1900)  # past the cooldown: the incident closes as automated
    await rig.engine.tick()


async def test_loop_detection_counts_job_restarts_across_incidents(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock, tmp_path: Path
) -> None:
    pytorchjob(kube_api)
    rig = Rig(
        kube_api,
        kube_client,
        clock,
        tmp_path,
        loops=LoopSettings(max_restarts=2, restart_window_seconds=7200.0),
    )
    await _hang_restarted_and_closed(rig, "fp-h1")
    await _hang_restarted_and_closed(rig, "fp-h2")
    assert len(kube_api.deleted) == 32
    # a third hang within the hour: no third restart, a page that says why
    writes = rig.writes()
    await rig.send(_event(rig.clock, HUNG, "fp-h3"))
    assert rig.writes() == writes
    assert ("restart", "skipped") in rig.actions()
    assert any("restarted 2 times" in p.summary for p in rig.pager.firing)
    await rig.engine.aclose()


async def test_a_job_restarted_for_a_hang_is_not_restarted_again_by_the_straggler_migrate(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock, tmp_path: Path
) -> None:
    for node in NODES:
        kube_api.add_node(node)
    pytorchjob(kube_api)
    rig = Rig(kube_api, kube_client, clock, tmp_path, loops=LoopSettings(max_restarts=1))
    await _hang_restarted_and_closed(rig, "fp-h1")
    writes = rig.writes()
    await rig.send(_event(rig.clock, STRAGGLER, "fp-s"))
    assert rig.writes() == writes, "neither a cordon nor a second job restart"
    assert "unschedulable" not in kube_api.nodes["gpu-b"]["spec"]
    assert ("migrate", "skipped") in rig.actions()
    (page,) = rig.pager.firing
    assert "restarted 1 times" in page.summary and "rank 11" in page.summary
    await rig.engine.aclose()


async def test_a_sixteen_rank_restart_is_one_action_against_the_budget(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock, tmp_path: Path
) -> None:
    pytorchjob(kube_api)
    rig = Rig(kube_api, kube_client, clock, tmp_path, budgets=BudgetSettings(max_actions_per_minute=1))
    await rig.send(_event(rig.clock, HUNG, "fp-hung"))
    assert len(kube_api.deleted) == 16
    assert rig.actions() == [("restart", "success")]
    assert not rig.engine.stats().get("breaker", {}).get("open"), rig.engine.stats()
    await rig.engine.aclose()
