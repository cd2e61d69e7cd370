"""Property-based fuzz of POST /api/v1/alerts from recorded Alertmanager payloads: no 5xx for any body,
timestamp, content type or encoding, and nothing recorded when a request is refused."""

from __future__ import annotations

import asyncio
import copy
import gzip
import http.client
import json
import threading
import zlib
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

    def post(self, body: bytes, token: str = TOKEN, headers: dict[str, str] | None = None) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.service.port, timeout=10)
        hdrs = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", **(headers or {})}
        try:
            conn.request("POST", "/api/v1/alerts", body=body, headers={k: v for k, v in hdrs.items() if v})
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


# RFC 3339 look-alikes around the edges: the first and last instants of years 1 and 9999 with offsets
# that push them out of range in UTC (the timestamps intake overflowed on), impossible dates,
# offsets up to ±24 h, 0 to 12 fraction digits
zones = st.sampled_from(
    ["Z", "z", "+00:00", "-00:00", "+05:30", "-05:30", "+14:00", "-14:00", "+23:59", "-23:59", "+24:00", ""]
)
timestamps = st.one_of(
    st.builds(lambda hh, z: f"0001-01-01T{hh:02d}:00:00{z}", st.integers(0, 23), zones),
    st.builds(lambda hh, z: f"9999-12-31T{hh:02d}:59:59.999999999{z}", st.integers(0, 23), zones),
    st.builds(
        lambda y, mo, d, h, mi, s, frac, zone: f"{y}-{mo}-{d}T{h}:{mi}:{s}{frac}{zone}",
        st.sampled_from(["0001", "0002", "1970", "2026", "9998", "9999"]),
        st.sampled_from(["00", "01", "02", "12", "13"]),
        st.sampled_from(["00", "01", "28", "29", "31", "32"]),
        st.sampled_from(["00", "03", "23", "24"]),
        st.sampled_from(["00", "59", "60"]),
        st.sampled_from(["00", "59", "60"]),
        st.sampled_from(["", ".", ".5", ".886825742", ".123456789012"]),
        zones,
    ),
)


@st.composite
def payloads_with_timestamps(draw: st.DrawFn) -> bytes:
    """A recorded payload whose startsAt and/or endsAt are edge-case timestamps."""
    doc: dict[str, Any] = copy.deepcopy(draw(st.sampled_from(BASES)))
    for a in doc["alerts"]:
        a["fingerprint"] = draw(st.text("0123456789abcdef", min_size=16, max_size=16))
        for key in ("startsAt", "endsAt"):
            if draw(st.booleans()):
                a[key] = draw(timestamps)
    return json.dumps(doc).encode()


def _gzip_plain(raw: bytes) -> bytes:
    return raw  # labelled gzip, sent plain


ENCODINGS: dict[str, Any] = {
    "": lambda raw: raw,
    "identity": lambda raw: raw,
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "gzip ": _gzip_plain,
    "br": lambda raw: raw,
    "gzip, gzip": lambda raw: gzip.compress(gzip.compress(raw)),
}


@st.composite
def encoded_requests(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """A body, a content coding (honest, lying or unknown) and a content type."""
    raw = draw(st.one_of(mutated_payloads(), payloads_with_timestamps()))
    coding = draw(st.sampled_from(sorted(ENCODINGS)))
    body = ENCODINGS[coding](raw)
    if draw(st.integers(0, 9)) == 0:  # a damaged compressed stream now and then
        cut = draw(st.integers(0, max(0, len(body) - 1)))
        body = body[:cut] + body[cut + 1 :]
    content_type = draw(
        st.sampled_from(
            ["application/json", "application/json; charset=utf-8", "text/plain", "", "application/x-gzip"]
        )
    )
    return body, {"Content-Encoding": coding.strip(), "Content-Type": content_type}


bodies = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    mutated_payloads(),
    payloads_with_timestamps(),
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


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=encoded_requests())
def test_no_encoding_or_content_type_causes_a_5xx_and_refusals_record_nothing(
    service: ServiceThread, request: tuple[bytes, dict[str, str]]
) -> None:
    body, headers = request
    before = count_rows(service.service.ctl.settings.inbox_path)
    status = service.post(body, headers=headers)
    assert status in (200, 400, 413, 415), (status, headers, body[:200])
    if status != 200:
        assert count_rows(service.service.ctl.settings.inbox_path) == before, (status, headers)


@settings(max_examples=30, deadline=None)
# visible ASCII: what an HTTP header value can carry (aiohttp's parser refuses control characters itself)
@given(body=bodies, token=st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=40))
def test_without_the_token_nothing_is_ever_recorded(service: ServiceThread, body: bytes, token: str) -> None:
    if token == TOKEN:
        token += "x"
    before = count_rows(service.service.ctl.settings.inbox_path)
    assert service.post(body, token=token) == 401
    assert count_rows(service.service.ctl.settings.inbox_path) == before
