"""Feeds the inbox to the engine in order, marks rows processed, retries failures, ticks the engine.

Ordering is per alert fingerprint: a row that failed and is backing off holds back the later rows of
the same alert (so the engine never sees `resolved` before the `firing` it resolves), while other
alerts keep flowing. Rows are marked processed after `engine.handle` returns; a crash in between
replays them on start, which the engine tolerates because handle is idempotent on dedup_key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from .metrics import RemediationMetrics
from .model import Engine
from .store import Inbox, InboxRow, StoreError

log = logging.getLogger(__name__)

BATCH_ROWS = 256


class WallClock(Protocol):
    """Unix time in seconds; tests pass a fake."""

    def time(self) -> float: ...


class SystemWallClock:
    def time(self) -> float:
        return time.time()


@dataclass(frozen=True)
class WorkerSettings:
    tick_interval_seconds: float = 1.0
    handle_timeout_seconds: float = 60.0
    retry_initial_seconds: float = 1.0
    retry_max_seconds: float = 300.0
    retention_seconds: float = 7 * 24 * 3600.0
    prune_interval_seconds: float = 3600.0


def backoff_seconds(attempts: int, initial: float, maximum: float) -> float:
    """Delay before attempt number `attempts + 1`: doubling from `initial`, capped at `maximum`."""
    return float(min(maximum, initial * 2 ** max(0, attempts - 1)))


class Worker:
    """One asyncio task that drains the inbox into the engine and calls engine.tick() on schedule."""

    def __init__(
        self,
        inbox: Inbox,
        engine: Engine,
        metrics: RemediationMetrics,
        settings: WorkerSettings | None = None,
        clock: WallClock | None = None,
    ) -> None:
        self.inbox = inbox
        self.engine = engine
        self.metrics = metrics
        self.settings = settings or WorkerSettings()
        self.clock = clock or SystemWallClock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.handled = 0
        self.failures = 0
        self.ticks = 0
        self.last_error = ""

    def start(self) -> None:
        """Start draining (rows left over from a previous run are processed first)."""
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="gpupulse-remediation-worker")

    def wake(self) -> None:
        """New rows were committed: process them now instead of at the next tick."""
        self._wake.set()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self, timeout_seconds: float = 10.0) -> None:
        """Finish the row in progress (within the timeout), then stop."""
        if self._task is None:
            return
        self._stopping = True
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_seconds)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None

    async def _run(self) -> None:
        next_tick = time.monotonic()
        next_prune = time.monotonic() + 60.0
        while not self._stopping:
            self._wake.clear()
            more = False
            try:
                more = await self.drain_once()
            except StoreError as e:  # the disk may come back; the rows are still there
                log.error("inbox read failed: %s", e)
            now = time.monotonic()
            if now >= next_tick:
                await self._tick()
                next_tick = now + self.settings.tick_interval_seconds
            if now >= next_prune:
                await self._prune()
                next_prune = now + self.settings.prune_interval_seconds
            if more or self._stopping:
                continue
            timeout = max(0.0, min(next_tick - time.monotonic(), await self._until_next_retry()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def _until_next_retry(self) -> float:
        try:
            due = await self.inbox.next_due()
        except StoreError:
            return self.settings.tick_interval_seconds
        if due is None:
            return float("inf")
        return max(0.0, due - self.clock.time())

    async def _tick(self) -> None:
        try:
            await asyncio.wait_for(self.engine.tick(), self.settings.handle_timeout_seconds)
            self.ticks += 1
        except Exception:
            log.exception("engine.tick failed")

    async def _prune(self) -> None:
        try:
            removed = await self.inbox.prune(self.clock.time() - self.settings.retention_seconds)
            if removed:
                log.info("pruned %d processed inbox rows", removed)
        except StoreError as e:
            log.warning("inbox prune failed: %s", e)

    async def drain_once(self) -> bool:
        """Process one batch of due rows; True when a full batch was read (more may be waiting)."""
        rows, waiting = await self.inbox.load_ready(self.clock.time(), BATCH_ROWS)
        held = dict(waiting)  # fingerprint → first row id that must go before later ones
        done: list[int] = []
        try:
            for row in rows:
                if self._stopping:
                    break
                first_held = held.get(row.fingerprint)
                if first_held is not None and first_held < row.id:
                    continue
                if await self._handle(row):
                    done.append(row.id)
                else:
                    held.setdefault(row.fingerprint, row.id)
        finally:
            # one commit for the whole batch; a crash before it replays these rows (handle is idempotent)
            if done:
                await self.inbox.mark_processed(done, self.clock.time())
                self.metrics.queue_depth.set(self.inbox.pending)
        return len(rows) == BATCH_ROWS

    async def _handle(self, row: InboxRow) -> bool:
        event = row.to_event()
        try:
            await asyncio.wait_for(self.engine.handle(event), self.settings.handle_timeout_seconds)
        except Exception as e:
            attempts = row.attempts + 1
            delay = backoff_seconds(attempts, self.settings.retry_initial_seconds, self.settings.retry_max_seconds)
            self.failures += 1
            self.last_error = f"{type(e).__name__}: {e}"
            log.warning(
                "engine.handle failed for inbox row %d (%s), attempt %d, retry in %.1f s: %s",
                row.id,
                event.dedup_key,
                attempts,
                delay,
                self.last_error,
                exc_info=not isinstance(e, TimeoutError),
            )
            await self.inbox.mark_failed(row.id, self.last_error, attempts, self.clock.time() + delay)
            return False
        self.handled += 1
        return True
