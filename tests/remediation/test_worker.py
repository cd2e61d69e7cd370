"""The worker: order, resume after restart, retry with backoff, ticks."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from remediation.inbox import Inbox, InboxRow
from remediation.intake import parse_notification
from remediation.metrics import RemediationMetrics
from remediation.worker import Worker, WorkerSettings, backoff_seconds
from tests.fakes.clock import FakeClock
from tests.fakes.intake import FakeEngine, alert, count_rows, make_settings, notification, start_harness


def _body(*alerts: dict[str, object]) -> bytes:
    import json

    return json.dumps(notification(list(alerts))).encode()


async def _stored_inbox(path: Path, *alerts: dict[str, object]) -> None:
    """Rows left behind by a controller that died before its worker ran."""
    inbox = Inbox(path)
    await inbox.start()
    try:
        await inbox.ingest(parse_notification(_body(*alerts), 1.0), max_pending=100)
    finally:
        await inbox.close()


async def test_worker_resumes_unprocessed_rows_after_restart(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    await _stored_inbox(
        settings.inbox_path,
        alert(fingerprint="f1"),
        alert(fingerprint="f2"),
        alert(fingerprint="f1", status="resolved"),
    )
    assert count_rows(settings.inbox_path, "processed_at IS NULL") == 3
    h = await start_harness(settings)
    try:
        assert h.service.ctl.inbox.pending == 3  # counted from the file at start
        await h.engine.wait_for(lambda: len(h.engine.handled) == 3)
        assert [(e.fingerprint, e.status) for e in h.engine.handled] == [
            ("f1", "firing"),
            ("f2", "firing"),
            ("f1", "resolved"),
        ]
        await h.service.ctl.worker.wait_until(lambda: h.service.ctl.inbox.pending == 0, within_seconds=5)
        assert count_rows(settings.inbox_path, "processed_at IS NULL") == 0
    finally:
        await h.session.close()
        await h.service.stop()


async def test_rows_handled_but_not_yet_marked_are_replayed_and_engine_dedups(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    await _stored_inbox(settings.inbox_path, alert(fingerprint="f1"))
    first = await start_harness(settings)
    await first.engine.wait_for(lambda: len(first.engine.calls) == 1)
    await first.session.close()
    await first.service.stop()
    # simulate a crash between engine.handle and the processed mark
    conn = sqlite3.connect(settings.inbox_path)
    conn.execute("UPDATE inbox SET processed_at = NULL")
    conn.commit()
    conn.close()
    second = await start_harness(settings)
    try:
        await second.engine.wait_for(lambda: len(second.engine.calls) == 1)
        assert second.engine.calls[0].dedup_key == first.engine.calls[0].dedup_key
        assert second.engine.calls[0].inbox_id == first.engine.calls[0].inbox_id
    finally:
        await second.session.close()
        await second.service.stop()


async def test_engine_exception_is_retried_and_not_lost(tmp_path: Path) -> None:
    engine = FakeEngine()
    h = await start_harness(make_settings(tmp_path, worker_retry_initial_seconds=0.05), engine=engine)
    try:
        body = notification([alert(fingerprint="flaky")])
        records = parse_notification(_body(alert(fingerprint="flaky")), 0.0)
        engine.fail_times[f"flaky|{records[0].starts_at}|firing"] = 2
        assert (await h.post_alerts(body)).status == 200
        await engine.wait_for(lambda: len(engine.handled) == 1)
        assert len(engine.calls) == 3
        await h.service.ctl.worker.wait_until(lambda: h.service.ctl.inbox.pending == 0, within_seconds=5)
        assert count_rows(h.inbox_path, "attempts = 2 AND processed_at IS NOT NULL") == 1
    finally:
        await h.session.close()
        await h.service.stop()


async def test_failing_row_backs_off_holds_its_successor_and_lets_others_through(tmp_path: Path) -> None:
    clock = FakeClock(start=1_800_000_000.0)
    inbox = Inbox(tmp_path / "db" / "inbox.db")
    await inbox.start()
    engine = FakeEngine()
    metrics = RemediationMetrics()
    settings = WorkerSettings(tick_interval_seconds=3600, retry_initial_seconds=30, retry_max_seconds=300)
    worker = Worker(inbox, engine, metrics, settings, clock)
    try:
        records = parse_notification(
            _body(
                alert(fingerprint="bad"),
                alert(fingerprint="good"),
                alert(fingerprint="bad", status="resolved"),
            ),
            clock.time(),
        )
        await inbox.ingest(records, max_pending=100)
        firing_key = f"bad|{records[0].starts_at}|firing"
        engine.fail_times[firing_key] = 2

        await worker.drain_once()
        # the firing row failed; the resolved row of the same alert was held back; "good" went through
        assert [(e.fingerprint, e.status) for e in engine.calls] == [("bad", "firing"), ("good", "firing")]
        assert [e.fingerprint for e in engine.handled] == ["good"]
        assert worker.failures == 1
        assert await inbox.count("attempts = 1 AND last_error LIKE 'RuntimeError%'") == 1

        # not due yet: nothing is retried (no spinning), however often the worker looks
        for _ in range(3):
            await worker.drain_once()
        assert len(engine.calls) == 2

        clock.advance(30)  # first retry after retry_initial_seconds
        await worker.drain_once()
        assert len(engine.calls) == 3 and worker.failures == 2
        assert await inbox.count("attempts = 2") == 1
        clock.advance(30)  # the second retry waits twice as long
        await worker.drain_once()
        assert len(engine.calls) == 3
        clock.advance(30)
        await worker.drain_once()
        # it succeeded; only now may the resolved row follow, in order
        assert [(e.fingerprint, e.status) for e in engine.handled] == [
            ("good", "firing"),
            ("bad", "firing"),
            ("bad", "resolved"),
        ]
        assert inbox.pending == 0
        assert await inbox.count("processed_at IS NOT NULL AND last_error IS NULL") == 3
    finally:
        await inbox.close()


async def test_engine_is_ticked_while_idle(tmp_path: Path) -> None:
    h = await start_harness(make_settings(tmp_path, engine_tick_interval_seconds=0.02))
    try:
        await h.engine.wait_for(lambda: h.engine.ticks >= 3, within_seconds=5)
    finally:
        await h.session.close()
        await h.service.stop()


async def test_a_hung_engine_call_times_out_and_is_retried(tmp_path: Path) -> None:
    clock = FakeClock(start=1_800_000_000.0)
    inbox = Inbox(tmp_path / "inbox.db")
    await inbox.start()
    engine = FakeEngine()
    engine.gate = asyncio.Event()  # never set: handle hangs
    settings = WorkerSettings(handle_timeout_seconds=0.05, retry_initial_seconds=10)
    worker = Worker(inbox, engine, RemediationMetrics(), settings, clock)
    try:
        await inbox.ingest(parse_notification(_body(alert()), clock.time()), max_pending=10)
        await worker.drain_once()
        assert worker.failures == 1
        assert inbox.pending == 1
        assert await inbox.count("attempts = 1 AND last_error LIKE 'TimeoutError%'") == 1
        # the overrunning call is left to finish, not cancelled (its decision may be committed)
        (late,) = worker.late_calls
        assert not late.done()
        engine.gate.set()
        await late
        assert not late.cancelled() and worker.late_calls == set()
    finally:
        await worker.stop()
        await inbox.close()


def test_backoff_doubles_and_is_capped() -> None:
    assert [backoff_seconds(n, 1.0, 10.0) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


async def test_queue_depth_metric_follows_the_inbox(tmp_path: Path) -> None:
    engine = FakeEngine()
    engine.gate = asyncio.Event()
    h = await start_harness(make_settings(tmp_path), engine=engine)
    try:
        await h.post_alerts(notification([alert(fingerprint="a"), alert(fingerprint="b")]))
        assert h.metrics.registry.get_sample_value("gpupulse_remediation_queue_depth") == 2
        engine.gate.set()
        await h.service.ctl.worker.wait_until(lambda: h.service.ctl.inbox.pending == 0, within_seconds=5)
        assert h.metrics.registry.get_sample_value("gpupulse_remediation_queue_depth") == 0
    finally:
        engine.gate.set()
        await h.session.close()
        await h.service.stop()


async def test_new_alerts_skip_the_inbox_read_once_the_backlog_is_clear(tmp_path: Path) -> None:
    # several ticks pass during the posts: a hand-over in flight at one tick must not look lost
    h = await start_harness(make_settings(tmp_path, engine_tick_interval_seconds=0.2))
    inbox = h.service.ctl.inbox
    reads = 0
    real_load = inbox.load_ready

    async def counting_load(now: float, limit: int) -> tuple[list[InboxRow], dict[str, int], int]:
        nonlocal reads
        reads += 1
        return await real_load(now, limit)

    inbox.load_ready = counting_load  # type: ignore[method-assign]
    try:
        await h.post_alerts(notification([alert(fingerprint="warmup")]))
        await h.service.ctl.worker.wait_until(lambda: inbox.pending == 0, within_seconds=5)
        before = reads
        for i in range(20):
            assert (await h.post_alerts(notification([alert(fingerprint=f"fast{i}")]))).status == 200
        await h.engine.wait_for(lambda: len(h.engine.handled) == 21)
        assert reads == before  # handed over in memory, not read back from SQLite
        assert [e.fingerprint for e in h.engine.handled[1:]] == [f"fast{i}" for i in range(20)]
    finally:
        await h.session.close()
        await h.service.stop()


async def test_rows_committed_but_never_handed_over_are_found_at_the_next_ticks(tmp_path: Path) -> None:
    h = await start_harness(make_settings(tmp_path))
    inbox = h.service.ctl.inbox
    try:
        await h.post_alerts(notification([alert(fingerprint="warmup")]))
        await h.engine.wait_for(lambda: len(h.engine.handled) == 1)
        # as if the intake handler was cancelled between its commit and worker.submit()
        await inbox.ingest(parse_notification(_body(alert(fingerprint="orphan")), 2.0), max_pending=100)
        assert inbox.written_upto == 2
        await h.engine.wait_for(lambda: len(h.engine.handled) == 2)
        assert h.engine.handled[1].fingerprint == "orphan"
        await h.service.ctl.worker.wait_until(lambda: inbox.pending == 0, within_seconds=5)
    finally:
        await h.session.close()
        await h.service.stop()


async def test_a_requeued_row_never_handed_over_is_found_at_the_next_ticks(tmp_path: Path) -> None:
    # Alertmanager's re-send of an old alert puts its processed row back in the queue. If that
    # hand-over is lost (the worker's switch from the inbox to the fast path drops ids it has read
    # already), the two-tick safety net must still see the row, though this process inserted nothing.
    settings = make_settings(tmp_path)
    earlier = Inbox(settings.inbox_path)  # an earlier process committed it, then went down
    await earlier.start()
    await earlier.ingest(parse_notification(_body(alert(fingerprint="old")), 0.0), max_pending=100)
    await earlier.close()
    h = await start_harness(settings)
    inbox = h.service.ctl.inbox
    try:
        await h.engine.wait_for(lambda: len(h.engine.calls) == 1)
        await h.service.ctl.worker.wait_until(lambda: inbox.pending == 0, within_seconds=5)
        # the re-send, committed without a hand-over (as when the switch to the fast path drops it)
        again = parse_notification(_body(alert(fingerprint="old")), 10_000.0)
        result = await inbox.ingest(again, max_pending=100, requeue_after_seconds=900.0)
        assert result.requeued == 1
        await h.engine.wait_for(lambda: len(h.engine.calls) == 2)
        received = [(e.fingerprint, e.received_at.timestamp()) for e in h.engine.calls]
        assert received == [("old", 0), ("old", 10_000)]
        await h.service.ctl.worker.wait_until(lambda: inbox.pending == 0, within_seconds=5)
    finally:
        await h.session.close()
        await h.service.stop()


async def test_a_failure_on_the_fast_path_falls_back_to_the_inbox_and_keeps_order(tmp_path: Path) -> None:
    engine = FakeEngine()
    h = await start_harness(make_settings(tmp_path, worker_retry_initial_seconds=0.05), engine=engine)
    try:
        firing = parse_notification(_body(alert(fingerprint="x")), 0.0)[0]
        engine.fail_times[f"x|{firing.starts_at}|firing"] = 1
        await h.post_alerts(notification([alert(fingerprint="warm")]))
        await engine.wait_for(lambda: len(engine.handled) == 1)
        await h.post_alerts(notification([alert(fingerprint="x")]))
        await h.post_alerts(notification([alert(fingerprint="x", status="resolved")]))
        await h.post_alerts(notification([alert(fingerprint="y")]))
        await engine.wait_for(lambda: len(engine.handled) == 4)
        order = [(e.fingerprint, e.status) for e in engine.handled]
        assert order.index(("x", "firing")) < order.index(("x", "resolved"))
        assert len(engine.calls) == 5  # x firing twice, everything else once
    finally:
        await h.session.close()
        await h.service.stop()


async def test_rows_committed_without_a_hand_over_are_found_by_the_next_tick(tmp_path: Path) -> None:
    h = await start_harness(make_settings(tmp_path, engine_tick_interval_seconds=0.05))
    try:
        await h.post_alerts(notification([alert(fingerprint="warm")]))
        await h.engine.wait_for(lambda: len(h.engine.handled) == 1)
        # as if the request handler died between commit and hand-over
        await h.service.ctl.inbox.ingest(parse_notification(_body(alert(fingerprint="orphan")), 0.0), 100)
        await h.engine.wait_for(lambda: any(e.fingerprint == "orphan" for e in h.engine.handled))
    finally:
        await h.session.close()
        await h.service.stop()
