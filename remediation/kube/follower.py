"""A follower's own inbox in cluster mode: it accepts every alert (Alertmanager sends each to every
replica) but drains nothing, so rows older than `keep_seconds` are marked processed, unhandled.

Each row is a spare copy for a takeover: the leader handled its own copy within moments, and a new
leader would judge a firing alert that old too old to act on (`engine.max_event_age`). Without the
trim a follower's inbox fills to `--queue.max-pending` and refuses alerts, and a takeover starts with
a backlog of every alert since the follower started.
"""

from __future__ import annotations

import asyncio
import logging

from gpupulse.clock import Clock
from remediation.errors import StoreError
from remediation.inbox import Inbox

log = logging.getLogger(__name__)


async def trim_once(inbox: Inbox, now: float, keep_seconds: float, batch: int = 1000) -> int:
    """Mark pending rows received before now - keep_seconds processed; returns how many."""
    trimmed = 0
    while True:
        rows, _, _ = await inbox.load_ready(now, batch)
        old = [r.id for r in rows if r.received_at < now - keep_seconds]
        if not old:
            return trimmed
        await inbox.mark_processed(old, now)
        trimmed += len(old)
        if len(old) < len(rows) or len(rows) < batch:
            return trimmed  # rows come in id order: the rest are newer


async def trim_follower_inbox(
    inbox: Inbox, keep_seconds: float, interval_seconds: float, clock: Clock
) -> None:
    """Trim every interval until cancelled (when this replica starts leading)."""
    while True:
        try:
            n = await trim_once(inbox, clock.time(), keep_seconds)
            if n:
                log.info("follower: %d inbox row(s) older than %.0f s set aside unhandled", n, keep_seconds)
        except StoreError as exc:
            log.warning("follower inbox trim failed: %s", exc)
        await asyncio.sleep(interval_seconds)
