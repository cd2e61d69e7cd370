"""HTTP/1.1 GETs of engine pages, framed by h11, with one idle keep-alive connection per endpoint.

Why h11 and not aiohttp's client: an engines round is a handful of small GETs, and aiohttp's request
and response machinery cost about twice a bare GET (docs/benchmarks.md, 2026-12-02); h11 is a pure
Python RFC 9112 parser of about 0.4 MiB that does no I/O. This module adds only what a scrape needs
around it: GET (and HEAD), no redirects, proxies or cookies; gzip or deflate when the server sends
it; one idle connection kept per (scheme, host, port). How the edge cases go:

* 1xx answers (100 Continue, 103 Early Hints) before the final one are skipped.
* a 204, a 304 or the answer to a HEAD has no body, whatever its headers say, so a kept
  connection is not read until it closes.
* bytes after a complete response are never read as the next one: the connection is closed.
* bytes or an end on an idle kept connection (a 408 the server wrote when it gave up on us, its
  keep-alive timeout): the connection is dropped before use and the GET goes out on a fresh one; a
  408 that crossed our request on a kept connection is asked again once on a fresh one too.
* obs-fold (a header line starting with a space): the line is joined to the header before it, as
  RFC 9112 5.2 tells a user agent to do; a continuation line with no header before it is an error.
* Content-Length other than ASCII digits, or two that differ, is a protocol error.

Bounds: the response head (status line and headers, 1xx answers included) is at most
MAX_HEAD_BYTES, and h11 holds no more than that of a chunk-size line; the caller bounds the body
and the time. Any protocol breach is an HttpError
(exporter/errors.py) naming it; the connection it came on is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import zlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import cast
from urllib.parse import quote, urlsplit

import h11

from exporter.errors import HttpConnectError, HttpError

MAX_HEAD_BYTES = 64 * 1024  # status line and headers together
_READ_BYTES = 64 * 1024  # the socket is paused while this much waits unread
_MAX_INTERIM = 16  # 1xx answers skipped before the final one
_URL_SAFE = "".join(chr(c) for c in range(0x21, 0x7F))  # printable ASCII but the space
_MEMO_MAX = 1024  # requests and connection keys kept per client (endpoints come and go)
_TIMED_OUT = 408
_MAX_REASON = 200  # characters of h11's message kept
Key = tuple[str, str, int]  # (scheme, host, port)
_Event = (
    h11.InformationalResponse
    | h11.Response
    | h11.Data
    | h11.EndOfMessage
    | h11.ConnectionClosed
    | h11.Request
)


class _Wire(asyncio.Protocol):
    """The socket's bytes as they arrive, held for the reader; what came while no one read shows."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._eof = False
        self._error: OSError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if len(self._buffer) > _READ_BYTES and not self._paused and self.transport is not None:
            self.transport.pause_reading()  # a fast server waits for the parser, not the heap
            self._paused = True
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # the transport closes itself: no half-open connections are kept

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        if isinstance(exc, OSError):
            self._error = exc
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def readable(self) -> None:
        """Return once a byte or the end has come."""
        while not self._buffer and not self._eof:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def read(self) -> bytes:
        """What has come so far, at least one byte; b"" at the end. OSError when the connection broke."""
        await self.readable()
        data = bytes(self._buffer)
        self._buffer.clear()
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        if not data and self._error is not None:
            raise self._error
        return data

    def stale(self) -> bool:
        """Bytes or an end came while the connection sat idle, or it is closing: not to be used."""
        return bool(self._buffer) or self._eof or self.transport is None or self.transport.is_closing()

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


@dataclass
class _Connection:
    wire: _Wire
    h11: h11.Connection
    reused: bool = False
    received: int = 0  # bytes of the exchange under way

    async def next_event(self) -> _Event | None:
        """h11's next event, reading from the socket as it needs; None when the connection ended
        before any byte of this exchange's response came; HttpError on a breach."""
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                # h11 quotes the offending line: cut, as it ends up in logs and in the scrape's error
                raise HttpError(f"HTTP/1.1 protocol error: {str(exc)[:_MAX_REASON]}") from exc
            if event is not h11.NEED_DATA:
                if event is h11.PAUSED:  # h11 waits for start_next_cycle; never while a response is read
                    raise HttpError("the response ended where h11 expected more")
                return cast(_Event, event)
            try:
                data = await self.wire.read()
            except OSError as exc:
                if not self.received:
                    return None
                raise HttpError(f"connection lost inside the response: {exc!r}") from exc
            if not data and not self.received:
                return None
            self.received += len(data)
            self.h11.receive_data(data)

    def reusable(self) -> bool:
        """The whole response was read, both sides may go on, and nothing came after it."""
        return (
            self.h11.our_state is h11.DONE
            and self.h11.their_state is h11.DONE
            and not self.h11.trailing_data[0]
            and not self.wire.stale()
        )

    def close(self) -> None:
        self.wire.close()


@dataclass
class Response:
    """A response whose head has been read; `chunks()` yields its decoded body."""

    status: int
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    _conn: _Connection
    _decoder: zlib._Decompress | None = None
    done: bool = False  # the whole body was read and framed correctly

    async def chunks(self, max_chunk_bytes: int = _READ_BYTES) -> AsyncIterator[bytes]:
        """The body, decompressed when the server compressed it; HttpError on a broken body."""
        async for raw in self._raw():
            if self._decoder is None:
                yield raw
                continue
            try:
                # bounded output per call: a small compressed chunk cannot balloon in one step
                data = self._decoder.decompress(raw, max_chunk_bytes)
                while data:
                    yield data
                    data = self._decoder.decompress(self._decoder.unconsumed_tail, max_chunk_bytes)
            except zlib.error as exc:
                raise HttpError(f"undecodable {self.headers.get('content-encoding')} body: {exc}") from exc
        if self._decoder is not None and not self._decoder.eof:
            raise HttpError("compressed body ends before its end marker")
        self.done = True

    async def _raw(self) -> AsyncIterator[bytes]:
        while True:
            event = await self._conn.next_event()
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return
            else:
                raise HttpError(f"unexpected {type(event).__name__} inside a response body")


class HttpClient:
    """GETs with one idle keep-alive connection per (scheme, host, port).

    https verifies the server's certificate against the system's CAs (aiohttp's default, kept), or
    against `ssl_context` when given.
    """

    def __init__(
        self, user_agent: str = "gpupulse-exporter", ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.user_agent = user_agent
        self._ssl = ssl_context
        self._idle: dict[Key, _Connection] = {}
        self.connections_opened = 0  # for tests and the bench: keep-alive at work
        self._requests: dict[tuple[object, ...], tuple[Key, h11.Request]] = {}
        self._places: dict[str, Key] = {}  # URL -> connection key, for retain

    def get(self, url: str, headers: dict[str, str]) -> contextlib.AbstractAsyncContextManager[Response]:
        """GET url; the response is usable inside the block (see `request`)."""
        return self.request("GET", url, headers)

    @contextlib.asynccontextmanager
    async def request(self, method: str, url: str, headers: dict[str, str]) -> AsyncIterator[Response]:
        """`method` (GET or HEAD) url; the response is usable inside the block. The caller bounds the
        time (a timeout around the block); the connection is kept for the next request only when the
        body was read whole and nothing followed it."""
        key, request = self._request(method, url, headers)
        resp = await self._exchange(key, request)
        try:
            yield resp
        finally:
            conn = resp._conn
            if resp.done and conn.reusable() and key not in self._idle:
                conn.h11.start_next_cycle()
                conn.reused = True
                self._idle[key] = conn
            else:
                conn.close()

    async def _exchange(self, key: Key, request: h11.Request) -> Response:
        conn = self._idle.pop(key, None)
        if conn is not None and conn.wire.stale():
            conn.close()  # what an idle connection said (a 408, its end) is no answer to this GET
            conn = None
        if conn is not None:
            resp = await self._send(conn, request)
            if resp is not None and resp.status != _TIMED_OUT:
                return resp
            # the server closed it while idle, or gave up on it as our request crossed: once more
            conn.close()
        conn = await self._connect(key)
        resp = await self._send(conn, request)
        if resp is None:
            raise HttpError("connection closed before any response")
        return resp

    def _request(self, method: str, url: str, headers: dict[str, str]) -> tuple[Key, h11.Request]:
        # the same GETs every round: each URL's request is made once
        memo = (method, url, tuple(headers.items()), self.user_agent)
        found = self._requests.get(memo)
        if found is None:
            found = _request_of(method, url, headers, self.user_agent)
            if len(self._requests) >= _MEMO_MAX:
                self._requests.clear()
            self._requests[memo] = found
        return found

    def retain(self, urls: Iterable[str]) -> None:
        """Close the idle connections to any place none of these URLs points at (gone endpoints)."""
        keep = set()
        for url in urls:
            key = self._places.get(url)
            if key is None:
                with contextlib.suppress(ValueError):
                    parts = urlsplit(url)
                    port = parts.port or (443 if parts.scheme == "https" else 80)
                    key = (parts.scheme, parts.hostname or "", port)
                    if len(self._places) >= _MEMO_MAX:
                        self._places.clear()
                    self._places[url] = key
            if key is not None:
                keep.add(key)
        for key in [k for k in self._idle if k not in keep]:
            self._idle.pop(key).close()

    async def close(self) -> None:
        """Close the idle connections; the next GET opens new ones."""
        idle, self._idle = self._idle, {}
        for conn in idle.values():
            conn.close()

    async def _connect(self, key: Key) -> _Connection:
        scheme, host, port = key
        context = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        try:
            _, wire = await asyncio.get_running_loop().create_connection(_Wire, host, port, ssl=context)
        except OSError as exc:  # ssl.SSLError is one
            raise HttpConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        self.connections_opened += 1
        return _Connection(wire, h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES))

    async def _send(self, conn: _Connection, request: h11.Request) -> Response | None:
        """The response to request on conn; None when no byte of one came back on a kept connection
        (the caller decides whether to try again). Closes conn on any failure."""
        conn.received = 0
        try:
            conn.wire.write(conn.h11.send(request) + (conn.h11.send(h11.EndOfMessage()) or b""))
            for _ in range(_MAX_INTERIM + 1):
                event = await conn.next_event()
                if event is None:
                    conn.close()
                    if conn.reused:
                        return None
                    raise HttpError("connection closed before any response")
                if not isinstance(event, h11.InformationalResponse):
                    break  # 100 Continue, 103 Early Hints: not the answer, skipped
            else:
                raise HttpError(f"more than {_MAX_INTERIM} 1xx answers before the final one")
            if not isinstance(event, h11.Response):
                raise HttpError(f"unexpected {type(event).__name__} instead of a response")
            # h11 bounds a head still incomplete; one that came whole in a read is bounded here
            if conn.received - len(conn.h11.trailing_data[0]) > MAX_HEAD_BYTES:
                raise HttpError(f"response head longer than {MAX_HEAD_BYTES} bytes")
            return _response(conn, event)
        except BaseException:
            conn.close()
            raise


def _request_of(method: str, url: str, headers: dict[str, str], user_agent: str) -> tuple[Key, h11.Request]:
    """(connection key, request) of a GET or HEAD; HttpError when the URL or a header cannot be sent."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HttpError(f"not an http(s) URL: {url}")
    host = parts.hostname
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise HttpError(f"bad port in {url}") from exc
    key = (parts.scheme, host, port)
    # what a request line may not hold raw (spaces, controls, non-ASCII) is percent-encoded
    target = quote((parts.path or "/") + (f"?{parts.query}" if parts.query else ""), safe=_URL_SAFE)
    try:
        ascii_host = host if host.isascii() else host.encode("idna").decode("ascii")
        host_header = f"[{host}]" if ":" in host else ascii_host
    except UnicodeError as exc:
        raise HttpError(f"host name {host!r} cannot be sent") from exc
    if parts.port is not None:
        host_header += f":{port}"
    if any(c in v for v in headers.values() for c in "\r\n"):
        raise HttpError("a request header holds a line break")
    fields = [("Host", host_header), ("User-Agent", user_agent), *headers.items()]
    try:
        encoded = [(k.encode("ascii"), v.encode("ascii")) for k, v in fields]
        return key, h11.Request(method=method, target=target.encode("ascii"), headers=encoded)
    except UnicodeEncodeError as exc:
        raise HttpError(f"a request header is not ASCII: {exc}") from exc
    except h11.LocalProtocolError as exc:
        raise HttpError(f"the request cannot be sent: {exc}") from exc


def _response(conn: _Connection, event: h11.Response) -> Response:
    headers: dict[str, str] = {}
    for raw_name, raw_value in event.headers:  # h11 gives the names lower-case
        name, value = raw_name.decode("ascii"), raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    resp = Response(event.status_code, headers, conn)
    encoding = headers.get("content-encoding", "identity").lower()
    if encoding in ("gzip", "x-gzip", "deflate"):
        resp._decoder = zlib.decompressobj(32 + zlib.MAX_WBITS)  # a gzip or zlib header, told apart
    elif encoding != "identity":
        raise HttpError(f"unsupported Content-Encoding {encoding!r}")
    return resp
