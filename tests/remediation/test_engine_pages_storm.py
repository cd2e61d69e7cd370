"""A fleet-wide storm is one story for the on-call: with the default budgets, the first few incidents
of one signature page on their own (max_pages_per_signature) and the rest share one summary page,
updated under one dedup key; the global budget (max_pages_per_window) still caps all signatures
together. The storms come as Alertmanager webhook bodies parsed by the real intake, in both shapes:
our own rules' (target_kind pod, 300 pods) and a foreign rule's plain one (XID 79 on 300 nodes)."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from remediation.intake import parse_notification
from remediation.model import Page
from remediation.settings import BudgetSettings
from tests.fakes.intake import alert, load_fixture, notification
from tests.remediation.test_engine_support import Rig, engine_settings

DEFAULTS = BudgetSettings()
PER_SIGNATURE = DEFAULTS.max_pages_per_signature
STORM = 300
# a page-only serving alert of ours, on pods
LATENCY = {
    "alertname": "InferenceLatencyP99Spike",
    "severity": "warning",
    "layer": "serving",
    "fault_class": "serving_latency",
    "target_kind": "pod",
    "namespace": "llm",
    "model": "llama",
}
# XID 79 as a rule that is not ours sends it (DCGM-style), on nodes: no target_kind, no fault_class
PLAIN_XID79 = {"alertname": "GpuXidError", "severity": "critical", "xid": "79", "gpu": "0"}


def test_the_default_budgets_page_a_few_of_one_signature_and_cap_them_all() -> None:
    # the figures the storm below is read against (and the docs and chart state)
    assert (DEFAULTS.max_pages_per_signature, DEFAULTS.max_pages_per_window) == (3, 20)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = Rig(tmp_path, engine_settings(external_url="https://remediation.example"))
    r.build()
    yield r
    await r.engine.aclose()


def storm_alerts(
    rig: Rig, labels: Mapping[str, str], where: str, n: int, status: str = "firing"
) -> list[Any]:
    """n alerts of one rule, one per pod or node (`where`), in Alertmanager's webhook shape."""
    starts = rig.clock.utcnow().isoformat().replace("+00:00", "Z")
    out = []
    for i in range(n):
        doc = alert(fingerprint=f"{abs(hash((labels['alertname'], where, i))):016x}", status=status)
        doc["labels"] = {**labels, where: f"{where}-{i:03d}"}
        doc["startsAt"] = starts
        doc["annotations"] = {}
        out.append(doc)
    return out


async def deliver(rig: Rig, alerts: Sequence[Mapping[str, Any]], status: str = "firing") -> None:
    """One webhook body, parsed by the real intake, handed alert by alert to the real engine."""
    template = load_fixture("firing.json")
    body = notification(list(alerts), status=status, receiver=template["receiver"])
    records = parse_notification(json.dumps(body).encode(), rig.clock.time())
    for i, record in enumerate(records):
        await rig.engine.handle(record.to_event(i + 1))
    await rig.engine.wait_idle()


def incidents(rig: Rig) -> list[Mapping[str, Any]]:
    return list(rig.engine.list_incidents(limit=10_000))


def alone(rig: Rig, signature: str = "") -> list[Page]:
    return [
        p
        for p in rig.pager.firing
        if p.dedup_key.startswith("gpupulse-incident-") and (not signature or p.signature == signature)
    ]


def summaries(rig: Rig, signature: str = "") -> list[Page]:
    return [
        p
        for p in rig.pager.pages
        if p.dedup_key.startswith("gpupulse-summary-") and (not signature or p.signature == signature)
    ]


@pytest.mark.parametrize(
    ("labels", "where", "signature"),
    [(LATENCY, "pod", "serving-latency"), (PLAIN_XID79, "node", "xid-79-fell-off-bus")],
    ids=["300-pods-our-shape", "300-nodes-plain-shape"],
)
async def test_a_storm_of_one_signature_pages_its_first_few_then_one_summary(
    rig: Rig, labels: Mapping[str, str], where: str, signature: str
) -> None:
    await deliver(rig, storm_alerts(rig, labels, where, STORM))
    assert len(incidents(rig)) == STORM
    assert [p.signature for p in alone(rig)] == [signature] * PER_SIGNATURE
    await rig.advance(1)
    (summary,) = summaries(rig)
    assert summary.signature == signature
    assert summary.summary.startswith(f"{STORM - PER_SIGNATURE} incidents of {signature}")
    assert f"First targets: {where}:" in summary.summary and "and 287 more" in summary.summary
    assert "past the page budget (3 of one signature, 20 in all, per 600 s)" in summary.summary
    assert len(rig.pager.pages) == PER_SIGNATURE + 1  # 300 alerts, 4 pages
    assert {i["state"] for i in incidents(rig)} == {"paged"}


async def test_the_summary_is_updated_under_one_key_as_the_storm_goes_on(rig: Rig) -> None:
    alerts = storm_alerts(rig, LATENCY, "pod", STORM)
    await deliver(rig, alerts[:150])
    await rig.advance(1)
    await deliver(rig, alerts[150:])
    await rig.advance(30)
    assert len(summaries(rig)) == 1  # at most one update per group interval
    await rig.advance(31)
    first, update = summaries(rig)
    assert first.dedup_key == update.dedup_key  # the receiver updates, never duplicates
    assert first.summary.startswith("147 incidents") and update.summary.startswith("297 incidents")
    assert len(alone(rig)) == PER_SIGNATURE
    await rig.advance(61)
    assert len(summaries(rig)) == 2  # nothing new joined: nothing is sent


async def test_two_signatures_storming_at_once_each_get_their_own_few_and_summary(rig: Rig) -> None:
    pods = storm_alerts(rig, LATENCY, "pod", STORM)
    nodes = storm_alerts(rig, PLAIN_XID79, "node", STORM)
    interleaved = [a for pair in zip(pods, nodes, strict=True) for a in pair]
    await deliver(rig, interleaved)
    await rig.advance(1)
    for signature in ("serving-latency", "xid-79-fell-off-bus"):
        assert len(alone(rig, signature)) == PER_SIGNATURE
        (summary,) = summaries(rig, signature)
        assert summary.summary.startswith(f"{STORM - PER_SIGNATURE} incidents of {signature}")
    assert len({p.dedup_key for p in summaries(rig)}) == 2
    assert len(rig.pager.pages) == 2 * (PER_SIGNATURE + 1)


async def test_the_global_budget_still_caps_all_signatures_together(tmp_path: Path) -> None:
    budgets = replace(DEFAULTS, max_pages_per_signature=3, max_pages_per_window=5)
    r = Rig(tmp_path, engine_settings(budgets=budgets))
    r.build()
    try:
        await deliver(r, storm_alerts(r, LATENCY, "pod", 10))
        await deliver(r, storm_alerts(r, PLAIN_XID79, "node", 10))
        assert len(alone(r, "serving-latency")) == 3
        assert len(alone(r, "xid-79-fell-off-bus")) == 2  # 5 in all: the global budget is spent
        await r.advance(1)
        assert summaries(r, "serving-latency")[0].summary.startswith("7 incidents")
        assert summaries(r, "xid-79-fell-off-bus")[0].summary.startswith("8 incidents")
        spent = [
            str(h["summary"])
            for i in incidents(r)
            for h in (r.engine.get_incident(int(i["id"])) or {"history": []})["history"]
            if h["status"] == "summarized"
        ]
        assert any("page budget spent: 5 incidents paged within 600 s (limit 5)" in s for s in spent)
        assert any("page budget of serving-latency spent: 3 of its incidents" in s for s in spent)
    finally:
        await r.engine.aclose()


async def test_the_signature_budget_refills_when_the_window_passes(rig: Rig) -> None:
    await deliver(rig, storm_alerts(rig, LATENCY, "pod", 5))
    assert len(alone(rig)) == PER_SIGNATURE
    rig.clock.advance(601)
    late = alert(fingerprint="fedcba9876543210")
    late["labels"] = {**LATENCY, "pod": "late-0"}
    late["startsAt"] = rig.clock.utcnow().isoformat().replace("+00:00", "Z")
    await deliver(rig, [late])
    assert rig.pager.firing[-1].dedup_key.startswith("gpupulse-incident-")


async def test_a_storm_delivered_twice_pages_no_more(rig: Rig) -> None:
    alerts = storm_alerts(rig, PLAIN_XID79, "node", STORM)
    await deliver(rig, alerts)
    await rig.advance(1)
    # Alertmanager re-sends the whole group at every group_interval: the same alerts again
    await deliver(rig, alerts)
    await deliver(rig, alerts[:10] + alerts[:10])  # and duplicates within one body
    await rig.advance(61)
    assert len(incidents(rig)) == STORM
    assert len(alone(rig)) == PER_SIGNATURE
    assert len(summaries(rig)) == 1


async def test_a_reordered_storm_pages_the_first_few_of_its_own_order(rig: Rig) -> None:
    alerts = storm_alerts(rig, LATENCY, "pod", STORM)
    random.Random(24).shuffle(alerts)
    await deliver(rig, alerts)
    await rig.advance(1)
    paged_pods = [p.target.pod for p in alone(rig)]
    assert paged_pods == [a["labels"]["pod"] for a in alerts[:PER_SIGNATURE]]
    (summary,) = summaries(rig)
    assert summary.summary.startswith("297 incidents")
    assert [h["target"] for h in summary.history[:2]] == [
        f"pod:llm/{a['labels']['pod']}" for a in alerts[PER_SIGNATURE : PER_SIGNATURE + 2]
    ]


async def test_alerts_resolved_before_they_fired_page_nothing(rig: Rig) -> None:
    alerts = storm_alerts(rig, PLAIN_XID79, "node", 20)
    resolved = [
        {**a, "status": "resolved", "endsAt": rig.clock.utcnow().isoformat().replace("+00:00", "Z")}
        for a in alerts[:10]
    ]
    await deliver(rig, resolved, status="resolved")
    await deliver(rig, alerts)
    await rig.advance(1)
    paged_nodes = [p.target.node for p in alone(rig)]
    assert paged_nodes == ["node-010", "node-011", "node-012"]
    (summary,) = summaries(rig)
    assert summary.summary.startswith("7 incidents")


async def test_the_summary_of_a_storm_resolves_once_with_its_last_incident(rig: Rig) -> None:
    alerts = storm_alerts(rig, LATENCY, "pod", 30)
    await deliver(rig, alerts)
    await rig.advance(1)
    (summary,) = summaries(rig)
    now = rig.clock.utcnow().isoformat().replace("+00:00", "Z")
    ended = [{**a, "status": "resolved", "endsAt": now} for a in alerts]
    await deliver(rig, ended[:-1], status="resolved")
    await rig.advance(61)
    assert not any(p.resolved for p in summaries(rig))
    await deliver(rig, ended[-1:], status="resolved")
    await rig.advance(1)
    resolves = [p for p in summaries(rig) if p.resolved]
    assert [p.dedup_key for p in resolves] == [summary.dedup_key]
