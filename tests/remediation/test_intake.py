"""POST /api/v1/alerts: auth, size limit, validation, idempotence, durability, backpressure."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from remediation.inbox import Inbox
from tests.fakes.intake import (
    FIXTURES,
    TOKEN,
    FakeEngine,
    Harness,
    alert,
    count_rows,
    load_fixture,
    make_settings,
    notification,
    start_harness,
)


def _rejected(h: Harness, reason: str) -> float:
    return float(h.metrics.alerts_rejected.labels(reason=reason)._value.get())


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": "Bearer"},
    ],
    ids=["missing", "wrong", "not-bearer", "prefix-match", "empty"],
)
async def test_unauthenticated_webhook_gets_401_and_nothing_is_recorded(
    harness: Harness, headers: dict[str, str]
) -> None:
    resp = await harness.post_alerts(notification(), headers=headers)
    assert resp.status == 401
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert count_rows(harness.inbox_path) == 0
    assert _rejected(harness, "auth") == 1
    assert harness.engine.calls == []


async def test_oversized_body_gets_413_and_nothing_is_recorded(tmp_path: Path) -> None:
    h = await start_harness(make_settings(tmp_path, max_body_bytes=4096))
    try:
        big = notification([alert(fingerprint=f"{i:016x}") for i in range(40)])
        assert len(json.dumps(big)) > 4096
        resp = await h.post_alerts(big)
        assert resp.status == 413

        async def chunked() -> Any:  # no Content-Length: the limit must hold while streaming too
            body = json.dumps(big).encode()
            for i in range(0, len(body), 1000):
                yield body[i : i + 1000]

        json_headers = {**h.headers, "Content-Type": "application/json"}
        async with h.session.post(f"{h.url}/api/v1/alerts", data=chunked(), headers=json_headers) as r:
            assert r.status == 413
        assert count_rows(h.inbox_path) == 0
        assert _rejected(h, "size") == 2
        # just under the limit is fine
        assert (await h.post_alerts(notification([alert()]))).status == 200
    finally:
        await h.session.close()
        await h.service.stop()


def _without(doc: dict[str, Any], *path: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    target: Any = out
    for p in path[:-1]:
        target = target[p]
    del target[path[-1]]
    return out


def _with(doc: dict[str, Any], value: Any, *path: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    target: Any = out
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    return out


VALID = notification()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"not json", "body"),
        (b"\xff\xfe{}", "body"),
        (b"[" * 100_000, "body"),
        (b"[]", "body"),
        (_with(VALID, "3", "version"), "version"),
        (_without(VALID, "version"), "version"),
        (_with(VALID, "pending", "status"), "status"),
        (_without(VALID, "receiver"), "receiver"),
        (_without(VALID, "groupKey"), "groupKey"),
        (_without(VALID, "alerts"), "alerts"),
        (_with(VALID, [], "alerts"), "alerts"),
        (_with(VALID, ["x"], "alerts"), "alerts[0]"),
        (_without(VALID, "alerts", 0, "fingerprint"), "alerts[0].fingerprint"),
        (_with(VALID, "", "alerts", 0, "fingerprint"), "alerts[0].fingerprint"),
        (_with(VALID, "active", "alerts", 0, "status"), "alerts[0].status"),
        (_with(VALID, {"a": 1}, "alerts", 0, "labels"), "alerts[0].labels.a"),
        (_with(VALID, ["a"], "alerts", 0, "labels"), "alerts[0].labels"),
        (_with(VALID, {"a": None}, "alerts", 0, "annotations"), "alerts[0].annotations.a"),
        (_without(VALID, "alerts", 0, "startsAt"), "alerts[0].startsAt"),
        (_with(VALID, "yesterday", "alerts", 0, "startsAt"), "alerts[0].startsAt"),
        (_with(VALID, "2026-11-30T00:25:25", "alerts", 0, "startsAt"), "alerts[0].startsAt"),
        (_with(VALID, "2026-13-30T00:25:25Z", "alerts", 0, "startsAt"), "alerts[0].startsAt"),
        (_with(VALID, "0001-01-01T00:00:00Z", "alerts", 0, "startsAt"), "alerts[0].startsAt"),
        (_with(VALID, 5, "alerts", 0, "endsAt"), "alerts[0].endsAt"),
        (_with(VALID, 5, "alerts", 0, "generatorURL"), "alerts[0].generatorURL"),
        (_with(VALID, "\ud800", "alerts", 0, "fingerprint"), "alerts[0].fingerprint"),
    ],
)
async def test_malformed_payload_gets_400_naming_the_field_and_nothing_is_recorded(
    harness: Harness, body: bytes | dict[str, Any], field: str
) -> None:
    resp = await harness.post_alerts(body)
    assert resp.status == 400
    doc = await harness.json(resp)
    assert doc["field"] == field
    assert doc["error"]
    assert count_rows(harness.inbox_path) == 0
    assert _rejected(harness, "invalid") == 1


async def test_a_bad_alert_rejects_the_whole_notification(harness: Harness) -> None:
    body = notification([alert(fingerprint="aaaa"), {**alert(fingerprint="bbbb"), "startsAt": "soon"}])
    resp = await harness.post_alerts(body)
    assert resp.status == 400
    assert (await harness.json(resp))["field"] == "alerts[1].startsAt"
    assert count_rows(harness.inbox_path) == 0


async def test_duplicate_delivery_is_acknowledged_and_stored_once(harness: Harness) -> None:
    body = load_fixture("firing.json")
    first = await harness.post_alerts(body)
    again = await harness.post_alerts(body)
    assert (first.status, again.status) == (200, 200)
    assert (await harness.json(again)) == {"status": "ok", "accepted": 0, "duplicates": 1}
    assert count_rows(harness.inbox_path) == 1
    await harness.engine.wait_for(lambda: len(harness.engine.calls) >= 1)
    assert harness.metrics.alerts_received.labels(status="firing")._value.get() == 1


async def test_the_same_alert_firing_again_later_is_a_new_row(harness: Harness) -> None:
    await harness.post_alerts(notification([alert(starts_at="2026-11-30T00:00:00Z")]))
    await harness.post_alerts(notification([alert(starts_at="2026-11-30T01:00:00Z")]))
    assert count_rows(harness.inbox_path) == 2


async def test_alert_is_committed_before_the_response(tmp_path: Path) -> None:
    h = await start_harness(make_settings(tmp_path))
    gate = h.engine.gate = asyncio.Event()  # the engine must not be what makes the row appear
    try:
        resp = await h.post_alerts(load_fixture("firing.json"))
        assert resp.status == 200
        # no await between the acknowledgement and this read: a fresh connection sees a committed row
        assert count_rows(h.inbox_path) == 1
        # a second opener of the file (a restarted controller) finds it pending, engine still stuck
        reopened = Inbox(h.inbox_path)
        await reopened.start()
        try:
            assert reopened.pending == 1
        finally:
            await reopened.close()
    finally:
        gate.set()
        await h.session.close()
        await h.service.stop()


async def test_full_queue_answers_503_and_records_nothing(tmp_path: Path) -> None:
    engine = FakeEngine()
    engine.gate = asyncio.Event()  # the engine is stuck, so the queue fills up
    h = await start_harness(make_settings(tmp_path, queue_max_pending=2), engine=engine)
    try:
        for fp in ("a1", "a2"):
            assert (await h.post_alerts(notification([alert(fingerprint=fp)]))).status == 200
        resp = await h.post_alerts(notification([alert(fingerprint="a3")]))
        assert resp.status == 503  # Alertmanager retries 5xx; it drops 4xx (429 included)
        assert resp.headers["Retry-After"]
        assert count_rows(h.inbox_path) == 2
        assert _rejected(h, "overloaded") == 1
        # while full, even a re-delivery waits (it is retried; once stored it is acknowledged as a duplicate)
        assert (await h.post_alerts(notification([alert(fingerprint="a1")]))).status == 503
        assert count_rows(h.inbox_path) == 2
        engine.gate.set()
        await h.service.ctl.worker.wait_until(lambda: h.service.ctl.inbox.pending == 0, within_seconds=5)
        assert (await h.post_alerts(notification([alert(fingerprint="a3")]))).status == 200
    finally:
        engine.gate.set()
        await h.session.close()
        await h.service.stop()


async def test_unknown_extra_fields_from_newer_alertmanagers_are_accepted(harness: Harness) -> None:
    body = load_fixture("firing.json")
    body["notification_reason"] = "first notification"  # 0.32
    body["routeLabels"] = {"team": "ml-infra"}  # 0.34
    body["somethingFromTheFuture"] = {"nested": [1, 2, 3]}
    body["alerts"][0]["newAlertField"] = True
    resp = await harness.post_alerts(body)
    assert resp.status == 200
    await harness.engine.wait_for(lambda: len(harness.engine.handled) == 1)
    assert harness.engine.handled[0].fingerprint == body["alerts"][0]["fingerprint"]


async def test_resolved_notification_follows_its_firing_one(harness: Harness) -> None:
    firing, resolved = load_fixture("firing.json"), load_fixture("resolved.json")
    assert (await harness.post_alerts(firing)).status == 200
    assert (await harness.post_alerts(resolved)).status == 200
    await harness.engine.wait_for(lambda: len(harness.engine.handled) == 2)
    first, second = harness.engine.handled
    assert (first.status, second.status) == ("firing", "resolved")
    assert first.fingerprint == second.fingerprint
    assert first.starts_at == second.starts_at
    assert second.ends_at is not None and first.ends_at is None  # Go's zero time means "no end yet"
    assert first.dedup_key != second.dedup_key
    assert count_rows(harness.inbox_path) == 2


# both lines' payloads (tests/fixtures/alertmanager: 0.25; its 0.3x/: 0.3x)
@pytest.mark.parametrize("name", sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*.json")))
async def test_recorded_alertmanager_payloads_are_accepted(harness: Harness, name: str) -> None:
    body = load_fixture(name)
    resp = await harness.post_alerts(body)
    assert resp.status == 200
    assert (await harness.json(resp))["accepted"] == len(body["alerts"])
    await harness.engine.wait_for(lambda: len(harness.engine.handled) == len(body["alerts"]))
    event = harness.engine.handled[0]
    assert event.receiver == body["receiver"]
    assert event.group_key == body["groupKey"]
    assert dict(event.labels) == body["alerts"][0]["labels"]
    assert event.starts_at.tzinfo is not None
    assert event.inbox_id > 0


async def test_metrics_and_probes_need_no_token(harness: Harness) -> None:
    await harness.post_alerts(load_fixture("firing.json"))
    await harness.post_alerts(b"{", headers={})
    for path in ("/healthz", "/readyz"):
        async with harness.session.get(harness.url + path) as r:
            assert r.status == 200, path
    async with harness.session.get(harness.url + "/metrics") as r:
        assert r.status == 200
        text = await r.text()
    assert 'gpupulse_remediation_alerts_received_total{status="firing"} 1.0' in text
    assert 'gpupulse_remediation_alerts_rejected_total{reason="auth"} 1.0' in text
    assert "gpupulse_remediation_ingest_latency_seconds_count 1.0" in text
    assert "gpupulse_remediation_queue_depth" in text


async def test_healthz_fails_when_the_worker_died(harness: Harness) -> None:
    task = harness.service.ctl.worker._task
    assert task is not None
    task.cancel()  # as if the drain loop had died of a bug
    with contextlib.suppress(asyncio.CancelledError):
        await task
    async with harness.session.get(harness.url + "/healthz") as r:
        assert r.status == 503
    async with harness.session.get(harness.url + "/readyz") as r:
        assert r.status == 503


async def test_readyz_fails_while_draining(harness: Harness) -> None:
    harness.service.ctl.draining = True
    async with harness.session.get(harness.url + "/readyz") as r:
        assert r.status == 503
    assert (await harness.post_alerts(notification())).status == 503
    assert count_rows(harness.inbox_path) == 0


async def test_concurrent_deliveries_are_group_committed_and_all_stored(harness: Harness) -> None:
    gate = harness.engine.gate = asyncio.Event()  # no processed marks: only ingest transactions count
    try:
        before = harness.service.ctl.inbox.commit_batches
        bodies = [notification([alert(fingerprint=f"{i:016x}")]) for i in range(200)]
        results = await asyncio.gather(*(harness.post_alerts(b) for b in bodies))
        assert {r.status for r in results} == {200}
        assert count_rows(harness.inbox_path) == 200
        # fewer transactions (fsyncs) than requests: concurrent requests shared commits
        assert harness.service.ctl.inbox.commit_batches - before < 200
    finally:
        gate.set()


async def test_token_compare_uses_the_whole_secret(tmp_path: Path) -> None:
    h = await start_harness(make_settings(tmp_path))
    try:
        for guess in (TOKEN[:-1], TOKEN.upper(), " " + TOKEN + "\t"):
            resp = await h.post_alerts(notification(), headers={"Authorization": f"Bearer {guess}"})
            # surrounding whitespace is not part of the token; anything else must match exactly
            assert resp.status == (200 if guess.strip() == TOKEN else 401), guess
    finally:
        await h.session.close()
        await h.service.stop()


async def test_client_disconnect_mid_body_records_nothing(harness: Harness) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", harness.service.port)
    body = json.dumps(notification()).encode()
    head = (
        f"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    writer.write(head + body[: len(body) // 2])
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    # the server is still healthy and recorded nothing from the cut request
    resp = await harness.post_alerts(notification([alert(fingerprint="after")]))
    assert resp.status == 200
    assert count_rows(harness.inbox_path) == 1
    del reader
