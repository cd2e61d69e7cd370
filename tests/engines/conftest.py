"""Shared helpers for the engines tests."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client.core import Metric

from exporter.engines.detect import PREFIXES, WANTED
from exporter.engines.targets import Target
from exporter.exposition.parse import Exposition, parse_exposition

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "engines"


class FakeClock:
    """Wall clock that only moves when told."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


def load_fixture(name: str) -> str:
    return (FIXTURES / f"{name}.prom").read_text()


def expo_of(name: str) -> Exposition:
    """A fixture parsed the way the collector parses it: only the families the normalizers declare."""
    return parse_exposition(load_fixture(name), wanted=WANTED, note_prefixes=PREFIXES)


def samples(metrics: Sequence[Metric], sample_name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample with this name whose labels include `labels`."""
    out = []
    for fam in metrics:
        for s in fam.samples:
            if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()):
                out.append((dict(s.labels), float(s.value)))
    return out


def value(metrics: Sequence[Metric], sample_name: str, **labels: str) -> float:
    found = samples(metrics, sample_name, **labels)
    assert len(found) == 1, f"{sample_name}{labels}: {found}"
    return found[0][1]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


class ListSource:
    """A target source whose list the test replaces at will."""

    def __init__(self, targets: list[Target]) -> None:
        self.items = targets

    async def targets(self) -> list[Target]:
        return list(self.items)

    async def close(self) -> None:
        return None


def free_port() -> int:
    """A port nothing listens on (bound then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def fake_engines() -> AsyncIterator[str]:
    """An HTTP server with one path per engine behaviour; yields its base URL."""
    release = asyncio.Event()

    def serve(name: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handler(_: web.Request) -> web.StreamResponse:
            return web.Response(text=load_fixture(name), content_type="text/plain")

        return handler

    async def slow(_: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.Response(text="")

    async def garbage(_: web.Request) -> web.StreamResponse:
        return web.Response(text="<html><body>502 Bad Gateway</body></html>\n", content_type="text/html")

    async def huge(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()  # chunked: no Content-Length to reject early
        await resp.prepare(request)
        line = b'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n' * 1000
        for _ in range(200):
            await resp.write(line)
        return resp

    async def error(_: web.Request) -> web.StreamResponse:
        return web.Response(status=500, text="boom")

    app = web.Application()
    for name in ("vllm-0.33.0", "trtllm-serve-2026", "tgi-3.3", "sglang-0.5.23", "triton-trtllm-2.73"):
        app.router.add_get(f"/{name}", serve(name))
    app.router.add_get("/slow", slow)
    app.router.add_get("/garbage", garbage)
    app.router.add_get("/huge", huge)
    app.router.add_get("/error", error)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        release.set()
        await runner.cleanup()


def render_text(metrics: Sequence[Metric]) -> str:
    """The text exposition prometheus-client writes for these families."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import CollectorRegistry

    class _Fixed:
        def collect(self) -> Sequence[Metric]:
            return metrics

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed())
    return generate_latest(registry).decode()
