"""The real ladder engine with the Kubernetes backend against the in-process API server:
a pod restarted, its node cordoned and drained with a PodDisruptionBudget honoured, then a page."""

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
from remediation.settings import EngineSettings, ScopeSettings
from tests.fakes.clock import FakeClock
from tests.fakes.kube_api import FakeKubeAPI
from tests.fakes.pager_sink import RecordingPager
from tests.kube.conftest import StepClock, backend_settings

LEAK = {
    "alertname": "GPUProcessMemoryAboveHardLimit",
    "severity": "critical",
    "layer": "serving",
    "fault_class": "memory_leak",
    "target_kind": "pod",
    "namespace": "llm",
    "pod": "vllm-0",
    "node": "gpu-1",
    "uuid": "GPU-aaaa",
}


def firing_leak(clock: FakeClock) -> AlertEvent:
    """The leak alert on llm/vllm-0 (gpu-1), firing now (shared by the kube tests that post it)."""
    now = clock.utcnow()
    return AlertEvent(
        fingerprint="fp-leak",
        status="firing",
        labels=dict(LEAK),
        annotations={},
        starts_at=datetime.fromtimestamp(clock.time(), tz=UTC),
        ends_at=None,
        generator_url="http://prometheus/graph",
        receiver="gpupulse",
        group_key="{}:{}",
        received_at=now,
    )


async def test_ladder_restarts_then_drains_with_pdb_then_pages(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock, tmp_path: Path
) -> None:
    kube_api.add_node("gpu-1")
    first = kube_api.add_pod(
        "llm", "vllm-0", "gpu-1", owner=("StatefulSet", "vllm"), labels={"app": "vllm"}, gpus=1
    )
    pdb = kube_api.add_pdb("llm", "vllm-pdb", {"app": "vllm"}, disruptions_allowed=0)
    engine_clock = FakeClock()
    pager = RecordingPager()
    engine = cast(
        RemediationEngine,
        build_engine(
            EngineSettings(scope=ScopeSettings(namespaces=(LEAK["namespace"],))),
            tmp_path / "ledger.db",
            RemediationMetrics(),
            clock=engine_clock,
            backend=KubernetesBackend(kube_client, backend_settings(), clock),
            pager=pager,
        ),
    )

    async def send(event: AlertEvent) -> None:
        await engine.handle(event)
        await engine.wait_idle()

    # 1. restart: the StatefulSet pod is deleted by UID; the test then plays the StatefulSet controller
    ev = firing_leak(engine_clock)
    await send(ev)
    assert kube_api.deleted == [("llm/vllm-0", first["metadata"]["uid"], "delete")]
    second = kube_api.add_pod(
        "llm", "vllm-0", "gpu-1", owner=("StatefulSet", "vllm"), labels={"app": "vllm"}, gpus=1
    )
    await send(replace(ev, status="resolved", received_at=engine_clock.utcnow()))

    # 2. it recurs: migrate cordons gpu-1 and evicts; the PDB refuses twice, then a replica elsewhere is ready
    clock.after_sleep.append(lambda n: pdb["status"].update(disruptionsAllowed=1) if n == 2 else None)
    engine_clock.advance(120)
    again = firing_leak(engine_clock)
    await send(again)
    node = kube_api.nodes["gpu-1"]
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"][0]["key"] == "gpupulse.io/remediation"
    assert len(kube_api.calls("POST", "/pods/vllm-0/eviction")) == 3
    assert kube_api.deleted[-1] == ("llm/vllm-0", second["metadata"]["uid"], "eviction")
    await send(replace(again, status="resolved", received_at=engine_clock.utcnow()))

    # 3. it recurs after the migration: page, no further Kubernetes writes
    writes = len([r for r in kube_api.requests if r.method in ("DELETE", "POST", "PATCH")])
    engine_clock.advance(60)
    await send(firing_leak(engine_clock))
    (incident,) = engine.list_incidents()
    full = engine.get_incident(int(incident["id"]))
    assert full is not None and full["state"] == "paged"
    actions = [(h["rung"], h["status"]) for h in full["history"] if h["kind"] == "action"]
    assert actions[:2] == [("restart", "success"), ("migrate", "success")]
    assert actions[2][0] == "page"
    assert len(pager.firing) == 1
    assert [h["rung"] for h in pager.firing[0].history if h["kind"] == "action"] == [
        "restart",
        "migrate",
        "page",
    ]
    assert len([r for r in kube_api.requests if r.method in ("DELETE", "POST", "PATCH")]) == writes
    await engine.aclose()
