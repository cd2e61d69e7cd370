"""Fetch one engine endpoint with a timeout and a response-size limit, parsing as it streams in."""

from __future__ import annotations

import asyncio

from exporter.errors import HttpConnectError, HttpError, ScrapeError
from exporter.exposition.parse import Exposition, ExpositionParser
from exporter.wire.http1 import HttpClient

# Plain text: prometheus-client would switch to OpenMetrics for an openmetrics Accept header.
# No gzip asked for: engine pages are small and near (loopback, the pod network), and inflating
# costs more CPU than the bytes save; a server that compresses anyway is decoded.
_HEADERS = {"Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1", "Accept-Encoding": "identity"}
_CHUNK_BYTES = 64 * 1024  # the parser runs between chunks, so no chunk holds the loop long


async def fetch_page(
    client: HttpClient, url: str, timeout_seconds: float, max_bytes: int, parser: ExpositionParser
) -> Exposition:
    """Stream the page into the parser as it arrives, under one deadline for the whole request.

    Reading stops at max_bytes (the families completed before the cut are kept, the page is marked
    truncated "too_large") or when the parser has seen its sample cap; the rest of the body is never
    pulled off the socket. Raises ScrapeError(timeout|refused|http_status|network) or ExpositionError.
    """
    try:
        async with asyncio.timeout(timeout_seconds):
            async with client.get(url, _HEADERS) as resp:
                if resp.status != 200:
                    raise ScrapeError("http_status", f"HTTP {resp.status}")
                size = 0
                async for chunk in resp.chunks(_CHUNK_BYTES):
                    room = max_bytes - size
                    if len(chunk) > room:
                        parser.feed_bytes(chunk[:room])
                        return parser.finish(truncated="too_large")
                    size += len(chunk)
                    if not parser.feed_bytes(chunk):
                        break  # the sample cap: the parser has marked the page itself
                return parser.finish()
    except TimeoutError as exc:
        raise ScrapeError("timeout", f"no complete answer within {timeout_seconds}s") from exc
    except HttpConnectError as exc:
        raise ScrapeError("refused", str(exc)) from exc
    except HttpError as exc:
        raise ScrapeError("network", str(exc)) from exc
