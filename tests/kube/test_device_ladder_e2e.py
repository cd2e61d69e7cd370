"""The real ladder engine with the Kubernetes backend against the in-process API server: GPUFellOffBus
on one GPU of a DRA node taints that device, records the rule in the incident and pages with its undo;
in a dry run it writes nothing, or, with dry_run_device_preview, the rule with effect None."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from remediation.backends.kubernetes import KubernetesBackend
from remediation.engine import RemediationEngine, build_engine
from remediation.kube.client import KubeClient
from remediation.metrics import RemediationMetrics
from remediation.model import AlertEvent
from remediation.settings import EngineSettings
from tests.fakes.clock import FakeClock
from tests.fakes.kube_api import FakeKubeAPI
from tests.fakes.pager_sink import RecordingPager
from tests.kube.conftest import StepClock, backend_settings

DRIVER = "gpu.nvidia.com"
FELL_OFF = {
    "alertname": "GPUFellOffBus",
    "severity": "critical",
    "layer": "hardware",
    "fault_class": "gpu_lost",
    "target_kind": "gpu",
    "node": "gpu-1",
    "uuid": "GPU-5",
    "gpu": "5",
}


def _firing(clock: FakeClock) -> AlertEvent:
    return AlertEvent(
        fingerprint="fp-bus",
        status="firing",
        labels=dict(FELL_OFF),
        annotations={"summary": "GPU fell off the bus."},
        starts_at=datetime.fromtimestamp(clock.time(), tz=UTC),
        ends_at=None,
        generator_url="http://prometheus/graph",
        receiver="gpupulse",
        group_key="{}:{}",
        received_at=clock.utcnow(),
    )


def _dra_node(api: FakeKubeAPI) -> None:
    api.add_node("gpu-1")
    devices = [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{i}"}}} for i in range(8)]
    api.add_resourceslice("gpu-1-gpu.nvidia.com", "gpu-1", DRIVER, "gpu-1", devices)
    for i in (4, 5):
        pod = api.add_pod("ml", f"rank-{i}", "gpu-1", owner=("Job", f"train-{i}"))
        api.dra.add_claim("ml", f"rank-{i}-gpu", (DRIVER, "gpu-1", f"gpu-{i}"), pod)


async def _engine_after_alert(
    client: KubeClient,
    clock: StepClock,
    tmp_path: Path,
    pager: RecordingPager,
    dry_run: bool = False,
    **backend: Any,
) -> RemediationEngine:
    engine_clock = FakeClock()
    engine = cast(
        RemediationEngine,
        build_engine(
            EngineSettings(dry_run=dry_run),
            tmp_path / "ledger.db",
            RemediationMetrics(),
            clock=engine_clock,
            backend=KubernetesBackend(client, backend_settings(**backend), clock),
            pager=pager,
        ),
    )
    await engine.handle(_firing(engine_clock))
    await engine.wait_idle()
    return engine


def _history(engine: RemediationEngine) -> list[dict[str, Any]]:
    (incident,) = engine.list_incidents()
    full = engine.get_incident(int(incident["id"]))
    assert full is not None
    return list(full["history"])


async def test_fell_off_bus_quarantines_the_device_records_the_rule_and_pages_its_undo(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock, tmp_path: Path
) -> None:
    _dra_node(kube_api)
    pager = RecordingPager()
    engine = await _engine_after_alert(kube_client, clock, tmp_path, pager)

    (rule,) = kube_api.dra.rules.values()
    name = rule["metadata"]["name"]
    assert rule["spec"]["deviceSelector"]["device"] == "gpu-5"
    assert not kube_api.nodes["gpu-1"]["spec"].get("unschedulable")
    assert [d[0] for d in kube_api.deleted] == ["ml/rank-5"]  # rank-4 on GPU 4 keeps running
    (migrate,) = [h for h in _history(engine) if h["kind"] == "action" and h["rung"] == "migrate"]
    assert migrate["status"] == "success"
    assert migrate["details"]["quarantine"] == "device"
    assert migrate["details"]["device_taint_rules"][0]["name"] == name
    # the signature asks a human to reboot or repair: the page says what is left and how to undo it
    (page,) = pager.firing
    assert f"undo: kubectl delete devicetaintrule {name}" in page.summary
    assert "not cordoned" in page.summary
    await engine.aclose()


@pytest.mark.parametrize("preview", [False, True])
async def test_a_dry_run_writes_no_rule_unless_asked_for_a_preview_of_effect_none(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock, tmp_path: Path, preview: bool
) -> None:
    _dra_node(kube_api)
    engine = await _engine_after_alert(
        kube_client, clock, tmp_path, RecordingPager(), dry_run=True, dry_run_device_preview=preview
    )
    assert not kube_api.deleted and not kube_api.nodes["gpu-1"]["spec"].get("unschedulable")
    history = _history(engine)
    assert [h["status"] for h in history if h["kind"] == "action"] == ["dry_run"]
    previews = [h for h in history if h["status"] == "dry_run_preview"]
    if not preview:
        assert not kube_api.dra.rules and not previews
        assert not kube_api.calls("GET", "/resourceslices")  # the default dry run reads nothing either
        await engine.aclose()
        return
    (rule,) = kube_api.dra.rules.values()
    assert rule["spec"]["taint"]["effect"] == "None"
    assert rule["spec"]["deviceSelector"]["device"] == "gpu-5"
    (entry,) = previews
    assert entry["details"]["device_taint_rules"][0]["name"] == rule["metadata"]["name"]
    assert "kubectl delete devicetaintrule" in entry["details"]["left"]
    await engine.aclose()
