"""Durable inbox of accepted alerts in SQLite (WAL), written by one thread with group commit.

Both SQLite files are opened with `remediation.sqlitedb.open_db`. The intake owns the `inbox`
table: one row per (fingerprint, starts_at, status), so a re-delivered notification is stored once.
All SQLite work runs on two dedicated threads (one writer, one reader); the event loop only awaits
futures. Concurrent writes are batched into one transaction (one fsync) per writer wake-up.

Longer than our ~500-line mark on purpose: the Inbox API, the writer thread's group commit, the
reader thread and the shared deadline timer exchange private job and transaction types (_Job, _Tx)
whose settle/timeout rules must be read together; splitting them would export those internals.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import sqlite3
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import orjson

from remediation.errors import QueueFull, StoreCorrupt, StoreError
from remediation.sqlitedb import check_integrity, is_corruption, open_db, set_aside

from .model import AlertEvent, AlertStatus

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_BATCH_JOBS = 1024
COMMIT_DELAY_SECONDS = 0.001

SCHEMA = """
CREATE TABLE IF NOT EXISTS inbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    fingerprint TEXT NOT NULL,
    starts_at TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('firing', 'resolved')),
    ends_at TEXT,
    labels TEXT NOT NULL,
    annotations TEXT NOT NULL,
    generator_url TEXT NOT NULL,
    receiver TEXT NOT NULL,
    group_key TEXT NOT NULL,
    received_at REAL NOT NULL,
    raw TEXT NOT NULL,
    processed_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL DEFAULT 0,
    last_error TEXT,
    UNIQUE (fingerprint, starts_at, status)
);
CREATE INDEX IF NOT EXISTS inbox_unprocessed ON inbox (id) WHERE processed_at IS NULL;
CREATE INDEX IF NOT EXISTS inbox_processed_at ON inbox (processed_at) WHERE processed_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS inbox_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


def canonical_json(value: Any) -> str:
    """Compact JSON with sorted keys (orjson; the standard encoder for what orjson refuses, such as
    integers beyond 64 bits)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return json.dumps(value, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class RecreatedInbox:
    """What was lost when a corrupt inbox was set aside and replaced by an empty one."""

    set_aside_as: Path
    # unprocessed alerts the damaged file still showed; None when it could not be read at all
    lost_alerts: int | None
    reason: str


@dataclass(frozen=True)
class InboxRecord:
    """One alert ready to be stored (built by intake from a validated payload)."""

    fingerprint: str
    status: AlertStatus
    starts_at: str  # normalised: UTC, datetime.isoformat()
    ends_at: str | None
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    generator_url: str
    receiver: str
    group_key: str
    received_at: float
    raw: str
    # the parsed forms of starts_at and ends_at, kept so the hand-over to the worker skips a re-parse
    starts: datetime | None = field(default=None, compare=False, repr=False)
    ends: datetime | None = field(default=None, compare=False, repr=False)

    def to_event(self, inbox_id: int) -> AlertEvent:
        """The engine's view of this record once stored as row `inbox_id`."""
        starts = self.starts if self.starts is not None else datetime.fromisoformat(self.starts_at)
        ends = self.ends
        if ends is None and self.ends_at is not None:
            ends = datetime.fromisoformat(self.ends_at)
        return AlertEvent(
            fingerprint=self.fingerprint,
            status=self.status,
            labels=self.labels,
            annotations=self.annotations,
            starts_at=starts,
            ends_at=ends,
            generator_url=self.generator_url,
            receiver=self.receiver,
            group_key=self.group_key,
            received_at=datetime.fromtimestamp(self.received_at, tz=UTC),
            inbox_id=inbox_id,
        )


@dataclass(frozen=True)
class InboxRow:
    """One stored alert as the worker reads it back."""

    id: int
    fingerprint: str
    status: AlertStatus
    starts_at: str
    ends_at: str | None
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    generator_url: str
    receiver: str
    group_key: str
    received_at: float
    attempts: int
    next_attempt_at: float

    def to_event(self) -> AlertEvent:
        """The engine's view of this row."""
        return AlertEvent(
            fingerprint=self.fingerprint,
            status=self.status,
            labels=dict(self.labels),
            annotations=dict(self.annotations),
            starts_at=datetime.fromisoformat(self.starts_at),
            ends_at=datetime.fromisoformat(self.ends_at) if self.ends_at else None,
            generator_url=self.generator_url,
            receiver=self.receiver,
            group_key=self.group_key,
            received_at=datetime.fromtimestamp(self.received_at, tz=UTC),
            inbox_id=self.id,
        )


@dataclass(frozen=True)
class IngestResult:
    inserted_by_status: Mapping[str, int]
    duplicates: int
    # inbox id of each input record, None where it was a duplicate (a re-queued duplicate has its id)
    ids: Sequence[int | None] = ()
    # duplicates queued again because their stored copy was processed long ago
    requeued: int = 0

    @property
    def inserted(self) -> int:
        return sum(self.inserted_by_status.values())


class _Tx:
    """State a writer job sees: the pending count including earlier jobs of this batch."""

    def __init__(self, pending: int) -> None:
        self.pending = pending


class _Job(Generic[T]):
    def __init__(self, fn: Callable[[sqlite3.Connection, _Tx], T], loop: asyncio.AbstractEventLoop) -> None:
        self.fn = fn
        self.loop = loop
        self.future: asyncio.Future[T] = loop.create_future()

    def settle(self, result: T | None, exc: BaseException | None) -> None:
        self.loop.call_soon_threadsafe(self.resolve, result, exc)

    def resolve(self, result: T | None, exc: BaseException | None) -> None:
        """Set the outcome; runs on the event loop."""
        if self.future.done():  # the caller gave up waiting (timeout); the outcome is in the DB anyway
            return
        if exc is not None:
            self.future.set_exception(exc)
        else:
            self.future.set_result(cast(T, result))


_STOP = object()


class _WriterThread(threading.Thread):
    """Runs write jobs; every job queued while the previous commit ran goes into the next transaction."""

    def __init__(self, conn: sqlite3.Connection, pending: int) -> None:
        super().__init__(name="gpupulse-inbox-writer", daemon=True)
        self.conn = conn
        self.pending = pending
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.batches = 0
        self.jobs_done = 0
        self.last_batch_size = 0
        self.commit_delay_seconds = COMMIT_DELAY_SECONDS
        # why the last transaction failed; "" once one commits again (readiness reads it)
        self.failure = ""
        self.corrupt = False

    def _failed(self, error: BaseException) -> None:
        self.failure = f"{type(error).__name__}: {error}"
        if is_corruption(error):
            self.corrupt = True

    def run(self) -> None:
        stopping = False
        while not stopping:
            first = self.jobs.get()
            if first is _STOP:
                break
            batch: list[_Job[Any]] = [first]
            # under load (the last batch had company) wait a moment for more jobs: fewer, larger
            # transactions cost less CPU per alert; an idle controller commits at once
            deadline = time.monotonic() + (self.commit_delay_seconds if self.last_batch_size > 1 else 0.0)
            while len(batch) < MAX_BATCH_JOBS:
                try:
                    remaining = deadline - time.monotonic()
                    nxt = self.jobs.get(timeout=remaining) if remaining > 0 else self.jobs.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stopping = True
                    break
                batch.append(nxt)
            self.last_batch_size = len(batch)
            self._run_batch(batch)
        self.conn.close()

    def _run_batch(self, batch: list[_Job[Any]]) -> None:
        tx = _Tx(self.pending)
        outcomes: list[tuple[_Job[Any], Any, BaseException | None]] = []
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            self._failed(e)
            for job in batch:
                job.settle(None, StoreError(f"begin failed: {e}"))
            return
        for job in batch:
            try:
                result = job.fn(self.conn, tx)
            except QueueFull as e:  # raised before the job wrote anything: only this job fails
                outcomes.append((job, None, e))
                continue
            except BaseException as e:
                # no savepoint per job (they cost a statement each): an unexpected failure fails the
                # whole batch, and every caller gets a retryable error
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("ROLLBACK")
                self._failed(e)
                err = e if isinstance(e, StoreError) else StoreError(f"{type(e).__name__}: {e}")
                _settle_all([(j, None, err) for j in batch])
                return
            outcomes.append((job, result, None))
        try:
            self.conn.execute("COMMIT")
        except sqlite3.Error as e:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")
            self._failed(e)
            with contextlib.suppress(sqlite3.Error):
                self.pending = _count_pending(self.conn)
            _settle_all([(j, None, StoreError(f"commit failed: {e}")) for j in batch])
            return
        self.pending = tx.pending
        self.failure = ""
        self.batches += 1
        self.jobs_done += len(batch)
        _settle_all(outcomes)


def _settle_all(outcomes: list[tuple[_Job[Any], Any, BaseException | None]]) -> None:
    """Hand a whole batch's outcomes to each loop with one wake-up (not one per job)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Job[Any], Any, BaseException | None]]] = {}
    for outcome in outcomes:
        by_loop.setdefault(outcome[0].loop, []).append(outcome)
    for loop, items in by_loop.items():
        loop.call_soon_threadsafe(_resolve_all, items)


def _resolve_all(items: list[tuple[_Job[Any], Any, BaseException | None]]) -> None:
    for job, result, exc in items:
        job.resolve(result, exc)


class _Deadlines:
    """Fails jobs the database threads have not answered within the timeout. Every job has the same
    timeout, so deadlines come in submission order and one timer serves all jobs in flight (a timer
    per job cost more than the rest of the hand-over)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_seconds: float) -> None:
        self.loop = loop
        self.timeout_seconds = timeout_seconds
        self.jobs: deque[tuple[float, _Job[Any]]] = deque()
        self.timer: asyncio.TimerHandle | None = None

    def watch(self, job: _Job[Any]) -> None:
        jobs = self.jobs
        while jobs and jobs[0][1].future.done():  # answered jobs leave from the front
            jobs.popleft()
        jobs.append((self.loop.time() + self.timeout_seconds, job))
        if self.timer is None:
            self.timer = self.loop.call_at(jobs[0][0], self._expire)

    def _expire(self) -> None:
        self.timer = None
        now = self.loop.time()
        while self.jobs:
            deadline, job = self.jobs[0]
            if not job.future.done():
                if deadline > now:
                    self.timer = self.loop.call_at(deadline, self._expire)
                    return
                job.future.set_exception(StoreError(f"inbox did not answer within {self.timeout_seconds} s"))
            self.jobs.popleft()


class _ReaderThread(threading.Thread):
    """Runs read jobs one at a time on its own connection (WAL readers never block the writer)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__(name="gpupulse-inbox-reader", daemon=True)
        self.conn = conn
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.corrupt = False

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is _STOP:
                break
            try:
                job.settle(job.fn(self.conn, _Tx(0)), None)
            except BaseException as e:
                if is_corruption(e):
                    self.corrupt = True
                job.settle(None, StoreError(str(e)))
        self.conn.close()


def _identity(conn: sqlite3.Connection) -> str:
    row = conn.execute("SELECT value FROM inbox_meta WHERE key = 'id'").fetchone()
    if row is not None:
        return str(row[0])
    identity = uuid.uuid4().hex
    conn.execute(
        "INSERT INTO inbox_meta (key, value) VALUES ('id', ?), ('created_at', ?)",
        (identity, str(time.time())),
    )
    return identity


def _count_salvageable(path: Path) -> int | None:
    """Unprocessed rows a damaged inbox still shows (a lower bound of what is lost), None if unreadable."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return None
    try:
        return _count_pending(conn)
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def _count_pending(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM inbox WHERE processed_at IS NULL").fetchone()
    return int(row[0])


_INSERT = (
    "INSERT INTO inbox (fingerprint, starts_at, status, ends_at, labels, annotations, generator_url,"
    " receiver, group_key, received_at, raw) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (fingerprint, starts_at, status) DO NOTHING"
)
_REQUEUE = (
    "UPDATE inbox SET received_at = ?, processed_at = NULL, attempts = 0, next_attempt_at = 0,"
    " last_error = NULL WHERE fingerprint = ? AND starts_at = ? AND status = 'firing'"
    " AND processed_at IS NOT NULL AND received_at < ? RETURNING id"
)
_ROW_COLUMNS = (
    "id, fingerprint, status, starts_at, ends_at, labels, annotations, generator_url, receiver,"
    " group_key, received_at, attempts, next_attempt_at"
)


def _row(r: Sequence[Any]) -> InboxRow:
    return InboxRow(
        id=r[0],
        fingerprint=r[1],
        status=r[2],
        starts_at=r[3],
        ends_at=r[4],
        labels=orjson.loads(r[5]),
        annotations=orjson.loads(r[6]),
        generator_url=r[7],
        receiver=r[8],
        group_key=r[9],
        received_at=r[10],
        attempts=r[11],
        next_attempt_at=r[12],
    )


class Inbox:
    """The durable queue between the webhook and the engine."""

    def __init__(self, path: Path, synchronous: str = "FULL", timeout_seconds: float = 5.0) -> None:
        self.path = path
        self.synchronous = synchronous
        self.timeout_seconds = timeout_seconds
        self._writer: _WriterThread | None = None
        self._reader: _ReaderThread | None = None
        # highest row id ingest has written (set in the writer thread, so a caller cancelled
        # between commit and hand-over still moves it); the worker's lost-hand-over check uses it
        self.written_upto = 0
        self._deadlines: _Deadlines | None = None
        # random id written into the file when it is created: the ledger remembers the inbox it
        # pairs with, so an emptied, truncated or replaced inbox is noticed
        self.identity = ""

    async def start(self, on_corrupt: str = "refuse") -> RecreatedInbox | None:
        """Open the database after an integrity check, create the inbox tables, start both threads.

        A corrupt file raises StoreCorrupt, or with on_corrupt="recreate" is moved aside and replaced by
        an empty inbox; the return value then says what was lost (the caller logs and counts it).
        """
        if on_corrupt not in ("refuse", "recreate"):
            raise ValueError(f"on_corrupt must be refuse or recreate, not {on_corrupt!r}")
        recreated: RecreatedInbox | None = None
        try:
            opened = await asyncio.wait_for(asyncio.to_thread(self._open), self.timeout_seconds * 4)
        except StoreCorrupt as e:
            if on_corrupt != "recreate":
                raise
            lost = await asyncio.to_thread(_count_salvageable, self.path)
            aside = await asyncio.to_thread(set_aside, self.path, time.time())
            recreated = RecreatedInbox(aside, lost, str(e))
            opened = await asyncio.wait_for(asyncio.to_thread(self._open), self.timeout_seconds * 4)
        wconn, rconn, pending, self.identity = opened
        self._writer = _WriterThread(wconn, pending)
        self._reader = _ReaderThread(rconn)
        self._writer.start()
        self._reader.start()
        return recreated

    def _open(self) -> tuple[sqlite3.Connection, sqlite3.Connection, int, str]:
        try:
            wconn = open_db(self.path, self.synchronous)
        except StoreCorrupt:
            raise
        except (sqlite3.Error, OSError) as e:
            raise StoreError(f"cannot open {self.path}: {e}") from e
        try:
            check_integrity(wconn, self.path)
            wconn.executescript(SCHEMA)
            identity = _identity(wconn)
            pending = _count_pending(wconn)
            rconn = open_db(self.path, self.synchronous)
        except StoreError:
            wconn.close()
            raise
        except (sqlite3.Error, OSError) as e:
            wconn.close()
            if is_corruption(e):
                raise StoreCorrupt(f"{self.path}: {e}") from e
            raise StoreError(f"cannot open {self.path}: {e}") from e
        return wconn, rconn, pending, identity

    async def close(self) -> None:
        """Finish queued writes, then stop both threads."""
        for t in (self._writer, self._reader):
            if t is not None and t.is_alive():
                t.jobs.put(_STOP)
                await asyncio.to_thread(t.join, self.timeout_seconds * 4)
        self._writer = self._reader = None

    @property
    def running(self) -> bool:
        return self._writer is not None and self._writer.is_alive()

    @property
    def writable(self) -> bool:
        """False from a failed transaction until the next commit (a webhook's or probe()'s)."""
        return self.running and self._writer is not None and not self._writer.failure

    @property
    def failure(self) -> str:
        """Why the last transaction failed ("" when the last one committed)."""
        return self._writer.failure if self._writer is not None else "inbox is not open"

    @property
    def corrupt(self) -> bool:
        """SQLite reported the file damaged while running: only a restart (integrity check) helps."""
        return any(t is not None and t.corrupt for t in (self._writer, self._reader))

    async def probe(self) -> None:
        """Commit a tiny write: how an unwritable inbox (disk full) finds out it can commit again."""
        at = str(time.time())

        def job(conn: sqlite3.Connection, tx: _Tx) -> None:
            conn.execute(
                "INSERT INTO inbox_meta (key, value) VALUES ('probed_at', ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (at,),
            )

        await self._write(job)

    @property
    def pending(self) -> int:
        """Committed rows not yet processed (exact: every write goes through the writer thread)."""
        return self._writer.pending if self._writer is not None else 0

    @property
    def commit_batches(self) -> int:
        return self._writer.batches if self._writer is not None else 0

    async def _submit(
        self, thread: _WriterThread | _ReaderThread | None, fn: Callable[[sqlite3.Connection, _Tx], T]
    ) -> T:
        if thread is None or not thread.is_alive():
            raise StoreError("inbox is not open")
        loop = asyncio.get_running_loop()
        job = _Job(fn, loop)
        thread.jobs.put(job)
        deadlines = self._deadlines
        if deadlines is None or deadlines.loop is not loop:
            deadlines = self._deadlines = _Deadlines(loop, self.timeout_seconds)
        deadlines.watch(job)
        # a job that times out fails here; the thread skips futures that are already settled
        return await job.future

    async def _write(self, fn: Callable[[sqlite3.Connection, _Tx], T]) -> T:
        return await self._submit(self._writer, fn)

    async def _read(self, fn: Callable[[sqlite3.Connection, _Tx], T]) -> T:
        return await self._submit(self._reader, fn)

    async def ingest(
        self, records: Sequence[InboxRecord], max_pending: int, requeue_after_seconds: float = 0.0
    ) -> IngestResult:
        """Store new alerts durably (committed on return); raise QueueFull, storing none, when the
        queue already holds max_pending unprocessed alerts.

        With requeue_after_seconds, a re-sent firing alert whose stored copy was processed and received
        longer ago than that is queued again with the new receive time: Alertmanager's re-sends are
        how an alert that is still firing renews evidence the engine would otherwise think stale.
        """
        params = [
            (
                r.fingerprint,
                r.starts_at,
                r.status,
                r.ends_at,
                canonical_json(r.labels),
                canonical_json(r.annotations),
                r.generator_url,
                r.receiver,
                r.group_key,
                r.received_at,
                r.raw,
            )
            for r in records
        ]

        def job(conn: sqlite3.Connection, tx: _Tx) -> IngestResult:
            # checked before writing (the writer relies on it); one notification may take the queue
            # past the limit by its own size, so a group larger than the limit can still land
            if tx.pending >= max_pending:
                raise QueueFull(f"{tx.pending} alerts pending, limit {max_pending}")
            by_status: dict[str, int] = {}
            ids: list[int | None] = []
            requeued = 0
            for p in params:
                cur = conn.execute(_INSERT, p)
                if cur.rowcount:
                    by_status[p[2]] = by_status.get(p[2], 0) + 1
                    ids.append(cur.lastrowid)
                    continue
                again: tuple[int] | None = None
                if requeue_after_seconds > 0 and p[2] == "firing":
                    received = float(p[9])
                    cutoff = received - requeue_after_seconds
                    again = conn.execute(_REQUEUE, (received, p[0], p[1], cutoff)).fetchone()
                ids.append(int(again[0]) if again else None)
                requeued += 1 if again else 0
            inserted = sum(by_status.values())
            tx.pending += inserted + requeued
            if inserted or requeued:  # a re-queued row is pending again: the safety net must see it
                self.written_upto = max(self.written_upto, max(i for i in ids if i is not None))
            return IngestResult(
                inserted_by_status=by_status, duplicates=len(params) - inserted, ids=ids, requeued=requeued
            )

        return await self._write(job)

    async def mark_processed(self, ids: Sequence[int], at: float) -> None:
        """Record that the engine handled these rows."""
        id_list = list(ids)

        def job(conn: sqlite3.Connection, tx: _Tx) -> None:
            done = conn.executemany(
                "UPDATE inbox SET processed_at = ?, last_error = NULL WHERE id = ? AND processed_at IS NULL",
                [(at, i) for i in id_list],
            ).rowcount
            tx.pending -= done

        await self._write(job)

    async def mark_failed(self, row_id: int, error: str, attempts: int, next_attempt_at: float) -> None:
        """Record a failed attempt; the row stays pending until next_attempt_at."""

        def job(conn: sqlite3.Connection, tx: _Tx) -> None:
            conn.execute(
                "UPDATE inbox SET attempts = ?, next_attempt_at = ?, last_error = ? WHERE id = ?",
                (attempts, next_attempt_at, error[:2000], row_id),
            )

        await self._write(job)

    async def prune(self, processed_before: float) -> int:
        """Delete processed rows older than the retention; returns how many."""

        def job(conn: sqlite3.Connection, tx: _Tx) -> int:
            cur = conn.execute(
                "DELETE FROM inbox WHERE processed_at IS NOT NULL AND processed_at < ?", (processed_before,)
            )
            return int(cur.rowcount)

        return await self._write(job)

    async def load_ready(self, now: float, limit: int) -> tuple[list[InboxRow], dict[str, int], int]:
        """Pending rows due by `now` in id order, per fingerprint the first row still backing off,
        and the highest id in the inbox, all from one snapshot."""

        def job(conn: sqlite3.Connection, tx: _Tx) -> tuple[list[InboxRow], dict[str, int], int]:
            conn.execute("BEGIN")  # one snapshot for both queries
            try:
                rows = conn.execute(
                    f"SELECT {_ROW_COLUMNS} FROM inbox WHERE processed_at IS NULL AND next_attempt_at <= ?"
                    " ORDER BY id LIMIT ?",
                    (now, limit),
                ).fetchall()
                waiting = conn.execute(
                    "SELECT fingerprint, min(id) FROM inbox"
                    " WHERE processed_at IS NULL AND next_attempt_at > ? GROUP BY fingerprint",
                    (now,),
                ).fetchall()
                max_id = conn.execute("SELECT coalesce(max(id), 0) FROM inbox").fetchone()[0]
            finally:
                conn.execute("COMMIT")
            return [_row(r) for r in rows], {fp: int(i) for fp, i in waiting}, int(max_id)

        return await self._read(job)

    async def has_pending_upto(self, row_id: int) -> bool:
        """True when some row with id <= row_id is still unprocessed."""

        def job(conn: sqlite3.Connection, tx: _Tx) -> bool:
            sql = "SELECT 1 FROM inbox WHERE processed_at IS NULL AND id <= ? LIMIT 1"
            return conn.execute(sql, (row_id,)).fetchone() is not None

        return await self._read(job)

    async def next_due(self) -> float | None:
        """The earliest next_attempt_at of any pending row, or None when nothing is pending."""

        def job(conn: sqlite3.Connection, tx: _Tx) -> float | None:
            row = conn.execute("SELECT min(next_attempt_at) FROM inbox WHERE processed_at IS NULL").fetchone()
            return None if row[0] is None else float(row[0])

        return await self._read(job)

    async def count(self, where: str = "1", params: Sequence[Any] = ()) -> int:
        """Row count (for tests and the bench); `where` is code, never user input."""

        def job(conn: sqlite3.Connection, tx: _Tx) -> int:
            return int(conn.execute(f"SELECT count(*) FROM inbox WHERE {where}", tuple(params)).fetchone()[0])

        return await self._read(job)
