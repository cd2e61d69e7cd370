"""An in-process HTTP sink that records pages (generic webhook, PagerDuty, Slack), and a recording Pager.

PagerSink binds 127.0.0.1 on a free port; `fail_next(n, status)` makes the next n requests fail so
retry behaviour can be tested; `wait_for(count)` awaits deliveries without sleeping.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from remediation.model import Page


@dataclass
class Received:
    """One request the sink accepted (or refused)."""

    path: str
    body: Any
    headers: dict[str, str]
    status: int


@dataclass
class PagerSink:
    """aiohttp server recording every POST body as JSON."""

    received: list[Received] = field(default_factory=list)
    _fail: list[int] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    _cond: asyncio.Condition = field(default_factory=asyncio.Condition)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail_next(self, count: int, status: int = 503) -> None:
        """Answer the next `count` requests with `status`."""
        self._fail.extend([status] * count)

    @property
    def accepted(self) -> list[Received]:
        return [r for r in self.received if r.status < 300]

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def wait_for(self, count: int, deadline_seconds: float = 10.0) -> list[Received]:
        """Wait until at least `count` requests were accepted."""
        async with asyncio.timeout(deadline_seconds), self._cond:
            await self._cond.wait_for(lambda: len(self.accepted) >= count)
        return self.accepted

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        status = self._fail.pop(0) if self._fail else 202
        self.received.append(Received(request.path, body, dict(request.headers), status))
        async with self._cond:
            self._cond.notify_all()
        return web.json_response({"status": "ok" if status < 300 else "error"}, status=status)


class RecordingPager:
    """A Pager that keeps pages in memory (engine tests)."""

    name = "recording"

    def __init__(self) -> None:
        self.pages: list[Page] = []
        self.fail = False

    async def send(self, page: Page) -> None:
        if self.fail:
            raise RuntimeError("pager down")
        self.pages.append(page)

    @property
    def firing(self) -> list[Page]:
        return [p for p in self.pages if not p.resolved]
