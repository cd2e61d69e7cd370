"""A minimal HTTP/1.1 GET client on asyncio streams for engine pages, with keep-alive per endpoint.

Why not aiohttp's client: an engines round is a handful of small GETs, and aiohttp's request and
response machinery cost about twice a bare streams GET (docs/benchmarks.md, 2026-12-02). This
client does only what an engine scrape needs: GET, no redirects, no proxies, no cookies; bodies
sized by Content-Length, chunked, or the connection's end; gzip or deflate when the server sends it;
one idle connection kept per (scheme, host, port). Bounds: the response head (status line and
headers) is at most MAX_HEAD_BYTES, a chunk-size line is short, and the caller bounds the body. Any
protocol breach is an HttpError (exporter/errors.py) naming it; the connection it came on is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import zlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from exporter.errors import HttpConnectError, HttpError

MAX_HEAD_BYTES = 64 * 1024  # status line and headers together
_MAX_HEADERS = 100
_MAX_CHUNK_LINE = 1024  # hex size and extensions
_READ_BYTES = 64 * 1024
_STATUS = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: [^\r\n]*)?")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_URL_SAFE = "".join(chr(c) for c in range(0x21, 0x7F))  # printable ASCII but the space
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_MEMO_MAX = 1024  # requests and connection keys kept per client (endpoints come and go)


@dataclass
class Response:
    """A response whose head has been read; `chunks()` yields its decoded body."""

    status: int
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    _conn: _Connection
    _framing: str  # "length", "chunked" or "close"
    _length: int = 0
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
        reader = self._conn.reader
        try:
            if self._framing == "length":
                left = self._length
                while left:
                    data = await reader.read(min(left, _READ_BYTES))
                    if not data:
                        raise HttpError(f"body ends {left} bytes short of its Content-Length")
                    left -= len(data)
                    yield data
            elif self._framing == "chunked":
                async for data in _chunked(reader):
                    yield data
            else:
                while data := await reader.read(_READ_BYTES):
                    yield data
        except (ConnectionError, OSError) as exc:
            raise HttpError(f"connection lost while reading the body: {exc!r}") from exc


async def _chunked(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while True:
        line = await _line(reader, _MAX_CHUNK_LINE, "chunk size line")
        size_text = line.split(b";", 1)[0].strip()
        if _HEX.fullmatch(size_text) is None:
            raise HttpError(f"malformed chunk size {size_text[:40]!r}")
        size = int(size_text, 16)
        if size == 0:
            break
        left = size
        while left:
            data = await reader.read(min(left, _READ_BYTES))
            if not data:
                raise HttpError("body ends inside a chunk")
            left -= len(data)
            yield data
        try:
            end = await reader.readexactly(2)
        except asyncio.IncompleteReadError as exc:
            raise HttpError("body ends inside a chunk") from exc
        if end != b"\r\n":
            raise HttpError("chunk longer than its size line says")
    for _ in range(_MAX_HEADERS):  # trailers, up to the empty line
        if await _line(reader, MAX_HEAD_BYTES, "trailer") == b"":
            return
    raise HttpError("too many trailer lines")


async def _line(reader: asyncio.StreamReader, limit: int, what: str) -> bytes:
    """One CRLF-ended line without its CRLF, at most `limit` bytes."""
    try:
        line = await reader.readuntil(b"\r\n")
    except asyncio.IncompleteReadError as exc:
        raise HttpError(f"connection closed inside a {what}") from exc
    except asyncio.LimitOverrunError as exc:
        raise HttpError(f"{what} longer than {limit} bytes") from exc
    if len(line) - 2 > limit:
        raise HttpError(f"{what} longer than {limit} bytes")
    return line[:-2]


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reused: bool = False

    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing() and not self.reader.exception()

    def close(self) -> None:
        self.writer.close()


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
        self._idle: dict[tuple[str, str, int], _Connection] = {}
        self.connections_opened = 0  # for tests and the bench: keep-alive at work
        self._requests: dict[tuple[object, ...], tuple[tuple[str, str, int], bytes]] = {}
        self._places: dict[str, tuple[str, str, int]] = {}  # URL -> connection key, for retain

    @contextlib.asynccontextmanager
    async def get(self, url: str, headers: dict[str, str]) -> AsyncIterator[Response]:
        """GET url; the response is usable inside the block. The caller bounds the time (a timeout
        around the block); the connection is kept for the next GET only when the body was read whole."""
        key, request = self._request(url, headers)
        resp = await self._exchange(key, request)
        try:
            yield resp
        finally:
            keep = resp.done and resp._framing != "close" and _keep_alive(resp)
            if keep and resp._conn.usable() and key not in self._idle:
                self._idle[key] = resp._conn
            else:
                resp._conn.close()

    async def _exchange(self, key: tuple[str, str, int], request: bytes) -> Response:
        conn = self._idle.pop(key, None)
        if conn is not None and not conn.usable():
            conn.close()
            conn = None
        if conn is not None:
            try:
                resp = await self._send(conn, request)
            except BaseException:
                conn.close()
                raise
            if resp is not None:
                return resp
            conn.close()  # the server closed it while idle (its keep-alive timeout): once more
        conn = await self._connect(key)
        try:
            resp = await self._send(conn, request)
        except BaseException:
            conn.close()
            raise
        if resp is None:
            conn.close()
            raise HttpError("connection closed before any response")
        return resp

    def _request(self, url: str, headers: dict[str, str]) -> tuple[tuple[str, str, int], bytes]:
        # the same GETs every round: each URL's request is made once
        memo = (url, tuple(headers.items()), self.user_agent)
        found = self._requests.get(memo)
        if found is None:
            found = _request_of(url, headers, self.user_agent)
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

    async def _connect(self, key: tuple[str, str, int]) -> _Connection:
        scheme, host, port = key
        context = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        try:
            reader, writer = await asyncio.open_connection(host, port, ssl=context, limit=MAX_HEAD_BYTES)
        except (OSError, ssl.SSLError) as exc:
            raise HttpConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        self.connections_opened += 1
        return _Connection(reader, writer)

    async def _send(self, conn: _Connection, request: bytes) -> Response | None:
        """The response to request on conn; None when no byte of one came back on a reused
        connection, or none at all on a fresh one (the caller decides whether to try again)."""
        fresh = not conn.reused
        conn.reused = True
        try:
            conn.writer.write(request)
            head = await conn.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                return None
            raise HttpError("connection closed inside the response head") from exc
        except asyncio.LimitOverrunError as exc:
            raise HttpError(f"response head longer than {MAX_HEAD_BYTES} bytes") from exc
        except (ConnectionError, OSError) as exc:
            if not fresh:
                return None
            raise HttpError(f"connection lost before the response: {exc!r}") from exc
        return _response(conn, head)


def _request_of(url: str, headers: dict[str, str], user_agent: str) -> tuple[tuple[str, str, int], bytes]:
    """(connection key, request bytes) of a GET; HttpError when the URL or a header cannot be sent."""
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
    lines = [f"GET {target} HTTP/1.1", f"Host: {host_header}", f"User-Agent: {user_agent}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    try:
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
    except UnicodeEncodeError as exc:
        raise HttpError(f"a request header is not ASCII: {exc}") from exc
    if any(c in v for v in headers.values() for c in "\r\n"):
        raise HttpError("a request header holds a line break")
    return key, request


def _response(conn: _Connection, head: bytes) -> Response:
    lines = head[:-4].split(b"\r\n")
    m = _STATUS.fullmatch(lines[0])
    if m is None:
        raise HttpError(f"malformed status line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    if len(lines) - 1 > _MAX_HEADERS:
        raise HttpError(f"more than {_MAX_HEADERS} response headers")
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or _TOKEN.fullmatch(name) is None:
            raise HttpError(f"malformed header line {line[:80]!r}")
        key = name.decode("ascii").lower()
        text = value.strip(b" \t").decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    resp = Response(int(m.group(2)), headers, conn, "close")
    if m.group(1) == b"0" and "keep-alive" not in headers.get("connection", "").lower():
        headers.setdefault("connection", "close")
    te = headers.get("transfer-encoding")
    if te is not None:
        if te.lower() != "chunked":
            raise HttpError(f"unsupported Transfer-Encoding {te!r}")
        resp._framing = "chunked"  # wins over a Content-Length (RFC 9112 6.3); not kept after
        if "content-length" in headers:
            headers["connection"] = "close"
    elif "content-length" in headers:
        length = headers["content-length"]
        if not length.isdigit() or len(length) > 18:
            raise HttpError(f"malformed Content-Length {length[:40]!r}")
        resp._framing, resp._length = "length", int(length)
    encoding = headers.get("content-encoding", "identity").lower()
    if encoding in ("gzip", "x-gzip", "deflate"):
        resp._decoder = zlib.decompressobj(32 + zlib.MAX_WBITS)  # a gzip or zlib header, told apart
    elif encoding != "identity":
        raise HttpError(f"unsupported Content-Encoding {encoding!r}")
    return resp


def _keep_alive(resp: Response) -> bool:
    return "close" not in resp.headers.get("connection", "").lower()
