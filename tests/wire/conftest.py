"""The misbehaving servers the HTTP/1.1 tests talk to: raw asyncio servers that write whatever bytes
the test's handler writes, so a test can break the protocol on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
Start = Callable[[Handler], Awaitable[str]]


@pytest.fixture
async def raw_server() -> AsyncIterator[Start]:
    """Start asyncio servers that answer with whatever bytes the test writes; yields a starter."""
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> str:
        async def guarded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await handler(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(guarded, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/metrics"

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()
