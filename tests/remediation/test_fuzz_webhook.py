"""Property-based fuzz of POST /api/v1/alerts: no 5xx for any body, nothing recorded when rejected."""

from __future__ import annotations

import asyncio
import copy
import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remediation.server import RunningService
from tests.fakes.intake import TOKEN, count_rows, load_fixture, make_settings, notification, start_harness


class ServiceThread:
    """The real service on its own event loop thread, so hypothesis can drive it synchronously."""

    def __init__(self, tmp: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        # the queue limit is far above what the fuzz can fill: 503 is not under test here
        self.harness = self._run(start_harness(make_settings(tmp, queue_max_pending=1_000_000)))
        self.service: RunningService = self.harness.service

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def post(self, body: bytes, token: str = TOKEN) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.service.port, timeout=10)
        try:
            conn.request(
                "POST",
                "/api/v1/alerts",
                body=body,
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            return conn.getresponse().status
        finally:
            conn.close()

    def close(self) -> None:
        self._run(self.harness.session.close())
        self._run(self.service.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceThread]:
    s = ServiceThread(tmp_path_factory.mktemp("fuzz"))
    yield s
    s.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
BASES = [load_fixture("firing.json"), load_fixture("firing-group.json"), notification()]
PATHS = [
    ("version",),
    ("status",),
    ("receiver",),
    ("groupKey",),
    ("alerts",),
    ("alerts", 0),
    ("alerts", 0, "status"),
    ("alerts", 0, "labels"),
    ("alerts", 0, "annotations"),
    ("alerts", 0, "startsAt"),
    ("alerts", 0, "endsAt"),
    ("alerts", 0, "fingerprint"),
    ("alerts", 0, "generatorURL"),
    ("alerts", 0, "labels", "alertname"),
]


@st.composite
def mutated_payloads(draw: st.DrawFn) -> bytes:
    """A recorded/valid payload with one field replaced by arbitrary JSON or removed."""
    doc: dict[str, Any] = copy.deepcopy(draw(st.sampled_from(BASES)))
    path = draw(st.sampled_from(PATHS))
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    if draw(st.booleans()):
        target[path[-1]] = draw(json_values)
    elif isinstance(target, dict):
        target.pop(path[-1], None)
    # vary the fingerprint so accepted mutations are new rows, not duplicates
    if isinstance(doc.get("alerts"), list) and doc["alerts"] and isinstance(doc["alerts"][0], dict):
        if path != ("alerts", 0, "fingerprint"):
            doc["alerts"][0]["fingerprint"] = draw(st.text("0123456789abcdef", min_size=16, max_size=16))
    return json.dumps(doc).encode()


bodies = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    mutated_payloads(),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies)
def test_no_body_causes_a_5xx_and_rejected_bodies_record_nothing(service: ServiceThread, body: bytes) -> None:
    before = count_rows(service.service.ctl.settings.inbox_path)
    status = service.post(body)
    assert status < 500, body
    assert status in (200, 400, 413), (status, body)
    after = count_rows(service.service.ctl.settings.inbox_path)
    if status != 200:
        assert after == before, body


@settings(max_examples=30, deadline=None)
# visible ASCII: what an HTTP header value can carry (aiohttp's parser refuses control characters itself)
@given(body=bodies, token=st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=40))
def test_without_the_token_nothing_is_ever_recorded(service: ServiceThread, body: bytes, token: str) -> None:
    if token == TOKEN:
        token += "x"
    before = count_rows(service.service.ctl.settings.inbox_path)
    assert service.post(body, token=token) == 401
    assert count_rows(service.service.ctl.settings.inbox_path) == before
