"""Per-node mutual exclusion: a Lease `gpupulse-node-<node>` held while an action touches the node."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from gpupulse.clock import Clock
from remediation.errors import KubeConflict, KubeError, KubeNotFound, KubeTooManyRequests, KubeUnavailable
from remediation.kube.lease import LeaseRecord, LeaseStore
from remediation.kube.retry import retry_throttled

log = logging.getLogger(__name__)

_MAX_NAME = 253
FIRST_RETRY_SECONDS = 0.2  # retry_throttled's first backoff


class NodeBusy(Exception):
    """Another action (of this replica or another) holds the node's Lease. The message is what a
    page says: who holds it, when it expires, and how to clear it should that holder be dead."""

    def __init__(
        self,
        node: str,
        holder: str,
        seconds_left: float,
        lease: str = "",
        expires_at: datetime | None = None,
    ) -> None:
        self.node = node
        self.holder = holder
        self.seconds_left = seconds_left
        self.lease = lease  # namespace/name
        self.expires_at = expires_at
        until = f" until {expires_at.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}" if expires_at is not None else ""
        text = f"node {node} is locked by {holder or 'another writer'}{until} ({seconds_left:.0f}s left)"
        if lease:
            namespace, _, name = lease.partition("/")
            text += (
                f"; Lease {lease}, expires by itself; if {holder or 'its holder'} is gone: "
                f"kubectl -n {namespace} delete lease {name}"
            )
        super().__init__(text)


def node_lease_name(node: str) -> str:
    """gpupulse-node-<node>, shortened with a hash when the node name is too long for an object name."""
    name = f"gpupulse-node-{node}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:12]
    return f"{name[: _MAX_NAME - 13].rstrip('.-')}-{digest}"


class NodeLock:
    """Takes and releases node Leases; every hold gets its own holder identity."""

    def __init__(self, store: LeaseStore, identity: str, clock: Clock, duration_seconds: int) -> None:
        self._store = store
        self._identity = identity
        self._clock = clock
        self._duration = duration_seconds
        self._retrying: set[asyncio.Task[None]] = set()  # releases the server refused, being retried

    @asynccontextmanager
    async def hold(self, node: str) -> AsyncIterator[str]:
        """Hold the node's Lease for the body; raises NodeBusy when it is taken."""
        holder = f"{self._identity}/{uuid.uuid4().hex[:8]}"
        name = node_lease_name(node)
        await self._acquire(node, name, holder)
        try:
            yield holder
        finally:
            await self._release(name, holder)

    async def _acquire(self, node: str, name: str, holder: str) -> None:
        now = self._clock.utcnow()
        current = await self._store.get(name)
        wanted = LeaseRecord(
            holder_identity=holder,
            lease_duration_seconds=self._duration,
            acquire_time=now,
            renew_time=now,
        )
        try:
            if current is None:
                await self._store.create(name, wanted)
                return
            if not current.expired_at(now):
                raise self._busy(node, name, current, now)
            await self._store.swap(
                name,
                replace(
                    wanted,
                    lease_transitions=current.lease_transitions + 1,
                    resource_version=current.resource_version,
                ),
            )
        except KubeConflict as exc:
            # someone wrote the Lease between our read and our write: they won; say who, if we can
            try:
                winner = await self._store.get(name)
            except KubeError:
                winner = None
            if winner is None or winner.expired_at(now):
                raise NodeBusy(node, "", float(self._duration), self._where(name)) from exc
            raise self._busy(node, name, winner, now) from exc

    def _where(self, name: str) -> str:
        return f"{self._store.namespace}/{name}"

    def _busy(self, node: str, name: str, current: LeaseRecord, now: datetime) -> NodeBusy:
        left = current.seconds_left(now)
        renewed = current.renew_time
        expires = renewed + timedelta(seconds=current.lease_duration_seconds) if renewed else None
        return NodeBusy(node, current.holder_identity, left, self._where(name), expires)

    async def _release(self, name: str, holder: str) -> None:
        """Give the Lease up. A throttled or unavailable server is retried (Retry-After honoured) until
        the Lease would have expired anyway, in the background after the first try so the action's
        outcome is not held up: a release refused once used to leave the node locked for the whole
        duration, and every later action on it escalated as "locked"."""
        expires = self._clock.monotonic() + self._duration
        try:
            await self._release_once(name, holder)
        except (KubeTooManyRequests, KubeUnavailable) as exc:
            log.warning("node lease %s: release refused (%s); retrying until it would expire", name, exc)
            task = asyncio.create_task(self._release_until(name, holder, expires, exc.retry_after_seconds))
            self._retrying.add(task)
            task.add_done_callback(self._retrying.discard)
        except KubeError as exc:
            # not fatal: the Lease expires by itself after its duration
            log.warning("could not release node lease %s: %s", name, exc)

    async def _release_until(self, name: str, holder: str, expires: float, wait_seconds: float) -> None:
        # the inline try was refused too: its Retry-After holds for the first retry as for the rest (the
        # API server's audit log showed the retry 0.01 s after a 429 that asked for 1 s)
        wait = max(wait_seconds, FIRST_RETRY_SECONDS * random.uniform(0.5, 1.0))
        if self._clock.monotonic() + wait > expires:
            log.warning("could not release node lease %s before it expires", name)
            return
        await self._clock.sleep(wait)
        try:
            await retry_throttled(
                lambda: self._release_once(name, holder),
                clock=self._clock,
                deadline=expires,
                what=f"releasing node lease {name}",
            )
        except KubeError as exc:
            log.warning("could not release node lease %s before it expires: %s", name, exc)

    async def _release_once(self, name: str, holder: str) -> None:
        try:
            current = await self._store.get(name)
            if current is None or current.holder_identity != holder:
                return
            released = replace(current, holder_identity="", renew_time=self._clock.utcnow())
            await self._store.swap(name, released)
        except (KubeConflict, KubeNotFound):
            return  # someone else's now, or gone: nothing of ours to release

    async def drain(self) -> None:
        """Wait for releases still being retried (tests, shutdown)."""
        while self._retrying:
            await asyncio.gather(*self._retrying, return_exceptions=True)
