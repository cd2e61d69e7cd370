"""The on-call board's series on the controller's /metrics: one series per open incident, gone when it
closes, capped however many are open; the latest actions with their outcome; the budgets left."""

from __future__ import annotations

import asyncio
import time
from asyncio.subprocess import PIPE, STDOUT
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from demo.neighbours import line
from remediation.engine import RemediationEngine, build_engine
from remediation.ledger import Ledger, connect
from remediation.metrics import BoardSnapshot, RemediationMetrics
from remediation.model import Engine, Target
from remediation.safety import SafetyGate
from remediation.server import RunningService, start_service
from remediation.settings import BudgetSettings, Settings
from remediation.transitions.board import MAX_OPEN_INCIDENTS, budgets_left, read_board, target_text
from tests.fakes.clock import FakeClock
from tests.fakes.intake import alert, make_settings, notification
from tests.fakes.pager_sink import RecordingPager
from tests.remediation.test_engine_support import CORRUPT_MODEL, ScriptedBackend, engine_settings

LEAK = {
    "alertname": "GPUProcessMemoryAboveHardLimit",
    "fault_class": "memory_leak",
    "target_kind": "pod",
    "namespace": "llm",
    "pod": "vllm-0",
    "node": "node-a",
}
Samples = dict[str, list[tuple[dict[str, str], float]]]


@dataclass
class Controller:
    """A controller service with the real engine on a fake clock, and an HTTP session to it."""

    service: RunningService
    clock: FakeClock
    backend: ScriptedBackend
    metrics: RemediationMetrics
    session: aiohttp.ClientSession
    token: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.service.port}"

    async def post(self, labels: Mapping[str, str], fingerprint: str, status: str = "firing") -> None:
        doc = alert(fingerprint=fingerprint, status=status)
        doc["labels"] = dict(labels)
        if status == "resolved":
            doc["endsAt"] = self.clock.utcnow().isoformat().replace("+00:00", "Z")
        headers = {"Authorization": f"Bearer {self.token}"}
        async with self.session.post(
            f"{self.url}/api/v1/alerts", json=notification([doc], status=status), headers=headers
        ) as r:
            assert r.status == 200, await r.text()

    async def text(self) -> str:
        async with self.session.get(f"{self.url}/metrics") as r:
            assert r.status == 200
            return await r.text()

    async def scrape(self) -> Samples:
        out: Samples = {}
        for family in text_string_to_metric_families(await self.text()):
            for s in family.samples:
                out.setdefault(s.name, []).append((dict(s.labels), s.value))
        return out

    async def until_board(self, holds: Callable[[BoardSnapshot], object], within: float = 10.0) -> None:
        """Wait until the published board satisfies `holds` (re-checked after every worker commit)."""
        worker = self.service.ctl.worker
        await worker.wait_until(lambda: bool(holds(self.metrics.board.snapshot)), within)


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    clock = FakeClock(start=time.time())
    backend, pager = ScriptedBackend(), RecordingPager()
    metrics = RemediationMetrics()
    settings = make_settings(tmp_path, engine=engine_settings(backend="none"))

    async def factory(s: Settings, m: RemediationMetrics) -> Engine:
        return build_engine(s.engine, s.db_path, m, clock, backend=backend, pager=pager)

    service = await start_service(settings, factory, metrics=metrics, clock=clock)
    session = aiohttp.ClientSession()
    try:
        yield Controller(service, clock, backend, metrics, session, settings.auth_token)
    finally:
        await session.close()
        await service.stop()


def _open(snapshot: BoardSnapshot) -> set[int]:
    return {row.incident for row in snapshot.open_incidents}


async def test_an_open_incident_has_its_series_until_it_closes(controller: Controller) -> None:
    c = controller
    await c.post(LEAK, "f-leak")
    await c.until_board(lambda b: any(a.outcome == "success" for a in b.actions))
    samples = await c.scrape()
    [(labels, value)] = samples["gpupulse_remediation_incident_open_info"]
    incident = labels["incident"]
    assert labels == {
        "incident": incident,
        "signature": "gpu-memory-leak",
        "target_kind": "pod",
        "target": "llm/vllm-0",
        "state": "verifying",
        "rung": "restart",
    }
    assert value == 1.0
    [(opened_labels, opened)] = samples["gpupulse_remediation_incident_opened_timestamp_seconds"]
    assert opened_labels == {"incident": incident}
    assert opened == pytest.approx(c.clock.time(), abs=1.0)
    [(action, ended)] = samples["gpupulse_remediation_action_last_timestamp_seconds"]
    assert action == {
        "incident": incident,
        "signature": "gpu-memory-leak",
        "target_kind": "pod",
        "target": "llm/vllm-0",
        "rung": "restart",
        "outcome": "success",
    }
    assert ended == pytest.approx(c.clock.time(), abs=1.0)
    assert samples["gpupulse_remediation_incidents_open_unlisted"] == [({}, 0.0)]
    # the exposition with the board in it passes Prometheus' own lint (names, help, types, units)
    promtool = await asyncio.create_subprocess_exec(
        str(line().promtool), "check", "metrics", stdin=PIPE, stdout=PIPE, stderr=STDOUT
    )
    out, _ = await promtool.communicate((await c.text()).encode())
    assert promtool.returncode == 0, out.decode()

    # the memory is back (the alert resolves), nothing recurs for the cooldown: the incident closes
    await c.post(LEAK, "f-leak", status="resolved")
    await c.until_board(lambda b: _open(b) and b.open_incidents[0].state == "cooldown")
    c.clock.advance(901)
    await c.until_board(lambda b: not _open(b))
    samples = await c.scrape()
    assert "gpupulse_remediation_incident_open_info" not in samples
    assert "gpupulse_remediation_incident_opened_timestamp_seconds" not in samples
    # what was done stays on the board after the incident closed
    assert [lab["outcome"] for lab, _ in samples["gpupulse_remediation_action_last_timestamp_seconds"]] == [
        "success"
    ]


async def test_the_budgets_left_are_on_the_board_for_every_signature(controller: Controller) -> None:
    c = controller
    await c.until_board(lambda b: b.budgets)
    samples = await c.scrape()
    budgets = {lab["budget"]: v for lab, v in samples["gpupulse_remediation_budget_remaining"]}
    limits = BudgetSettings()
    assert budgets == {
        "concurrent_actions": limits.max_concurrent_actions,
        "actions_per_minute": limits.max_actions_per_minute,
        "nodes_migrated": limits.max_nodes_migrated,
        "pages_per_window": limits.max_pages_per_window,
    }
    pages = {lab["signature"]: v for lab, v in samples["gpupulse_remediation_signature_pages_remaining"]}
    assert pages["gpu-memory-leak"] == limits.max_pages_per_signature
    assert len(pages) >= 10  # every shipped signature, before any incident
    # a restart takes one from the per-minute budget until the minute has passed
    await c.post(LEAK, "f-leak")
    await c.until_board(lambda b: any(a.outcome == "success" for a in b.actions))
    await c.until_board(lambda b: dict(b.budgets)["actions_per_minute"] == limits.max_actions_per_minute - 1)
    c.clock.advance(61)
    await c.until_board(lambda b: dict(b.budgets)["actions_per_minute"] == limits.max_actions_per_minute)
    # an incident that pages takes one page from its signature's budget and from the global one
    await c.post(CORRUPT_MODEL, "f-model")
    await c.until_board(
        lambda b: dict(b.signature_pages)["model-artifact"] == limits.max_pages_per_signature - 1
    )
    samples = await c.scrape()
    pages = {lab["signature"]: v for lab, v in samples["gpupulse_remediation_signature_pages_remaining"]}
    budgets = {lab["budget"]: v for lab, v in samples["gpupulse_remediation_budget_remaining"]}
    assert pages["model-artifact"] == limits.max_pages_per_signature - 1
    assert pages["gpu-memory-leak"] == limits.max_pages_per_signature
    assert budgets["pages_per_window"] == limits.max_pages_per_window - 1


async def test_a_board_that_cannot_be_read_never_stops_the_engine(
    controller: Controller, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The board only shows what the engine did: when reading it fails, the action still happens and
    /metrics keeps answering with the last board published."""
    c = controller

    def broken(*_: object, **__: object) -> BoardSnapshot:
        raise RuntimeError("board query failed")

    monkeypatch.setattr("remediation.transitions.timers.read_board", broken)
    await c.post(LEAK, "f-leak")
    await c.service.ctl.worker.wait_until(lambda: c.backend.rungs == ["restart"], 10.0)
    assert "gpupulse_remediation_incident_open_info" not in await c.scrape()
    assert "the on-call board could not be read" in caplog.text


def test_pages_left_of_a_signature_are_its_own_budget_capped_by_the_global_one() -> None:
    b = BudgetSettings(max_pages_per_signature=3, max_pages_per_window=5)
    counts = {"in_flight": 5, "last_minute": 30, "nodes_migrated": 1}
    overall, per_signature = budgets_left(
        b, **counts, paged=4, paged_by_signature={"a": 1, "gone": 3}, signatures=["a", "b"]
    )
    assert dict(overall) == {
        "concurrent_actions": 0,  # never negative, though more run than the budget allows
        "actions_per_minute": 0,
        "nodes_migrated": 2,
        "pages_per_window": 1,
    }
    # a signature no longer loaded still shows while it has pages in the window
    assert dict(per_signature) == {"a": 1, "b": 1, "gone": 0}


@pytest.mark.parametrize(
    ("target", "text"),
    [
        (Target(kind="pod", node="n", namespace="llm", pod="vllm-0", uuid="GPU-1"), "llm/vllm-0"),
        (
            Target(kind="job", namespace="research", training_job_kind="PyTorchJob", training_job="t"),
            "research/t",
        ),
        (Target(kind="gpu", node="n", uuid="GPU-1"), "n/GPU-1"),
        (Target(kind="gpu", uuid="GPU-1"), "GPU-1"),
        (Target(kind="node", node="n"), "n"),
    ],
)
def test_a_target_is_named_as_an_on_call_names_it(target: Target, text: str) -> None:
    assert target_text(target) == text


def _storm(db_path: Path, total: int, now: float) -> None:
    """`total` open incidents of one signature on as many pods, written as the engine writes them."""
    db = Ledger(connect(db_path))
    try:
        with db.transaction():
            for i in range(total):
                target = Target(kind="pod", node="node-a", namespace="llm", pod=f"vllm-{i}")
                db.insert_incident(
                    {
                        "key": f"storm-{i}",
                        "signature": "gpu-memory-leak",
                        "fault_class": "memory_leak",
                        "alertname": LEAK["alertname"],
                        "target": target,
                        "loop_key": target.key,
                        "state": "paged",
                        "opened_at": now,
                        "updated_at": now,
                        "labels": {**LEAK, "pod": f"vllm-{i}"},
                        "annotations": {},
                        "firing_fps": (f"fp-{i}",),
                    }
                )
    finally:
        db.conn.close()


async def test_ten_thousand_open_incidents_export_the_cap_and_count_the_rest(tmp_path: Path) -> None:
    """An alert storm left 10,000 incidents open: /metrics lists the newest up to the cap, counts the rest,
    and follows them as they close."""
    clock = FakeClock(start=time.time())
    total = 10_000
    _storm(tmp_path / "gpupulse.db", total, clock.time())
    metrics = RemediationMetrics()
    engine = build_engine(
        engine_settings(backend="none"), tmp_path / "gpupulse.db", metrics, clock, pager=RecordingPager()
    )
    assert isinstance(engine, RemediationEngine)
    try:
        # the board is published at start (recovery), before the first tick
        assert metrics.board.snapshot.unlisted == total - MAX_OPEN_INCIDENTS
        await engine.tick()
        text = generate_latest(metrics.registry).decode()
        board = metrics.board.snapshot
        assert len(board.open_incidents) == MAX_OPEN_INCIDENTS
        assert min(_open(board)) == total - MAX_OPEN_INCIDENTS + 1  # the newest
        assert _lines(text, "gpupulse_remediation_incident_open_info{") == MAX_OPEN_INCIDENTS
        assert _lines(text, "gpupulse_remediation_incident_opened_timestamp_seconds{") == MAX_OPEN_INCIDENTS
        assert f"gpupulse_remediation_incidents_open_unlisted {float(total - MAX_OPEN_INCIDENTS)}" in text
        # the operator closes most of them: the next tick lists what is left
        db = Ledger(connect(tmp_path / "gpupulse.db"))
        try:
            with db.transaction():
                db.conn.execute("UPDATE rem_incidents SET state = 'closed' WHERE id > 50")
        finally:
            db.conn.close()
        await engine.tick()
        board = metrics.board.snapshot
        assert _open(board) == set(range(1, 51)) and board.unlisted == 0
        text = generate_latest(metrics.registry).decode()
        assert _lines(text, "gpupulse_remediation_incident_open_info{") == 50
    finally:
        await engine.aclose()


def _lines(text: str, prefix: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith(prefix))


def test_read_board_of_an_empty_ledger_is_ready_with_full_budgets(tmp_path: Path) -> None:
    db = Ledger(connect(tmp_path / "db"))
    try:
        board = read_board(db, SafetyGate(db, BudgetSettings(), 0), ["x"], time.time())
    finally:
        db.conn.close()
    assert board.ready and board.open_incidents == () and board.unlisted == 0 and board.actions == ()
    assert dict(board.signature_pages) == {"x": BudgetSettings().max_pages_per_signature}
