"""HTTP serving: /metrics returns the latest snapshot's rendered bytes; nothing here calls NVML."""

from __future__ import annotations

import asyncio
import html
import logging
import ssl
from collections.abc import Awaitable, Callable

from aiohttp import web

from exporter.config import exporter_version
from exporter.sampler import Sampler
from exporter.snapshot import CONTENT_TYPE
from exporter.webconfig import WebConfigFile, auth_middleware

SAMPLER_KEY = web.AppKey("sampler", Sampler)
# a request head must be complete this long after its first byte; aiohttp itself has no such deadline,
# so a client sending one header byte a second would hold a connection forever (slowloris)
HEADER_TIMEOUT_SECONDS = 10.0
_TIMEOUT_REPLY = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"

log = logging.getLogger(__name__)


async def metrics(request: web.Request) -> web.Response:
    """The last snapshot; 503 before the first one exists."""
    snap = request.app[SAMPLER_KEY].snapshot
    if snap is None:
        return web.Response(status=503, text="no sample yet\n")
    snap.mark_requested()
    headers = {"Content-Type": CONTENT_TYPE}
    gzipped = "gzip" in request.headers.get("Accept-Encoding", "")
    if not snap.ready(gzipped):
        # the first scrape of a snapshot nobody asked for yet renders it, on a thread, not the loop
        # (a family that cannot be written as text is left out by render(), never the whole scrape)
        await asyncio.to_thread(snap.gzipped if gzipped else lambda: snap.body)
    if gzipped:
        headers["Content-Encoding"] = "gzip"
        return web.Response(body=snap.gzipped(), headers=headers)
    return web.Response(body=snap.body, headers=headers)


async def healthz(request: web.Request) -> web.Response:
    """The process is alive and serving."""
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    """200 while the last good sample is fresh; 503 before the first and when sampling stalls."""
    sampler = request.app[SAMPLER_KEY]
    if sampler.ready():
        return web.Response(text="ready\n")
    if sampler.last_good_monotonic is None:
        return web.Response(status=503, text="no good sample yet\n")
    age = sampler.clock.monotonic() - sampler.last_good_monotonic
    return web.Response(status=503, text=f"last good sample is {age:.1f} s old\n")


async def index(request: web.Request) -> web.Response:
    """A small landing page: GPUs and collector status."""
    sampler = request.app[SAMPLER_KEY]
    snap = sampler.snapshot
    rows, collectors = [], []
    if snap is not None:
        for gpu, up in snap.gpus:
            rows.append(
                f"<tr><td>{html.escape(gpu.index)}</td><td>{html.escape(gpu.name)}</td>"
                f"<td><code>{html.escape(gpu.uuid)}</code></td><td>{html.escape(gpu.pci_bus_id)}</td>"
                f"<td>{up}</td></tr>"
            )
        for name, r in sorted(snap.rounds.items()):
            status = "ok" if r.success else "failing"
            collectors.append(
                f"<tr><td>{html.escape(name)}</td><td>{status}</td>"
                f"<td>{r.duration_seconds * 1000:.1f} ms</td></tr>"
            )
    body = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>gpupulse exporter</title></head>
<body><h1>gpupulse exporter {html.escape(exporter_version())}</h1>
<p><a href="/metrics">/metrics</a> · <a href="/healthz">/healthz</a> · <a href="/readyz">/readyz</a></p>
<h2>GPUs</h2><table><tr><th>gpu</th><th>name</th><th>uuid</th><th>PCI bus</th><th>state</th></tr>
{"".join(rows) or "<tr><td colspan=5>none seen yet</td></tr>"}</table>
<h2>Collectors</h2><table><tr><th>collector</th><th>last round</th><th>duration</th></tr>
{"".join(collectors)}</table>
</body></html>
"""
    return web.Response(text=body, content_type="text/html")


class _HeadDeadline(asyncio.Protocol):
    """Wraps aiohttp's protocol for one connection and closes it when a request head is late.

    The same guard as the controller's (remediation/httpguard.py); the two services share no code.
    Every route here is a GET, so no request body is ever read and needs no deadline of its own.
    """

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
            self._timer = asyncio.get_running_loop().call_later(self._timeout_seconds, self._expire)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.head_received()
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def head_received(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._in_request = True

    def request_done(self) -> None:
        self._in_request = False

    def _expire(self) -> None:
        self._timer = None
        if self._transport is not None and not self._transport.is_closing():
            log.info("closing a connection: request head not complete in %.0f s", self._timeout_seconds)
            self._transport.write(_TIMEOUT_REPLY)
            self._transport.close()


class _DeadlineSite(web.BaseSite):
    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        timeout_seconds: float,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host, self._port, self._timeout_seconds = host, port, timeout_seconds

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context is not None else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        timeout = self._timeout_seconds
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _HeadDeadline(server(), timeout),
            self._host,
            self._port,
            backlog=self._backlog,
            ssl=self._ssl_context,
        )


def make_site(
    runner: web.BaseRunner,
    host: str,
    port: int,
    header_timeout_seconds: float = HEADER_TIMEOUT_SECONDS,
    ssl_context: ssl.SSLContext | None = None,
) -> web.BaseSite:
    """The TCP site the exporter listens on: aiohttp's, plus a deadline for each request head, over
    TLS when a context is given (--web.config.file)."""
    return _DeadlineSite(runner, host, port, header_timeout_seconds, ssl_context)


@web.middleware
async def _head_deadline(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    proto = request.transport.get_protocol() if request.transport is not None else None
    if not isinstance(proto, _HeadDeadline):
        return await handler(request)
    proto.head_received()
    try:
        return await handler(request)
    finally:
        proto.request_done()


def make_app(sampler: Sampler, web_config: WebConfigFile | None = None) -> web.Application:
    """The aiohttp application serving one sampler's snapshots (with --web.config.file's basic auth
    and headers when one is given)."""
    middlewares = [_head_deadline] + ([auth_middleware(web_config)] if web_config is not None else [])
    app = web.Application(middlewares=middlewares)
    app[SAMPLER_KEY] = sampler
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/", index)
    return app
