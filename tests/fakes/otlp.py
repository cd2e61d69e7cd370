"""An in-process OTLP/HTTP metrics receiver (aiohttp on 127.0.0.1) that decodes the protobuf."""

from __future__ import annotations

import asyncio
import gzip
import socket
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)


class FakeOtlpReceiver:
    """Collects every ExportMetricsServiceRequest POSTed to /v1/metrics."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.headers: list[dict[str, str]] = []
        self.fail_status: int | None = None
        self._received = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.fail_status is not None:
            return web.Response(status=self.fail_status)
        message = ExportMetricsServiceRequest()
        message.ParseFromString(body)
        async with self._received:
            self.requests.append(message)
            self.headers.append(dict(request.headers))
            self._received.notify_all()
        return web.Response(
            body=ExportMetricsServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    async def wait_for_requests(self, count: int) -> None:
        """Wait until `count` requests have arrived."""
        async with self._received:
            await self._received.wait_for(lambda: len(self.requests) >= count)

    def metrics(self, index: int = -1) -> dict[str, Any]:
        """Name -> OTLP Metric message of one request."""
        out = {}
        for rm in self.requests[index].resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    out[metric.name] = metric
        return out

    async def start(self) -> None:
        """Listen on a free port of 127.0.0.1."""
        app = web.Application()
        app.router.add_post("/v1/metrics", self._handle)
        runner = web.AppRunner(app)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(runner, sock)
        await site.start()
        self._runner = runner
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
