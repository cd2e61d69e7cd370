"""Safety rails: budgets and the breaker (one grouped page per burst), dry-run, pause, scope."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from remediation.settings import BudgetSettings, EngineSettings, ScopeSettings
from tests.remediation.test_engine_support import (
    CORRUPT_MODEL,
    LEAK,
    SCOPE,
    XID_RESET,
    Rig,
    engine_settings,
    statuses,
)


async def _rig(tmp_path: Path, settings: EngineSettings) -> Rig:
    r = Rig(tmp_path, settings)
    r.build()
    return r


@pytest.fixture
async def burst_rig(tmp_path: Path) -> AsyncIterator[Rig]:
    settings = engine_settings(
        budgets=BudgetSettings(max_actions_per_minute=2, group_page_interval_seconds=60)
    )
    r = await _rig(tmp_path, settings)
    yield r
    await r.engine.aclose()


async def _burst(rig: Rig, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        await rig.engine.handle(rig.event({**LEAK, "pod": f"worker-{i}", "node": f"node-{i}"}))
    await rig.engine.wait_idle()


async def test_breaker_opens_under_burst_and_pages_once_as_a_group(burst_rig: Rig) -> None:
    rig = burst_rig
    await _burst(rig, 50)
    assert len(rig.backend.calls) == 2  # the budget allowed two restarts
    assert rig.metric("gpupulse_remediation_breaker_open") == 1
    assert rig.pager.pages == []  # nothing paged per incident
    await rig.advance(1)
    assert len(rig.pager.pages) == 1
    page = rig.pager.pages[0]
    assert page.signature == "safety-breaker"
    assert len(page.history) == 48
    assert {h["target"] for h in page.history} >= {"pod:llm/worker-2", "pod:llm/worker-49"}
    assert rig.engine.stats()["breaker"]["open"] is True
    assert rig.metric("gpupulse_remediation_actions_total", rung="restart", outcome="blocked") == 48

    # more alerts during the same burst join the group: one update later, same dedup key
    await _burst(rig, 10, start=50)
    await rig.advance(1)
    assert len(rig.pager.pages) == 1  # within group_page_interval: held back
    await rig.advance(60)
    assert len(rig.pager.pages) == 2
    assert rig.pager.pages[1].dedup_key == page.dedup_key
    assert len(rig.pager.pages[1].history) == 58
    await rig.advance(60)
    assert len(rig.pager.pages) == 2  # nothing new joined: no page
    # the two restarted pods never recovered: their next rung (migrate) is blocked and joins the group
    await rig.advance(300)
    assert len(rig.pager.pages) == 3
    assert len(rig.pager.pages[2].history) == 60
    assert len(rig.backend.calls) == 2


async def test_concurrent_actions_budget_opens_breaker(tmp_path: Path) -> None:
    rig = await _rig(tmp_path, engine_settings(budgets=BudgetSettings(max_concurrent_actions=2)))
    rig.backend.gate = asyncio.Event()  # actions hang, so they pile up
    try:
        for i in range(3):
            await rig.engine.handle(rig.event({**LEAK, "pod": f"p{i}"}))
        assert rig.metric("gpupulse_remediation_breaker_open") == 1
        rig.backend.gate.set()
        await rig.engine.wait_idle()
        assert len(rig.backend.calls) == 2
        assert rig.metric("gpupulse_remediation_breaker_open") == 1
        assert "concurrent" in rig.engine.stats()["breaker"]["reason"]
    finally:
        await rig.engine.aclose()


async def test_breaker_stays_open_across_restart_until_a_human_resets_it(burst_rig: Rig) -> None:
    rig = burst_rig
    await _burst(rig, 3)
    assert rig.metric("gpupulse_remediation_breaker_open") == 1
    await rig.restart_controller()
    assert rig.metric("gpupulse_remediation_breaker_open") == 1
    rig.clock.advance(120)  # the per-minute budget has room again; the breaker still holds
    await rig.fire({**LEAK, "pod": "after-restart"})
    assert rig.backend.calls == []
    rig.engine.reset_breaker("alice")
    assert rig.metric("gpupulse_remediation_breaker_open") == 0
    assert rig.engine.stats()["breaker"]["closed_by"] == "alice"
    await rig.fire({**LEAK, "pod": "after-reset"})
    assert [t.pod for _, t in rig.backend.calls] == ["after-reset"]


async def test_actions_per_minute_budget(tmp_path: Path) -> None:
    rig = await _rig(tmp_path, engine_settings(budgets=BudgetSettings(max_actions_per_minute=3)))
    try:
        for i in range(4):
            await rig.fire({**LEAK, "pod": f"p{i}"})
        assert len(rig.backend.calls) == 3
        assert rig.metric("gpupulse_remediation_breaker_open") == 1
        assert "last minute" in rig.engine.stats()["breaker"]["reason"]
    finally:
        await rig.engine.aclose()


async def test_nodes_migrated_budget_absolute_and_fraction(tmp_path: Path) -> None:
    rig = await _rig(
        tmp_path, engine_settings(budgets=BudgetSettings(max_nodes_migrated=2, max_nodes_migrated_fraction=0))
    )
    try:
        for n in ("n1", "n2", "n3"):
            await rig.fire({**XID_RESET, "node": n, "uuid": f"GPU-{n}"})
        assert [t.node for _, t in rig.backend.calls] == ["n1", "n2"]
        assert "nodes migrated" in rig.engine.stats()["breaker"]["reason"]
    finally:
        await rig.engine.aclose()

    frac = engine_settings(
        budgets=BudgetSettings(max_nodes_migrated=100, max_nodes_migrated_fraction=0.2), cluster_node_count=10
    )
    rig = await _rig(tmp_path / "frac", frac)
    try:
        for n in ("n1", "n2", "n3"):
            await rig.fire({**XID_RESET, "node": n, "uuid": f"GPU-{n}"})
        assert len(rig.backend.calls) == 2  # 20 % of 10 nodes
    finally:
        await rig.engine.aclose()


async def test_dry_run_never_calls_backends_or_pagers(tmp_path: Path) -> None:
    rig = await _rig(tmp_path, engine_settings(dry_run=True))
    try:
        await rig.fire(LEAK)
        await rig.advance(301)  # not resolved: the ladder moves on, still dry
        await rig.advance(301)
        await rig.fire(CORRUPT_MODEL)
        assert rig.backend.calls == []
        assert rig.pager.pages == []
        leak = rig.engine.get_incident(int(rig.incidents()[1]["id"]))
        assert leak is not None
        assert statuses(leak) == [("restart", "dry_run"), ("migrate", "dry_run"), ("page", "dry_run")]
        assert rig.metric("gpupulse_remediation_actions_total", rung="restart", outcome="dry_run") == 1
        assert rig.engine.stats()["dry_run"] is True
    finally:
        await rig.engine.aclose()


async def test_pause_blocks_actions_and_pages_until_resume(tmp_path: Path) -> None:
    rig = await _rig(tmp_path, engine_settings())
    try:
        rig.engine.pause("bob")
        assert rig.metric("gpupulse_remediation_paused") == 1
        paused_at = rig.clock.time()
        assert rig.metric("gpupulse_remediation_paused_since_timestamp_seconds") == paused_at
        await rig.advance(60)  # a tick rewrites the gauges from the ledger: still the pause's start
        assert rig.metric("gpupulse_remediation_paused_since_timestamp_seconds") == paused_at
        await rig.fire(LEAK)
        assert rig.backend.calls == []
        assert rig.only_incident()["state"] == "paged"
        assert "paused by bob" in rig.pager.firing[0].summary
        rig.engine.resume("bob")
        assert rig.metric("gpupulse_remediation_paused") == 0
        assert rig.metric("gpupulse_remediation_paused_since_timestamp_seconds") == 0
        await rig.fire({**LEAK, "pod": "later"})
        assert rig.backend.rungs == ["restart"]
    finally:
        await rig.engine.aclose()


async def test_out_of_scope_namespace_is_recorded_never_acted_on(tmp_path: Path) -> None:
    rig = await _rig(tmp_path, EngineSettings(scope=ScopeSettings(namespaces=("prod",))))
    try:
        await rig.fire({**LEAK, "namespace": "dev"})
        assert rig.backend.calls == [] and rig.pager.pages == []
        inc = rig.only_incident()
        assert (inc["state"], inc["resolution"]) == ("ignored", "out_of_scope")
        assert "allowlist" in inc["reason"]
        await rig.fire({**LEAK, "namespace": "prod"})
        assert rig.backend.rungs == ["restart"]
    finally:
        await rig.engine.aclose()


async def test_an_empty_scope_acts_on_no_workload_but_still_on_gpus(tmp_path: Path) -> None:
    # the default scope, as the chart renders it: no --scope.namespaces flag at all
    rig = await _rig(tmp_path, EngineSettings())
    try:
        await rig.fire({**LEAK, "namespace": "prod-payments"})
        await rig.fire({k: v for k, v in LEAK.items() if k != "namespace"} | {"pod": "bare"})
        assert rig.backend.calls == [] and rig.pager.pages == []
        for inc in rig.incidents():
            assert (inc["state"], inc["resolution"]) == ("ignored", "out_of_scope")
            assert "namespace scope is empty" in inc["reason"]
        # a GPU alert that names no namespace is no workload: it still acts
        await rig.fire(XID_RESET)
        assert [(rung, t.kind) for rung, t in rig.backend.calls] == [("migrate", "gpu")]
        # one that names a namespace (not a routing one) is as out of scope as a pod there
        await rig.fire({**XID_RESET, "uuid": "GPU-cccc", "node": "node-c", "namespace": "prod-payments"})
        assert len(rig.backend.calls) == 1
    finally:
        await rig.engine.aclose()


async def test_a_star_scope_acts_in_every_namespace(tmp_path: Path) -> None:
    rig = await _rig(tmp_path, EngineSettings(scope=ScopeSettings(namespaces=("*",))))
    try:
        await rig.fire({**LEAK, "namespace": "prod-payments"})
        await rig.fire({**LEAK, "namespace": "anything-else", "pod": "other"})
        assert [(rung, t.namespace) for rung, t in rig.backend.calls] == [
            ("restart", "prod-payments"),
            ("restart", "anything-else"),
        ]
    finally:
        await rig.engine.aclose()


async def test_opt_in_label_required_when_configured(tmp_path: Path) -> None:
    rig = await _rig(tmp_path, EngineSettings(scope=replace(SCOPE, opt_in_label="gpupulse_io_remediate")))
    try:
        await rig.fire(LEAK)
        assert rig.backend.calls == []
        assert rig.only_incident()["resolution"] == "out_of_scope"
        await rig.fire({**LEAK, "pod": "opted-in", "gpupulse_io_remediate": "true"})
        assert rig.backend.rungs == ["restart"]
    finally:
        await rig.engine.aclose()


async def test_a_pod_without_a_namespace_is_out_of_scope_under_an_allowlist(tmp_path: Path) -> None:
    rig = await _rig(tmp_path, EngineSettings(scope=ScopeSettings(namespaces=("prod",))))
    try:
        bare = {k: v for k, v in LEAK.items() if k != "namespace"}
        await rig.fire(bare)
        assert rig.backend.calls == []
        inc = rig.only_incident()
        assert inc["resolution"] == "out_of_scope"
        assert "pod target without a namespace" in inc["reason"]
    finally:
        await rig.engine.aclose()


async def test_node_targets_count_in_the_migrated_nodes_budget(tmp_path: Path) -> None:
    budgets = BudgetSettings(max_nodes_migrated=1, max_nodes_migrated_fraction=0)
    rig = await _rig(tmp_path, engine_settings(budgets=budgets))
    node_alert = {
        "alertname": "NodeGpuDegraded",
        "fault_class": "crash_loop",
        "target_kind": "node",
        "severity": "critical",
    }
    try:
        await rig.fire({**node_alert, "node": "n1"})
        await rig.fire({**node_alert, "node": "n2"})  # a second node within the window: over budget
        assert [(r, t.kind, t.node) for r, t in rig.backend.calls] == [("migrate", "node", "n1")]
        assert "nodes migrated" in rig.engine.stats()["breaker"]["reason"]
    finally:
        await rig.engine.aclose()


@pytest.mark.parametrize(("gap", "blocked"), [(60.0, True), (60.001, False)])
async def test_the_per_minute_budget_counts_an_action_exactly_a_minute_old(
    tmp_path: Path, gap: float, blocked: bool
) -> None:
    rig = await _rig(tmp_path, engine_settings(budgets=BudgetSettings(max_actions_per_minute=1)))
    try:
        await rig.fire({**LEAK, "pod": "first"})
        rig.clock.advance(gap)
        await rig.fire({**LEAK, "pod": "second"})
        assert len(rig.backend.calls) == (1 if blocked else 2)
        assert rig.metric("gpupulse_remediation_breaker_open") == (1 if blocked else 0)
    finally:
        await rig.engine.aclose()
