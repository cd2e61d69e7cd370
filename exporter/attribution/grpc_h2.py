"""One unary gRPC call over HTTP/2 cleartext on a unix socket, spoken with h2 (the kubelet's List).

grpcio would do it too, but importing grpc.aio costs about 9 MiB of RSS for one call every 10 s;
h2 (pure Python, with hpack and hyperframe) costs about 1 MiB. The call follows gRPC's
"PROTOCOL-HTTP2.md": prior-knowledge HTTP/2, one POST stream whose DATA is the 5-byte framed
request, an answer of HEADERS, DATA and trailers carrying grpc-status and grpc-message. Each call
opens its own connection (a restarted kubelet recreates its socket, and a refresh every 10 s makes
a connection cheaper than the bookkeeping to keep one alive). Every way it can fail, the deadline
included, raises PodResourcesError with what went wrong; nothing else escapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
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
_SETTINGS = 0x4  # HTTP/2 frame type
_OVERHEAD_BYTES = 1 << 20  # frames, headers and trailers around the one message
_CLOSED_EARLY = "the server closed the connection before the answer was complete"


async def unary_call(
    socket_path: str, method: str, request: bytes, *, timeout_seconds: float, max_message_bytes: int
) -> bytes:
    """Call `method` ("/package.Service/Method") once and return the answer's message bytes."""
    deadline = asyncio.get_running_loop().time() + timeout_seconds  # for connect and answer together
    try:
        async with asyncio.timeout_at(deadline):
            reader, writer = await asyncio.open_unix_connection(socket_path)
    except FileNotFoundError as exc:
        # dcgm-exporter skips silently here; a missing hostPath mount must be visible instead.
        raise PodResourcesError(f"pod-resources socket {socket_path} does not exist") from exc
    except TimeoutError as exc:
        raise PodResourcesError(f"no connection to {socket_path} within {timeout_seconds:g}s") from exc
    except OSError as exc:
        # ConnectionRefusedError: the socket file is there but nobody listens (a kubelet that died)
        raise PodResourcesError(f"cannot connect to {socket_path}: {exc.strerror or exc}") from exc
    try:
        async with asyncio.timeout_at(deadline):
            return await _exchange(reader, writer, method, request, timeout_seconds, max_message_bytes)
    except TimeoutError as exc:
        raise PodResourcesError(f"no answer from {socket_path} within {timeout_seconds:g}s") from exc
    except h2.exceptions.H2Error as exc:
        raise PodResourcesError(f"HTTP/2 protocol error from {socket_path}: {exc}") from exc
    except OSError as exc:
        raise PodResourcesError(f"connection to {socket_path} failed: {exc.strerror or exc}") from exc
    finally:
        writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(_CLOSE_SECONDS):
                await writer.wait_closed()


async def _exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    method: str,
    request: bytes,
    timeout_seconds: float,
    max_message_bytes: int,
) -> bytes:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    conn.send_headers(
        _STREAM,
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
    conn.send_data(_STREAM, _PREFIX.pack(0, len(request)) + request, end_stream=True)
    writer.write(conn.data_to_send())
    await writer.drain()

    # h2 buffers a frame until all of it is there: an HTTP/1 answer read as a frame header announces
    # megabytes. A server's first frame is its SETTINGS, so anything else is refused on 9 bytes.
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
        if received > limit:
            raise PodResourcesError(f"the server sent more than {limit} bytes for one answer")
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                headers = dict(event.headers)
                _check_response_headers(headers)
                status.update(headers)  # a trailers-only answer puts grpc-status here
            elif isinstance(event, h2.events.DataReceived):
                body += event.data
                # hand the window back at once, or an answer over 64 KiB stalls the stream
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                _check_length(body, max_message_bytes)
            elif isinstance(event, h2.events.TrailersReceived):
                status.update(dict(event.headers))
            elif isinstance(event, h2.events.StreamReset):
                raise PodResourcesError(
                    f"the server reset the stream (HTTP/2 error {_code(event.error_code)})"
                )
            elif isinstance(event, h2.events.ConnectionTerminated):
                raise PodResourcesError(
                    f"the server closed the connection with GOAWAY ({_code(event.error_code)})"
                    " before the answer was complete"
                )
            elif isinstance(event, h2.events.StreamEnded):
                return _message(method, status, bytes(body))
        if pending := conn.data_to_send():
            writer.write(pending)
            await writer.drain()
        data = await reader.read(_READ_BYTES)
        if not data:
            raise PodResourcesError(_CLOSED_EARLY)
        received += len(data)


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
