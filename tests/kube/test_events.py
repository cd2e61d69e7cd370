"""Kubernetes Events for every action and outcome: their shape (within the API server's limits), the
object each is about, and the engine writing them through the Kubernetes backend; an audit trail that
fails or hangs never stops the action."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pytest

from remediation import runner as runner_mod
from remediation.backends.kubernetes import KubernetesBackend
from remediation.engine import RemediationEngine, build_engine
from remediation.kube.client import KubeClient
from remediation.kube.events import (
    INCIDENT_ANNOTATION,
    NOTE_MAX_BYTES,
    SIGNATURE_ANNOTATION,
    KubeEventAudit,
    event_body,
)
from remediation.metrics import RemediationMetrics
from remediation.model import ActionNotice, Target
from remediation.settings import EngineSettings
from tests.fakes.clock import FakeClock
from tests.fakes.kube_api import FakeKubeAPI
from tests.fakes.pager_sink import RecordingPager
from tests.kube.conftest import StepClock, backend_settings
from tests.kube.test_ladder_e2e import firing_leak

NOW = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
POD = Target("pod", node="gpu-1", namespace="llm", pod="vllm-0", uuid="GPU-a")


def _notice(target: Target = POD, phase: str = "started", summary: str = "why") -> ActionNotice:
    return ActionNotice(target, "restart", phase, 7, "gpu-memory-leak", summary)  # type: ignore[arg-type]


def test_a_pod_action_is_an_event_on_the_pod_in_its_namespace_related_to_its_node() -> None:
    body = event_body(_notice(), "gpupulse-remediation-0", NOW, 0xABC)
    assert body["metadata"]["namespace"] == "llm"
    assert body["metadata"]["name"] == "vllm-0.abc"
    assert body["regarding"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "llm", "name": "vllm-0"}
    assert body["related"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-1"}
    annotations = {INCIDENT_ANNOTATION: "7", SIGNATURE_ANNOTATION: "gpu-memory-leak"}
    assert body["metadata"]["annotations"] == annotations
    assert (body["reason"], body["type"], body["action"]) == ("RemediationStarted", "Normal", "Restart")
    assert body["eventTime"] == "2026-12-01T03:00:00.000000Z"
    assert "incident 7" in body["note"] and "gpu-memory-leak" in body["note"]


@pytest.mark.parametrize(
    ("phase", "reason", "kind"),
    [
        ("success", "RemediationSucceeded", "Normal"),
        ("failed", "RemediationFailed", "Warning"),
        ("temporary", "RemediationRetrying", "Warning"),
    ],
)
def test_outcomes_have_their_own_reason_and_failures_are_warnings(phase: str, reason: str, kind: str) -> None:
    body = event_body(_notice(phase=phase), "r", NOW, 1)
    assert (body["reason"], body["type"]) == (reason, kind)


def test_gpu_and_node_targets_are_events_on_the_node_in_default() -> None:
    for target in (Target("gpu", node="gpu-1", uuid="GPU-a"), Target("node", node="gpu-1")):
        body = event_body(_notice(target), "r", NOW, 1)
        assert body["metadata"]["namespace"] == "default"
        assert body["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-1"}
        assert "related" not in body


def test_a_training_job_action_is_an_event_on_the_job_object() -> None:
    target = Target(
        "job", node="gpu-2", namespace="research", uuid="GPU-b",
        training_job_kind="PyTorchJob.kubeflow.org", training_job="llama",
    )
    body = event_body(_notice(target), "r", NOW, 1)
    assert body["regarding"] == {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "namespace": "research", "name": "llama"
    }
    assert body["metadata"]["namespace"] == "research"


def test_oversized_note_and_name_are_cut_to_the_api_servers_limits() -> None:
    long_pod = replace(POD, pod="p" * 253)
    body = event_body(_notice(long_pod, summary="é" * 2000), "i" * 300, NOW, 2**63)
    assert len(body["note"].encode()) <= NOTE_MAX_BYTES
    assert len(body["metadata"]["name"]) <= 253
    assert len(body["reportingInstance"]) <= 128


def _engine(
    kube_client: KubeClient, clock: StepClock, tmp_path: Path, audit: object, dry_run: bool = False
) -> RemediationEngine:
    settings = EngineSettings()
    settings = replace(settings, dry_run=dry_run, scope=replace(settings.scope, namespaces=("llm",)))
    return cast(
        RemediationEngine,
        build_engine(
            settings,
            tmp_path / "ledger.db",
            RemediationMetrics(),
            clock=FakeClock(),
            backend=KubernetesBackend(kube_client, backend_settings(), clock),
            pager=RecordingPager(),
            audit=audit,  # type: ignore[arg-type]
        ),
    )


def _events(api: FakeKubeAPI) -> list[dict[str, object]]:
    return [o for (v, plural, _, _), o in sorted(api.objects.items()) if plural == "events"]


async def test_a_restart_leaves_a_started_and_a_succeeded_event_on_the_pod(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock, tmp_path: Path
) -> None:
    kube_api.add_node("gpu-1")
    kube_api.add_pod("llm", "vllm-0", "gpu-1", owner=("StatefulSet", "vllm"), gpus=1)
    engine = _engine(kube_client, clock, tmp_path, KubeEventAudit(kube_client, "gpupulse-remediation-0"))
    try:
        await engine.handle(firing_leak(FakeClock()))
        await engine.wait_idle()
    finally:
        await engine.aclose()
    events = _events(kube_api)
    assert [e["reason"] for e in events] in (
        ["RemediationStarted", "RemediationSucceeded"],
        ["RemediationSucceeded", "RemediationStarted"],
    )
    for e in events:
        assert e["regarding"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "llm", "name": "vllm-0"}
        meta = cast(dict[str, dict[str, str]], e["metadata"])
        assert meta["annotations"][SIGNATURE_ANNOTATION]
        assert meta["annotations"][INCIDENT_ANNOTATION].isdigit()
    assert [d[0] for d in kube_api.deleted] == ["llm/vllm-0"]


class _BrokenAudit:
    def __init__(self, hang: bool) -> None:
        self.hang = hang
        self.calls = 0

    async def announce(self, notice: ActionNotice) -> None:
        self.calls += 1
        if self.hang:
            await asyncio.Event().wait()
        raise RuntimeError("events API refused")


@pytest.mark.parametrize("hang", [False, True], ids=["raising", "hung"])
async def test_an_audit_trail_that_fails_or_hangs_never_stops_the_action(
    kube_api: FakeKubeAPI,
    kube_client: KubeClient,
    clock: StepClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    hang: bool,
) -> None:
    monkeypatch.setattr(runner_mod, "AUDIT_TIMEOUT_SECONDS", 0.05)
    kube_api.add_node("gpu-1")
    kube_api.add_pod("llm", "vllm-0", "gpu-1", owner=("StatefulSet", "vllm"), gpus=1)
    audit = _BrokenAudit(hang)
    engine = _engine(kube_client, clock, tmp_path, audit)
    try:
        await engine.handle(firing_leak(FakeClock()))
        await engine.wait_idle()
        incidents = list(engine.list_incidents())
    finally:
        await engine.aclose()
    assert audit.calls == 2  # started and the outcome were both attempted
    assert [d[0] for d in kube_api.deleted] == ["llm/vllm-0"]
    assert incidents and incidents[0]["state"] != "acting"


async def test_a_dry_run_leaves_an_event_saying_what_would_have_been_done(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock, tmp_path: Path
) -> None:
    kube_api.add_node("gpu-1")
    kube_api.add_pod("llm", "vllm-0", "gpu-1", owner=("StatefulSet", "vllm"), gpus=1)
    engine = _engine(kube_client, clock, tmp_path, KubeEventAudit(kube_client, "r"), dry_run=True)
    try:
        await engine.handle(firing_leak(FakeClock()))
        await engine.wait_idle()
    finally:
        await engine.aclose()
    [event] = _events(kube_api)
    assert event["reason"] == "RemediationDryRun" and event["type"] == "Normal"
    assert "would restart" in str(event["note"])
    assert kube_api.deleted == []
