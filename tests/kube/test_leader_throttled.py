"""Leader election under API Priority and Fairness: a throttled renewal waits the server's Retry-After
(header only, as APF sends it) before calling again, and steps down at the renew deadline when the
wait would end past it; a follower's throttled read waits it out as well."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from remediation.kube.client import KubeClient
from remediation.kube.leader import LeaderElectionSettings, LeaderElector
from tests.fakes.kube_api import FakeKubeAPI
from tests.kube.conftest import StepClock

LEASE_PATH = "/leases/gpupulse-remediation-leader"
DURATION, RENEW, RETRY = 15, 10.0, 2.0  # the chart's defaults


@dataclass
class Witness:
    """Every Lease request the fake server saw, stamped with the elector's clock."""

    clock: StepClock
    calls: list[tuple[str, float]] = field(default_factory=list)
    started: list[float] = field(default_factory=list)
    stopped: list[float] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def hook(self, method: str, path: str) -> None:
        if path.endswith(LEASE_PATH):
            self.calls.append((method, self.clock.t))
            self.changed.set()

    async def until(self, condition: Callable[[], object], within_seconds: float = 10.0) -> None:
        async def wait() -> None:
            while not condition():
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), within_seconds)


@pytest.fixture
async def elected(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock
) -> AsyncIterator[tuple[Witness, LeaderElector]]:
    witness = Witness(clock)
    kube_api.before.append(witness.hook)
    elector = LeaderElector(
        kube_client,
        LeaderElectionSettings(
            namespace="gpupulse",
            identity="replica-a",
            lease_duration_seconds=DURATION,
            renew_deadline_seconds=RENEW,
            retry_period_seconds=RETRY,
        ),
        clock,
    )

    async def lead() -> None:
        witness.started.append(clock.t)
        witness.changed.set()
        await asyncio.Event().wait()

    async def stopped() -> None:
        witness.stopped.append(clock.t)
        witness.changed.set()

    task = asyncio.create_task(elector.run(lead, stopped))
    await witness.until(lambda: witness.started)
    yield witness, elector
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _after_refusal(witness: Witness, seen_before: int) -> tuple[float, list[tuple[str, float]]]:
    """When the first PUT after `seen_before` calls was refused, and the calls that followed it."""
    later = witness.calls[seen_before:]
    refused = next(i for i, (method, _) in enumerate(later) if method == "PUT")
    return later[refused][1], later[refused + 1 :]


async def test_a_throttled_renewal_waits_the_retry_after_and_keeps_leading(
    kube_api: FakeKubeAPI, elected: tuple[Witness, LeaderElector]
) -> None:
    witness, elector = elected
    seen = len(witness.calls)
    kube_api.throttle("PUT", LEASE_PATH, retry_after="7")
    await witness.until(lambda: _calls_after_refusal(witness, seen) >= 2)
    refused_at, following = _after_refusal(witness, seen)
    gap = following[0][1] - refused_at
    assert gap >= 7.0  # not the 2 s retry period: the server said 7
    assert [m for m, _ in following[:2]] == ["GET", "PUT"]
    assert witness.stopped == [] and len(witness.started) == 1  # 2 + 7 < 10: still leading throughout
    assert elector.is_leader


async def test_a_retry_after_past_the_renew_deadline_steps_down_at_the_deadline_without_calling(
    kube_api: FakeKubeAPI, elected: tuple[Witness, LeaderElector]
) -> None:
    witness, elector = elected
    seen = len(witness.calls)
    kube_api.throttle("PUT", LEASE_PATH, retry_after="30")
    await witness.until(lambda: len(witness.started) == 2)  # stepped down, then led again
    refused_at, following = _after_refusal(witness, seen)
    # the Lease was created (acquired) when it started leading, renewed by each PUT since
    last_renewal = max([witness.started[0]] + [t for m, t in witness.calls[:seen] if m == "PUT"])
    assert len(witness.stopped) == 1
    assert witness.stopped[0] - last_renewal == pytest.approx(RENEW)  # at the deadline, not later
    assert following[0][1] - refused_at >= 30.0  # no call at all until the server's wait was over
    assert elector.is_leader


def _calls_after_refusal(witness: Witness, seen_before: int) -> int:
    if not any(method == "PUT" for method, _ in witness.calls[seen_before:]):
        return 0
    return len(_after_refusal(witness, seen_before)[1])


async def test_a_follower_whose_read_is_throttled_waits_the_retry_after_too(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock
) -> None:
    witness = Witness(clock)
    kube_api.before.append(witness.hook)
    kube_api.leases[("gpupulse", "gpupulse-remediation-leader")] = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "gpupulse-remediation-leader", "namespace": "gpupulse", "resourceVersion": "3"},
        "spec": {
            "holderIdentity": "replica-b",
            "leaseDurationSeconds": 3600,
            "renewTime": "2026-01-01T00:00:00.000000Z",
        },
    }
    elector = LeaderElector(
        kube_client, LeaderElectionSettings(namespace="gpupulse", identity="replica-a"), clock
    )

    async def lead() -> None:
        raise AssertionError("the Lease is held by replica-b: replica-a must not lead")

    async def stopped() -> None:
        return None

    task = asyncio.create_task(elector.run(lead, stopped))
    try:
        await witness.until(lambda: len(witness.calls) >= 2)  # following: a read every retry period
        kube_api.throttle("GET", LEASE_PATH, retry_after="7")
        seen = len(witness.calls)
        await witness.until(lambda: len(witness.calls) >= seen + 2)
        (refused_at, next_at) = (t for _, t in witness.calls[seen : seen + 2])
        assert next_at - refused_at >= 7.0  # not the 2 s retry period
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
