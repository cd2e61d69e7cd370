"""HTTP serving: /metrics returns the latest snapshot's pre-rendered bytes; nothing here calls NVML."""

from __future__ import annotations

import html

from aiohttp import web

from exporter.config import exporter_version
from exporter.sampler import Sampler
from exporter.snapshot import CONTENT_TYPE

SAMPLER_KEY = web.AppKey("sampler", Sampler)


async def metrics(request: web.Request) -> web.Response:
    """The last snapshot; 503 before the first one exists."""
    snap = request.app[SAMPLER_KEY].snapshot
    if snap is None:
        return web.Response(status=503, text="no sample yet\n")
    headers = {"Content-Type": CONTENT_TYPE}
    if "gzip" in request.headers.get("Accept-Encoding", ""):
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


def make_app(sampler: Sampler) -> web.Application:
    """The aiohttp application serving one sampler's snapshots."""
    app = web.Application()
    app[SAMPLER_KEY] = sampler
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/", index)
    return app
