"""The ladder end to end on the real engine, with a fake clock, a scripted backend and a recording pager."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from remediation.settings import EngineSettings, ScopeSettings
from tests.remediation.test_engine_support import (
    CORRUPT_MODEL,
    LEAK,
    XID_RESET,
    Rig,
    engine_settings,
    events,
    statuses,
)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = Rig(tmp_path, engine_settings())
    r.build()
    yield r
    await r.engine.aclose()


async def test_leak_fixed_by_restart_closes_as_automated(rig: Rig) -> None:
    ev = await rig.fire(LEAK)
    assert rig.backend.rungs == ["restart"]
    assert rig.backend.calls[0][1].pod == LEAK["pod"]
    assert rig.only_incident()["state"] == "verifying"

    rig.clock.advance(60)
    await rig.resolve(ev)
    assert rig.only_incident()["state"] == "cooldown"

    await rig.advance(899)
    assert rig.only_incident()["state"] == "cooldown"
    await rig.advance(2)
    inc = rig.only_incident()
    assert (inc["state"], inc["resolution"]) == ("closed", "automated")
    assert statuses(inc) == [("restart", "success")]
    assert rig.pager.pages == []
    assert rig.engine.stats()["automated_ratio"] == 1.0
    assert rig.metric("gpupulse_remediation_actions_total", rung="restart", outcome="success") == 1
    assert rig.metric("gpupulse_remediation_incidents_total", resolution="automated") == 1
    assert rig.metric("gpupulse_remediation_incidents_open") == 0


async def test_restart_that_does_not_hold_escalates_to_migrate_then_page(rig: Rig) -> None:
    ev = await rig.fire(LEAK)
    await rig.resolve(ev)
    rig.clock.advance(120)
    again = await rig.fire(LEAK, fingerprint=ev.fingerprint)  # same alert, new startsAt: recurred
    assert rig.backend.rungs == ["restart", "migrate"]
    await rig.resolve(again)
    rig.clock.advance(60)
    await rig.fire(LEAK, fingerprint=ev.fingerprint)
    assert rig.backend.rungs == ["restart", "migrate"]  # recurrence after a migration pages
    inc = rig.only_incident()
    assert inc["state"] == "paged"
    assert len(rig.pager.firing) == 1
    page = rig.pager.firing[0]
    assert page.signature == "gpu-memory-leak"
    assert page.dedup_key == f"gpupulse-incident-{inc['id']}"
    assert [h["rung"] for h in page.history if h["kind"] == "action"] == ["restart", "migrate", "page"]
    assert "recurred" in events(inc)


async def test_leak_not_resolved_within_window_migrates(rig: Rig) -> None:
    await rig.fire(LEAK)
    await rig.advance(299)
    assert rig.backend.rungs == ["restart"]
    await rig.advance(2)
    assert rig.backend.rungs == ["restart", "migrate"]
    await rig.advance(301)
    assert rig.only_incident()["state"] == "paged"
    assert len(rig.pager.firing) == 1


async def test_corrupt_model_never_restarts_and_pages(rig: Rig) -> None:
    await rig.fire(CORRUPT_MODEL)
    assert rig.backend.calls == []
    inc = rig.only_incident()
    assert (inc["state"], inc["signature"]) == ("paged", "model-artifact")
    assert [p.signature for p in rig.pager.pages] == ["model-artifact"]
    page = rig.pager.pages[0]
    assert "no automated fix" in page.summary and "restart only loops" in page.summary
    assert page.runbook_url.endswith("/model_artifact.md")
    assert page.history[0]["details"]["restart_fixes"] is False
    assert rig.metric("gpupulse_remediation_actions_total", rung="page", outcome="success") == 1


async def test_crash_loop_with_corrupt_model_message_skips_restart_and_migrate(rig: Rig) -> None:
    labels = {**LEAK, "alertname": "KubePodCrashLooping", "fault_class": "crash_loop"}
    await rig.fire(
        labels, annotations={"description": "vllm: safetensors header invalid: model file is corrupt"}
    )
    assert rig.backend.calls == []
    assert rig.only_incident()["signature"] == "model-artifact-by-message"
    assert len(rig.pager.firing) == 1


async def test_reset_class_xid_migrates_then_pages_for_the_gpu_reset(rig: Rig) -> None:
    ev = await rig.fire(XID_RESET)
    assert rig.backend.rungs == ["migrate"]  # restart never helps a GPU that needs a reset
    assert rig.backend.calls[0][1].kind == "gpu"
    # the drain worked, but the GPU still needs a reset: a human is paged at once
    inc = rig.only_incident()
    assert inc["state"] == "paged"
    (page,) = rig.pager.firing
    assert page.fault_class == "xid_reset" and "reset the GPU" in page.summary
    # the XID's event window ends and the alert resolves: that is no GPU reset, so the page stays open
    await rig.resolve(ev)
    inc = rig.only_incident()
    assert (inc["state"], inc["resolution"]) == ("closed", "human")
    assert [p for p in rig.pager.pages if p.resolved] == []
    assert "page_left_open" in events(inc)
    assert rig.engine.stats()["automated_ratio"] == 0.0


async def test_new_incident_after_recent_migration_goes_straight_to_page(rig: Rig) -> None:
    crash = {**LEAK, "alertname": "InferenceEngineCrashLooping", "fault_class": "crash_loop"}
    ev = await rig.fire(crash)
    assert rig.backend.rungs == ["migrate"]
    await rig.resolve(ev)
    await rig.advance(1801)  # cooldown over: closed as automated
    assert rig.incidents()[0]["resolution"] == "automated"
    await rig.fire(crash)  # the same workload, within the hour: the migration did not fix it
    assert rig.backend.rungs == ["migrate"]
    newest = rig.incidents()[0]
    assert newest["state"] == "paged"
    assert "migrated" in newest["reason"]


async def test_unknown_fault_pages(rig: Rig) -> None:
    await rig.fire({**LEAK, "alertname": "SomethingNew", "fault_class": "not_a_class"})
    assert rig.backend.calls == []
    inc = rig.only_incident()
    assert (inc["signature"], inc["state"]) == ("unknown-fault", "paged")
    assert rig.pager.firing[0].signature == "unknown-fault"


async def test_unknown_alerts_on_one_target_page_separately(rig: Rig) -> None:
    await rig.fire({**LEAK, "alertname": "NewThingA", "fault_class": ""})
    await rig.fire({**LEAK, "alertname": "NewThingB", "fault_class": ""})
    assert len(rig.pager.firing) == 2


async def test_failed_action_after_alert_resolved_does_not_escalate(rig: Rig) -> None:
    import asyncio

    from remediation.errors import PermanentError

    rig.backend.gate = asyncio.Event()
    rig.backend.errors["restart"] = [PermanentError("pod has no owner")]
    ev = rig.event(LEAK)
    await rig.engine.handle(ev)
    await rig.backend.entered.wait()
    await rig.engine.handle(replace(ev, status="resolved"))
    rig.backend.gate.set()
    await rig.engine.wait_idle()
    assert rig.backend.rungs == ["restart"]
    assert rig.only_incident()["resolution"] == "self_resolved"


async def test_missing_target_kind_pages_instead_of_guessing(rig: Rig) -> None:
    labels = {k: v for k, v in LEAK.items() if k != "target_kind"}
    await rig.fire(labels)
    assert rig.backend.calls == []
    assert rig.only_incident()["state"] == "paged"


async def test_xid_app_error_without_a_named_pod_pages(tmp_path: Path) -> None:
    # under "*" a pod target without a namespace is in scope (a named scope records it out of scope)
    rig = Rig(tmp_path, engine_settings(scope=ScopeSettings(namespaces=("*",))))
    rig.build()
    labels = {
        "alertname": "GPUXidAppError",
        "fault_class": "xid_app",
        "xid": "31",
        "target_kind": "pod",
        "node": "node-a",
        "uuid": "GPU-aaaa",
        "gpu": "0",
    }  # the GPU is shared by several pods, so the rule names none
    await rig.fire(labels)
    assert rig.backend.calls == []
    inc = rig.only_incident()
    assert inc["state"] == "paged"
    assert "without namespace, pod" in inc["reason"]
    await rig.engine.aclose()


async def test_handle_is_idempotent_on_dedup_key(rig: Rig) -> None:
    ev = await rig.fire(LEAK)
    await rig.engine.handle(ev)
    await rig.engine.handle(ev)
    await rig.engine.wait_idle()
    assert rig.backend.rungs == ["restart"]
    res = await rig.resolve(ev)
    await rig.engine.handle(res)
    await rig.engine.wait_idle()
    inc = rig.only_incident()
    assert events(inc).count("resolved") == 1
    assert inc["state"] == "cooldown"


async def test_resolve_page_sent_when_paged_incident_resolves(rig: Rig) -> None:
    ev = await rig.fire(CORRUPT_MODEL)
    await rig.resolve(ev)
    inc = rig.only_incident()
    assert (inc["state"], inc["resolution"]) == ("closed", "human")
    assert [p.resolved for p in rig.pager.pages] == [False, True]
    assert rig.pager.pages[0].dedup_key == rig.pager.pages[1].dedup_key
    assert rig.engine.stats()["automated_ratio"] == 0.0


async def test_temporary_error_retries_same_rung_then_permanent_moves_on(rig: Rig) -> None:
    from remediation.errors import PermanentError, TemporaryError

    rig.backend.errors["restart"] = [TemporaryError("api timeout", delay_seconds=10)]
    await rig.fire(LEAK)
    assert rig.only_incident()["state"] == "retry_wait"
    await rig.advance(11)
    assert rig.backend.rungs == ["restart", "restart"]
    assert rig.only_incident()["state"] == "verifying"

    rig.backend.errors["restart"] = [PermanentError("no owner")]
    other = {**LEAK, "pod": "other-6c7d8f9b5d-abcde"}
    await rig.fire(other)
    assert rig.backend.rungs[-2:] == ["restart", "migrate"]


async def test_pager_failure_is_retried_from_tick(rig: Rig) -> None:
    rig.pager.fail = True
    await rig.fire(CORRUPT_MODEL)
    assert rig.pager.pages == []
    rig.pager.fail = False
    await rig.advance(31)
    assert len(rig.pager.firing) == 1
    assert rig.metric("gpupulse_remediation_actions_total", rung="page", outcome="failed") == 1


async def test_thermal_pages_at_once_and_migrates_only_when_persistent(rig: Rig) -> None:
    thermal = {**XID_RESET, "alertname": "GPUTemperatureHigh", "fault_class": "thermal"}
    thermal.pop("xid")
    await rig.fire(thermal)
    assert rig.backend.calls == []
    assert len(rig.pager.firing) == 1
    await rig.advance(901)
    assert rig.backend.rungs == ["migrate"]


async def test_thermal_that_clears_quickly_is_never_acted_on(rig: Rig) -> None:
    thermal = {**XID_RESET, "alertname": "GPUTemperatureHigh", "fault_class": "thermal"}
    thermal.pop("xid")
    ev = await rig.fire(thermal)
    rig.clock.advance(100)
    await rig.resolve(ev)
    await rig.advance(1000)
    assert rig.backend.calls == []
    assert rig.only_incident()["resolution"] == "self_resolved"
    assert [p.resolved for p in rig.pager.pages] == [False, True]  # the early page is resolved too


def test_invalid_settings_and_signatures_refuse_to_build(tmp_path: Path) -> None:
    from dataclasses import replace

    from remediation.engine import build_engine
    from remediation.errors import SignatureError
    from remediation.metrics import RemediationMetrics
    from remediation.settings import BudgetSettings

    bad = replace(EngineSettings(), budgets=BudgetSettings(max_concurrent_actions=0))
    with pytest.raises(ValueError, match="max_concurrent_actions"):
        build_engine(bad, tmp_path / "db", RemediationMetrics())
    sigs = tmp_path / "sigs"
    sigs.mkdir()
    (sigs / "x.yaml").write_text("signatures:\n  - name: x\n    fault_class: nope\n")
    with pytest.raises(SignatureError, match="unknown fault_class 'nope'"):
        build_engine(EngineSettings(signature_dirs=(sigs,)), tmp_path / "db", RemediationMetrics())


async def test_a_failed_migrate_pages_what_it_left_on_the_cluster(rig: Rig) -> None:
    from remediation.errors import PermanentError

    failed = PermanentError("migrate node-b: forbidden by the API server (RBAC?)")
    failed.left = "node node-b left cordoned and tainted k=v:NoSchedule; undo: kubectl uncordon node-b"
    rig.backend.errors["migrate"] = [failed]
    await rig.fire(XID_RESET)
    assert rig.backend.rungs == ["migrate"]
    (page,) = rig.pager.firing
    assert "cluster state: node node-b left cordoned and tainted k=v:NoSchedule" in page.summary
    assert "undo: kubectl uncordon node-b" in page.summary
