"""Loop detection: restart loops stop, recurrence after migration pages, flapping pages; all persisted."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from remediation.ladder import loop_identity, target_from_labels, workload_name
from remediation.ledger import REAL_ACTION_STATUSES, Ledger, connect
from remediation.loops import LoopDetector
from remediation.settings import LoopSettings
from remediation.signatures import load_library, parse_document
from tests.remediation.test_engine_support import LEAK, Rig, engine_settings, events, pod

RESTART_THEN_PAGE = """
signatures:
  - name: leak-restart-only
    fault_class: memory_leak
    priority: 100
    match: {labels: {fault_class: memory_leak}}
    ladder: {rungs: [restart, page], verify_window_seconds: 300, cooldown_seconds: 60}
    restart_fixes: true
    reason: test ladder without migrate
"""


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = Rig(tmp_path, engine_settings(loops=LoopSettings(max_restarts=3, restart_window_seconds=3600)))
    r.build()
    yield r
    await r.engine.aclose()


async def _fixed_by_restart(rig: Rig, pod_name: str) -> None:
    ev = await rig.fire(pod(LEAK, pod_name))
    await rig.resolve(ev)
    await rig.advance(901)


def test_workload_identity_survives_a_restart() -> None:
    assert workload_name("vllm-7d9f8b6c5d-x2x4z") == "vllm"
    assert workload_name("vllm-7d9f8b6c5d-bcdfg") == "vllm"
    assert workload_name("my-redis") == "my-redis"  # vowels: not a generated suffix
    assert workload_name("trainer-0") == "trainer-0"
    a, _ = target_from_labels(pod(LEAK, "vllm-7d9f8b6c5d-x2x4z"))
    b, _ = target_from_labels(pod(LEAK, "vllm-7d9f8b6c5d-m9k2p"))
    assert a != b and loop_identity(a) == loop_identity(b) == "pod:llm/vllm"


async def test_restart_loop_is_stopped_and_escalates(rig: Rig) -> None:
    for name in ("vllm-7d9f8b6c5d-x2x4z", "vllm-7d9f8b6c5d-m9k2p", "vllm-7d9f8b6c5d-q7w8r"):
        await _fixed_by_restart(rig, name)
    assert rig.backend.rungs == ["restart"] * 3
    await rig.fire(pod(LEAK, "vllm-7d9f8b6c5d-z5x6c"))
    assert rig.backend.rungs == ["restart"] * 3 + ["migrate"]
    newest = rig.engine.get_incident(int(rig.incidents()[0]["id"]))
    assert newest is not None and "restart_loop" in events(newest)
    assert rig.metric("gpupulse_remediation_loops_detected_total") == 1
    assert rig.metric("gpupulse_remediation_actions_total", rung="restart", outcome="skipped") == 1


async def test_restart_loop_pages_when_no_migrate_rung(tmp_path: Path) -> None:
    lib_sigs = parse_document(RESTART_THEN_PAGE, "test.yaml", "user")
    r = Rig(tmp_path, engine_settings(loops=LoopSettings(max_restarts=2)))
    from remediation.signatures import SignatureLibrary

    r.library = SignatureLibrary([*load_library(), *lib_sigs])
    r.build()
    try:
        for name in ("vllm-7d9f8b6c5d-x2x4z", "vllm-7d9f8b6c5d-m9k2p"):
            ev = await r.fire(pod(LEAK, name))
            await r.resolve(ev)
            await r.advance(61)
        await r.fire(pod(LEAK, "vllm-7d9f8b6c5d-q7w8r"))
        assert r.backend.rungs == ["restart", "restart"]
        assert r.incidents()[0]["state"] == "paged"
        assert len(r.pager.firing) == 1
    finally:
        await r.engine.aclose()


async def test_restart_window_forgets_old_restarts(rig: Rig) -> None:
    for name in ("vllm-7d9f8b6c5d-x2x4z", "vllm-7d9f8b6c5d-m9k2p", "vllm-7d9f8b6c5d-q7w8r"):
        await _fixed_by_restart(rig, name)
    rig.clock.advance(3600)
    await rig.fire(pod(LEAK, "vllm-7d9f8b6c5d-z5x6c"))
    assert rig.backend.rungs == ["restart"] * 4


async def test_restart_loop_survives_controller_restart(rig: Rig) -> None:
    for name in ("vllm-7d9f8b6c5d-x2x4z", "vllm-7d9f8b6c5d-m9k2p", "vllm-7d9f8b6c5d-q7w8r"):
        await _fixed_by_restart(rig, name)
    await rig.restart_controller()
    await rig.fire(pod(LEAK, "vllm-7d9f8b6c5d-z5x6c"))
    assert rig.backend.rungs == ["migrate"]


async def test_flapping_alert_pages_instead_of_acting(tmp_path: Path) -> None:
    settings = engine_settings(loops=LoopSettings(flap_max_transitions=4, flap_window_seconds=600))
    r = Rig(tmp_path, settings)
    r.build()
    try:
        thermal = {**LEAK, "alertname": "GPUTemperatureHigh", "fault_class": "thermal", "target_kind": "gpu"}
        fp = "thermal-1"
        for _ in range(2):  # fire/resolve quickly: nothing to act on yet (thermal waits 900 s)
            ev = await r.fire(thermal, fingerprint=fp)
            r.clock.advance(30)
            await r.resolve(ev)
            r.clock.advance(30)
        await r.fire(thermal, fingerprint=fp)  # fifth transition within 600 s
        newest = r.incidents()[0]
        assert newest["state"] == "paged"
        assert "changed state 5 times" in newest["reason"]
        assert r.metric("gpupulse_remediation_flapping_alerts_total") == 1
        await r.advance(1000)
        assert r.backend.calls == []  # recognised as flapping: never migrated
    finally:
        await r.engine.aclose()


async def test_flapping_during_ladder_stops_acting(tmp_path: Path) -> None:
    settings = engine_settings(loops=LoopSettings(flap_max_transitions=2, flap_window_seconds=600))
    r = Rig(tmp_path, settings)
    r.build()
    try:
        ev = await r.fire(LEAK)
        assert r.backend.rungs == ["restart"]
        r.clock.advance(10)
        await r.resolve(ev)
        r.clock.advance(10)
        await r.fire(LEAK, fingerprint=ev.fingerprint)  # third transition: flapping, not a recurrence
        assert r.backend.rungs == ["restart"]
        assert r.only_incident()["state"] == "paged"
    finally:
        await r.engine.aclose()


def test_loop_settings_defaults_are_documented_values() -> None:
    s = LoopSettings()
    assert (s.max_restarts, s.restart_window_seconds) == (3, 3600.0)
    assert replace(s, max_restarts=5).max_restarts == 5


async def test_flapping_starts_one_transition_past_the_limit(tmp_path: Path) -> None:
    settings = engine_settings(loops=LoopSettings(flap_max_transitions=3, flap_window_seconds=600))
    r = Rig(tmp_path, settings)
    r.build()
    try:
        thermal = {**LEAK, "alertname": "GPUTemperatureHigh", "fault_class": "thermal", "target_kind": "gpu"}
        for i in range(3):  # three firing notifications about one target: exactly the limit
            await r.fire(thermal, fingerprint=f"t{i}")
            r.clock.advance(10)
        assert r.metric("gpupulse_remediation_flapping_alerts_total") == 0
        assert r.only_incident()["state"] == "open"
        await r.fire(thermal, fingerprint="t3")  # the fourth is one too many
        assert r.metric("gpupulse_remediation_flapping_alerts_total") == 1
        assert r.only_incident()["state"] == "paged"
    finally:
        await r.engine.aclose()


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    conn = connect(tmp_path / "ledger.db")
    yield Ledger(conn)
    conn.close()


def _action(ledger: Ledger, rung: str, at: float, loop_key: str = "pod:llm/vllm") -> None:
    with ledger.transaction():
        ledger.add_entry(1, at, "action", "success", rung, rung=rung, loop_key=loop_key)


def test_restart_loop_holds_when_restarts_already_exceed_the_limit(ledger: Ledger) -> None:
    # a lowered limit (or a second controller's restarts) leaves more restarts than allowed: still a loop
    d = LoopDetector(ledger, LoopSettings(max_restarts=2, restart_window_seconds=3600))
    now = 10_000.0
    for at in (now - 30, now - 20):
        _action(d.ledger, "restart", at)
    assert d.restart_loop("pod:llm/vllm", now).kind == "restart_loop"
    _action(d.ledger, "restart", now - 10)
    verdict = d.restart_loop("pod:llm/vllm", now)
    assert verdict.kind == "restart_loop" and "restarted 3 times" in verdict.detail
    assert not d.restart_loop("pod:llm/other", now)


@pytest.mark.parametrize(("age", "recurs"), [(0.0, True), (3600.0, True), (3600.001, False)])
def test_recurrence_counts_only_migrations_within_the_window(
    ledger: Ledger, age: float, recurs: bool
) -> None:
    d = LoopDetector(ledger, LoopSettings(migration_recurrence_window_seconds=3600))
    now = 100_000.0
    _action(d.ledger, "migrate", now - age)
    _action(d.ledger, "restart", now)  # a restart is no migration
    assert bool(d.recurrence_after_migration("pod:llm/vllm", now)) is recurs
    assert not d.recurrence_after_migration("pod:llm/other", now)


@pytest.mark.parametrize(("age", "flapping"), [(600.0, True), (600.001, False)])
def test_flapping_counts_only_transitions_within_the_window(
    ledger: Ledger, age: float, flapping: bool
) -> None:
    d = LoopDetector(ledger, LoopSettings(flap_max_transitions=2, flap_window_seconds=600))
    now = 100_000.0
    with d.ledger.transaction():
        d.ledger.add_transition("k", "firing", now - age)  # the oldest: in or out at the edge
        d.ledger.add_transition("k", "resolved", now - 5)
        d.ledger.add_transition("k", "firing", now)
    assert bool(d.flapping("k", now)) is flapping


async def _throttled(rig: Rig, pod_name: str) -> None:
    """One incident whose every restart the API server refused (a 429 from API Priority and Fairness)."""
    from remediation.errors import TemporaryError

    attempts = rig.settings.max_temporary_retries + 1
    rig.backend.errors["restart"] = [
        TemporaryError("restart: 429 TooManyRequests", 10.0, nothing_changed=True) for _ in range(attempts)
    ]
    await rig.fire(pod(LEAK, pod_name))
    for _ in range(attempts - 1):
        await rig.advance(11)


async def test_throttled_restarts_are_not_a_restart_loop_and_page_could_not_act(rig: Rig) -> None:
    names = ("vllm-7d9f8b6c5d-x2x4z", "vllm-7d9f8b6c5d-m9k2p", "vllm-7d9f8b6c5d-q7w8r")
    for name in names:
        await _throttled(rig, name)
    assert rig.backend.rungs == ["restart"] * 4 * len(names)  # retried, never escalated to migrate
    assert {i["state"] for i in rig.incidents()} == {"paged"}
    assert len(rig.pager.firing) == len(names)
    assert all("could not act" in p.summary for p in rig.pager.firing), [p.summary for p in rig.pager.firing]
    ledger = Ledger(connect(rig.db_path))
    assert ledger.count_actions(("restart", "migrate"), 0.0, statuses=REAL_ACTION_STATUSES) == 0
    assert not LoopDetector(ledger, rig.settings.loops).restart_loop("pod:llm/vllm", rig.clock.time())
    # the server is back: the next incident restarts (no loop), and that confirmed restart counts
    await rig.fire(pod(LEAK, "vllm-7d9f8b6c5d-z5x6c"))
    assert rig.backend.rungs[-1] == "restart"
    assert rig.metric("gpupulse_remediation_loops_detected_total") == 0
    assert ledger.count_loop_actions("pod:llm/vllm", "restart", 0.0) == 1
    ledger.conn.close()


async def test_temporary_failures_that_may_have_acted_still_count_towards_a_loop(rig: Rig) -> None:
    from remediation.errors import TemporaryError

    for name in ("vllm-7d9f8b6c5d-x2x4z", "vllm-7d9f8b6c5d-m9k2p", "vllm-7d9f8b6c5d-q7w8r"):
        # a timeout after the delete was sent: the server may have acted
        rig.backend.errors["restart"] = [TemporaryError("timed out", 10.0)]
        await rig.fire(pod(LEAK, name))
        await rig.advance(11)
    ledger = Ledger(connect(rig.db_path))
    assert LoopDetector(ledger, rig.settings.loops).restart_loop("pod:llm/vllm", rig.clock.time())
    ledger.conn.close()


async def test_a_throttled_migrate_is_not_migrated_recently(rig: Rig) -> None:
    from remediation.errors import TemporaryError

    crash = {**LEAK, "alertname": "InferenceEngineCrashLooping", "fault_class": "crash_loop"}
    attempts = rig.settings.max_temporary_retries + 1
    rig.backend.errors["migrate"] = [
        TemporaryError("migrate: 429 TooManyRequests", 10.0, nothing_changed=True) for _ in range(attempts)
    ]
    ev = await rig.fire(crash)
    for _ in range(attempts - 1):
        await rig.advance(11)
    assert rig.backend.rungs == ["migrate"] * attempts
    assert "could not act" in rig.only_incident()["reason"]
    await rig.resolve(ev)
    await rig.fire(crash)  # the same workload again: nothing was ever migrated, so migrate now
    assert rig.backend.rungs == ["migrate"] * (attempts + 1)
    newest = rig.engine.get_incident(int(rig.incidents()[0]["id"]))
    assert newest is not None and "migrated" not in newest["reason"]
