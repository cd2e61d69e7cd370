"""A controller killed mid-incident resumes where it was and repeats no action."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.remediation.test_engine_support import CORRUPT_MODEL, LEAK, Rig, engine_settings, events, statuses


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = Rig(tmp_path, engine_settings())
    r.build()
    yield r
    await r.engine.aclose()


async def test_killed_during_restart_verifies_instead_of_restarting_again(rig: Rig) -> None:
    rig.backend.gate = asyncio.Event()  # the restart never reports back: the controller dies first
    ev = rig.event(LEAK)
    await rig.engine.handle(ev)
    await rig.backend.entered.wait()
    assert rig.backend.rungs == ["restart"]
    assert rig.only_incident()["state"] == "acting"

    await rig.restart_controller()
    inc = rig.only_incident()
    assert inc["state"] == "verifying"
    assert statuses(inc) == [("restart", "interrupted")]
    assert "recovered" in events(inc)

    await rig.engine.handle(ev)  # the worker replays the unprocessed inbox row
    await rig.advance(10)
    assert rig.backend.calls == []
    await rig.resolve(ev)
    await rig.advance(901)
    inc = rig.only_incident()
    assert (inc["state"], inc["resolution"]) == ("closed", "automated")
    assert rig.backend.calls == []


async def test_killed_during_restart_escalates_if_fault_persists(rig: Rig) -> None:
    rig.backend.gate = asyncio.Event()
    await rig.engine.handle(rig.event(LEAK))
    await rig.backend.entered.wait()
    await rig.restart_controller()
    await rig.advance(301)  # the interrupted restart is not verified: next rung, not a second restart
    assert rig.backend.rungs == ["migrate"]


async def test_killed_in_cooldown_keeps_ladder_position(rig: Rig) -> None:
    ev = await rig.fire(LEAK)
    await rig.resolve(ev)
    await rig.restart_controller()
    assert rig.only_incident()["state"] == "cooldown"
    rig.clock.advance(100)
    await rig.fire(LEAK, fingerprint=ev.fingerprint)
    assert rig.backend.rungs == ["migrate"]


async def test_killed_before_page_delivered_pages_after_restart(rig: Rig) -> None:
    rig.pager.fail = True
    await rig.fire(CORRUPT_MODEL)
    await rig.restart_controller()
    rig.pager.fail = False
    await rig.advance(31)
    assert len(rig.pager.firing) == 1
    assert rig.only_incident()["page_pending"] == 0


async def test_replayed_events_after_restart_are_not_handled_twice(rig: Rig) -> None:
    ev = await rig.fire(LEAK)
    res = await rig.resolve(ev)
    await rig.restart_controller()
    for replay in (ev, res, ev):
        await rig.engine.handle(replay)
    await rig.engine.wait_idle()
    assert rig.backend.calls == []
    assert rig.only_incident()["state"] == "cooldown"
