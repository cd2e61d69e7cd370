"""The diagnosis inside the controller, against the replayed stories on a real Prometheus: stored with
the incident when it opens, refreshed before it pages, shown in the API, the page and
`gpupulse-remediation incidents`, and used where it is sure: a restart is not the answer to
page-cache eviction or load. Without Prometheus, or with a broken one, the ladder runs as before and
the incident says "no diagnosis" and why."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from remediation.incidents_cli import cmd_incidents
from remediation.settings import EngineDiagnosisSettings, EngineSettings, ScopeSettings
from remediation.signatures import SignatureError, parse_document
from tests.diagnosis import replay_tsdb
from tests.fakes.clock import FakeClock
from tests.fakes.prometheus_process import PromHandle, free_port, running_prometheus
from tests.remediation.test_engine_support import Rig, events, statuses

ONSET, STORIES = replay_tsdb.ONSET, replay_tsdb.STORIES

# what some teams wire up first: restart the engine when its latency or cache goes bad
NAIVE_RESTART = """
signatures:
  - name: restart-on-serving-symptoms
    description: Restart the engine when its P99 spikes or its KV cache stops hitting.
    fault_class: serving_latency
    priority: 100
    match: {alertname: [InferenceLatencyP99Spike, KVCacheHitRateDrop]}
    ladder: {rungs: [restart, page], attempts: {restart: 1}, verify_window_seconds: 300}
    restart_fixes: true
    reason: The team's choice.
"""
HARDWARE_ONLY = NAIVE_RESTART.replace("restart-on-serving-symptoms", "restart-on-hardware-only").replace(
    "reason: The team's choice.", "reason: The team's choice.\n    diagnosis: {acts_on: [hardware]}"
)


def _alert(story_name: str) -> dict[str, str]:
    s = STORIES[story_name]
    return {
        "alertname": s.alertname,
        "severity": "warning",
        "layer": "serving",
        "fault_class": "kv_cache" if s.alertname == "KVCacheHitRateDrop" else "serving_latency",
        "target_kind": "pod",
        "namespace": s.namespace,
        "pod": s.pod,
        "model": s.model,
        "node": s.node,
    }


def _rig(tmp_path: Path, url: str, signatures: str = NAIVE_RESTART, **diagnosis: Any) -> Rig:
    sig_dir = tmp_path / "signatures"
    sig_dir.mkdir(exist_ok=True)
    (sig_dir / "user.yaml").write_text(signatures)
    settings = EngineSettings(
        # every story is a pod in its own namespace
        scope=ScopeSettings(namespaces=tuple(sorted({s.namespace for s in STORIES.values()}))),
        signature_dirs=(sig_dir,),
        prometheus_url=url,
        diagnosis=EngineDiagnosisSettings(
            dashboard_url="https://grafana.example/d/gpupulse-serving", **diagnosis
        ),
    )
    rig = Rig(tmp_path, settings, clock=FakeClock(start=ONSET + 300))
    rig.build()
    return rig


@pytest.fixture
async def prom(tsdb: Path) -> AsyncIterator[PromHandle]:
    async with running_prometheus(replay_tsdb.CONFIG, tsdb_path=tsdb, extra_args=replay_tsdb.LOOKBACK) as p:
        yield p


async def test_page_cache_eviction_is_not_answered_by_a_restart(tmp_path: Path, prom: PromHandle) -> None:
    rig = _rig(tmp_path, prom.url)
    try:
        await rig.fire(_alert("evicted"))
        assert rig.backend.calls == []  # the restart rung was skipped
        inc = rig.only_incident()
        assert inc["state"] == "paged"
        assert ("restart", "skipped") in statuses(inc)
        assert "host: page-cache eviction" in inc["reason"] and "does not act on" in inc["reason"]
        # stored with the incident: on open, then refreshed before it paged
        assert [d["trigger"] for d in inc["diagnoses"]] == ["open", "page"]
        assert inc["diagnosis"]["top_cause"] == "host.page_cache_eviction"
        assert inc["diagnosis"]["confident"] is True
        ev = inc["diagnosis"]["candidates"][0]["evidence"][0]
        assert ev["signal"] == "page_cache_residency" and ev["points"] and ev["before"] > ev["after"]
        assert "diagnosed" in events(inc)
        # the page: top cause in the summary, the evidence, a dashboard link over the window
        (page,) = rig.pager.pages
        assert page.summary.endswith("| diagnosis: host: page-cache eviction")
        assert page.diagnosis is not None and page.diagnosis["top_cause"] == "host.page_cache_eviction"
        assert {e["signal"] for e in page.diagnosis["evidence"]} >= {
            "page_cache_residency",
            "node_disk_reads",
        }
        link = page.diagnosis["dashboard_url"]
        assert link.startswith("https://grafana.example/d/gpupulse-serving?from=")
        assert f"to={int((ONSET + 300) * 1000)}" in link and "var-pod=chat-0" in link
        # the list view carries the headline
        (listed,) = rig.incidents()
        assert listed["diagnosis"]["headline"] == "host: page-cache eviction"
        # counted for the dashboards' annotations, once per run
        labels = {"layer": "host", "cause": "host.page_cache_eviction", "confident": "true"}
        assert rig.metric("gpupulse_remediation_diagnoses_total", **labels) == 2
    finally:
        await rig.engine.aclose()


async def test_load_is_not_answered_by_a_restart_and_the_gpu_is_not_blamed(
    tmp_path: Path, prom: PromHandle
) -> None:
    rig = _rig(tmp_path, prom.url)
    try:
        await rig.fire(_alert("spike"))
        assert rig.backend.calls == []
        inc = rig.only_incident()
        assert inc["diagnosis"]["top_cause"] == "serving.load"
        assert all(c["layer"] != "hardware" for c in inc["diagnosis"]["candidates"])
        assert "serving: load" in rig.pager.pages[0].summary
    finally:
        await rig.engine.aclose()


@pytest.mark.parametrize(
    ("story", "cause", "label"),
    [
        # another restart in the middle of a rollout's cold start only starts it over
        ("rollout", "serving.rollout", "serving: restart or rollout (cold start)"),
        # the neighbour is still there after ours restarts: its owner is the one to page
        (
            "sm_neighbour",
            "scheduling.gpu_sm_neighbour",
            "scheduling: another pod on the GPU takes its SM time",
        ),
        ("cpu_hog", "host.cpu_contention", "host: other processes take the node's CPU"),
    ],
)
async def test_a_rollout_or_a_neighbour_is_not_answered_by_a_restart(
    tmp_path: Path, prom: PromHandle, story: str, cause: str, label: str
) -> None:
    rig = _rig(tmp_path, prom.url)
    try:
        await rig.fire(_alert(story))
        assert rig.backend.calls == []
        inc = rig.only_incident()
        assert inc["state"] == "paged" and ("restart", "skipped") in statuses(inc)
        assert inc["diagnosis"]["top_cause"] == cause and inc["diagnosis"]["confident"] is True
        assert f"this signature does not act on {cause}" in inc["reason"]
        (page,) = rig.pager.pages
        assert page.summary.endswith(f"| diagnosis: {label}")
        assert page.diagnosis is not None
        notes = {e["signal"]: e["note"] for e in page.diagnosis["evidence"]}
        if story == "sm_neighbour":
            # the page names the neighbour, whose owner it is for
            assert "namespace=research, pod=vllm-0" in notes["top_sm_neighbour"]
    finally:
        await rig.engine.aclose()


async def test_a_cause_the_restart_may_address_lets_the_ladder_run(tmp_path: Path, prom: PromHandle) -> None:
    rig = _rig(tmp_path, prom.url)
    try:
        await rig.fire(_alert("colocated"))
        assert rig.backend.rungs == ["restart"]
        inc = rig.only_incident()
        assert inc["diagnosis"]["top_cause"] == "scheduling.gpu_memory_neighbour"
        # the first action waited for the diagnosis, and went on as soon as it came
        order = [h["status"] if h["kind"] == "event" else h["rung"] for h in inc["history"]]
        assert order.index("waiting") < order.index("diagnosed") < order.index("restart")
    finally:
        await rig.engine.aclose()


async def test_acts_on_limits_a_signature_to_the_diagnoses_it_names(tmp_path: Path, prom: PromHandle) -> None:
    rig = _rig(tmp_path, prom.url, signatures=HARDWARE_ONLY)
    try:
        await rig.fire(_alert("colocated"))
        assert rig.backend.calls == []
        inc = rig.only_incident()
        assert "acts only on hardware" in inc["reason"]
        await rig.fire({**_alert("thermal"), "alertname": "InferenceLatencyP99Spike"})
        assert rig.backend.rungs == ["restart"]  # hardware: thermal throttling is what it acts on
    finally:
        await rig.engine.aclose()


async def test_without_prometheus_the_ladder_runs_as_before_and_says_why(tmp_path: Path) -> None:
    rig = _rig(tmp_path, "")
    try:
        await rig.fire(_alert("evicted"))
        assert rig.backend.rungs == ["restart"]  # as without diagnosis
        inc = rig.only_incident()
        assert inc["diagnosis"]["status"] == "no_diagnosis"
        assert inc["diagnosis"]["reason_code"] == "no_prometheus"
        assert rig.metric("gpupulse_remediation_diagnosis_failures_total", reason="no_prometheus") == 0
        assert "waiting" not in events(inc)  # nothing to wait for
        await rig.advance(301)  # not verified: the ladder pages, and the page says why it cannot tell
        assert rig.pager.pages[-1].summary.endswith(
            "| diagnosis: no diagnosis: no Prometheus is configured "
            "(--diagnosis.prometheus-url or --verify.prometheus-url)"
        )
    finally:
        await rig.engine.aclose()


async def test_an_unreachable_prometheus_is_no_diagnosis_and_the_ladder_goes_on(tmp_path: Path) -> None:
    rig = _rig(tmp_path, f"http://127.0.0.1:{free_port()}")
    try:
        await rig.fire(_alert("evicted"))
        assert rig.backend.rungs == ["restart"]
        inc = rig.only_incident()
        assert inc["diagnosis"]["reason_code"] == "prometheus_unavailable"
        # counted apart from "nothing lined up", so that a blind diagnosis can be alerted on
        await rig.advance(0)
        failures = "gpupulse_remediation_diagnosis_failures_total"
        assert rig.metric(failures, reason="prometheus_unavailable") == 1
    finally:
        await rig.engine.aclose()


async def test_a_hung_prometheus_delays_the_first_action_only_until_the_wait_ends(tmp_path: Path) -> None:
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({"status": "error", "error": "late"}, status=503)

    app = web.Application()
    app.router.add_get("/api/v1/query_range", hang)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    rig = _rig(tmp_path, url, wait_seconds=30.0, deadline_seconds=60.0)
    try:
        await rig.engine.handle(rig.event(_alert("evicted")))
        assert rig.backend.calls == []  # waiting for the diagnosis
        rig.clock.advance(31)
        await rig.engine.tick()  # the wait is over: the ladder runs as without diagnosis
        await asyncio.wait_for(rig.backend.entered.wait(), 10)
        assert rig.backend.rungs == ["restart"]
    finally:
        release.set()
        await rig.engine.aclose(grace_seconds=5)
        await runner.cleanup()


def test_signature_diagnosis_fields_are_validated() -> None:
    bad = NAIVE_RESTART.replace("reason: The team's choice.", "reason: x\n    diagnosis: {not_when: [gpu]}")
    with pytest.raises(SignatureError, match=r"diagnosis.not_when.*unknown layer or cause 'gpu'"):
        parse_document(bad, "user.yaml", "user")
    both = NAIVE_RESTART.replace(
        "reason: The team's choice.", "reason: x\n    diagnosis: {acts_on: [host], not_when: [host]}"
    )
    with pytest.raises(SignatureError, match="in both acts_on and not_when"):
        parse_document(both, "user.yaml", "user")
    typo = NAIVE_RESTART.replace("reason: The team's choice.", "reason: x\n    diagnosis: {act_on: [host]}")
    with pytest.raises(SignatureError, match=r"diagnosis.act_on.*unknown field"):
        parse_document(typo, "user.yaml", "user")
    (sig,) = parse_document(NAIVE_RESTART, "user.yaml", "user")
    # a restarting ladder that says nothing gets the default
    assert sig.diagnosis.effective_not_when(sig.ladder.rungs) == (
        "host.page_cache_eviction",
        "serving.load",
        "serving.rollout",
        "scheduling.gpu_sm_neighbour",
        "host.cpu_contention",
    )
    (explicit,) = parse_document(
        NAIVE_RESTART.replace("reason: The team's choice.", "reason: x\n    diagnosis: {not_when: []}"),
        "user.yaml",
        "user",
    )
    assert explicit.diagnosis.effective_not_when(explicit.ladder.rungs) == ()
    assert explicit.to_dict()["diagnosis"] == {"not_when": []}


async def test_the_incidents_command_shows_the_diagnosis(tmp_path: Path, prom: PromHandle) -> None:
    rig = _rig(tmp_path, prom.url)
    try:
        await rig.fire(_alert("evicted"))
        incident_id = int(rig.incidents()[0]["id"])
    finally:
        await rig.engine.aclose()

    def run(*args: str) -> tuple[int, str, str]:
        ns = argparse.Namespace(
            db=str(rig.db_path), storage_path=None, state=None, limit=50, output="table", id=None
        )
        for a in args:
            key, _, value = a.partition("=")
            setattr(ns, key, int(value) if key == "id" else value)
        out, err = io.StringIO(), io.StringIO()
        return cmd_incidents(ns, {}, out, err), out.getvalue(), err.getvalue()

    code, table, _ = run()
    assert code == 0
    header, row = table.splitlines()
    assert header.split()[-1] == "DIAGNOSIS" and row.endswith("host: page-cache eviction")
    code, detail, _ = run(f"id={incident_id}")
    assert code == 0
    assert "diagnosis (page" in detail and "host       cause: page-cache eviction" in detail
    assert "model weights resident in the page cache (ratio): 1 -> 0.35" in detail
    code, as_json, _ = run(f"id={incident_id}", "output=json")
    assert json.loads(as_json)["diagnosis"]["top_cause"] == "host.page_cache_eviction"
    code, _, err = run("db=" + str(tmp_path / "nope.db"))
    assert code == 2 and "does not exist" in err


def test_the_incidents_command_reads_a_ledger_from_before_diagnoses(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        from remediation.ledger_schema import SCHEMA

        conn.executescript(SCHEMA.split("CREATE TABLE IF NOT EXISTS rem_diagnoses")[0])
    ns = argparse.Namespace(db=str(db), storage_path=None, state=None, limit=50, output="table", id=None)
    out = io.StringIO()
    assert cmd_incidents(ns, {}, out, io.StringIO()) == 0
    assert out.getvalue().startswith("ID")


async def test_a_page_only_symptom_pages_with_its_diagnosis(tmp_path: Path, prom: PromHandle) -> None:
    # the shipped serving-latency signature only pages: the diagnosis runs right before the page
    rig = _rig(tmp_path, prom.url, signatures="signatures: []\n")
    try:
        await rig.fire(_alert("thermal"))
        inc = rig.only_incident()
        assert inc["signature"] == "serving-latency" and inc["state"] == "paged"
        assert [d["trigger"] for d in inc["diagnoses"]] == ["page"]
        (page,) = rig.pager.pages
        assert page.summary.endswith("| diagnosis: hardware: thermal throttling")
        assert page.diagnosis is not None and page.diagnosis["layers"]["hardware"].startswith("cause:")
    finally:
        await rig.engine.aclose()


async def test_the_dashboards_annotate_confident_diagnoses(prom: PromHandle) -> None:
    from alerts.config import load_config
    from dashboards.boards import annotations, node, remediation, serving

    assert annotations.DIAGNOSES.expr.startswith(
        "sum by (layer, cause) (increase(gpupulse_remediation_diagnoses_total"
    )
    config = load_config()
    for board in (serving.dashboard(config), node.dashboard(config), remediation.dashboard()):
        marks = {m["name"]: m for m in board.render()["annotations"]["list"]}
        assert set(marks) == {"Diagnoses", "Remediation actions"}
        mark = marks["Diagnoses"]
        assert mark["expr"] == annotations.DIAGNOSES.expr and mark["datasource"]["uid"] == "${datasource}"
    # the expressions are PromQL the real server accepts
    assert await prom.query(annotations.DIAGNOSES.expr) == []
    assert await prom.query(annotations.ACTIONS.expr) == []


async def test_past_the_queue_limit_an_incident_gets_no_diagnosis_busy(tmp_path: Path) -> None:
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({"status": "error", "error": "late"}, status=503)

    app = web.Application()
    app.router.add_get("/api/v1/query_range", hang)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    rig = _rig(tmp_path, url, max_queued=1, max_concurrent=1, deadline_seconds=60.0)
    try:
        await rig.engine.handle(rig.event(_alert("evicted")))  # its diagnosis hangs, holding the queue
        await rig.engine.handle(rig.event(_alert("spike")))
        await asyncio.wait_for(rig.backend.entered.wait(), 10)
        # the second did not queue behind the first: no diagnosis, and its ladder ran at once
        (target,) = [t for _, t in rig.backend.calls]
        assert target.pod == "search-0"
        spike = next(i for i in rig.incidents() if i["target_pod"] == "search-0")
        assert spike["diagnosis"]["reason_code"] == "busy"
    finally:
        release.set()
        await rig.engine.aclose(grace_seconds=5)
        await runner.cleanup()


async def test_a_diagnosis_that_raises_never_stops_the_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from remediation.diagnosis.diagnose import Diagnoser

    async def broken(self: Diagnoser, labels: object, fired_at: float, own: object = ()) -> None:
        raise RuntimeError("bug in the diagnosis")

    monkeypatch.setattr(Diagnoser, "diagnose", broken)
    rig = _rig(tmp_path, f"http://127.0.0.1:{free_port()}", signatures="signatures: []\n")
    try:
        await rig.fire(_alert("thermal"))  # page-only: the refresh before the page raises
        (page,) = rig.pager.pages
        assert page.summary.endswith(
            "| diagnosis: no diagnosis: the diagnosis failed: RuntimeError: bug in the diagnosis"
        )
        assert rig.only_incident()["diagnosis"]["reason_code"] == "failed"
    finally:
        await rig.engine.aclose()
