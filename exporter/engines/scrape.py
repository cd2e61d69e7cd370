"""Fetch one engine endpoint with a timeout and a response-size limit."""

from __future__ import annotations

import asyncio

import aiohttp

# Plain text: prometheus-client would switch to OpenMetrics for an openmetrics Accept header.
_HEADERS = {"Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1"}


class ScrapeError(Exception):
    """A failed scrape; `reason` is the failure counter's label value."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


async def fetch(session: aiohttp.ClientSession, url: str, timeout_seconds: float, max_bytes: int) -> str:
    """Return the body as text; raise ScrapeError(timeout|refused|http_status|too_large|network)."""
    try:
        async with asyncio.timeout(timeout_seconds):
            async with session.get(url, headers=_HEADERS, allow_redirects=False) as resp:
                if resp.status != 200:
                    raise ScrapeError("http_status", f"HTTP {resp.status}")
                if resp.content_length is not None and resp.content_length > max_bytes:
                    raise ScrapeError("too_large", f"Content-Length {resp.content_length} > {max_bytes}")
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_chunked(64 * 1024):
                    size += len(chunk)
                    if size > max_bytes:
                        # Stop reading: the rest of an oversized body is never pulled off the socket.
                        raise ScrapeError("too_large", f"body over {max_bytes} bytes")
                    chunks.append(chunk)
                return b"".join(chunks).decode("utf-8", errors="replace")
    except TimeoutError as exc:
        raise ScrapeError("timeout", f"no complete answer within {timeout_seconds}s") from exc
    except aiohttp.ClientConnectorError as exc:
        raise ScrapeError("refused", str(exc)) from exc
    except aiohttp.ClientError as exc:
        raise ScrapeError("network", str(exc)) from exc
