"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's timing rules.

Followers judge expiry by when *they* last saw the record change (not by the holder's renewTime), so
clock skew between replicas does not matter. The leader steps down as soon as it has not renewed for
`renew_deadline_seconds`, which is shorter than the lease duration: it stops acting before anyone else
may start. A 429 or 5xx with a Retry-After (API Priority and Fairness sends it as a header) holds
every Lease call until that wait is over; a wait that ends past the renew deadline ends leadership at
the deadline, without hammering a server that asked for quiet.

With a legacy Lease name (the one Lease every release shared before the chart named one per release),
a candidate also holds that Lease, and does not lead while a replica of its own release (by pod-name
prefix) holds it: during a rolling upgrade the old version's replicas campaign only on the legacy
name, so without this an old and a new replica would both lead until the rollout ends. A holder from
another release is left alone: releases never wait on each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

from gpupulse.clock import Clock, SystemClock
from remediation.errors import KubeConflict, KubeError
from remediation.kube.client import KubeClient
from remediation.kube.lease import LeaseRecord, LeaseStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaderElectionSettings:
    """Lease location and timing (defaults as draino and client-go use them)."""

    namespace: str
    identity: str
    lease_name: str = "gpupulse-remediation-leader"
    lease_duration_seconds: int = 15
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0
    release_on_cancel: bool = True
    legacy_lease_name: str = ""  # "": no earlier version to exclude
    legacy_holder_prefix: str = ""  # holders of the legacy Lease that are this release's replicas

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("leader election needs a non-empty identity (the pod name)")
        if self.legacy_lease_name == self.lease_name:
            raise ValueError(f"the legacy Lease name must differ from the Lease name ({self.lease_name})")
        if not self.lease_duration_seconds > self.renew_deadline_seconds > self.retry_period_seconds > 0:
            raise ValueError(
                "need lease_duration_seconds > renew_deadline_seconds > retry_period_seconds > 0"
            )


class LeaderElector:
    """Campaigns for the Lease, runs a callback while leading, cancels it the moment leadership ends."""

    def __init__(
        self, client: KubeClient, settings: LeaderElectionSettings, clock: Clock | None = None
    ) -> None:
        self._store = LeaseStore(client, settings.namespace)
        self._settings = settings
        self._clock = clock or SystemClock()
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._last_renew: float | None = None
        self._legacy: LeaseRecord | None = None  # the legacy Lease as last read, and when it changed
        self._legacy_at = 0.0
        self._legacy_waiting_on = ""
        self._not_before = 0.0  # monotonic: the server's Retry-After forbids another call until then

    @property
    def identity(self) -> str:
        """This candidate's holderIdentity."""
        return self._settings.identity

    @property
    def is_leader(self) -> bool:
        """True only while we hold the Lease and renewed it within the renew deadline."""
        if self._last_renew is None:
            return False
        return self._clock.monotonic() - self._last_renew < self._settings.renew_deadline_seconds

    @property
    def term(self) -> int:
        """The Lease's leaseTransitions as last read: one number per leadership, growing (a fencing token)."""
        return self._observed.lease_transitions if self._observed else 0

    @property
    def observed_holder(self) -> str:
        """Who held the Lease when we last read it."""
        return self._observed.holder_identity if self._observed else ""

    async def run(
        self,
        on_started_leading: Callable[[], Coroutine[Any, Any, None]],
        on_stopped_leading: Callable[[], Awaitable[None]],
    ) -> None:
        """Campaign; lead while renewals succeed, then campaign again. Cancel the call to stop."""
        while True:
            await self._acquire()
            work = asyncio.create_task(on_started_leading(), name=f"leading:{self.identity}")
            renewing = asyncio.create_task(self._renew_until_lost(), name=f"renewing:{self.identity}")
            try:
                done, _ = await asyncio.wait({work, renewing}, return_when=asyncio.FIRST_COMPLETED)
                if work in done and not work.cancelled() and work.exception() is None:
                    await renewing  # the work ended on its own: keep the Lease until it is lost
            finally:
                self._last_renew = None  # is_leader turns false before anything else happens
                for task in (work, renewing):
                    task.cancel()
                for task in (work, renewing):
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                try:
                    await on_stopped_leading()
                finally:
                    failed = work.done() and not work.cancelled() and work.exception() is not None
                    if self._settings.release_on_cancel and (_cancelling() or failed):
                        await self._release()
            error = work.exception() if work.done() and not work.cancelled() else None
            if error is not None:
                raise error

    async def _acquire(self) -> None:
        while True:
            throttled = self._not_before - self._clock.monotonic()
            if throttled > 0:  # e.g. stepped down on a 429: the first try waits it out too
                await self._clock.sleep(throttled)
            if await self._try_acquire_or_renew():
                break
            await self._clock.sleep(self._next_attempt_in())
        log.info("%s became leader of %s", self.identity, self._settings.lease_name)

    async def _renew_until_lost(self) -> None:
        s = self._settings
        while True:
            await self._clock.sleep(self._renew_in())
            left = s.renew_deadline_seconds - (self._clock.monotonic() - (self._last_renew or 0.0))
            if left > 0 and self._clock.monotonic() >= self._not_before:
                try:
                    await asyncio.wait_for(self._try_acquire_or_renew(), left)
                except TimeoutError:
                    pass
            if self.observed_holder not in ("", s.identity):
                self._last_renew = None  # someone else holds it: never act beside them
            if not self.is_leader:
                log.warning("%s lost leadership of %s", self.identity, s.lease_name)
                return

    async def _try_acquire_or_renew(self) -> bool:
        s = self._settings
        now = self._clock.utcnow()
        mono = self._clock.monotonic()
        mine = LeaseRecord(
            holder_identity=s.identity,
            lease_duration_seconds=s.lease_duration_seconds,
            acquire_time=now,
            renew_time=now,
        )
        try:
            current = await self._store.get(s.lease_name)
            if current is None:
                self._note(await self._store.create(s.lease_name, mine), mono)
                return await self._renewed(mine, mono)
            if self._observed is None or _changed(self._observed, current):
                self._observed, self._observed_at = current, mono
            held_by_other = current.holder_identity not in ("", s.identity)
            if held_by_other and mono - self._observed_at < current.lease_duration_seconds:
                return False
            if current.holder_identity == s.identity:
                record = replace(current, renew_time=now, lease_duration_seconds=s.lease_duration_seconds)
            else:
                record = replace(
                    mine,
                    lease_transitions=current.lease_transitions + 1,
                    resource_version=current.resource_version,
                )
            self._note(await self._store.swap(s.lease_name, record), mono)
            return await self._renewed(mine, mono)
        except KubeConflict:
            return False
        except KubeError as exc:
            if exc.retry_after_seconds > 0:
                self._not_before = self._clock.monotonic() + exc.retry_after_seconds
            log.warning("%s: lease %s call failed: %s", s.identity, s.lease_name, exc)
            return False

    async def _renewed(self, mine: LeaseRecord, mono: float) -> bool:
        """After the Lease was written: lead (count it as a renewal) unless the legacy Lease says an
        earlier version of this release may still be leading."""
        if not await self._legacy_clear(mine, mono):
            return False
        self._last_renew = mono
        return True

    async def _legacy_clear(self, mine: LeaseRecord, mono: float) -> bool:
        """True when no replica of this release but us can lead on the legacy Lease: we hold it
        (created, renewed or taken once expired, by the same rules as the Lease), or a live holder
        belongs to another release."""
        s = self._settings
        name = s.legacy_lease_name
        if not name:
            return True
        current = await self._store.get(name)
        if current is None:
            self._legacy, self._legacy_at = await self._store.create(name, mine), mono
            return True
        if self._legacy is None or _changed(self._legacy, current):
            self._legacy, self._legacy_at = current, mono
        holder = current.holder_identity
        if holder == s.identity:
            record = replace(
                current, renew_time=mine.renew_time, lease_duration_seconds=s.lease_duration_seconds
            )
        elif holder and mono - self._legacy_at < current.lease_duration_seconds:
            if not holder.startswith(s.legacy_holder_prefix):
                return True  # another release's replica: not ours to wait on or to take
            if holder != self._legacy_waiting_on:  # once per holder, not every retry period
                log.info(
                    "%s: %s (an earlier version of this release?) holds %s; not leading",
                    s.identity,
                    holder,
                    name,
                )
                self._legacy_waiting_on = holder
            return False
        else:
            record = replace(
                mine,
                lease_transitions=current.lease_transitions + 1,
                resource_version=current.resource_version,
            )
        self._legacy, self._legacy_at = await self._store.swap(name, record), mono
        return True

    def _next_attempt_in(self) -> float:
        """Seconds to the next try: the retry period, or sooner when the observed Lease expires
        sooner, so a follower takes over right at expiry instead of up to one period later; never
        sooner than the server's Retry-After."""
        period = self._settings.retry_period_seconds
        throttled = self._not_before - self._clock.monotonic()
        if self._observed is None:
            return max(period, throttled)
        left = self._observed.lease_duration_seconds - (self._clock.monotonic() - self._observed_at)
        return max(min(period, max(left, 0.0) + 0.05), throttled)

    def _renew_in(self) -> float:
        """Seconds to the next renewal: the retry period, or the server's Retry-After when longer,
        but never past the renew deadline (a wait that would end past it ends there: we step down,
        as client-go's leader does when its renew context times out)."""
        s = self._settings
        now = self._clock.monotonic()
        wait = max(s.retry_period_seconds, self._not_before - now)
        left = s.renew_deadline_seconds - (now - (self._last_renew or 0.0))
        return min(wait, max(left, 0.0))

    def _note(self, record: LeaseRecord, mono: float) -> None:
        self._observed, self._observed_at = record, mono

    async def _release(self) -> None:
        """Give the Leases up on a clean stop so a follower need not wait out the duration."""
        for name in (self._settings.lease_name, self._settings.legacy_lease_name):
            if name:
                await self._release_one(name)

    async def _release_one(self, name: str) -> None:
        period = self._settings.retry_period_seconds
        try:
            current = await asyncio.wait_for(self._store.get(name), period)
            if current is None or current.holder_identity != self.identity:
                return
            released = replace(
                current, holder_identity="", lease_duration_seconds=1, renew_time=self._clock.utcnow()
            )
            await asyncio.wait_for(self._store.swap(name, released), period)
        except (KubeError, TimeoutError) as exc:
            log.warning("%s could not release %s: %s", self.identity, name, exc)


def _changed(old: LeaseRecord, new: LeaseRecord) -> bool:
    return (old.holder_identity, old.renew_time, old.resource_version) != (
        new.holder_identity,
        new.renew_time,
        new.resource_version,
    )


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
