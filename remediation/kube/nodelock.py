"""Per-node mutual exclusion: a Lease `gpupulse-node-<node>` held while an action touches the node."""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

from gpupulse.clock import Clock
from remediation.errors import KubeConflict, KubeError, KubeNotFound
from remediation.kube.lease import LeaseRecord, LeaseStore

log = logging.getLogger(__name__)

_MAX_NAME = 253


class NodeBusy(Exception):
    """Another action (of this replica or another) holds the node's Lease."""

    def __init__(self, node: str, holder: str, seconds_left: float) -> None:
        super().__init__(f"node {node} is locked by {holder or 'another writer'} ({seconds_left:.0f}s left)")
        self.node = node
        self.holder = holder
        self.seconds_left = seconds_left


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
                raise NodeBusy(node, current.holder_identity, current.seconds_left(now))
            await self._store.swap(
                name,
                replace(
                    wanted,
                    lease_transitions=current.lease_transitions + 1,
                    resource_version=current.resource_version,
                ),
            )
        except KubeConflict as exc:
            # someone wrote the Lease between our read and our write: they won
            raise NodeBusy(node, "", float(self._duration)) from exc

    async def _release(self, name: str, holder: str) -> None:
        try:
            current = await self._store.get(name)
            if current is None or current.holder_identity != holder:
                return
            released = replace(current, holder_identity="", renew_time=self._clock.utcnow())
            await self._store.swap(name, released)
        except (KubeConflict, KubeNotFound):
            return
        except KubeError as exc:
            # not fatal: the Lease expires by itself after its duration
            log.warning("could not release node lease %s: %s", name, exc)
