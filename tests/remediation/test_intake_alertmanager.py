"""A real Alertmanager (the current line's 0.3x; the payloads on Debian's 0.25 too) against our intake:
recorded payloads and bearer-token delivery.

Set GPUPULSE_RECORD_FIXTURES=1 to (re-)write tests/fixtures/alertmanager/{,0.3x/}*.json from the real
processes.
"""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from demo.neighbours import LINES
from tests.fakes.intake import FIXTURES_BY_LINE, TOKEN, Alertmanager, count_rows, make_settings, start_harness

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("alertmanager_available")]

XID_LABELS = {
    "alertname": "GPUXidAppError",
    "severity": "critical",
    "layer": "hardware",
    "fault_class": "xid_app",
    "target_kind": "pod",
    "node": "gpu-node-1",
    "uuid": "GPU-5b4a7c1e-0f2d-4c59-9a57-1d3e3c8b6a10",
    "gpu": "0",
    "xid": "13",
    "namespace": "serving",
    "pod": "vllm-llama-0",
    "container": "vllm",
}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class Capture:
    """A webhook receiver that keeps every (headers, body) Alertmanager posts."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[tuple[dict[str, str], dict[str, Any]]] = asyncio.Queue()

    async def handle(self, request: web.Request) -> web.Response:
        await self.received.put((dict(request.headers), json.loads(await request.read())))
        return web.json_response({"status": "ok"})

    async def next(self, status: str) -> tuple[dict[str, str], dict[str, Any]]:
        while True:
            headers, body = await asyncio.wait_for(self.received.get(), 20)
            if body["status"] == status:
                return headers, body


@pytest.mark.parametrize("line_name", LINES)
async def test_real_alertmanager_payloads_match_the_recorded_fixtures(tmp_path: Path, line_name: str) -> None:
    fixtures = FIXTURES_BY_LINE[line_name]
    capture = Capture()
    app = web.Application()
    app.router.add_post("/api/v1/alerts", capture.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    am = Alertmanager(tmp_path, f"http://127.0.0.1:{port}/api/v1/alerts", token_file, line_name)
    await asyncio.to_thread(am.start)
    try:
        leak = {
            "labels": XID_LABELS,
            "annotations": {"summary": "XID 13 on GPU 0"},
            "generatorURL": "http://p/g",
        }
        await asyncio.to_thread(am.post, [leak])
        headers, firing = await capture.next("firing")
        await asyncio.to_thread(am.post, [{**leak, "endsAt": _now()}])
        _, resolved = await capture.next("resolved")
        group = [
            {
                "labels": {**XID_LABELS, "node": "gpu-node-2", "gpu": str(i), "uuid": f"GPU-{i}"},
                "annotations": {},
            }
            for i in range(2)
        ]
        await asyncio.to_thread(am.post, group)
        _, grouped = await capture.next("firing")
    finally:
        await asyncio.to_thread(am.stop)
        await runner.cleanup()

    assert headers["Authorization"] == f"Bearer {TOKEN}"
    assert headers["User-Agent"].startswith("Alertmanager/")
    assert len(grouped["alerts"]) == 2
    recorded = {"firing.json": firing, "resolved.json": resolved, "firing-group.json": grouped}
    if os.environ.get("GPUPULSE_RECORD_FIXTURES") == "1":
        fixtures.mkdir(parents=True, exist_ok=True)
        for name, body in recorded.items():
            (fixtures / name).write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
    for name, body in recorded.items():
        fixture = json.loads((fixtures / name).read_text())
        assert set(body) == set(fixture), name
        assert [set(a) for a in body["alerts"]] == [set(a) for a in fixture["alerts"]], name
        assert body["version"] == fixture["version"] == "4"


async def test_alertmanager_delivers_with_bearer_token_into_the_inbox(tmp_path: Path) -> None:
    h = await start_harness(make_settings(tmp_path))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    am = Alertmanager(tmp_path, f"{h.url}/api/v1/alerts", token_file)
    await asyncio.to_thread(am.start)
    try:
        await asyncio.to_thread(am.post, [{"labels": XID_LABELS, "annotations": {"summary": "XID 13"}}])
        await h.engine.wait_for(lambda: len(h.engine.handled) == 1, within_seconds=20)
        event = h.engine.handled[0]
        assert event.status == "firing"
        assert event.labels["fault_class"] == "xid_app"
        assert event.receiver == "gpupulse"
        await h.service.ctl.worker.wait_until(lambda: h.service.ctl.worker.marked == 1, within_seconds=5)
        assert count_rows(h.inbox_path, "processed_at IS NOT NULL") == 1
        assert h.metrics.alerts_rejected.labels(reason="auth")._value.get() == 0
    finally:
        await asyncio.to_thread(am.stop)
        await h.session.close()
        await h.service.stop()


async def test_alertmanager_with_a_wrong_token_is_refused_and_nothing_lands(tmp_path: Path) -> None:
    h = await start_harness(make_settings(tmp_path))
    token_file = tmp_path / "token"
    token_file.write_text("not-the-token")
    am = Alertmanager(tmp_path, f"{h.url}/api/v1/alerts", token_file)
    await asyncio.to_thread(am.start)
    try:
        await asyncio.to_thread(am.post, [{"labels": XID_LABELS, "annotations": {}}])

        def refused() -> bool:
            return bool(h.metrics.alerts_rejected.labels(reason="auth")._value.get() >= 1)

        deadline = asyncio.get_running_loop().time() + 20
        while not refused():
            assert asyncio.get_running_loop().time() < deadline, "Alertmanager never tried to deliver"
            await asyncio.sleep(0.05)  # polling an external process, which offers no event
        assert count_rows(h.inbox_path) == 0
        assert h.engine.calls == []
    finally:
        await asyncio.to_thread(am.stop)
        await h.session.close()
        await h.service.stop()
