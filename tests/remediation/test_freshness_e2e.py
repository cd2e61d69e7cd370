"""The controller's whole path (webhook, inbox, worker, real engine) on rows that waited in the inbox
through an outage: they are recorded and not acted on, and Alertmanager's re-send of an alert that
still fires, a duplicate for the inbox, is queued again as fresh evidence."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from remediation.engine import build_engine
from remediation.inbox import Inbox
from remediation.intake import parse_notification
from remediation.metrics import RemediationMetrics
from remediation.model import Engine
from remediation.server import start_service
from remediation.settings import Settings
from tests.fakes.clock import FakeClock
from tests.fakes.intake import alert, count_rows, make_settings, notification
from tests.fakes.pager_sink import RecordingPager
from tests.remediation.test_engine_support import ScriptedBackend, engine_settings

LEAK = {
    "alertname": "GPUProcessMemoryAboveHardLimit",
    "fault_class": "memory_leak",
    "target_kind": "pod",
    "namespace": "llm",
    "pod": "vllm-0",
    "node": "node-a",
}


def _payload(fingerprint: str) -> dict[str, object]:
    doc = alert(fingerprint=fingerprint)
    doc["labels"] = dict(LEAK)
    return notification([doc])


async def test_rows_left_from_before_an_outage_do_not_act_until_alertmanager_resends(tmp_path: Path) -> None:
    clock = FakeClock()
    settings = make_settings(tmp_path, engine=engine_settings(max_event_age_seconds=900.0, backend="none"))
    # accepted six hours ago, never processed: the controller went down right after the 200
    inbox = Inbox(settings.inbox_path)
    await inbox.start()
    body = json.dumps(_payload("f-outage")).encode()
    await inbox.ingest(parse_notification(body, clock.time() - 6 * 3600), 100)
    await inbox.close()

    backend, pager = ScriptedBackend(), RecordingPager()

    async def factory(s: Settings, metrics: RemediationMetrics) -> Engine:
        return build_engine(s.engine, s.db_path, metrics, clock, backend=backend, pager=pager)

    service = await start_service(settings, factory, clock=clock)
    try:
        worker = service.ctl.worker
        await worker.wait_until(lambda: worker.marked == 1, 10)
        assert backend.calls == []
        assert service.ctl.engine.stats()["stale_alerts"] == {"too_old": 1}

        # Alertmanager re-sends the group (repeat_interval): same fingerprint, startsAt and status
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{service.port}/api/v1/alerts"
            headers = {"Authorization": f"Bearer {settings.auth_token}"}
            async with session.post(url, json=_payload("f-outage"), headers=headers) as r:
                assert r.status == 200
                assert (await r.json())["duplicates"] == 1
            await worker.wait_until(lambda: worker.marked == 2, 10)
            assert count_rows(settings.inbox_path) == 1  # the same row, queued again
            assert [rung for rung, _ in backend.calls] == ["restart"]
            # a re-send soon after is a plain duplicate: nothing queued, nothing done again
            async with session.post(url, json=_payload("f-outage"), headers=headers) as r:
                assert r.status == 200
        assert count_rows(settings.inbox_path, "processed_at IS NULL") == 0
        assert worker.marked == 2
    finally:
        await service.stop()
