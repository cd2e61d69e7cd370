"""The exporter's HTTP server cuts off a client whose request head never completes (slowloris)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from exporter.config import ExporterSettings
from exporter.sampler import Sampler
from exporter.server import make_app, make_site
from tests.exporter.clocks import StepClock
from tests.fakes.exporter_core import FakeCollector


@pytest.fixture
async def port() -> AsyncIterator[int]:
    sampler = Sampler([FakeCollector()], ExporterSettings(sampling_interval_seconds=1.0), StepClock())
    runner = web.AppRunner(make_app(sampler), access_log=None)
    await runner.setup()
    site = make_site(runner, "127.0.0.1", 0, header_timeout_seconds=0.2)
    await site.start()
    yield int(runner.addresses[0][1])
    await runner.cleanup()


async def test_a_request_head_that_never_completes_is_closed_with_408(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: ")  # and never the rest
    await writer.drain()
    reply = await asyncio.wait_for(reader.read(), 10)  # returns at EOF: the server closed it
    assert reply.startswith(b"HTTP/1.1 408")
    writer.close()


async def test_complete_requests_on_a_kept_alive_connection_are_served(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(2):
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200")
        await reader.readexactly(3)  # "ok\n"
        # idle past the head deadline: the clock starts only with the next request's first byte
        await asyncio.sleep(0.4)
    writer.close()
