"""A broken store is never served as healthy: corrupt files are refused (or set aside loudly), an
emptied or replaced inbox is noticed by the ledger it pairs with, a full disk makes /readyz 503 until
a commit succeeds again, and none of it ends in a traceback."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from remediation.engine import build_engine
from remediation.errors import StoreCorrupt, StoreError
from remediation.inbox import Inbox
from remediation.intake import parse_notification
from remediation.metrics import RemediationMetrics
from remediation.settings import EngineSettings
from remediation.sqlitedb import is_corruption
from tests.fakes.clock import FakeClock
from tests.fakes.intake import (
    FakeEngine,
    Harness,
    alert,
    count_rows,
    make_settings,
    notification,
    start_harness,
)


async def _fill_inbox(path: Path, alerts: int, processed: int = 0) -> None:
    """An inbox file with this many rows (enough for many pages), the first `processed` of them done."""
    inbox = Inbox(path)
    await inbox.start()
    try:
        for start in range(0, alerts, 100):
            batch = [alert(fingerprint=f"{i:016x}", summary="x" * 300) for i in range(start, start + 100)]
            await inbox.ingest(parse_notification(json.dumps(notification(batch)).encode(), 1.0), 10**6)
        if processed:
            await inbox.mark_processed(list(range(1, processed + 1)), 2.0)
    finally:
        await inbox.close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything into the main file
    conn.close()


def _garbage_over_middle_pages(path: Path, pages: int = 8) -> None:
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.seek((size // 2) // 4096 * 4096)
        f.write(os.urandom(4096 * pages))


def _remove_db(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


async def _service(tmp_path: Path, **overrides: object) -> Harness:
    return await start_harness(make_settings(tmp_path, **overrides))


async def _stop(h: Harness) -> None:
    await h.session.close()
    await h.service.stop()


async def test_an_inbox_with_garbage_over_middle_pages_is_refused_naming_the_file(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    await _fill_inbox(settings.inbox_path, 2000)
    _garbage_over_middle_pages(settings.inbox_path)
    with pytest.raises(StoreCorrupt, match=r"inbox\.db: integrity check failed"):
        await start_harness(settings)


async def test_a_corrupt_inbox_can_be_set_aside_loudly_and_the_loss_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(tmp_path, storage_on_corrupt="recreate")
    await _fill_inbox(settings.inbox_path, 2000, processed=500)
    await _stop(await start_harness(make_settings(tmp_path)))  # the ledger pairs with this inbox
    _garbage_over_middle_pages(settings.inbox_path, pages=2)
    with caplog.at_level(logging.ERROR, logger="remediation.server"):
        h = await start_harness(settings)
    try:
        aside = [p.name for p in settings.inbox_path.parent.glob("inbox.db.corrupt-*")]
        assert len([n for n in aside if not n.endswith(("-wal", "-shm"))]) == 1, aside
        message = next(r.getMessage() for r in caplog.records if "was corrupt" in r.getMessage())
        assert h.metrics.inbox_recreated._value.get() == 1
        lost = int(h.metrics.inbox_alerts_lost._value.get())
        # the unprocessed rows the damaged file still shows are reported, in the log and the metric
        assert 0 < lost <= 1500
        assert f"{lost} accepted alerts not yet processed are lost" in message
        assert count_rows(h.inbox_path) == 0
        assert (await h.post_alerts(notification([alert(fingerprint="after")]))).status == 200
    finally:
        await _stop(h)


@pytest.mark.parametrize("damage", ["truncated", "deleted", "replaced"])
async def test_an_emptied_or_replaced_inbox_is_detected_by_the_ledger(tmp_path: Path, damage: str) -> None:
    settings = make_settings(tmp_path)
    h = await start_harness(settings)
    assert (await h.post_alerts(notification([alert(fingerprint="accepted")]))).status == 200
    await _stop(h)
    if damage == "replaced":
        other = make_settings(tmp_path / "other")
        await _stop(await start_harness(other))
        _remove_db(settings.inbox_path)
        shutil.copy(other.inbox_path, settings.inbox_path)
    else:
        _remove_db(settings.inbox_path)
        if damage == "truncated":
            settings.inbox_path.write_bytes(b"")
    with pytest.raises(StoreError, match=r"not the one this ledger paired with.*--storage\.accept-new-inbox"):
        await start_harness(settings)
    # the operator acknowledges the loss: the ledger pairs with the new inbox and says so
    h = await start_harness(make_settings(tmp_path, storage_accept_new_inbox=True))
    await _stop(h)
    await _stop(await start_harness(settings))  # and from then on it is the inbox


async def test_a_corrupt_ledger_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "gpupulse.db"
    db.write_bytes(b"this is not a database" * 500)
    with pytest.raises(StoreCorrupt, match=r"gpupulse\.db: file is not a database"):
        build_engine(EngineSettings(backend="none"), db, RemediationMetrics(), FakeClock())


async def test_a_ledger_with_damaged_pages_is_refused_before_any_engine_runs(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    await _stop(await start_harness(settings))
    conn = sqlite3.connect(settings.db_path)
    conn.execute("CREATE TABLE filler (x TEXT)")
    conn.executemany("INSERT INTO filler VALUES (?)", [("y" * 500,) for _ in range(3000)])
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    _garbage_over_middle_pages(settings.db_path)
    engine = FakeEngine()
    with pytest.raises(StoreCorrupt, match=r"gpupulse\.db"):
        await start_harness(settings, engine=engine)


def _serve(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "remediation",
            "serve",
            "--insecure-no-auth",
            "--web.listen-address=127.0.0.1:0",
            f"--storage.path={tmp_path}",
            "--backend=none",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUPULSE_")},
    )


@pytest.mark.integration
@pytest.mark.parametrize("which", ["gpupulse.db", "inbox.db"])
def test_serve_exits_with_a_message_not_a_traceback_on_a_corrupt_store(tmp_path: Path, which: str) -> None:
    (tmp_path / which).write_bytes(b"garbage, not SQLite " * 400)
    done = _serve(tmp_path)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert f"{which}: file is not a database" in done.stderr


async def _limit_writer_pages(h: Harness, extra_pages: int) -> None:
    """Make the inbox's write connection behave like a full disk (SQLite's own SQLITE_FULL)."""

    def job(conn: sqlite3.Connection, tx: object) -> None:
        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
        conn.execute(f"PRAGMA max_page_count = {pages + extra_pages}")

    await h.service.ctl.inbox._write(job)


async def _space_returns_behind_the_inbox(h: Harness) -> None:
    """Lift the limit in a transaction that fails itself: no commit succeeds, as when an operator
    frees space while no webhook arrives; only the worker's probe can notice."""

    def job(conn: sqlite3.Connection, tx: object) -> None:
        conn.execute("PRAGMA max_page_count = 1073741823")
        raise sqlite3.OperationalError("database or disk is full")

    with pytest.raises(StoreError):
        await h.service.ctl.inbox._write(job)


async def test_a_full_disk_makes_readyz_503_and_it_comes_back_within_a_tick(tmp_path: Path) -> None:
    h = await _service(tmp_path)
    try:
        assert (await h.post_alerts(notification([alert(fingerprint="before")]))).status == 200
        await _limit_writer_pages(h, 0)
        big = [alert(fingerprint=f"{i:016x}", summary="z" * 2000) for i in range(50)]
        reply = await h.post_alerts(notification(big))
        assert reply.status == 503 and reply.headers["Retry-After"] == "5"
        ready = await h.session.get(f"{h.url}/readyz")
        assert ready.status == 503
        assert "cannot commit" in (await ready.json())["reason"]
        assert h.metrics.inbox_writable._value.get() == 0
        await _space_returns_behind_the_inbox(h)
        worker = h.service.ctl.worker
        ticks = worker.ticks
        await worker.wait_until(lambda: worker.ticks >= ticks + 1, 5)
        assert (await h.session.get(f"{h.url}/readyz")).status == 200
        assert (await h.post_alerts(notification(big))).status == 200
        # nothing accepted was lost: the row from before and the 50 after
        assert count_rows(h.inbox_path) == 51
        await h.engine.wait_for(lambda: len(h.engine.handled) == 51)
    finally:
        await _stop(h)


async def test_healthz_fails_once_sqlite_reports_the_inbox_damaged(tmp_path: Path) -> None:
    h = await _service(tmp_path)
    try:
        assert (await h.session.get(f"{h.url}/healthz")).status == 200
        damaged = tmp_path / "damaged.db"
        await _fill_inbox(damaged, 2000)
        _garbage_over_middle_pages(damaged)
        # the reader meets the damage the way a live process would: SQLite's own error on a read
        h.service.ctl.inbox._reader.conn = sqlite3.connect(damaged, check_same_thread=False)  # type: ignore[union-attr]
        with pytest.raises(StoreError, match="malformed"):
            await h.service.ctl.inbox.count("labels LIKE '%x%'")
        health = await h.session.get(f"{h.url}/healthz")
        assert health.status == 503
        assert (await h.session.get(f"{h.url}/readyz")).status == 503
    finally:
        await _stop(h)


def test_corruption_is_told_apart_from_a_full_disk(tmp_path: Path) -> None:
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorname = "SQLITE_FULL"
    assert not is_corruption(full)
    path = tmp_path / "x.db"
    path.write_bytes(b"x" * 8192)
    with pytest.raises(sqlite3.DatabaseError) as raised:
        sqlite3.connect(path).execute("SELECT * FROM sqlite_master")
    assert is_corruption(raised.value)


class FullDiskEngine(FakeEngine):
    """An engine whose own SQLite file is full for the first `failures` calls."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def handle(self, event: object) -> None:
        if self.failures > 0:
            self.failures -= 1
            self.calls.append(event)  # type: ignore[arg-type]
            raise sqlite3.OperationalError("database or disk is full")
        await super().handle(event)  # type: ignore[arg-type]


async def test_an_engine_store_failure_is_retried_each_tick_without_growing_backoff(tmp_path: Path) -> None:
    # backoff would reach the 300 s cap after a few failures; a full disk is not the alert's fault
    settings = make_settings(tmp_path, worker_retry_initial_seconds=30.0, worker_retry_max_seconds=300.0)
    engine = FullDiskEngine(failures=5)
    h = await start_harness(settings, engine=engine)
    try:
        assert (await h.post_alerts(notification([alert(fingerprint="waits")]))).status == 200
        worker = h.service.ctl.worker
        await worker.wait_until(lambda: worker.marked == 1, 10)
        assert len(engine.calls) == 6
        assert count_rows(h.inbox_path, "attempts = 0 AND processed_at IS NOT NULL") == 1
    finally:
        await _stop(h)
