"""How the controller waits when the API server says "not now": the Retry-After it sends, and one
bounded, jittered backoff for every call that may be retried (as client-go's rest client does).

API Priority and Fairness answers a rejected request 429 with a plain-text body and the wait only in
the `Retry-After` header; other 429s and 5xx carry `details.retryAfterSeconds` in a Status body.
KubeError.retry_after_seconds reads both; `retry_throttled` waits at least that long, never past
its deadline.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TypeVar

from gpupulse.clock import Clock
from remediation.errors import KubeTooManyRequests, KubeUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

# a server asking for longer than this is capped: past it the caller's own deadline decides
MAX_RETRY_AFTER_SECONDS = 60.0


def parse_retry_after(value: str | None, now: datetime | None = None) -> float:
    """Seconds a Retry-After header value asks for (RFC 9110 10.2.3: delta-seconds or an HTTP-date),
    capped at MAX_RETRY_AFTER_SECONDS; 0.0 when absent or malformed, or a date already past."""
    if not value:
        return 0.0
    text = value.strip()
    if text.isascii() and text.isdigit():
        return min(float(int(text)), MAX_RETRY_AFTER_SECONDS)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return 0.0
    if when.tzinfo is None:  # an HTTP-date is GMT; a date without a zone is read as such
        when = when.replace(tzinfo=UTC)
    seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)


async def retry_throttled(
    call: Callable[[], Awaitable[T]],
    *,
    clock: Clock,
    deadline: float,
    what: str,
    initial_seconds: float = 0.2,
    max_seconds: float = 5.0,
) -> T:
    """`call()` until it succeeds; a 429 or an unavailable server (5xx, no answer) is retried after
    max(Retry-After, jittered exponential backoff) while that ends before `deadline` (the clock's
    monotonic seconds), then raised. Other errors are raised at once."""
    delay = initial_seconds
    attempt = 0
    while True:
        attempt += 1
        try:
            return await call()
        except (KubeTooManyRequests, KubeUnavailable) as exc:
            wait = max(exc.retry_after_seconds, delay * random.uniform(0.5, 1.0))
            if clock.monotonic() + wait > deadline:
                raise
            log.info("%s: %s; attempt %d, retrying in %.2f s", what, exc, attempt, wait)
            await clock.sleep(wait)
            delay = min(delay * 2, max_seconds)
