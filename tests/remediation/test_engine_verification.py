"""Resolution is not repair: each signature says which rungs an alert's resolution can verify, and
which faults always need a human after the drain (their page stays open when the alert resolves)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from remediation.errors import PermanentError, SignatureError
from remediation.settings import BudgetSettings
from remediation.signatures import load_library, parse_document
from tests.remediation.test_engine_support import LEAK, Rig, engine_settings, events

REPO = Path(__file__).resolve().parents[2]
XID_APP = {
    "alertname": "GPUXidAppError",
    "severity": "warning",
    "layer": "hardware",
    "fault_class": "xid_app",
    "target_kind": "pod",
    "xid": "13",
    "namespace": "llm",
    "pod": "vllm-0",
    "container": "vllm",
    "node": "node-a",
    "uuid": "GPU-aaaa",
    "gpu": "0",
}
FELL_OFF = {
    "alertname": "GPUFellOffBus",
    "severity": "critical",
    "layer": "hardware",
    "fault_class": "gpu_lost",
    "target_kind": "gpu",
    "node": "node-b",
    "uuid": "GPU-bbbb",
    "gpu": "1",
}


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = Rig(tmp_path, engine_settings())
    r.build()
    yield r
    await r.engine.aclose()


async def test_an_xid_restart_is_watched_through_the_cooldown_not_verified_by_resolution(rig: Rig) -> None:
    ev = await rig.fire(XID_APP)
    assert rig.backend.rungs == ["restart"]
    # an XID alert resolves when its event window passes, whatever was done: no verification there
    assert rig.only_incident()["state"] == "cooldown"
    assert "watching" in events(rig.only_incident())
    await rig.advance(300)
    await rig.resolve(ev)
    assert rig.only_incident()["state"] == "cooldown"
    await rig.advance(601)  # 900 s after the restart, quiet
    inc = rig.only_incident()
    assert (inc["state"], inc["resolution"]) == ("closed", "automated")


async def test_an_xid_still_firing_after_the_cooldown_escalates(rig: Rig) -> None:
    await rig.fire(XID_APP)  # and the XID keeps coming: the alert never resolves
    await rig.advance(901)
    assert rig.backend.rungs == ["restart", "migrate"]
    assert "still fires after the 900 s cooldown" in rig.only_incident()["reason"]


async def test_an_xid_recurring_after_the_restart_escalates(rig: Rig) -> None:
    ev = await rig.fire(XID_APP, fingerprint="x")
    await rig.advance(300)
    await rig.resolve(ev)
    await rig.advance(120)
    await rig.fire(XID_APP, fingerprint="x")  # a new episode: the restart did not hold
    assert rig.backend.rungs == ["restart", "migrate"]


async def test_a_lost_gpu_is_drained_then_paged_for_the_reboot(rig: Rig) -> None:
    ev = await rig.fire(FELL_OFF)  # our own alert: it carries no xid, yet the XID 79 signature takes it
    inc = rig.only_incident()
    assert inc["signature"] == "xid-79-fell-off-bus"
    assert rig.backend.rungs == ["migrate"]
    assert inc["state"] == "paged"
    assert "reboot the node" in rig.pager.firing[0].summary
    await rig.resolve(ev)  # the node rebooted and the GPU is back
    assert rig.only_incident()["resolution"] == "human"
    assert not any(p.resolved for p in rig.pager.pages)


async def test_a_failed_drain_still_pages(rig: Rig) -> None:
    rig.backend.errors["migrate"] = [PermanentError("node has no other place for the pods")]
    await rig.fire(FELL_OFF)
    assert rig.only_incident()["state"] == "paged"
    assert "migrate failed" in rig.pager.firing[0].summary


async def test_a_leak_restart_is_verified_by_the_alert_resolving(rig: Rig) -> None:
    ev = await rig.fire(LEAK)
    assert rig.only_incident()["state"] == "verifying"  # waits for the memory to come back down
    await rig.resolve(ev)
    assert rig.only_incident()["state"] == "cooldown"


async def test_an_interrupted_reset_class_drain_pages_after_a_restart(rig: Rig) -> None:
    rig.backend.gate = asyncio.Event()
    task = asyncio.ensure_future(rig.engine.handle(rig.event(FELL_OFF)))
    await rig.backend.entered.wait()
    await task
    await rig.restart_controller()  # the drain's outcome was never recorded
    assert rig.pager.pages == []
    await rig.advance(1)  # the page goes out with the first tick
    assert rig.backend.calls == []  # not drained twice
    assert len(rig.pager.firing) == 1 and "reboot the node" in rig.pager.firing[0].summary


def test_every_shipped_acting_signature_says_what_a_resolution_verifies() -> None:
    for path in sorted((REPO / "remediation" / "signatures").glob("*.yaml")):
        for raw in yaml.safe_load(path.read_text())["signatures"]:
            rungs = raw["ladder"]["rungs"]
            if rungs != ["page"]:
                assert "resolution_verifies" in raw["ladder"], f"{path.name}: {raw['name']}"


@pytest.mark.parametrize("fault_class", ["xid_reset", "gpu_lost", "gpu_hardware"])
def test_faults_that_need_a_reset_reboot_or_rma_page_after_the_drain(fault_class: str) -> None:
    lib = load_library()
    for sig in lib:
        if sig.fault_class == fault_class:
            assert sig.ladder.human_after_migrate, sig.name
            assert sig.ladder.resolution_verifies == (), sig.name


@pytest.mark.parametrize(
    ("ladder", "field"),
    [
        ({"rungs": ["restart", "page"], "resolution_verifies": ["migrate"]}, "ladder.resolution_verifies"),
        ({"rungs": ["restart", "page"], "resolution_verifies": "restart"}, "ladder.resolution_verifies"),
        ({"rungs": ["restart", "page"], "human_after_migrate": "reset it"}, "ladder.human_after_migrate"),
        ({"rungs": ["migrate", "page"], "human_after_migrate": 3}, "ladder.human_after_migrate"),
    ],
)
def test_verification_fields_are_validated(ladder: dict[str, object], field: str) -> None:
    sig = {
        "name": "s",
        "fault_class": "xid_reset",
        "match": {"alertname": "X"},
        "ladder": ladder,
        "restart_fixes": "restart" in ladder["rungs"],  # type: ignore[operator]
        "reason": "r",
    }
    with pytest.raises(SignatureError, match=f"field '{field}'"):
        parse_document(yaml.safe_dump({"signatures": [sig]}), "x.yaml", "user")


async def test_a_drain_finishing_after_the_breaker_opened_keeps_its_task_in_the_group_page(
    tmp_path: Path,
) -> None:

    rig = Rig(tmp_path, engine_settings(budgets=BudgetSettings(max_concurrent_actions=1)))
    rig.build()
    try:
        rig.backend.gate = asyncio.Event()
        first = asyncio.ensure_future(rig.engine.handle(rig.event(FELL_OFF)))
        await rig.backend.entered.wait()
        await first
        # a second drain while the first runs: over the budget, the breaker opens
        await rig.engine.handle(rig.event({**FELL_OFF, "node": "node-c", "uuid": "GPU-cccc"}))
        assert rig.metric("gpupulse_remediation_breaker_open") == 1
        rig.backend.gate.set()
        await rig.engine.wait_idle()
        await rig.advance(1)
        (group_page,) = [p for p in rig.pager.pages if p.dedup_key.startswith("gpupulse-breaker")]
        drained = [h for h in group_page.history if h["target"] == "gpu:node-b/GPU-bbbb"]
        assert "reboot the node" in drained[0]["reason"]
    finally:
        await rig.engine.aclose()
