"""HTTP/1.1 as RFC 9112 frames it, against raw servers that bend it the ways real ones do (issue 37).

Each case failed on the stream parser that came before h11: a 1xx failed the scrape, bytes after a
response became the next answer (a smuggled value exported), a 408 written on an idle connection
became the next scrape's answer, a Unicode digit in Content-Length raised out of the client, a folded
header failed the scrape, and a keep-alive 204 was read until the server closed.
"""

from __future__ import annotations

import asyncio

import pytest

from exporter.engines.detect import PREFIXES, WANTED
from exporter.errors import HttpError, ScrapeError
from exporter.exposition.fetch import fetch_page
from exporter.exposition.parse import ExpositionParser
from exporter.wire.http1 import HttpClient
from tests.wire.conftest import Handler, Start


def page(value: int) -> bytes:
    return b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} %d\n' % value


def ok(body: bytes, *headers: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n%s" % (
        b"".join(h + b"\r\n" for h in headers),
        len(body),
        body,
    )


PAGE = page(1)


def answers(*parts: bytes) -> Handler:
    """Each request on a connection gets the next of `parts`; then the connection is held open."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for part in parts:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(part)
            await writer.drain()
        await reader.read()

    return handler


async def scrape(client: HttpClient, url: str) -> list[float]:
    expo = await fetch_page(client, url, 2.0, 1 << 20, ExpositionParser(WANTED, None, PREFIXES, {}))
    return [smp.value for smp in expo.gauge("vllm:num_requests_running")]


async def body_of(client: HttpClient, url: str, method: str = "GET") -> tuple[int, bytes, dict[str, str]]:
    async with asyncio.timeout(2.0):  # a body read until close would hang here
        async with client.request(method, url, {}) as resp:
            data = b"".join([c async for c in resp.chunks()])
            assert resp.done
            return resp.status, data, resp.headers


async def test_1xx_answers_before_the_final_one_are_skipped_and_the_connection_kept(
    raw_server: Start,
) -> None:
    interim = (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
    )
    url = await raw_server(answers(interim + ok(page(1)), interim + ok(page(2))))
    client = HttpClient()
    try:
        assert await scrape(client, url) == [1.0]
        assert await scrape(client, url) == [2.0]
    finally:
        await client.close()
    assert client.connections_opened == 1


async def test_bytes_after_a_complete_response_are_never_read_as_the_next_answer(raw_server: Start) -> None:
    smuggled = ok(page(666))
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        await reader.readuntil(b"\r\n\r\n")
        if len(connections) == 1:
            writer.write(ok(page(1)) + smuggled)  # one answer, then a second nobody asked for
        else:
            writer.write(ok(page(2)))
        await writer.drain()
        await reader.read()

    url = await raw_server(handler)
    client = HttpClient()
    try:
        assert await scrape(client, url) == [1.0]
        assert await scrape(client, url) == [2.0]  # not 666: that connection was closed
    finally:
        await client.close()
    assert client.connections_opened == 2 and len(connections) == 2


async def test_a_408_written_on_an_idle_connection_is_not_the_next_scrapes_answer(raw_server: Start) -> None:
    # nginx, uvicorn and Go's server write "408 Request Timeout" and close a connection they gave up on
    gave_up = asyncio.Event()
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(ok(page(len(connections))))
        await writer.drain()
        if len(connections) == 1:
            writer.write(b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            writer.close()
            await writer.wait_closed()
            gave_up.set()
            return
        await reader.read()

    url = await raw_server(handler)
    client = HttpClient()
    try:
        assert await scrape(client, url) == [1.0]
        await gave_up.wait()
        assert await scrape(client, url) == [2.0]
    finally:
        await client.close()
    assert client.connections_opened == 2


async def test_bytes_on_an_idle_connection_that_stays_open_drop_it(raw_server: Start) -> None:
    wrote = asyncio.Event()
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(ok(page(len(connections))))
        await writer.drain()
        if len(connections) == 1:
            await wrote.wait()
            writer.write(ok(page(666)))  # unasked, on an idle connection it keeps open
            await writer.drain()
        await reader.read()

    url = await raw_server(handler)
    client = HttpClient()
    try:
        assert await scrape(client, url) == [1.0]
        (idle,) = client._idle.values()
        wrote.set()
        await idle.wire.readable()  # the unasked bytes reached the client
        assert await scrape(client, url) == [2.0]
    finally:
        await client.close()
    assert client.connections_opened == 2


async def test_a_408_crossing_a_request_on_a_kept_connection_is_asked_again_on_a_fresh_one(
    raw_server: Start,
) -> None:
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(ok(page(len(connections))))
        await writer.drain()
        if len(connections) == 1:  # it gave up just as our next request came
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return
        await reader.read()

    url = await raw_server(handler)
    client = HttpClient()
    try:
        assert await scrape(client, url) == [1.0]
        assert await scrape(client, url) == [2.0]
    finally:
        await client.close()
    assert client.connections_opened == 2


@pytest.mark.parametrize(
    "length",
    ["١٢".encode(), b"\xb2", "\uff11\uff12".encode(), b"+12", b"1 2", b"12, 13"],
    ids=["arabic-indic", "superscript two in latin-1", "fullwidth", "sign", "space", "two that differ"],
)
async def test_a_content_length_that_is_not_ascii_digits_is_a_clean_protocol_error(
    length: bytes, raw_server: Start
) -> None:
    url = await raw_server(answers(b"HTTP/1.1 200 OK\r\nContent-Length: %s\r\n\r\n%s" % (length, PAGE)))
    client = HttpClient()
    try:
        with pytest.raises(ScrapeError) as err:
            await scrape(client, url)
    finally:
        await client.close()
    assert err.value.reason == "network"
    assert "Content-Length" in str(err.value)
    assert isinstance(err.value.__cause__, HttpError)
    assert not client._idle


async def test_an_obs_folded_header_is_joined_to_the_one_before_it(raw_server: Start) -> None:
    # RFC 9112 5.2: a user agent replaces each obs-fold with a space before reading the value
    folded = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain;\r\n\tversion=0.0.4\r\nX-Long: one\r\n  two\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE)
    )
    url = await raw_server(answers(folded, ok(page(2))))
    client = HttpClient()
    try:
        status, body, headers = await body_of(client, url)
        assert (status, body) == (200, PAGE)
        assert headers["content-type"] == "text/plain; version=0.0.4"
        assert headers["x-long"] == "one two"
        assert await scrape(client, url) == [2.0]
    finally:
        await client.close()
    assert client.connections_opened == 1


async def test_a_keep_alive_204_304_or_head_answer_has_no_body_and_the_connection_goes_on(
    raw_server: Start,
) -> None:
    url = await raw_server(
        answers(
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b'HTTP/1.1 304 Not Modified\r\nETag: "x"\r\n\r\n',
            b"HTTP/1.1 200 OK\r\nContent-Length: 12345\r\n\r\n",  # the length a GET would have had
            ok(PAGE),
        )
    )
    client = HttpClient()
    try:
        assert (await body_of(client, url))[:2] == (204, b"")
        assert (await body_of(client, url))[:2] == (304, b"")
        assert (await body_of(client, url, "HEAD"))[:2] == (200, b"")
        assert await scrape(client, url) == [1.0]
    finally:
        await client.close()
    assert client.connections_opened == 1
