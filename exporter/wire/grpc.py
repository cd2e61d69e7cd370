"""Unary gRPC calls over HTTP/2 cleartext on a unix socket, spoken with h2 (the kubelet's List).

grpcio would do it too, but importing grpc.aio costs about 9 MiB of RSS for one call every 10 s;
h2 (pure Python, with hpack and hyperframe) costs about 1 MiB. A call follows gRPC's
"PROTOCOL-HTTP2.md": prior-knowledge HTTP/2, one POST stream whose DATA is the 5-byte framed
request, an answer of HEADERS, DATA and trailers carrying grpc-status and grpc-message. The
connection is kept between calls (a new one, its SETTINGS exchange and its first, unindexed headers
were most of a refresh's CPU). A call the server never took goes out once more on a fresh
connection within the call's deadline, as grpc-go's transparent retry does: a kept connection the
server had closed (a restarted kubelet, an idle timeout), a GOAWAY whose last stream id is below
ours, a REFUSED_STREAM reset. A GOAWAY that takes our stream with NO_ERROR (grpc-go's graceful
stop: first a notice naming 2^31-1 and a PING, then the final GOAWAY) lets the call under way
finish; the connection then takes no new call. h2 closes its whole state on a GOAWAY and refuses
every later frame, the rest of our answer too, so GOAWAY frames are read here and never given to
it. Every way a call can fail, the deadline included, raises PodResourcesError with what went
wrong; nothing else escapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from dataclasses import dataclass
from typing import NoReturn
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from exporter.errors import PodResourcesError

# google.rpc.Code, by number (grpc/doc/statuscodes.md)
_STATUS_NAMES = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
)  # fmt: skip
_PREFIX = struct.Struct(">BI")  # gRPC length-prefixed message: compressed flag, length
_READ_BYTES = 65536
_CLOSE_SECONDS = 1.0
_STREAM = 1  # the first client stream of a fresh connection
_FRAME_HEADER_BYTES = 9
_SETTINGS = 0x4  # HTTP/2 frame types
_GOAWAY = 0x7
_OVERHEAD_BYTES = 1 << 20  # frames, headers and trailers around the one message
_CLOSED_EARLY = "the server closed the connection before the answer was complete"
_LAST_STREAM = 2**31 - 1 - 2  # a client's stream ids are odd and below 2**31: past this, a new connection


@dataclass(frozen=True)
class _Again:
    """The server never took the call, so it may go out once more on a fresh connection: why."""

    reason: str


class UnaryChannel:
    """Unary calls on one HTTP/2 connection to a unix socket, kept open between calls.

    A call the server never took (the kept connection closed before any answer on our stream, a
    GOAWAY below our stream, a REFUSED_STREAM) goes out once more on a fresh connection within the
    same deadline; never a third time. Any other failure drops the connection, so the next call
    starts afresh. One call at a time.
    """

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.connections_opened = 0  # for tests and the bench: the connection at work
        self._conn: _H2Connection | None = None
        self._lock = asyncio.Lock()

    async def call(
        self, method: str, request: bytes, *, timeout_seconds: float, max_message_bytes: int
    ) -> bytes:
        """Call `method` ("/package.Service/Method") once and return the answer's message bytes."""
        async with self._lock:
            deadline = asyncio.get_running_loop().time() + timeout_seconds  # connect and answer together
            conn = self._conn
            if conn is None or not conn.usable():
                conn = await self._connect(deadline, timeout_seconds)
            answer = await self._exchange(conn, method, request, deadline, timeout_seconds, max_message_bytes)
            if isinstance(answer, _Again):  # the server never took it: once more, on a new connection
                conn = await self._connect(deadline, timeout_seconds)
                answer = await self._exchange(
                    conn, method, request, deadline, timeout_seconds, max_message_bytes
                )
                if isinstance(answer, _Again):
                    raise PodResourcesError(f"{answer.reason} (and did so when asked a second time)")
            return _message(method, *answer)  # a failed status on a sound stream: kept

    async def _connect(self, deadline: float, timeout_seconds: float) -> _H2Connection:
        """A new connection in place of the kept one (dropped)."""
        await self._drop()
        path = self.socket_path
        try:
            async with asyncio.timeout_at(deadline):
                reader, writer = await asyncio.open_unix_connection(path)
        except FileNotFoundError as exc:
            # dcgm-exporter skips silently here; a missing hostPath mount must be visible instead.
            raise PodResourcesError(f"pod-resources socket {path} does not exist") from exc
        except TimeoutError as exc:
            raise PodResourcesError(f"no connection to {path} within {timeout_seconds:g}s") from exc
        except OSError as exc:
            # ConnectionRefusedError: the socket file is there but nobody listens (a kubelet that died)
            raise PodResourcesError(f"cannot connect to {path}: {exc.strerror or exc}") from exc
        self.connections_opened += 1
        self._conn = conn = _H2Connection(reader, writer)
        return conn

    async def close(self) -> None:
        """Close the connection; the next call opens a new one."""
        async with self._lock:
            await self._drop()

    async def _exchange(
        self,
        conn: _H2Connection,
        method: str,
        request: bytes,
        deadline: float,
        timeout_seconds: float,
        max_message_bytes: int,
    ) -> tuple[dict[bytes, bytes], bytes] | _Again:
        """One exchange on `conn` by the call's deadline; any failure drops the connection."""
        try:
            async with asyncio.timeout_at(deadline):
                answer = await conn.exchange(method, request, timeout_seconds, max_message_bytes)
            if isinstance(answer, _Again):
                await self._drop()
            return answer
        except BaseException as exc:
            await self._drop()
            _raise(exc, self.socket_path, timeout_seconds)

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(_CLOSE_SECONDS):
                await conn.writer.wait_closed()


def _raise(exc: BaseException, path: str, timeout_seconds: float) -> NoReturn:
    """Raise a call's failure as the PodResourcesError it is reported as (cancellation as it is)."""
    if isinstance(exc, TimeoutError):
        raise PodResourcesError(f"no answer from {path} within {timeout_seconds:g}s") from exc
    if isinstance(exc, h2.exceptions.H2Error):
        raise PodResourcesError(f"HTTP/2 protocol error from {path}: {exc}") from exc
    if isinstance(exc, OSError):
        raise PodResourcesError(f"connection to {path} failed: {exc.strerror or exc}") from exc
    raise exc


class _H2Connection:
    """The client side of one HTTP/2 connection: h2's state, the socket, and whether it was used."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.h2.initiate_connection()
        self.used = False  # a first exchange checks the server's first frame; a later one may be stale
        self.going_away = False  # a GOAWAY came: no new call on this connection
        self._partial = bytearray()  # the start of a frame not yet whole

    def frames(self, data: bytes) -> list[bytes]:
        """The whole frames received so far, each looked at alone: a GOAWAY is read here (h2 would
        close its state on it and refuse the rest of our answer), every other frame goes to h2. A
        gRPC server shutting down writes its GOAWAY and a PING together, so they come in one read."""
        buf = self._partial
        buf += data
        out, at = [], 0
        while len(buf) - at >= _FRAME_HEADER_BYTES:
            end = at + _FRAME_HEADER_BYTES + int.from_bytes(buf[at : at + 3], "big")
            if end > len(buf):
                break
            out.append(bytes(buf[at:end]))
            at = end
        del buf[:at]
        return out

    def _absorb(self, frames: list[bytes]) -> None:
        """Frames that came after our answer (a PING, a window update, a GOAWAY): h2 keeps its state;
        a GOAWAY marks the connection as taking no new call (`usable`)."""
        with contextlib.suppress(h2.exceptions.ProtocolError):
            for frame in frames:
                if _goaway(frame) is not None:
                    self.going_away = True
                else:
                    self.h2.receive_data(frame)

    def usable(self) -> bool:
        return (
            not self.going_away
            and not self.writer.is_closing()
            and not self.reader.at_eof()
            and self.reader.exception() is None
            and self.h2.state_machine.state != h2.connection.ConnectionState.CLOSED
            and self.h2.highest_outbound_stream_id is not None
            and self.h2.highest_outbound_stream_id < _LAST_STREAM
        )

    async def exchange(
        self, method: str, request: bytes, timeout_seconds: float, max_message_bytes: int
    ) -> tuple[dict[bytes, bytes], bytes] | _Again:
        """One call: its request on a new stream, then frames until that stream's answer ends; its
        headers and trailers, and its DATA. _Again when the server never took the stream (the call
        may go out again on a new connection): a GOAWAY below it, a REFUSED_STREAM, or, on a
        connection used before, its end before any frame of that stream."""
        reused, self.used = self.used, True
        conn, reader, writer = self.h2, self.reader, self.writer
        stream = conn.get_next_available_stream_id()
        conn.send_headers(
            stream,
            [
                (b":method", b"POST"),
                (b":scheme", b"http"),
                (b":path", method.encode()),
                (b":authority", b"localhost"),  # what grpc-go's clients send for a unix socket
                (b"content-type", b"application/grpc"),
                (b"te", b"trailers"),
                # the server gives up when we do instead of answering nobody
                (b"grpc-timeout", f"{max(1, int(timeout_seconds * 1000))}m".encode()),
                (b"user-agent", b"gpupulse-exporter"),
            ],
        )
        conn.send_data(stream, _PREFIX.pack(0, len(request)) + request, end_stream=True)
        answered = False  # a frame of our stream came: the server took it, so no second try
        try:
            writer.write(conn.data_to_send())
            await writer.drain()
            if reused:
                data = await reader.read(_READ_BYTES)
            else:
                # h2 buffers a frame until all of it is there: an HTTP/1 answer read as a frame header
                # announces megabytes. A server's first frame is its SETTINGS, so anything else is
                # refused on 9 bytes.
                try:
                    data = await reader.readexactly(_FRAME_HEADER_BYTES)
                except asyncio.IncompleteReadError as exc:
                    raise PodResourcesError(_CLOSED_EARLY) from exc
                if data[3] != _SETTINGS or data[5:9] != b"\0\0\0\0":
                    raise PodResourcesError(f"the server does not speak HTTP/2: its answer starts {data!r}")
            received, limit = len(data), max_message_bytes + _OVERHEAD_BYTES
            body = bytearray()
            status: dict[bytes, bytes] = {}
            while True:
                if not data:
                    if reused and not answered:
                        return _Again(_CLOSED_EARLY)
                    raise PodResourcesError(_CLOSED_EARLY)
                if received > limit:
                    raise PodResourcesError(f"the server sent more than {limit} bytes for one answer")
                frames = self.frames(data)
                for at, frame in enumerate(frames):
                    goaway = _goaway(frame)
                    if goaway is not None:
                        self.going_away = True
                        last, error_code = goaway
                        why = (
                            f"the server closed the connection with GOAWAY ({_code(error_code)})"
                            " before the answer was complete"
                        )
                        if last < stream:  # never seen by the server (RFC 9113 6.8): safe to send again
                            return _Again(why)
                        if error_code != h2.errors.ErrorCodes.NO_ERROR:
                            raise PodResourcesError(why)
                        # taken, and the server drains: our answer follows (a graceful stop's notice,
                        # 2^31-1, then its final GOAWAY); an end before it is an error below
                        continue
                    for event in conn.receive_data(frame):
                        if isinstance(event, h2.events.DataReceived):
                            # hand the window back at once, or an answer over 64 KiB stalls the stream
                            conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                        if getattr(event, "stream_id", None) != stream:
                            continue  # a frame of an earlier call's stream, or of the connection
                        answered = True
                        if isinstance(event, h2.events.ResponseReceived):
                            headers = dict(event.headers)
                            _check_response_headers(headers)
                            status.update(headers)  # a trailers-only answer puts grpc-status here
                        elif isinstance(event, h2.events.DataReceived):
                            body += event.data
                            _check_length(body, max_message_bytes)
                        elif isinstance(event, h2.events.TrailersReceived):
                            status.update(dict(event.headers))
                        elif isinstance(event, h2.events.StreamReset):
                            if event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM:
                                # RFC 9113 8.7: no part of the stream was processed
                                return _Again("the server refused the stream (REFUSED_STREAM)")
                            raise PodResourcesError(
                                f"the server reset the stream (HTTP/2 error {_code(event.error_code)})"
                            )
                        elif isinstance(event, h2.events.StreamEnded):
                            self._absorb(frames[at + 1 :])
                            return status, bytes(body)
                if pending := conn.data_to_send():
                    writer.write(pending)
                    await writer.drain()
                data = await reader.read(_READ_BYTES)
                received += len(data)
        except ConnectionError as exc:
            if reused and not answered:
                return _Again(f"the kept connection failed before any answer: {exc}")
            raise


def _goaway(frame: bytes) -> tuple[int, int] | None:
    """(last stream id, error code) of a GOAWAY frame; None for any other frame."""
    if frame[3] != _GOAWAY or len(frame) < _FRAME_HEADER_BYTES + 8:
        return None
    last = int.from_bytes(frame[9:13], "big") & 0x7FFFFFFF  # the reserved bit is ignored
    return last, int.from_bytes(frame[13:17], "big")


def _code(error_code: int | None) -> str:
    if error_code is None:
        return "no code"
    with contextlib.suppress(ValueError):
        return h2.errors.ErrorCodes(error_code).name
    return str(error_code)


def _check_response_headers(headers: dict[bytes, bytes]) -> None:
    if headers.get(b":status") != b"200":
        raise PodResourcesError(
            f"HTTP status {headers.get(b':status', b'?').decode(errors='replace')}, not 200"
        )
    content_type = headers.get(b"content-type", b"")
    if not content_type.startswith(b"application/grpc"):
        raise PodResourcesError(f"content-type {content_type.decode(errors='replace')!r} is not gRPC")


def _check_length(body: bytearray, max_message_bytes: int) -> None:
    if len(body) < _PREFIX.size:
        return
    flag, length = _PREFIX.unpack_from(body)
    if flag != 0:
        # we sent no grpc-accept-encoding, so the server may not compress (PROTOCOL-HTTP2.md)
        raise PodResourcesError(f"compressed answer (flag {flag}) although none was asked for")
    if length > max_message_bytes:
        raise PodResourcesError(f"answer of {length} bytes is over the limit of {max_message_bytes}")
    if len(body) > _PREFIX.size + length:
        raise PodResourcesError("more than one message in the answer of a unary call")


def _message(method: str, status: dict[bytes, bytes], body: bytes) -> bytes:
    raw = status.get(b"grpc-status")
    if raw is None:
        raise PodResourcesError("the answer ended without a grpc-status")
    try:
        code = int(raw)
    except ValueError:
        raise PodResourcesError(f"grpc-status {raw.decode(errors='replace')!r} is not a number") from None
    if code != 0:
        message = unquote(
            status.get(b"grpc-message", b"").decode("ascii", errors="replace"), errors="replace"
        )
        name = _STATUS_NAMES[code] if 0 <= code < len(_STATUS_NAMES) else f"status {code}"
        raise PodResourcesError(f"{method.rsplit('/', 1)[-1]} failed: {name}: {message}")
    if len(body) < _PREFIX.size:
        raise PodResourcesError(f"the answer has {len(body)} bytes, not one length-prefixed message")
    _, length = _PREFIX.unpack_from(body)
    if len(body) != _PREFIX.size + length:
        raise PodResourcesError(f"the answer's message is cut: {len(body) - _PREFIX.size} of {length} bytes")
    return body[_PREFIX.size :]
