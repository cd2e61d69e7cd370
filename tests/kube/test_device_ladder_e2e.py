"""The real ladder engine with the Kubernetes backend against the in-process API server: GPUFellOffBus
on one GPU of a DRA node taints that device, records the rule in the incident and pages with its undo;
in a dry run it writes nothing, or, with dry_run_device_preview, the rule with effect None; with
return_to_service, the alert's resolution starts a validation whose pass alone returns the GPU."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from remediation.backends.kubernetes import KubernetesBackend
from remediation.engine import RemediationEngine, build_engine
from remediation.kube.client import KubeClient
from remediation.kube.validation import ValidationSettings
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
    returning: bool = False,
    engine_clock: FakeClock | None = None,
    **backend: Any,
) -> RemediationEngine:
    engine_clock = engine_clock or FakeClock()
    engine = cast(
        RemediationEngine,
        build_engine(
            EngineSettings(dry_run=dry_run, return_to_service=returning),
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


def _play_job_controller(api: FakeKubeAPI, clock: StepClock, condition: str) -> None:
    """Every validation Job the backend polls reaches `condition` (Complete or Failed)."""

    def finish(_: int) -> None:
        for (version, plural, _ns, _name), job in api.objects.items():
            if (version, plural) == ("batch/v1", "jobs"):
                job["status"] = {
                    "conditions": [{"type": condition, "status": "True", "message": "dcgmi: 1 test failed"}]
                }

    clock.after_sleep.append(finish)


@pytest.mark.parametrize("verdict", ["Complete", "Failed"])
async def test_the_alert_resolving_starts_a_validation_whose_pass_alone_returns_the_gpu(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock, tmp_path: Path, verdict: str
) -> None:
    _dra_node(kube_api)
    pager = RecordingPager()
    engine_clock = FakeClock()
    validation = ValidationSettings(namespace="gpupulse", image="registry.example/dcgm:test")
    engine = await _engine_after_alert(
        kube_client, clock, tmp_path, pager, returning=True, engine_clock=engine_clock, validation=validation
    )
    (rule,) = kube_api.dra.rules.values()
    _play_job_controller(kube_api, clock, verdict)
    engine_clock.advance(120)
    await engine.handle(replace(_firing(engine_clock), status="resolved", received_at=engine_clock.utcnow()))
    await engine.wait_idle()

    (job,) = [o for (v, p, _, _), o in kube_api.objects.items() if (v, p) == ("batch/v1", "jobs")]
    assert job["metadata"]["name"].startswith("gpupulse-validate-")
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command == ["dcgmi", "diag", "-r", "3"]  # gpu_lost: the long diagnostic
    (incident,) = engine.list_incidents()
    statuses = [h["status"] for h in _history(engine) if h["kind"] == "event"]
    if verdict == "Complete":
        assert not kube_api.dra.rules  # deleted only after the pass
        assert incident["state"] == "closed" and incident["resolution"] == "returned"
        assert "returned" in statuses
        resolved = [p for p in pager.pages if p.resolved]  # the GPU is back: the page resolves
        assert resolved and resolved[-1].dedup_key == pager.firing[0].dedup_key
    else:
        assert list(kube_api.dra.rules) == [rule["metadata"]["name"]]  # the GPU stays out
        assert incident["state"] == "paged"
        assert "validation_failed" in statuses
        assert len(pager.firing) == 2  # the same page again, saying why the GPU stays out
        assert "stays out of service: validation Job failed: dcgmi: 1 test failed" in pager.firing[-1].summary
        assert not [p for p in pager.pages if p.resolved]
    await engine.aclose()


async def test_without_return_to_service_the_resolution_closes_and_the_gpu_stays_out(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock, tmp_path: Path
) -> None:
    _dra_node(kube_api)
    engine_clock = FakeClock()
    engine = await _engine_after_alert(
        kube_client, clock, tmp_path, RecordingPager(), engine_clock=engine_clock
    )
    await engine.handle(replace(_firing(engine_clock), status="resolved", received_at=engine_clock.utcnow()))
    await engine.wait_idle()
    (incident,) = engine.list_incidents()
    assert incident["resolution"] == "human" and len(kube_api.dra.rules) == 1
    assert not [o for (v, p, _, _), o in kube_api.objects.items() if (v, p) == ("batch/v1", "jobs")]
    await engine.aclose()
