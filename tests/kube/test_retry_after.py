"""Retry-After as API Priority and Fairness sends it (a header, a plain-text body) reaches every retry:
the client reads it, and retry_throttled waits at least that long, never past its deadline."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from remediation.errors import KubeForbidden, KubeTooManyRequests, KubeUnavailable
from remediation.kube.client import KubeClient
from remediation.kube.retry import MAX_RETRY_AFTER_SECONDS, parse_retry_after, retry_throttled
from tests.fakes.kube_api import FakeKubeAPI
from tests.kube.conftest import StepClock

NOW = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("3", 3.0),
        (" 7 ", 7.0),
        ("0", 0.0),
        ("Fri, 04 Dec 2026 12:00:05 GMT", 5.0),  # an HTTP-date (RFC 9110)
        ("Fri, 04 Dec 2026 11:59:00 GMT", 0.0),  # already past
        ("86400", MAX_RETRY_AFTER_SECONDS),  # capped: the caller's deadline decides past it
        ("-1", 0.0),
        ("1.5", 0.0),  # delta-seconds are whole
        ("١٢", 0.0),  # non-ASCII digits are not digits here
        ("soon", 0.0),
        ("", 0.0),
        (None, 0.0),
    ],
)
def test_retry_after_values_as_the_rfc_defines_them(value: str | None, seconds: float) -> None:
    assert parse_retry_after(value, NOW) == seconds


async def test_a_priority_and_fairness_429_carries_its_retry_after(
    kube_api: FakeKubeAPI, kube_client: KubeClient
) -> None:
    kube_api.add_node("n1")
    kube_api.throttle("GET", "/api/v1/nodes/n1", retry_after="4")
    with pytest.raises(KubeTooManyRequests) as throttled:
        await kube_client.get_node("n1")
    assert throttled.value.retry_after_seconds == 4.0  # from the header: the body is plain text
    assert (await kube_client.get_node("n1"))["metadata"]["name"] == "n1"


async def test_a_status_body_still_wins_over_nothing() -> None:
    body = {"details": {"retryAfterSeconds": 10}}
    assert KubeTooManyRequests(429, "TooManyRequests", "pdb", body).retry_after_seconds == 10.0
    assert KubeTooManyRequests(429, "TooManyRequests", "apf", {}, 2.0).retry_after_seconds == 2.0
    assert KubeTooManyRequests(429, "TooManyRequests", "none", {}).retry_after_seconds == 0.0


class Flaky:
    def __init__(self, errors: list[Exception]) -> None:
        self.errors, self.calls = errors, 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


async def test_retry_throttled_waits_at_least_the_servers_retry_after() -> None:
    clock = StepClock()
    call = Flaky([KubeTooManyRequests(429, "TooManyRequests", "apf", {}, 3.0)] * 2)
    assert await retry_throttled(call, clock=clock, deadline=clock.monotonic() + 60, what="x") == "done"
    assert call.calls == 3
    assert clock.sleeps == [3.0, 3.0]  # not the 0.1-0.2 s of its own backoff


async def test_retry_throttled_backs_off_with_bounded_jitter() -> None:
    clock = StepClock()
    call = Flaky([KubeUnavailable(503, "ServiceUnavailable", "down")] * 6)
    await retry_throttled(call, clock=clock, deadline=clock.monotonic() + 600, what="x", max_seconds=2.0)
    bounds = [0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert len(clock.sleeps) == 6
    assert all(b / 2 <= s <= b for s, b in zip(clock.sleeps, bounds, strict=True)), clock.sleeps


async def test_retry_throttled_gives_up_before_its_deadline_and_never_retries_a_refusal() -> None:
    clock = StepClock()
    call = Flaky([KubeTooManyRequests(429, "TooManyRequests", "apf", {}, 30.0)])
    with pytest.raises(KubeTooManyRequests):
        await retry_throttled(call, clock=clock, deadline=clock.monotonic() + 10, what="x")
    assert clock.sleeps == [] and call.calls == 1  # waiting 30 s would pass the deadline
    forbidden = Flaky([KubeForbidden(403, "Forbidden", "rbac")])
    with pytest.raises(KubeForbidden):
        await retry_throttled(forbidden, clock=clock, deadline=clock.monotonic() + 60, what="x")
    assert forbidden.calls == 1
