"""A local pager: receives the controller's generic-webhook pages and prints them as they arrive.

In the demo it runs inside the orchestrator; `python -m demo.pager_sink --listen 127.0.0.1:9099`
runs it alone. The URL path carries a random secret, as a real webhook URL does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

MAX_PAGE_BYTES = 1 << 20


@dataclass(frozen=True)
class ReceivedPage:
    """One page as the controller sent it (the generic webhook body)."""

    body: dict[str, Any]

    @property
    def dedup_key(self) -> str:
        return str(self.body.get("dedup_key", ""))

    @property
    def resolved(self) -> bool:
        return self.body.get("status") == "resolved"


def describe_page(page: ReceivedPage) -> str:
    """One readable line for a page."""
    b = page.body
    target = b.get("target") or {}
    who = (
        f"{target.get('namespace')}/{target.get('pod')}"
        if target.get("kind") == "pod"
        else f"{target.get('kind')} {target.get('uuid') or target.get('node')}"
    )
    state = "RESOLVED" if page.resolved else str(b.get("severity", "")).upper()
    return f"[{state}] {b.get('dedup_key')} {b.get('signature')} {who}: {b.get('summary')}"


def describe_diagnosis(page: ReceivedPage) -> str | None:
    """One readable line for the diagnosis a page carries (None when it carries none): the top cause
    and its layer, the signals that showed it, or why there is no diagnosis."""
    d = page.body.get("diagnosis")
    if not isinstance(d, dict):
        return None
    head = f"{page.dedup_key}: {d.get('headline', '')}"
    if d.get("status") != "diagnosed":
        return head
    signals = ", ".join(str(e.get("signal")) for e in d.get("evidence") or () if isinstance(e, dict))
    return f"{head} (layer {d.get('layer')}; evidence: {signals or 'none'})"


@dataclass
class PagerSink:
    """aiohttp server that accepts POST <path> with a JSON page and records it."""

    on_page: Callable[[ReceivedPage], None] = lambda _p: None
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    pages: list[ReceivedPage] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def path(self) -> str:
        return f"/pages/{self.secret}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    async def _handle(self, request: web.Request) -> web.Response:
        if request.match_info["secret"] != self.secret:
            return web.json_response({"error": "unknown page URL"}, status=404)
        raw = await request.content.read(MAX_PAGE_BYTES + 1)
        if len(raw) > MAX_PAGE_BYTES:
            return web.json_response({"error": "page too large"}, status=413)
        try:
            body = json.loads(raw)
        except ValueError:
            return web.json_response({"error": "not JSON"}, status=400)
        if not isinstance(body, dict) or not body.get("dedup_key"):
            return web.json_response({"error": "a page needs a dedup_key"}, status=400)
        page = ReceivedPage(body)
        self.pages.append(page)
        self.on_page(page)
        return web.json_response({"ok": True})

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen (port 0 = a free one); returns the page URL."""
        app = web.Application(client_max_size=MAX_PAGE_BYTES + 1)
        app.router.add_post("/pages/{secret}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self.url

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def for_incident(self, incident_id: int) -> list[ReceivedPage]:
        """Pages the controller sent about one incident."""
        return [p for p in self.pages if p.dedup_key == f"gpupulse-incident-{incident_id}"]


async def _serve(host: str, port: int) -> None:
    sink = PagerSink(on_page=lambda p: print(describe_page(p), flush=True))
    url = await sink.start(host, port)
    print(f"pager sink: POST pages to {url}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await sink.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sink alone until Ctrl-C."""
    parser = argparse.ArgumentParser(prog="python -m demo.pager_sink", description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (default: %(default)s)")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    try:
        asyncio.run(_serve(host or "127.0.0.1", int(port)))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
