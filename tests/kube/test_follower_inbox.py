"""A follower in cluster mode trims its own inbox: copies older than the event age limit are set aside
unhandled, newer ones stay for a takeover."""

from __future__ import annotations

import json
from pathlib import Path

from remediation.inbox import Inbox
from remediation.intake import parse_notification
from remediation.kube.follower import trim_once
from tests.fakes.intake import alert, notification


def _body(*fps: str) -> bytes:
    return json.dumps(notification([alert(fingerprint=fp) for fp in fps])).encode()


async def test_follower_sets_aside_only_copies_older_than_the_age_limit(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path / "inbox.db")
    await inbox.start()
    try:
        await inbox.ingest(parse_notification(_body(*(f"old{i}" for i in range(5))), 1000.0), 100)
        await inbox.ingest(parse_notification(_body("new"), 1950.0), 100)
        assert await trim_once(inbox, now=2000.0, keep_seconds=900.0, batch=2) == 5
        assert await inbox.count("processed_at IS NULL") == 1
        assert await inbox.count("processed_at IS NULL AND fingerprint = 'new'") == 1
        assert await trim_once(inbox, now=2000.0, keep_seconds=900.0) == 0
    finally:
        await inbox.close()
