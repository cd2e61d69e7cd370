"""A fake kubelet serving pod-resources v1 `List` over a unix socket with grpc.aio (device-plugin
devices and DRA claims, `dynamic_resources`, in the real v1 messages): demo/kubelet.py's server plus the
failures tests need (an error status, garbage bytes, an answer that never comes) and a call count.
`RawKubelet` speaks HTTP/2 by hand (the server side of h2) for what grpcio cannot be made to do:
compress unasked, reset, GOAWAY, hang, close mid-frame, answer without a status."""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import uuid
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import grpc
import grpc.aio
import h2.config
import h2.connection
import h2.events
import h2.exceptions

from demo.kubelet import DRA_DRIVER, PodResourcesServer, pod, pods_from_scenario
from exporter.attribution.podresources_proto import PodResources

__all__ = [
    "DRA_DRIVER",
    "FakeKubelet",
    "RawExchange",
    "RawKubelet",
    "grpc_frame",
    "pod",
    "pod_uid",
    "pods_from_scenario",
]


def pod_uid(namespace: str, name: str) -> str:
    """A stable pod UID for scenario pods (the kubelet does not report UIDs; cgroups do)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpupulse-test/{namespace}/{name}"))


class FakeKubelet(PodResourcesServer):
    """Serves whatever `pods` holds; `fail_with` makes List return that status instead."""

    def __init__(self, socket_path: str, pods: Iterable[PodResources] = ()) -> None:
        super().__init__(socket_path, pods)
        self.fail_with: grpc.StatusCode | None = None
        self.fail_message = "fake kubelet failure"
        self.garbage: bytes | None = None
        self.hang = False  # List never answers (the client's deadline must end the call)
        self.calls = 0

    async def _list(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.calls += 1
        if self.fail_with is not None:
            await context.abort(self.fail_with, self.fail_message)
        if self.hang:
            await asyncio.Event().wait()
        if self.garbage is not None:
            return self.garbage
        return await super()._list(request, context)


def grpc_frame(message: bytes, compressed: int = 0) -> bytes:
    """A gRPC length-prefixed message."""
    return struct.pack(">BI", compressed, len(message)) + message


class RawExchange:
    """One request stream of a RawKubelet connection: what its `respond` writes with."""

    def __init__(
        self, conn: h2.connection.H2Connection, stream_id: int, writer: asyncio.StreamWriter
    ) -> None:
        self.conn, self.stream_id, self._writer = conn, stream_id, writer

    async def headers(self, status: bytes = b"200", content_type: bytes = b"application/grpc") -> None:
        """The response headers."""
        self.conn.send_headers(self.stream_id, [(b":status", status), (b"content-type", content_type)])
        await self.flush()

    async def data(self, payload: bytes, end_stream: bool = False) -> None:
        """DATA frames (split at the peer's frame size) carrying `payload`."""
        size = self.conn.max_outbound_frame_size
        chunks = [payload[i : i + size] for i in range(0, len(payload), size)] or [b""]
        for i, chunk in enumerate(chunks):
            self.conn.send_data(self.stream_id, chunk, end_stream=end_stream and i == len(chunks) - 1)
        await self.flush()

    async def trailers(self, status: int = 0, message: bytes = b"") -> None:
        """The trailers that end the stream: grpc-status and, when given, grpc-message (already encoded)."""
        fields = [(b"grpc-status", str(status).encode())] + ([(b"grpc-message", message)] if message else [])
        self.conn.send_headers(self.stream_id, fields, end_stream=True)
        await self.flush()

    async def raw(self, data: bytes) -> None:
        """Bytes written as they are, past h2 (a frame cut short, something that is not HTTP/2)."""
        self._writer.write(data)
        await self._writer.drain()

    async def trailers_only(self, status: int, message: bytes = b"") -> None:
        """The one HEADERS of an answer that fails before any message (grpc-status among them)."""
        fields = [
            (b":status", b"200"),
            (b"content-type", b"application/grpc"),
            (b"grpc-status", str(status).encode()),
        ]
        self.conn.send_headers(
            self.stream_id, fields + ([(b"grpc-message", message)] if message else []), end_stream=True
        )
        await self.flush()

    def end(self) -> None:
        """Stop writing (a server going away mid-answer): the client reads the end of the stream."""
        self._writer.write_eof()

    async def flush(self) -> None:
        """Write what h2 has queued (resets and GOAWAYs sent through `conn`, too)."""
        self._writer.write(self.conn.data_to_send())
        await self._writer.drain()


async def _read(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.read(65536)
    except ConnectionResetError:
        return b""


class RawKubelet:
    """A unix-socket HTTP/2 server that lets `respond` answer each request however it likes."""

    def __init__(self, socket_path: str, respond: Callable[[RawExchange], Coroutine[Any, Any, None]]) -> None:
        self.socket_path = socket_path
        self._respond = respond
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.requests: list[dict[bytes, bytes]] = []  # headers of each request seen
        self.client_gone = asyncio.Event()  # a client closed its connection

    async def start(self) -> None:
        """Listen on the socket."""
        self._server = await asyncio.start_unix_server(self._handle, self.socket_path)

    async def stop(self) -> None:
        """Stop listening, end every connection and remove the socket file."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        # closing each connection ends its handler; cancelling one instead trips asyncio 3.11's
        # callback that calls exception() on the cancelled task and leaves the transport open
        for writer in list(self._writers):
            writer.close()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        conn.initiate_connection()
        responding: asyncio.Task[None] | None = None
        try:
            writer.write(conn.data_to_send())
            while data := await _read(reader):
                try:
                    events = conn.receive_data(data)
                except h2.exceptions.ProtocolError:
                    continue  # after a GOAWAY of ours the client's frames are not ours to judge
                for event in events:
                    if isinstance(event, h2.events.RequestReceived) and event.stream_id is not None:
                        self.requests.append(dict(event.headers))
                    elif isinstance(event, h2.events.StreamEnded) and event.stream_id is not None:
                        exchange = RawExchange(conn, event.stream_id, writer)
                        responding = asyncio.create_task(self._respond(exchange))
                writer.write(conn.data_to_send())
            self.client_gone.set()
        finally:
            if responding is not None:
                responding.cancel()
                await asyncio.gather(responding, return_exceptions=True)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            self._handlers.discard(task)
            self._writers.discard(writer)
