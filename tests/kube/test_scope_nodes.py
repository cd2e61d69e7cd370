"""The node selector reads real Node labels: KubeNodeLabels against the in-process API server, and the
ladder engine with the Kubernetes backend never cordons a node outside the selector."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pytest

from remediation.backends.kubernetes import KubernetesBackend
from remediation.engine import RemediationEngine, build_engine
from remediation.errors import KubeUnavailable
from remediation.kube.client import KubeClient
from remediation.kube.nodelabels import KubeNodeLabels
from remediation.metrics import RemediationMetrics
from remediation.model import AlertEvent
from remediation.settings import EngineSettings, ScopeSettings
from tests.fakes.clock import FakeClock
from tests.fakes.kube_api import FakeKubeAPI
from tests.fakes.pager_sink import RecordingPager
from tests.kube.conftest import StepClock, backend_settings


def _gpu_alert(clock: FakeClock, node: str) -> AlertEvent:
    now = clock.utcnow()
    return AlertEvent(
        fingerprint=f"fp-{node}",
        status="firing",
        labels={
            "alertname": "GPUXidResetRequired",
            "fault_class": "xid_reset",
            "xid": "48",
            "target_kind": "gpu",
            "node": node,
            "uuid": f"GPU-{node}",
            "gpu": "0",
        },
        annotations={},
        starts_at=datetime.fromtimestamp(clock.time(), tz=UTC),
        ends_at=None,
        generator_url="",
        receiver="gpupulse",
        group_key="{}:{}",
        received_at=now,
    )


async def test_node_labels_come_from_the_api_and_are_cached(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock
) -> None:
    kube_api.add_node("gpu-1", labels={"nodepool": "inference", "kubernetes.io/hostname": "gpu-1"})
    kube_api.add_node("gpu-2")
    labels = KubeNodeLabels(kube_client, ttl_seconds=60, clock=clock)
    assert await labels.labels("gpu-1") == {"nodepool": "inference", "kubernetes.io/hostname": "gpu-1"}
    assert await labels.labels("gpu-2") == {}
    assert await labels.labels("gone") is None
    await labels.labels("gpu-1")
    assert len(kube_api.calls("GET", "/api/v1/nodes/gpu-1")) == 1  # a storm about one node: one read
    kube_api.nodes["gpu-1"]["metadata"]["labels"]["nodepool"] = "training"
    clock.t += 61
    assert (await labels.labels("gpu-1") or {})["nodepool"] == "training"


async def test_an_unreachable_api_raises_instead_of_judging_the_node(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock
) -> None:
    await kube_api.stop()
    with pytest.raises(KubeUnavailable):
        await KubeNodeLabels(kube_client, clock=clock).labels("gpu-1")
    await kube_api.start()


async def test_the_kubernetes_ladder_never_cordons_a_node_outside_the_selector(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock, tmp_path: Path
) -> None:
    kube_api.add_node("gpu-train", labels={"nodepool": "training"})
    kube_api.add_node("gpu-serve", labels={"nodepool": "inference"})
    engine_clock = FakeClock()
    engine = cast(
        RemediationEngine,
        build_engine(
            EngineSettings(scope=ScopeSettings(node_selector="nodepool=inference")),
            tmp_path / "ledger.db",
            RemediationMetrics(),
            clock=engine_clock,
            backend=KubernetesBackend(kube_client, backend_settings(), clock),
            pager=RecordingPager(),
            node_labels=KubeNodeLabels(kube_client, clock=clock),
        ),
    )
    try:
        await engine.handle(_gpu_alert(engine_clock, "gpu-train"))
        await engine.wait_idle()
        assert kube_api.nodes["gpu-train"]["spec"].get("unschedulable") is None
        assert kube_api.calls("PATCH", "/api/v1/nodes/gpu-train") == []
        await engine.handle(_gpu_alert(engine_clock, "gpu-serve"))
        await engine.wait_idle()
        assert kube_api.nodes["gpu-serve"]["spec"]["unschedulable"] is True
        resolutions = sorted(str(i["resolution"]) for i in engine.list_incidents())
        assert resolutions == ["", "out_of_scope"]
    finally:
        await engine.aclose()
