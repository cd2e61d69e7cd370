"""Leader election on one Lease: one leader, fast failover, and a leader that cannot renew steps down."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import pytest

from remediation.kube.client import KubeClient
from remediation.kube.leader import LeaderElectionSettings, LeaderElector
from tests.fakes.kube_api import FakeKubeAPI
from tests.kube.conftest import GatedClock

LEASE = ("gpupulse", "gpupulse-remediation-leader")
DURATION, RENEW, RETRY = 2, 1.2, 0.2


class Candidate:
    """One replica: an elector plus events recording what its callbacks saw."""

    def __init__(self, client: KubeClient, name: str, release_on_cancel: bool = True) -> None:
        settings = LeaderElectionSettings(
            namespace="gpupulse",
            identity=name,
            lease_duration_seconds=DURATION,
            renew_deadline_seconds=RENEW,
            retry_period_seconds=RETRY,
            release_on_cancel=release_on_cancel,
        )
        self.elector = LeaderElector(client, settings)
        self.started = asyncio.Event()
        self.stopped = asyncio.Event()
        self.work_cancelled = asyncio.Event()
        self.leads = 0
        self.task: asyncio.Task[None] | None = None

    async def _lead(self) -> None:
        self.leads += 1
        self.started.set()
        try:
            await asyncio.Event().wait()  # act until told to stop
        except asyncio.CancelledError:
            self.work_cancelled.set()
            raise

    async def _stopped(self) -> None:
        self.stopped.set()

    def start(self) -> None:
        self.task = asyncio.create_task(self.elector.run(self._lead, self._stopped))

    async def kill(self) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@pytest.fixture
async def candidates(kube_client: KubeClient) -> AsyncIterator[Callable[..., Candidate]]:
    made: list[Candidate] = []

    def make(name: str, release_on_cancel: bool = True) -> Candidate:
        c = Candidate(kube_client, name, release_on_cancel)
        made.append(c)
        c.start()
        return c

    yield make
    for c in made:
        await c.kill()


async def _until(condition: Callable[[], bool], within_seconds: float = 5.0) -> None:
    deadline = time.monotonic() + within_seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(RETRY / 4)


async def _first_leader(a: Candidate, b: Candidate) -> tuple[Candidate, Candidate]:
    waits = {asyncio.create_task(a.started.wait()): a, asyncio.create_task(b.started.wait()): b}
    done, pending = await asyncio.wait(waits, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    for p in pending:
        p.cancel()
    assert done, "nobody became leader"
    leader = waits[next(iter(done))]
    return leader, (b if leader is a else a)


async def test_two_electors_on_one_lease_only_one_leads(
    kube_api: FakeKubeAPI, candidates: Callable[..., Candidate]
) -> None:
    a, b = candidates("replica-a"), candidates("replica-b")
    leader, follower = await _first_leader(a, b)
    # watch for longer than a lease duration: the follower must never lead beside the leader
    deadline = time.monotonic() + DURATION * 1.5
    while time.monotonic() < deadline:
        assert not follower.elector.is_leader
        assert leader.elector.is_leader
        await asyncio.sleep(RETRY / 2)
    assert follower.leads == 0 and leader.leads == 1
    assert kube_api.leases[LEASE]["spec"]["holderIdentity"] == leader.elector.identity
    assert follower.elector.observed_holder == leader.elector.identity


async def test_follower_takes_over_within_the_lease_duration_when_the_leader_dies(
    kube_api: FakeKubeAPI, candidates: Callable[..., Candidate]
) -> None:
    a = candidates("replica-a", release_on_cancel=False)  # a crash: no goodbye, the Lease just stops moving
    await asyncio.wait_for(a.started.wait(), 5)
    b = candidates("replica-b")
    await _until(lambda: b.elector.observed_holder == "replica-a")  # b has seen a's renewals
    assert not b.started.is_set()
    killed_at = time.monotonic()
    await a.kill()
    await asyncio.wait_for(b.started.wait(), DURATION + 2 * RETRY + 1.0)
    took = time.monotonic() - killed_at
    assert took <= DURATION + 2 * RETRY + 0.5
    assert took >= DURATION - RETRY  # not earlier: a might only be slow
    spec = kube_api.leases[LEASE]["spec"]
    assert spec["holderIdentity"] == "replica-b"
    assert spec["leaseTransitions"] == 1


async def test_clean_stop_releases_the_lease_for_an_immediate_takeover(
    kube_api: FakeKubeAPI, candidates: Callable[..., Candidate]
) -> None:
    a = candidates("replica-a")
    await asyncio.wait_for(a.started.wait(), 5)
    b = candidates("replica-b")
    await _until(lambda: b.elector.observed_holder == "replica-a")
    stopped_at = time.monotonic()
    await a.kill()
    assert a.stopped.is_set() and a.work_cancelled.is_set()
    await asyncio.wait_for(b.started.wait(), DURATION)
    assert time.monotonic() - stopped_at < DURATION / 2


async def test_a_leader_that_cannot_renew_stops_acting_before_the_lease_expires(
    kube_api: FakeKubeAPI, candidates: Callable[..., Candidate]
) -> None:
    a = candidates("replica-a")
    await asyncio.wait_for(a.started.wait(), 5)
    cut_at = time.monotonic()
    kube_api.fail("PUT", "/leases/gpupulse-remediation-leader", 503, "ServiceUnavailable", times=10_000)
    await asyncio.wait_for(a.work_cancelled.wait(), RENEW + 2 * RETRY + 0.5)
    assert time.monotonic() - cut_at < DURATION  # before anyone else may take the Lease
    assert a.stopped.is_set()
    assert not a.elector.is_leader


def test_timing_must_be_ordered_like_client_go() -> None:
    with pytest.raises(ValueError):
        LeaderElectionSettings(
            namespace="n", identity="a", lease_duration_seconds=5, renew_deadline_seconds=5
        )
    with pytest.raises(ValueError):
        LeaderElectionSettings(namespace="n", identity="")


async def test_is_leader_expires_by_the_clock_even_when_the_renew_loop_stalls(
    kube_client: KubeClient,
) -> None:
    clock = GatedClock()  # the renew loop's first sleep never returns: a stalled loop
    elector = LeaderElector(
        kube_client,
        LeaderElectionSettings(namespace="gpupulse", identity="replica-a", renew_deadline_seconds=10.0),
        clock,
    )
    leading = asyncio.Event()

    async def lead() -> None:
        leading.set()
        await asyncio.Event().wait()

    async def stopped() -> None:
        return None

    task = asyncio.create_task(elector.run(lead, stopped))
    await asyncio.wait_for(leading.wait(), 5)
    await asyncio.wait_for(clock.waiting.wait(), 5)
    assert elector.is_leader
    clock.t += 9.9
    assert elector.is_leader
    clock.t += 0.2
    assert not elector.is_leader  # the backend's may_act check now refuses, loop or no loop
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
