"""Limits on reading a request: a deadline for the head and one for the body, the body's size before
and after decompression, and which encodings and content types are read at all.

aiohttp has no deadline for a request head (a client that sends one header byte a second holds a
connection forever) and inflates `Content-Encoding: gzip` bodies while it parses them, before any
handler or authentication runs. So the service turns aiohttp's decompression off, inflates only after
authentication and only up to the body limit, and serves through `DeadlineSite`, which closes a
connection whose request head is not complete within the deadline.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import zlib
from collections.abc import Awaitable, Callable

from aiohttp import web

from remediation.errors import BodyRefused

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_TIMEOUT_REPLY = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
# wbits for zlib: 16 + 15 reads the gzip container, 15 the zlib container HTTP calls "deflate"
_WBITS = {"gzip": 31, "x-gzip": 31, "deflate": 15}
_CHUNK_BYTES = 64 * 1024


class _HeadDeadline(asyncio.Protocol):
    """Wraps aiohttp's protocol for one connection; closes it when a request head is not complete
    within the deadline, counted from the first byte of that head."""

    def __init__(self, inner: asyncio.Protocol, timeout_seconds: float) -> None:
        self._inner = inner
        self._timeout_seconds = timeout_seconds
        self._timer: asyncio.TimerHandle | None = None
        self._in_request = False
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._in_request and self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._timeout_seconds, self._expire)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def head_received(self) -> None:
        """The handler runs: the head arrived in time (the body has its own deadline)."""
        self._cancel()
        self._in_request = True

    def request_done(self) -> None:
        """The handler returned; the next bytes start the next request's head."""
        self._in_request = False

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        peer = transport.get_extra_info("peername")
        log.info("closing connection from %s: request head late (%.0f s)", peer, self._timeout_seconds)
        transport.write(_TIMEOUT_REPLY)
        transport.close()


class DeadlineSite(web.BaseSite):
    """A TCP site (optionally TLS) whose connections must send each request head within a deadline."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        header_timeout_seconds: float,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host = host
        self._port = port
        self._header_timeout_seconds = header_timeout_seconds

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        """Listen; every accepted connection gets the head deadline around aiohttp's protocol."""
        await super().start()
        server = self._runner.server
        assert server is not None
        timeout = self._header_timeout_seconds
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _HeadDeadline(server(), timeout),
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
        )


@web.middleware
async def head_deadline_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """First middleware: tells the connection its head arrived, and when the request is done."""
    transport = request.transport
    proto = transport.get_protocol() if transport is not None else None
    if not isinstance(proto, _HeadDeadline):
        return await handler(request)
    proto.head_received()
    try:
        return await handler(request)
    finally:
        proto.request_done()


def check_content_type(request: web.Request) -> None:
    """Only JSON is read: Alertmanager always sends `Content-Type: application/json`."""
    if request.content_type != "application/json":
        got = request.headers.get("Content-Type", "")
        raise BodyRefused(415, "Content-Type", f"must be application/json, got {got!r}")


def content_coding(request: web.Request) -> str:
    """The one content coding of the body ('identity', 'gzip' or 'deflate'), else 415."""
    raw = request.headers.get("Content-Encoding", "").strip().lower()
    if raw in ("", "identity"):
        return "identity"
    if raw in _WBITS:
        return raw
    raise BodyRefused(415, "Content-Encoding", f"unsupported coding {raw!r} (gzip, deflate, identity)")


async def read_body(request: web.Request, limit_bytes: int, timeout_seconds: float) -> bytes:
    """The raw body, at most limit_bytes, read within the deadline; 413 or 408 otherwise."""
    if request.content_length is not None and request.content_length > limit_bytes:
        raise BodyRefused(413, "body", f"body larger than {limit_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_seconds):
            while True:
                chunk = await request.content.read(_CHUNK_BYTES)
                if not chunk:
                    break
                size += len(chunk)
                if size > limit_bytes:
                    raise BodyRefused(413, "body", f"body larger than {limit_bytes} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise BodyRefused(408, "body", f"body not received within {timeout_seconds:.0f} s") from None
    return b"".join(chunks)


def decode_body(body: bytes, coding: str, limit_bytes: int) -> bytes:
    """Inflate a gzip/deflate body, stopping as soon as the output passes limit_bytes (413)."""
    if coding == "identity":
        return body
    out: list[bytes] = []
    size = 0
    data = body
    try:
        while True:  # gzip allows several members back to back
            inflater = zlib.decompressobj(_WBITS[coding])
            while data:
                piece = inflater.decompress(data, limit_bytes + 1 - size)
                size += len(piece)
                out.append(piece)
                if size > limit_bytes:
                    raise BodyRefused(413, "body", f"decompressed body larger than {limit_bytes} bytes")
                data = inflater.unconsumed_tail
                if inflater.eof:
                    break
            if not inflater.eof:
                raise BodyRefused(400, "body", f"truncated {coding} data")
            data = inflater.unused_data
            if not data or coding == "deflate":
                break
    except zlib.error as e:
        raise BodyRefused(400, "body", f"body is not valid {coding} data ({e})") from e
    if data:
        raise BodyRefused(400, "body", f"trailing bytes after the {coding} data")
    return b"".join(out)
