"""The inbox store: timeouts of a stalled database thread, canonical JSON, parsed timestamps."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from remediation.errors import PayloadError, StoreError
from remediation.inbox import Inbox, canonical_json
from remediation.intake import decode_json, parse_notification, parse_rfc3339
from tests.fakes.intake import alert, notification


def _body(*alerts: dict[str, object]) -> bytes:
    return json.dumps(notification(list(alerts))).encode()


async def test_a_stalled_writer_fails_waiting_callers_in_time_and_later_writes_still_land(
    tmp_path: Path,
) -> None:
    inbox = Inbox(tmp_path / "inbox.db", timeout_seconds=0.2)
    await inbox.start()
    entered, release = threading.Event(), threading.Event()

    def stall(conn: sqlite3.Connection, tx: object) -> None:
        entered.set()
        release.wait(10)  # a disk that stops answering

    stalled = asyncio.ensure_future(inbox._write(stall))  # type: ignore[arg-type]
    try:
        assert await asyncio.to_thread(entered.wait, 10)  # the writer is stuck inside the stall
        records = parse_notification(_body(alert(fingerprint="late")), 1.0)
        with pytest.raises(StoreError, match=r"did not answer within 0\.2 s"):
            await inbox.ingest(records, max_pending=100)
        with pytest.raises(StoreError, match="did not answer"):
            await stalled
        release.set()
        # the timed-out job was only given up on by its caller: the thread still ran it
        again = parse_notification(_body(alert(fingerprint="late"), alert(fingerprint="next")), 2.0)
        result = await inbox.ingest(again, max_pending=100)
        assert result.duplicates == 1 and result.inserted == 1
        assert await inbox.count() == 2
    finally:
        release.set()
        await inbox.close()


async def test_answered_jobs_never_time_out_and_leave_the_deadline_queue(tmp_path: Path) -> None:
    # short enough that the deadline timer runs during the test, long enough for a loaded machine's
    # fsync (0.1 s was missed once in a suite run at load 7)
    inbox = Inbox(tmp_path / "inbox.db", timeout_seconds=1.0)
    await inbox.start()
    try:
        for i in range(50):
            await inbox.ingest(parse_notification(_body(alert(fingerprint=f"f{i}")), 1.0), max_pending=1000)
        assert await inbox.count() == 50
        # answered jobs leave the front of the queue as new ones come: it never grows with traffic
        deadlines = inbox._deadlines
        assert deadlines is not None and len(deadlines.jobs) <= 1
        # the timer, due at the oldest deadline, finds only answered jobs: it fails none and stops
        assert deadlines.timer is not None
        await asyncio.sleep(deadlines.timer.when() - asyncio.get_running_loop().time() + 0.05)
        assert deadlines.timer is None and not deadlines.jobs
        assert await inbox.count() == 50
    finally:
        await inbox.close()


def test_canonical_json_sorts_keys_and_falls_back_for_what_orjson_refuses() -> None:
    assert canonical_json({"b": "2", "a": "ü"}) == '{"a":"ü","b":"2"}'
    huge = 10**30
    assert json.loads(canonical_json({"n": huge})) == {"n": huge}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-30T00:30:24Z", datetime(2026, 11, 30, 0, 30, 24, tzinfo=UTC)),
        ("2026-11-30t00:30:24z", datetime(2026, 11, 30, 0, 30, 24, tzinfo=UTC)),
        ("2026-11-30 02:30:24+02:00", datetime(2026, 11, 30, 0, 30, 24, tzinfo=UTC)),
        ("2026-11-30T00:30:24.796240109Z", datetime(2026, 11, 30, 0, 30, 24, 796240, tzinfo=UTC)),
        ("2026-11-30T00:30:24.5-01:00", datetime(2026, 11, 30, 1, 30, 24, 500000, tzinfo=UTC)),
        ("0001-01-01T00:00:00Z", datetime(1, 1, 1, tzinfo=UTC)),
    ],
)
def test_rfc3339_timestamps_as_alertmanager_and_other_senders_write_them(
    text: str, expected: datetime
) -> None:
    assert parse_rfc3339(text, "startsAt") == expected


@pytest.mark.parametrize(
    "text", ["2026-11-30T00:30:24", "2026-02-30T00:30:24Z", "30/11/2026", "2026-11-30T00:30Z"]
)
def test_bad_timestamps_name_the_field(text: str) -> None:
    with pytest.raises(PayloadError) as e:
        parse_rfc3339(text, "alerts[0].startsAt")
    assert e.value.field == "alerts[0].startsAt"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\xff{}", "not UTF-8"),
        (b'{"a": 1} x', "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)
def test_undecodable_bodies_get_the_standard_parsers_message(body: bytes, message: str) -> None:
    with pytest.raises(PayloadError, match=message):
        decode_json(body)


def test_a_lone_surrogate_is_decoded_so_that_validation_can_name_its_field() -> None:
    assert decode_json(b'{"a": "\\ud800"}') == {"a": "\ud800"}


async def test_a_resent_firing_alert_is_queued_again_only_once_its_stored_copy_is_old(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path / "inbox.db")
    await inbox.start()
    try:
        firing = _body(alert(fingerprint="f"))
        first = await inbox.ingest(parse_notification(firing, 1000.0), 100, requeue_after_seconds=900)
        row = first.ids[0]
        # not processed yet: a re-send is a plain duplicate, however late
        again = await inbox.ingest(parse_notification(firing, 5000.0), 100, requeue_after_seconds=900)
        assert (again.requeued, again.ids) == (0, [None])
        await inbox.mark_processed([row], 1001.0)  # type: ignore[list-item]
        soon = await inbox.ingest(parse_notification(firing, 1800.0), 100, requeue_after_seconds=900)
        assert (soon.requeued, soon.ids) == (0, [None])
        late = await inbox.ingest(parse_notification(firing, 1901.0), 100, requeue_after_seconds=900)
        assert (late.requeued, late.ids, late.duplicates) == (1, [row], 1)
        assert inbox.pending == 1
        assert await inbox.count("processed_at IS NULL AND received_at = 1901.0") == 1
        # resolutions are never queued again: they act on nothing and hold no evidence
        resolved = _body(alert(fingerprint="r", status="resolved"))
        done = await inbox.ingest(parse_notification(resolved, 1000.0), 100)
        await inbox.mark_processed([done.ids[0]], 1001.0)  # type: ignore[list-item]
        later = await inbox.ingest(parse_notification(resolved, 9000.0), 100, requeue_after_seconds=900)
        assert later.requeued == 0
    finally:
        await inbox.close()
