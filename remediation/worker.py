"""Feeds the inbox to the engine in order, marks rows processed, retries failures, ticks the engine.

Ordering is per alert fingerprint: a row that failed and is backing off holds back the later rows of
the same alert (so the engine never sees `resolved` before the `firing` it resolves), while other
alerts keep flowing. Rows are marked processed after `engine.handle` returns; a crash in between
replays them on start, which the engine tolerates because handle is idempotent on dedup_key.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpupulse.clock import Clock, SystemClock
from remediation.errors import StoreError

from .inbox import Inbox
from .metrics import RemediationMetrics
from .model import AlertEvent, Engine

log = logging.getLogger(__name__)

BATCH_ROWS = 256
FRESH_CAP_WHILE_BACKLOG = 10_000


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


async def _settled_within(call: asyncio.Future[None], timeout_seconds: float) -> None:
    """Wait until `call` is done or the timeout passes, never cancelling it (asyncio.wait without
    its set bookkeeping: this runs once per alert)."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(*_: object) -> None:
        if not waiter.done():
            waiter.set_result(None)

    timer = loop.call_later(timeout_seconds, wake)
    call.add_done_callback(wake)
    try:
        await waiter
    finally:
        timer.cancel()
        call.remove_done_callback(wake)


class Worker:
    """One asyncio task that drains the inbox into the engine and calls engine.tick() on schedule."""

    def __init__(
        self,
        inbox: Inbox,
        engine: Engine,
        metrics: RemediationMetrics,
        settings: WorkerSettings | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.inbox = inbox
        self.engine = engine
        self.metrics = metrics
        self.settings = settings or WorkerSettings()
        self.clock = clock or SystemClock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.handled = 0
        self.failures = 0
        self.ticks = 0
        self.last_error = ""
        self.marked = 0  # rows marked processed by this worker
        self.late_calls: set[asyncio.Future[None]] = set()  # handle calls that overran the timeout
        self._progress = asyncio.Condition()
        # rows handed over by intake after commit (heap by inbox id); used only while _backlog is False
        self._fresh: list[tuple[int, AlertEvent]] = []
        # True while the inbox may hold due rows that are not in _fresh: at start and after failures
        self._backlog = True
        self._fresh_lossy = False
        # lost hand-over check: the inbox's written_upto at the last tick that saw unexplained
        # pending rows; rows up to it still pending one tick later were never handed over
        self._suspect_upto: int | None = None
        # the gauge reads the writer's exact count at scrape time
        metrics.queue_depth.set_function(lambda: float(inbox.pending))

    def start(self) -> None:
        """Start draining (rows left over from a previous run are processed first)."""
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="gpupulse-remediation-worker")

    def wake(self) -> None:
        """New rows were committed: process them now instead of at the next tick."""
        self._wake.set()

    def rescan(self) -> None:
        """Read the inbox itself on the next pass: rows may exist that were never handed over
        in memory (another replica committed them to a shared inbox)."""
        self._backlog = True
        self._wake.set()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def crashed(self) -> bool:
        """True when the drain loop ended by itself (a bug), not through stop()."""
        return self._task is not None and self._task.done() and not self._stopping

    async def stop(self, timeout_seconds: float = 10.0) -> None:
        """Finish the row in progress (within the timeout), then stop."""
        for late in list(self.late_calls):  # shutting down: the engine recovers on the next start
            late.cancel()
        if self._task is None:
            return
        self._stopping = True
        self._wake.set()
        task, self._task = self._task, None
        if task.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout_seconds)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _late_call_done(self, call: asyncio.Future[None]) -> None:
        self.late_calls.discard(call)
        if not call.cancelled() and call.exception() is not None:
            log.warning("a late engine.handle call failed: %s", call.exception())

    async def _notify(self) -> None:
        async with self._progress:
            self._progress.notify_all()

    async def wait_until(self, predicate: Callable[[], bool], within_seconds: float) -> None:
        """Wait until predicate() holds, re-checked after every commit the worker makes."""
        async with self._progress:
            await asyncio.wait_for(self._progress.wait_for(predicate), within_seconds)

    def submit(self, rows: Sequence[tuple[int, AlertEvent]]) -> None:
        """Rows just committed by intake, handed over in memory so the fast path skips a DB read."""
        for item in rows:
            if self._backlog and len(self._fresh) >= FRESH_CAP_WHILE_BACKLOG:
                self._fresh_lossy = True  # memory stays bounded; the inbox still has every row
            else:
                heapq.heappush(self._fresh, item)
        self._wake.set()

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
                self._backlog = True
            now = time.monotonic()
            if now >= next_tick:
                await self._tick()
                next_tick = now + self.settings.tick_interval_seconds
                if await self._lost_hand_over():
                    # committed rows that never reached submit(): let the next pass read the inbox
                    self._backlog = True
                    more = True
            if now >= next_prune:
                await self._prune()
                next_prune = now + self.settings.prune_interval_seconds
            if more or self._stopping:
                continue
            timeout = next_tick - time.monotonic()
            if self._backlog:
                timeout = min(timeout, await self._until_next_retry())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, timeout)):
                    await self._wake.wait()

    async def _lost_hand_over(self) -> bool:
        """True when rows committed before the previous tick are pending but were never handed
        over. Checked across two ticks: a hand-over in flight right now (committed, submit() not yet
        called) is normal and must not cost an inbox read."""
        if self._backlog or self._fresh or self.inbox.pending == 0:
            self._suspect_upto = None
            return False
        suspect, self._suspect_upto = self._suspect_upto, self.inbox.written_upto
        if suspect is None:
            return False
        try:
            lost = await self.inbox.has_pending_upto(suspect)
        except StoreError:
            lost = True  # the inbox read that follows reports the error and retries
        if lost:
            self._suspect_upto = None
        return lost

    async def _until_next_retry(self) -> float:
        try:
            due = await self.inbox.next_due()
        except StoreError:
            return self.settings.tick_interval_seconds
        if due is None:
            return float("inf")
        return max(0.0, due - self.clock.time())

    async def _tick(self) -> None:
        if not self.inbox.writable and self.inbox.running:
            # nothing else commits while /readyz is 503 (no webhooks arrive): a probe write tells
            # when the disk has room again, so readiness returns within one tick
            try:
                await self.inbox.probe()
                log.warning("inbox commits again")
            except StoreError as e:
                log.debug("inbox still cannot commit: %s", e)
        try:
            async with asyncio.timeout(self.settings.handle_timeout_seconds):
                await self.engine.tick()
            self.ticks += 1
        except Exception:
            log.exception("engine.tick failed")
        await self._notify()

    async def _prune(self) -> None:
        try:
            removed = await self.inbox.prune(self.clock.time() - self.settings.retention_seconds)
            if removed:
                log.info("pruned %d processed inbox rows", removed)
        except StoreError as e:
            log.warning("inbox prune failed: %s", e)

    async def drain_once(self) -> bool:
        """Process one batch; True when more rows may be waiting right away."""
        if self._backlog:
            return await self._drain_inbox()
        return await self._drain_fresh()

    async def _drain_fresh(self) -> bool:
        """Fast path: rows submitted in memory, in id order, while nothing is backing off."""
        batch = [heapq.heappop(self._fresh) for _ in range(min(BATCH_ROWS, len(self._fresh)))]
        done: list[int] = []
        try:
            for row_id, event in batch:
                if self._stopping:
                    break
                if not await self._handle(row_id, event, attempts_before=0):
                    # from here on the inbox decides what is due and what is held back
                    self._backlog = True
                    self._fresh.clear()
                    break
                done.append(row_id)
        finally:
            await self._mark(done)
        return bool(self._fresh) or self._backlog

    async def _drain_inbox(self) -> bool:
        """Slow path: rows read from the inbox (after a start, a failure, or a lost hand-over)."""
        rows, waiting, max_id = await self.inbox.load_ready(self.clock.time(), BATCH_ROWS)
        if not rows and not waiting:
            if self._fresh_lossy:  # some hand-overs were dropped: start over with one more read
                self._fresh_lossy = False
                self._fresh.clear()
                return True
            # everything committed up to max_id is processed; newer rows are (or will be) in _fresh
            self._backlog = False
            self._fresh = [item for item in self._fresh if item[0] > max_id]
            heapq.heapify(self._fresh)
            return bool(self._fresh)
        held = dict(waiting)  # fingerprint → first row id that must go before later ones
        done: list[int] = []
        try:
            for row in rows:
                if self._stopping:
                    break
                first_held = held.get(row.fingerprint)
                if first_held is not None and first_held < row.id:
                    continue
                if await self._handle(row.id, row.to_event(), row.attempts):
                    done.append(row.id)
                else:
                    held.setdefault(row.fingerprint, row.id)
        finally:
            await self._mark(done)
        # a batch of which nothing could run (all held back) must not spin; the retry timer wakes us
        return bool(done)

    async def _mark(self, done: list[int]) -> None:
        # one commit per batch; a crash before it replays these rows (handle is idempotent)
        if done:
            await self.inbox.mark_processed(done, self.clock.time())
            self.marked += len(done)
            await self._notify()

    async def _handle(self, row_id: int, event: AlertEvent, attempts_before: int) -> bool:
        # a call that overruns is left running, never cancelled: a decision may already be committed
        # and cancelling could drop the effects that follow it; the retry meets the engine's dedup
        call = asyncio.ensure_future(self.engine.handle(event))
        if not call.done():
            await _settled_within(call, self.settings.handle_timeout_seconds)
        error: BaseException | None
        if call.done():
            error = call.exception()
        else:
            self.late_calls.add(call)
            call.add_done_callback(self._late_call_done)
            error = TimeoutError(
                f"engine.handle still running after {self.settings.handle_timeout_seconds} s"
            )
        if error is not None:
            attempts = attempts_before + 1
            delay = backoff_seconds(
                attempts, self.settings.retry_initial_seconds, self.settings.retry_max_seconds
            )
            if isinstance(error, sqlite3.OperationalError | StoreError):
                # the engine's store failed (disk full, locked), not this alert: retry at the next
                # tick without growing the backoff, so the queue drains as soon as space returns
                attempts, delay = attempts_before, self.settings.tick_interval_seconds
            self.failures += 1
            self.last_error = f"{type(error).__name__}: {error}"
            log.warning(
                "engine.handle failed for inbox row %d (%s), attempt %d, retry in %.1f s: %s",
                row_id,
                event.dedup_key,
                attempts,
                delay,
                self.last_error,
                exc_info=error if not isinstance(error, TimeoutError) else None,
            )
            await self.inbox.mark_failed(row_id, self.last_error, attempts, self.clock.time() + delay)
            await self._notify()
            return False
        self.handled += 1
        return True
