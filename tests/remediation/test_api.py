"""The operator API: token required, calls reach the engine, errors are clear."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakes.intake import Harness

ROUTES = [
    ("GET", "/api/v1/incidents"),
    ("GET", "/api/v1/incidents/1"),
    ("GET", "/api/v1/signatures"),
    ("GET", "/api/v1/stats"),
    ("POST", "/api/v1/pause"),
    ("POST", "/api/v1/resume"),
    ("POST", "/api/v1/breaker/reset"),
]


async def _call(h: Harness, method: str, path: str, auth: bool = True, **kw: Any) -> tuple[int, Any]:
    headers = h.headers if auth else {}
    async with h.session.request(method, h.url + path, headers=headers, **kw) as r:
        return r.status, await r.json(content_type=None)


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_api_needs_the_token(harness: Harness, method: str, path: str) -> None:
    status, body = await _call(harness, method, path, auth=False, json={"by": "mallory"})
    assert status == 401
    assert body["field"] == "Authorization"
    assert harness.engine.controls == []
    # a rejected API call is not a rejected webhook
    assert harness.metrics.alerts_rejected.labels(reason="auth")._value.get() == 0


@pytest.mark.parametrize(
    ("path", "call"),
    [("/api/v1/pause", "pause"), ("/api/v1/resume", "resume"), ("/api/v1/breaker/reset", "reset_breaker")],
)
async def test_control_calls_reach_the_engine_with_the_operator(
    harness: Harness, path: str, call: str
) -> None:
    status, body = await _call(harness, "POST", path, json={"by": "alice"})
    assert status == 200
    assert body["ok"] is True and body["by"] == "alice"
    assert harness.engine.controls == [(call, "alice")]


@pytest.mark.parametrize("payload", [None, {}, {"by": ""}, {"by": 3}, {"by": "x" * 500}, [1]])
async def test_control_without_an_operator_name_is_400(harness: Harness, payload: Any) -> None:
    kw: dict[str, Any] = {} if payload is None else {"json": payload}
    status, body = await _call(harness, "POST", "/api/v1/pause", **kw)
    assert status == 400
    assert body["field"] == "by"
    assert harness.engine.controls == []


async def test_incidents_are_listed_and_filtered_by_state(harness: Harness) -> None:
    status, body = await _call(harness, "GET", "/api/v1/incidents")
    assert status == 200 and [i["id"] for i in body["incidents"]] == [1, 2]
    status, body = await _call(harness, "GET", "/api/v1/incidents?state=resolved")
    assert [i["id"] for i in body["incidents"]] == [2]
    status, body = await _call(harness, "GET", "/api/v1/incidents?limit=0")
    assert status == 400 and body["field"] == "limit"


async def test_incident_comes_with_its_ledger_and_unknown_is_404(harness: Harness) -> None:
    status, body = await _call(harness, "GET", "/api/v1/incidents/1")
    assert status == 200 and body["ledger"] == [{"rung": "restart"}]
    status, body = await _call(harness, "GET", "/api/v1/incidents/99")
    assert status == 404 and body["field"] == "id"
    status, body = await _call(harness, "GET", "/api/v1/incidents/abc")
    assert status == 400


async def test_signatures_and_stats_come_from_the_engine(harness: Harness) -> None:
    status, body = await _call(harness, "GET", "/api/v1/signatures")
    assert status == 200 and body["signatures"][0]["fault_class"] == "xid_app"
    status, body = await _call(harness, "GET", "/api/v1/stats")
    assert status == 200 and body["handled_without_human_ratio"] == 0.5
