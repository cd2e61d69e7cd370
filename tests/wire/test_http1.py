"""The engine scrape client (exporter/wire/http1.py) against real aiohttp servers and hostile raw ones."""

from __future__ import annotations

import asyncio
import gzip
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from exporter.engines.detect import PREFIXES, WANTED
from exporter.errors import HttpError, ScrapeError
from exporter.exposition.fetch import fetch_page
from exporter.exposition.parse import ExpositionParser
from exporter.wire.http1 import HttpClient
from tests.engines.conftest import free_port, load_fixture
from tests.fakes.helm_api import make_certificate
from tests.wire.conftest import Handler, Start

PAGE = load_fixture("vllm-0.33.0").encode()


class Peers:
    """Connections an aiohttp server has seen, by the client's port."""

    def __init__(self) -> None:
        self.ports: set[int] = set()

    def note(self, request: web.Request) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer:
            self.ports.add(int(peer[1]))


@pytest.fixture
async def aio_server() -> AsyncIterator[tuple[str, Peers]]:
    peers = Peers()

    async def plain(request: web.Request) -> web.Response:
        peers.note(request)
        return web.Response(body=PAGE, content_type="text/plain")

    async def chunked(request: web.Request) -> web.StreamResponse:
        peers.note(request)
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for start in range(0, len(PAGE), 777):
            await resp.write(PAGE[start : start + 777])
        await resp.write_eof()
        return resp

    async def gzipped(request: web.Request) -> web.Response:
        peers.note(request)
        resp = web.Response(body=PAGE, content_type="text/plain")
        resp.enable_compression(force=web.ContentCoding.gzip)  # whatever the client asked for
        return resp

    async def not_found(request: web.Request) -> web.Response:
        peers.note(request)
        return web.Response(status=404, text="no such page")

    app = web.Application()
    app.router.add_get("/metrics", plain)
    app.router.add_get("/chunked", chunked)
    app.router.add_get("/gzip", gzipped)
    app.router.add_get("/missing", not_found)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", peers
    finally:
        await runner.cleanup()


async def _body(client: HttpClient, url: str) -> bytes:
    async with client.get(url, {}) as resp:
        assert resp.status == 200
        return b"".join([c async for c in resp.chunks()])


async def test_keep_alive_reuses_one_connection_for_plain_chunked_and_gzip_pages(
    aio_server: tuple[str, Peers],
) -> None:
    base, peers = aio_server
    client = HttpClient()
    try:
        for path in ("/metrics", "/chunked", "/gzip", "/metrics", "/chunked", "/gzip"):
            assert await _body(client, base + path) == PAGE
    finally:
        await client.close()
    assert client.connections_opened == 1
    assert len(peers.ports) == 1


async def test_a_non_200_answer_is_http_status_and_its_connection_dropped(
    aio_server: tuple[str, Peers],
) -> None:
    base, _ = aio_server
    client = HttpClient()
    parser = ExpositionParser(WANTED, None, PREFIXES, {})
    try:
        with pytest.raises(ScrapeError) as err:
            await fetch_page(client, base + "/missing", 2.0, 1 << 20, parser)
        assert err.value.reason == "http_status"
        assert await _body(client, base + "/metrics") == PAGE
    finally:
        await client.close()
    assert client.connections_opened == 2


async def test_nothing_listening_is_refused() -> None:
    client = HttpClient()
    parser = ExpositionParser(WANTED, None, PREFIXES, {})
    with pytest.raises(ScrapeError) as err:
        await fetch_page(client, f"http://127.0.0.1:{free_port()}/metrics", 2.0, 1 << 20, parser)
    assert err.value.reason == "refused"


def _answer(*parts: bytes) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        for part in parts:
            writer.write(part)
            await writer.drain()

    return handler


HOSTILE = {
    "status line of garbage": (_answer(b"HTTP/1.1 2OO OK\r\n\r\n"), "illegal status line"),
    "not HTTP at all": (
        _answer(os.urandom(2000).replace(b"\r\n\r\n", b"") + b"\r\n\r\n"),
        "illegal status line",
    ),
    "header without a colon": (
        _answer(b"HTTP/1.1 200 OK\r\nContent-Length 5\r\n\r\nhello"),
        "illegal header line",
    ),
    # obs-fold with no header before it (one after a header is joined to it, see below)
    "folded first header": (
        _answer(b"HTTP/1.1 200 OK\r\n X-Folded: yes\r\n\r\n"),
        "continuation line at start of headers",
    ),
    "head over the bound": (
        _answer(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"),
        "longer than",
    ),
    "body short of its length": (
        _answer(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n# TYPE x gauge\nx 1\n"),
        "without sending complete message body (received 19 bytes, expected 1000)",
    ),
    "bad Content-Length": (
        _answer(b"HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\n"),
        "bad Content-Length",
    ),
    "chunk size not hex": (
        _answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
        "illegal chunk header",
    ),
    "chunk longer than said": (
        _answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcdef\r\n0\r\n\r\n"),
        "malformed chunk footer",
    ),
    "chunked body cut off": (
        _answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n# TYPE x gauge\n"),
        "incomplete chunked read",
    ),
    "gzip that is not": (
        _answer(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 9\r\n\r\nnot gzip!"),
        "undecodable",
    ),
    "gzip cut short": (
        _answer(
            b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 40\r\n\r\n"
            + gzip.compress(PAGE)[:40]
        ),
        "before its end marker",
    ),
    "unknown encoding": (
        _answer(b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\n\r\n"),
        "unsupported Content-Encoding",
    ),
    "closed without a word": (_answer(), "closed before any response"),
    "closed inside the head": (
        _answer(b"HTTP/1.1 200 OK\r\nContent-Le"),
        "peer unexpectedly closed connection",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
async def test_a_broken_answer_is_a_clear_network_error(
    case: str, raw_server: Start
) -> None:
    handler, message = HOSTILE[case]
    url = await raw_server(handler)
    client = HttpClient()
    parser = ExpositionParser(WANTED, None, PREFIXES, {})
    try:
        with pytest.raises(ScrapeError) as err:
            await fetch_page(client, url, 2.0, 1 << 20, parser)
    finally:
        await client.close()
    assert err.value.reason == "network"
    assert message in str(err.value)
    assert isinstance(err.value.__cause__, HttpError)
    assert not client._idle  # a connection that broke HTTP is never used again


async def test_a_hung_or_dripping_server_is_cut_at_the_deadline(
    raw_server: Start,
) -> None:
    async def drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while True:
            writer.write(b"1\r\n#\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # reads the request, never answers

    client = HttpClient()
    try:
        for handler in (drip, hang):
            url = await raw_server(handler)
            parser = ExpositionParser(WANTED, None, PREFIXES, {})
            with pytest.raises(ScrapeError) as err:
                await fetch_page(client, url, 0.3, 1 << 20, parser)
            assert err.value.reason == "timeout"
    finally:
        await client.close()
    assert not client._idle


async def test_a_gzip_bomb_is_cut_at_the_byte_cap(raw_server: Start) -> None:
    # 64 MiB of one repeated line in about 100 KiB of gzip: inflated a bounded piece at a time and
    # cut at max_bytes, never held whole.
    page = b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 1\n'
    bomb = gzip.compress(page + b"# TYPE filler gauge\n" + b"# filler\n" * ((64 << 20) // 9), compresslevel=9)
    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(bomb)
    url = await raw_server(_answer(head, bomb))
    client = HttpClient()
    parser = ExpositionParser(WANTED, None, PREFIXES, {})
    try:
        expo = await fetch_page(client, url, 5.0, 1 << 20, parser)
    finally:
        await client.close()
    assert expo.truncated == "too_large"
    assert [smp.value for smp in expo.gauge("vllm:num_requests_running")] == [1.0]


async def test_a_connection_the_server_closed_while_idle_is_replaced_without_an_error(
    raw_server: Start,
) -> None:
    # uvicorn (vLLM, SGLang) closes an idle keep-alive connection after 5 s, the engines interval:
    # the next GET may find it closed; it goes out once more on a fresh connection.
    answered: list[int] = []

    async def one_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        answered.append(1)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE))
        await writer.drain()
        # keeps the connection open until the client's next request, then closes without answering
        await reader.read(1)

    url = await raw_server(one_then_close)
    client = HttpClient()
    try:
        assert await _body(client, url) == PAGE
        assert await _body(client, url) == PAGE
    finally:
        await client.close()
    assert client.connections_opened == 2 and len(answered) == 2


async def test_idle_connections_of_gone_endpoints_are_closed(aio_server: tuple[str, Peers]) -> None:
    base, _ = aio_server
    client = HttpClient()
    try:
        await _body(client, base + "/metrics")
        client.retain([base + "/other"])  # the same host and port: kept
        assert len(client._idle) == 1
        client.retain(["http://127.0.0.1:1/metrics", "not a url"])
        assert not client._idle
    finally:
        await client.close()


async def test_a_url_that_is_not_http_is_refused_clearly() -> None:
    client = HttpClient()
    with pytest.raises(HttpError, match="not an http"):
        async with client.get("ftp://127.0.0.1/metrics", {}):
            pass


async def test_https_verifies_the_certificate_and_keeps_the_connection(tmp_path: Path) -> None:
    cert, key = make_certificate(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def plain(request: web.Request) -> web.Response:
        return web.Response(body=PAGE, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", plain)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    url = f"https://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/metrics"  # type: ignore[union-attr]
    try:
        untrusting = HttpClient()  # the system's CAs: a self-signed server is refused, as aiohttp did
        with pytest.raises(ScrapeError) as err:
            await fetch_page(untrusting, url, 5.0, 1 << 20, ExpositionParser(WANTED, None, PREFIXES, {}))
        assert err.value.reason == "refused" and "CERTIFICATE_VERIFY_FAILED" in str(err.value)
        trusting = HttpClient(ssl_context=ssl.create_default_context(cafile=str(cert)))
        try:
            for _ in range(2):
                assert await _body(trusting, url) == PAGE
        finally:
            await trusting.close()
        assert trusting.connections_opened == 1
    finally:
        await runner.cleanup()


async def test_a_url_with_spaces_or_non_ascii_is_sent_percent_encoded(
    raw_server: Start,
) -> None:
    seen: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE))
        await writer.drain()

    url = (await raw_server(record)).replace("/metrics", "/métrics ä?q=1 2")
    client = HttpClient()
    try:
        assert await _body(client, url) == PAGE
        with pytest.raises(HttpError, match="line break"):
            async with client.get(url, {"X-Bad": "a\r\nInjected: 1"}):
                pass
    finally:
        await client.close()
    assert seen[0].startswith(b"GET /m%C3%A9trics%20%C3%A4?q=1%202 HTTP/1.1\r\n")


async def test_each_get_sends_the_headers_it_was_given_and_a_bad_url_fails_every_time() -> None:
    # requests are made once per URL and headers and kept: a GET with other headers, or another
    # user agent, must not be sent as the first one was
    seen: list[dict[str, str]] = []

    async def echo(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.Response(body=PAGE, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/metrics"  # type: ignore[union-attr]
    client = HttpClient()
    try:
        for headers in ({"Accept": "a"}, {"Accept": "b"}, {"Accept": "a", "X-Extra": "1"}, {"Accept": "a"}):
            async with client.get(url, headers) as resp:
                b"".join([c async for c in resp.chunks()])
        client.user_agent = "other-agent"
        async with client.get(url, {"Accept": "a"}) as resp:
            b"".join([c async for c in resp.chunks()])
        for _ in range(2):
            with pytest.raises(HttpError, match="bad port"):
                async with client.get("http://127.0.0.1:99999/metrics", {}):
                    pass
            with pytest.raises(HttpError, match="line break"):
                async with client.get(url, {"X-Bad": "a\r\nInjected: 1"}):
                    pass
    finally:
        await client.close()
        await runner.cleanup()
    assert [h.get("Accept") for h in seen] == ["a", "b", "a", "a", "a"]
    assert [h.get("X-Extra") for h in seen] == [None, None, "1", None, None]
    assert [h["User-Agent"] for h in seen] == ["gpupulse-exporter"] * 4 + ["other-agent"]
    assert client.connections_opened == 1
