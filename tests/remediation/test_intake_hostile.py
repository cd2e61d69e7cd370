"""Hostile webhook requests: impossible timestamps, encodings, content types, slow clients, work before
auth. Each answers a 4xx naming the field (never a 5xx, which Alertmanager retries forever) and
records nothing."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from remediation import httpguard
from tests.fakes.intake import (
    TOKEN,
    Harness,
    alert,
    count_rows,
    make_settings,
    notification,
    start_harness,
)


async def _post(h: Harness, body: bytes, **headers: str) -> tuple[int, dict[str, Any]]:
    hdrs = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    hdrs.update({k.replace("_", "-"): v for k, v in headers.items()})
    hdrs = {k: v for k, v in hdrs.items() if v != ""}
    # skip_auto_headers: aiohttp's client would otherwise add its own Content-Type
    async with h.session.post(
        f"{h.url}/api/v1/alerts", data=body, headers=hdrs, skip_auto_headers=["Content-Type"]
    ) as resp:
        return resp.status, json.loads(await resp.read() or b"{}")


def _body(**alert_fields: Any) -> bytes:
    doc = alert()
    doc.update(alert_fields)
    return json.dumps(notification([doc])).encode()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("startsAt", "9999-12-31T23:59:59-14:00"),  # past year 9999 in UTC: overflowed to a 500 before
        ("startsAt", "0001-01-01T03:00:00+05:00"),  # before year 1 in UTC
        ("startsAt", "0001-01-01T00:00:00-05:00"),  # year 1, but not Go's zero time
        ("startsAt", "0001-01-01T00:00:00Z"),  # the zero time is no start
        ("endsAt", "9999-12-31T23:59:59-14:00"),
        ("endsAt", "0001-01-01T00:00:00-14:00"),
        ("startsAt", "2026-02-30T00:00:00Z"),
        ("startsAt", "2026-11-30T00:25:25.886825742+24:00"),
    ],
)
async def test_impossible_timestamps_get_400_naming_the_field(
    harness: Harness, field: str, value: str
) -> None:
    status, body = await _post(harness, _body(**{field: value}))
    assert status == 400, body
    assert body["field"] == f"alerts[0].{field}"
    assert count_rows(harness.inbox_path) == 0


async def test_nan_and_infinity_literals_are_not_json(harness: Harness) -> None:
    for literal in ("NaN", "Infinity", "-Infinity"):
        # a lone surrogate sends the body down the standard parser, the one that knew NaN
        raw = json.dumps(notification()).replace('"truncatedAlerts": 0', f'"truncatedAlerts": {literal}')
        raw = raw.replace('"receiver": "gpupulse"', '"receiver": "gpu\\ud800"')
        status, body = await _post(harness, raw.encode())
        assert (status, body["field"]) == (400, "body"), literal
    assert count_rows(harness.inbox_path) == 0


@pytest.mark.parametrize(
    "content_type",
    ["", "text/plain", "application/x-www-form-urlencoded", "application/jsonx", "multipart/form-data"],
)
async def test_bodies_that_are_not_json_by_content_type_get_415(harness: Harness, content_type: str) -> None:
    status, body = await _post(harness, _body(), Content_Type=content_type)
    assert (status, body["field"]) == (415, "Content-Type")
    assert count_rows(harness.inbox_path) == 0


async def test_json_with_a_charset_parameter_is_accepted(harness: Harness) -> None:
    status, _ = await _post(harness, _body(), Content_Type="application/json; charset=utf-8")
    assert status == 200


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
async def test_compressed_bodies_are_inflated_and_accepted(harness: Harness, coding: str) -> None:
    raw = _body()
    packed = gzip.compress(raw) if coding == "gzip" else zlib.compress(raw)
    status, body = await _post(harness, packed, Content_Encoding=coding)
    assert (status, body.get("accepted")) == (200, 1)
    assert count_rows(harness.inbox_path) == 1


async def test_gzip_members_back_to_back_are_one_body(harness: Harness) -> None:
    raw = _body()
    packed = gzip.compress(raw[:40]) + gzip.compress(raw[40:])
    status, _ = await _post(harness, packed, Content_Encoding="gzip")
    assert status == 200


@pytest.mark.parametrize(
    ("coding", "make", "status"),
    [
        ("gzip", lambda raw: raw, 400),  # the header says gzip, the body is plain (a 500 before)
        ("gzip", lambda raw: gzip.compress(raw)[:-12], 400),  # truncated
        ("gzip", lambda raw: gzip.compress(raw) + b"junk", 400),  # trailing garbage
        ("deflate", lambda raw: gzip.compress(raw), 400),  # the wrong container
        ("gzip", lambda raw: b"", 400),
        ("br", lambda raw: raw, 415),
        ("gzip, deflate", lambda raw: raw, 415),
        ("compress", lambda raw: raw, 415),
    ],
    ids=["plain", "truncated", "trailing", "gzip-as-deflate", "empty", "br", "stacked", "compress"],
)
async def test_bad_encodings_get_a_4xx_and_record_nothing(
    harness: Harness, coding: str, make: Any, status: int
) -> None:
    got, body = await _post(harness, make(_body()), Content_Encoding=coding)
    assert got == status, body
    assert body["field"] in ("body", "Content-Encoding")
    assert count_rows(harness.inbox_path) == 0


async def test_a_gzip_bomb_stops_at_the_body_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = await start_harness(make_settings(tmp_path, max_body_bytes=64 * 1024))
    inflated: list[int] = []
    real = httpguard.zlib.decompressobj

    class Counting:
        def __init__(self, wbits: int) -> None:
            self.inner = real(wbits)

        def decompress(self, data: bytes, max_length: int = 0) -> bytes:
            out = self.inner.decompress(data, max_length)
            inflated.append(len(out))
            return out

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    monkeypatch.setattr(httpguard.zlib, "decompressobj", Counting)
    try:
        bomb = gzip.compress(b"0" * (32 * 1024 * 1024))  # 32 MiB of zeros in about 32 KiB
        assert len(bomb) < 64 * 1024
        status, body = await _post(h, bomb, Content_Encoding="gzip")
        assert (status, body["field"]) == (413, "body")
        # inflation stopped one byte past the limit instead of producing 32 MiB
        assert sum(inflated) == 64 * 1024 + 1
        assert count_rows(h.inbox_path) == 0
    finally:
        await h.session.close()
        await h.service.stop()


async def test_nothing_is_read_or_inflated_before_authentication(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    work: list[str] = []
    for name in ("read_body", "decode_body", "check_content_type"):
        real = getattr(httpguard, name)

        def spy(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            work.append(_name)
            return _real(*args, **kw)

        monkeypatch.setattr(f"remediation.server.{name}", spy)
    bomb = gzip.compress(b"0" * (8 * 1024 * 1024))
    status, _ = await _post(harness, bomb, Authorization="Bearer wrong", Content_Encoding="gzip")
    assert status == 401
    assert work == []
    # the same body with the token reaches the reader (the spies are wired where the handler looks)
    status, _ = await _post(harness, bomb, Content_Encoding="gzip")
    assert status == 413
    assert work == ["check_content_type", "read_body", "decode_body"]


async def _read_until_closed(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), 10)


async def test_a_slow_request_head_is_cut_off_with_408(tmp_path: Path) -> None:
    h = await start_harness(make_settings(tmp_path, web_read_header_timeout_seconds=0.3))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", h.service.port)
        writer.write(b"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # and never the rest
        await writer.drain()
        reply = await _read_until_closed(reader)  # returns at EOF: the server closed the connection
        assert reply.startswith(b"HTTP/1.1 408")
        writer.close()
        # the service still serves everyone else
        status, _ = await _post(h, _body())
        assert status == 200
    finally:
        await h.session.close()
        await h.service.stop()


async def test_an_idle_keepalive_connection_is_not_a_slow_head(tmp_path: Path) -> None:
    h = await start_harness(make_settings(tmp_path, web_read_header_timeout_seconds=0.2))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", h.service.port)
        request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        writer.write(request)
        await writer.drain()
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        await reader.readuntil(b'"ok"}')
        # idle for longer than the head deadline: the clock only starts with the next request's bytes
        await asyncio.sleep(0.5)
        writer.write(request)
        await writer.drain()
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 200")
        writer.close()
    finally:
        await h.session.close()
        await h.service.stop()


async def test_a_slow_body_gets_408_and_records_nothing(tmp_path: Path) -> None:
    h = await start_harness(make_settings(tmp_path, web_read_body_timeout_seconds=0.3))
    try:
        body = _body()
        reader, writer = await asyncio.open_connection("127.0.0.1", h.service.port)
        head = (
            f"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        writer.write(head + body[:20])  # the rest never comes
        await writer.drain()
        reply = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert reply.startswith(b"HTTP/1.1 408")
        length = next(
            int(x.split(b":")[1]) for x in reply.split(b"\r\n") if x.lower().startswith(b"content-length")
        )
        assert json.loads(await reader.readexactly(length))["field"] == "body"
        writer.close()
        assert count_rows(h.inbox_path) == 0
    finally:
        await h.session.close()
        await h.service.stop()


async def test_a_bad_request_never_loses_what_was_accepted(harness: Harness) -> None:
    status, _ = await _post(harness, json.dumps(notification([alert(fingerprint="kept")])).encode())
    assert status == 200
    for bad in (_body(startsAt="9999-12-31T23:59:59-14:00"), b"\x1f\x8b not gzip"):
        await _post(harness, bad, Content_Encoding="gzip")
    assert count_rows(harness.inbox_path) == 1
    await harness.engine.wait_for(lambda: len(harness.engine.handled) == 1)
