"""Pages go through the safety gate too: a global page budget per window, and beyond it one summary
page per signature that is updated, not repeated, and resolved when its last incident closes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from remediation.settings import BudgetSettings
from tests.remediation.test_engine_support import Rig, engine_settings

# XID 79 as a rule that is not ours sends it (DCGM-style): no target_kind, no fault_class
PLAIN_XID79 = {"alertname": "GpuXidError", "severity": "critical", "xid": "79", "gpu": "0"}
# a page-only serving alert of ours
LATENCY = {
    "alertname": "InferenceLatencyP99Spike",
    "severity": "warning",
    "layer": "serving",
    "fault_class": "serving_latency",
    "target_kind": "pod",
    "namespace": "llm",
    "model": "llama",
}
# the global budget alone (the per-signature one out of reach): tests/remediation/test_engine_pages_storm.py
# has the two together
BUDGET = BudgetSettings(
    max_pages_per_signature=10_000,
    max_pages_per_window=5,
    page_window_seconds=600.0,
    group_page_interval_seconds=60.0,
)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = Rig(tmp_path, engine_settings(budgets=BUDGET, external_url="https://remediation.example"))
    r.build()
    yield r
    await r.engine.aclose()


def _keys(rig: Rig) -> list[str]:
    return [p.dedup_key for p in rig.pager.pages]


async def test_a_plain_xid79_storm_pages_the_budget_then_one_summary(rig: Rig) -> None:
    for i in range(40):
        await rig.fire({**PLAIN_XID79, "node": f"node-{i:03d}"})
    individual = [k for k in _keys(rig) if k.startswith("gpupulse-incident-")]
    assert len(individual) == 5
    assert rig.backend.calls == []  # no target_kind: the controller never guesses a target
    await rig.advance(1)
    summaries = [p for p in rig.pager.pages if p.dedup_key.startswith("gpupulse-summary-")]
    assert len(summaries) == 1
    page = summaries[0]
    assert page.signature == "xid-79-fell-off-bus"
    assert page.summary.startswith("35 incidents of xid-79-fell-off-bus (gpu_lost)")
    assert "First targets: node:node-005, node:node-006" in page.summary and "and 25 more" in page.summary
    assert "https://remediation.example/api/v1/incidents?signature=xid-79-fell-off-bus&state=active" in (
        page.summary
    )
    assert len(page.history) == 10
    assert {i["state"] for i in rig.incidents()} == {"paged"}


async def test_the_summary_is_updated_under_the_same_key_not_repeated(rig: Rig) -> None:
    for i in range(10):
        await rig.fire({**LATENCY, "pod": f"vllm-{i}"})
    await rig.advance(1)
    assert len(rig.pager.pages) == 5 + 1
    for i in range(10, 20):  # the storm goes on
        await rig.fire({**LATENCY, "pod": f"vllm-{i}"})
    await rig.advance(30)
    assert len(rig.pager.pages) == 6  # at most one update per group interval
    await rig.advance(31)
    summaries = [p for p in rig.pager.pages if p.dedup_key.startswith("gpupulse-summary-")]
    assert len(summaries) == 2
    assert summaries[0].dedup_key == summaries[1].dedup_key  # the receiver updates, never duplicates
    assert summaries[1].summary.startswith("15 incidents of serving-latency")
    await rig.advance(61)
    assert len(rig.pager.pages) == 7  # nothing new joined: nothing is sent


async def test_each_signature_gets_its_own_summary(rig: Rig) -> None:
    for i in range(8):
        await rig.fire({**LATENCY, "pod": f"vllm-{i}"})
        await rig.fire({**PLAIN_XID79, "node": f"node-{i}"})
    await rig.advance(1)
    summaries = {p.signature for p in rig.pager.pages if p.dedup_key.startswith("gpupulse-summary-")}
    assert summaries == {"serving-latency", "xid-79-fell-off-bus"}


async def test_the_summary_resolves_when_its_last_incident_closes(rig: Rig) -> None:
    fired = [await rig.fire({**LATENCY, "pod": f"vllm-{i}"}) for i in range(8)]
    await rig.advance(1)
    (summary_key,) = {k for k in _keys(rig) if k.startswith("gpupulse-summary-")}
    for ev in fired[5:-1]:
        await rig.resolve(ev)
    await rig.advance(61)
    assert not any(p.resolved and p.dedup_key == summary_key for p in rig.pager.pages)
    await rig.resolve(fired[-1])
    await rig.advance(1)
    resolves = [p for p in rig.pager.pages if p.resolved and p.dedup_key == summary_key]
    assert len(resolves) == 1
    # members of a summary never get individual resolve pages
    assert not any(p.resolved and p.dedup_key.startswith("gpupulse-incident-") for p in rig.pager.pages[6:])


async def test_the_budget_refills_when_the_window_passes(rig: Rig) -> None:
    for i in range(6):
        await rig.fire({**LATENCY, "pod": f"vllm-{i}"})
    assert len(rig.pager.firing) == 5
    await rig.advance(601)
    await rig.fire({**LATENCY, "pod": "vllm-late"})
    assert rig.pager.pages[-1].dedup_key.startswith("gpupulse-incident-")


async def test_a_failed_summary_page_is_sent_again_at_the_next_tick(rig: Rig) -> None:
    for i in range(7):
        await rig.fire({**LATENCY, "pod": f"vllm-{i}"})
    rig.pager.fail = True
    await rig.advance(1)
    assert not any(p.dedup_key.startswith("gpupulse-summary-") for p in rig.pager.pages)
    rig.pager.fail = False
    await rig.advance(1)  # not a whole group interval later
    summaries = [p for p in rig.pager.pages if p.dedup_key.startswith("gpupulse-summary-")]
    assert len(summaries) == 1 and summaries[0].summary.startswith("2 incidents")


async def test_informational_pages_on_open_respect_the_budget(rig: Rig) -> None:
    thermal = {
        "alertname": "GPUTemperatureHigh",
        "fault_class": "thermal",
        "target_kind": "gpu",
        "severity": "warning",
    }
    for i in range(8):
        await rig.fire({**thermal, "node": f"n{i}", "uuid": f"GPU-{i}"})
    assert len(rig.pager.pages) == 5
    skipped = [i for i in rig.incidents() if "page_skipped" in str(rig.engine.get_incident(int(i["id"])))]
    assert len(skipped) == 3
    assert {i["state"] for i in rig.incidents()} == {"open"}  # the ladder still waits to migrate


async def test_without_a_budget_every_incident_pages(tmp_path: Path) -> None:
    # the baseline the storm figures compare against
    r = Rig(tmp_path, engine_settings(budgets=replace(BUDGET, max_pages_per_window=10_000)))
    r.build()
    try:
        for i in range(30):
            await r.fire({**PLAIN_XID79, "node": f"node-{i}"})
        assert len(r.pager.pages) == 30
    finally:
        await r.engine.aclose()
