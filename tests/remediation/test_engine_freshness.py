"""Stale evidence never acts: per alert the latest state wins whatever the arrival order, expired
alerts and rows processed long after they arrived are recorded and not acted on, and after a restart
or failover nothing acts until a fresh notification confirms it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from tests.remediation.test_engine_support import LEAK, Rig, engine_settings, events

THERMAL = {
    "alertname": "GPUTemperatureHigh",
    "severity": "warning",
    "layer": "hardware",
    "fault_class": "thermal",
    "target_kind": "gpu",
    "node": "node-t",
    "uuid": "GPU-tttt",
    "gpu": "0",
}


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = Rig(tmp_path, engine_settings(max_event_age_seconds=900.0))
    r.build()
    yield r
    await r.engine.aclose()


async def _handle(rig: Rig, ev: object) -> None:
    await rig.engine.handle(ev)  # type: ignore[arg-type]
    await rig.engine.wait_idle()


def _stale(rig: Rig) -> dict[str, int]:
    return dict(rig.engine.stats()["stale_alerts"])


async def test_a_resolution_that_arrives_before_its_firing_wins(rig: Rig) -> None:
    firing = rig.event(LEAK, fingerprint="f1")
    await _handle(rig, replace(firing, status="resolved"))
    await _handle(rig, firing)  # the firing notification, delivered late
    assert rig.backend.calls == []
    assert rig.incidents() == []
    assert _stale(rig) == {"out_of_order": 1}
    assert rig.metric("gpupulse_remediation_stale_alerts_total", reason="out_of_order") == 1


async def test_an_older_episode_never_resolves_or_reopens_the_newer_one(rig: Rig) -> None:
    old = rig.event(LEAK, fingerprint="f1")
    rig.clock.advance(600)
    new = rig.event(LEAK, fingerprint="f1")  # the same alert firing again later: a new startsAt
    await _handle(rig, new)
    assert rig.backend.rungs == ["restart"]
    await _handle(rig, replace(old, status="resolved"))  # the first episode's resolution, late
    assert rig.only_incident()["state"] == "verifying"  # not taken for the newer episode's
    await _handle(rig, old)  # and the first episode's firing, later still
    assert rig.backend.rungs == ["restart"]
    assert _stale(rig) == {"out_of_order": 2}


async def test_a_late_episode_leaves_the_latest_state_alone(rig: Rig) -> None:
    old = rig.event(LEAK, fingerprint="f1")
    rig.clock.advance(600)
    await rig.fire(LEAK, fingerprint="f1")
    await _handle(rig, old)  # the first episode's firing, then its resolution, both late
    await _handle(rig, replace(old, status="resolved"))
    assert rig.only_incident()["state"] == "verifying"
    assert _stale(rig) == {"out_of_order": 2}


async def test_a_firing_alert_whose_end_has_passed_is_expired(rig: Rig) -> None:
    ev = rig.event(LEAK, fingerprint="f1")
    hours_ago = rig.clock.utcnow() - timedelta(hours=3)
    await _handle(rig, replace(ev, ends_at=hours_ago))
    assert rig.backend.calls == []
    assert _stale(rig) == {"expired": 1}
    # an end still ahead (Alertmanager 0.2x passes on Prometheus' endsAt) is a live alert
    later = rig.clock.utcnow() + timedelta(minutes=4)
    await _handle(rig, replace(rig.event(LEAK, fingerprint="f2"), ends_at=later))
    assert rig.backend.rungs == ["restart"]


async def test_a_row_processed_hours_after_it_arrived_is_recorded_not_acted_on(rig: Rig) -> None:
    ev = rig.event(LEAK, fingerprint="f1")
    rig.clock.advance(6 * 3600)  # the controller was down; the inbox kept the row
    await _handle(rig, ev)
    assert rig.backend.calls == []
    assert rig.incidents() == []
    assert _stale(rig) == {"too_old": 1}
    # Alertmanager re-sends the still-firing alert: the same key, received now, is fresh evidence
    await _handle(rig, replace(ev, received_at=rig.clock.utcnow()))
    assert rig.backend.rungs == ["restart"]


async def test_a_row_just_within_the_age_limit_acts(rig: Rig) -> None:
    ev = rig.event(LEAK, fingerprint="f1")
    rig.clock.advance(900)
    await _handle(rig, ev)
    assert rig.backend.rungs == ["restart"]
    late = rig.event({**LEAK, "pod": "other-pod"}, fingerprint="f2")
    rig.clock.advance(900.5)
    await _handle(rig, late)
    assert rig.backend.rungs == ["restart"]
    assert _stale(rig) == {"too_old": 1}


async def test_a_stale_resolution_still_resolves(rig: Rig) -> None:
    ev = await rig.fire(LEAK, fingerprint="f1")
    resolved = replace(ev, status="resolved", received_at=rig.clock.utcnow())
    rig.clock.advance(3600)  # processed an hour after it arrived: a resolution never acts
    await _handle(rig, resolved)
    assert rig.only_incident()["state"] == "cooldown"


async def test_after_a_long_outage_open_incidents_wait_for_a_fresh_notification(rig: Rig) -> None:
    ev = await rig.fire(THERMAL, fingerprint="hot")  # pages at once, migrates after 900 s still firing
    assert rig.backend.calls == []
    await rig.advance(10)
    rig.clock.advance(6 * 3600)  # the controller is down for six hours
    await rig.restart_controller()
    await rig.advance(1)
    assert rig.backend.calls == []  # the 900 s came due long ago, but on evidence from before the gap
    inc = rig.only_incident()
    assert inc["held"] == 2
    assert "did not watch" in " ".join(h["summary"] for h in inc["history"])
    # Alertmanager re-sends the alert that still fires: the next tick takes the step that was due
    await _handle(rig, replace(ev, received_at=rig.clock.utcnow()))
    await rig.advance(1)
    assert rig.backend.rungs == ["migrate"]
    assert "evidence_renewed" in events(rig.only_incident())


async def test_a_held_incident_whose_alert_resolved_meanwhile_closes_without_acting(rig: Rig) -> None:
    ev = await rig.fire(THERMAL, fingerprint="hot")
    rig.clock.advance(2 * 3600)
    await rig.restart_controller()
    await rig.advance(1)
    await _handle(rig, replace(ev, status="resolved", received_at=rig.clock.utcnow()))
    inc = rig.only_incident()
    assert (inc["state"], inc["resolution"]) == ("closed", "self_resolved")
    assert rig.backend.calls == []


async def test_a_held_incident_that_never_hears_again_closes_unresolved(rig: Rig) -> None:
    await rig.fire(THERMAL, fingerprint="hot")
    rig.clock.advance(2 * 3600)
    await rig.restart_controller()
    await rig.advance(1)
    await rig.advance(rig.settings.paged_incident_max_age_seconds + 1)
    inc = rig.only_incident()
    assert (inc["state"], inc["resolution"]) == ("closed", "unresolved")
    assert rig.backend.calls == []


async def test_a_quick_restart_continues_the_ladder(rig: Rig) -> None:
    await rig.fire(THERMAL, fingerprint="hot")
    rig.clock.advance(30)  # a rollout: the controller is back within the age limit
    await rig.restart_controller()
    await rig.advance(900)
    assert rig.backend.rungs == ["migrate"]
    assert rig.only_incident()["held"] == 0


async def test_an_interrupted_action_after_a_long_outage_is_not_escalated(rig: Rig) -> None:
    gate_backend = rig.backend
    gate_backend.gate = asyncio.Event()
    ev = rig.event(LEAK, fingerprint="f1")
    task = asyncio.ensure_future(rig.engine.handle(ev))
    await gate_backend.entered.wait()
    await task
    rig.clock.advance(4 * 3600)
    await rig.restart_controller()  # the restart's outcome was never recorded
    await rig.advance(301)  # its verify window ends: the next rung (migrate) would act
    assert rig.backend.calls == []
    assert rig.only_incident()["held"] == 2
    gate_backend.gate.set()
