"""coordination.k8s.io/v1 Lease records: read, create and compare-and-swap through KubeClient."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from remediation.errors import KubeNotFound
from remediation.kube.client import JSON, KubeClient
from remediation.kube.timing import micro_time, parse_time


@dataclass(frozen=True)
class LeaseRecord:
    """The spec fields of a Lease plus the resourceVersion it was read at."""

    holder_identity: str = ""
    lease_duration_seconds: int = 0
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    lease_transitions: int = 0
    resource_version: str = ""

    @classmethod
    def from_json(cls, lease: JSON) -> LeaseRecord:
        """Read the record out of an API object."""
        spec: dict[str, Any] = lease.get("spec") or {}
        meta: dict[str, Any] = lease.get("metadata") or {}
        return cls(
            holder_identity=str(spec.get("holderIdentity") or ""),
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=parse_time(spec.get("acquireTime")),
            renew_time=parse_time(spec.get("renewTime")),
            lease_transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str(meta.get("resourceVersion") or ""),
        )

    def to_json(self, namespace: str, name: str) -> JSON:
        """The API object for a create (no resourceVersion) or a replace (with it)."""
        spec: JSON = {
            "leaseDurationSeconds": self.lease_duration_seconds,
            "leaseTransitions": self.lease_transitions,
        }
        if self.holder_identity:
            spec["holderIdentity"] = self.holder_identity
        if self.acquire_time is not None:
            spec["acquireTime"] = micro_time(self.acquire_time)
        if self.renew_time is not None:
            spec["renewTime"] = micro_time(self.renew_time)
        meta: JSON = {"name": name, "namespace": namespace}
        if self.resource_version:
            meta["resourceVersion"] = self.resource_version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def expired_at(self, now: datetime) -> bool:
        """True when nobody holds it or its holder stopped renewing more than a duration ago."""
        if not self.holder_identity or self.renew_time is None:
            return True
        return (now - self.renew_time).total_seconds() >= self.lease_duration_seconds

    def seconds_left(self, now: datetime) -> float:
        """How long the current holder still owns it (0 when expired)."""
        if self.expired_at(now) or self.renew_time is None:
            return 0.0
        return max(0.0, self.lease_duration_seconds - (now - self.renew_time).total_seconds())


class LeaseStore:
    """Reads and writes Lease records of one namespace."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        self._client = client
        self.namespace = namespace

    async def get(self, name: str) -> LeaseRecord | None:
        """The current record, or None when the Lease does not exist."""
        try:
            return LeaseRecord.from_json(await self._client.get_lease(self.namespace, name))
        except KubeNotFound:
            return None

    async def create(self, name: str, record: LeaseRecord) -> LeaseRecord:
        """Create it; raises KubeConflict when someone else created it first."""
        body = replace(record, resource_version="").to_json(self.namespace, name)
        return LeaseRecord.from_json(await self._client.create_lease(self.namespace, body))

    async def swap(self, name: str, record: LeaseRecord) -> LeaseRecord:
        """Replace it if still at record.resource_version; raises KubeConflict otherwise."""
        body = record.to_json(self.namespace, name)
        return LeaseRecord.from_json(await self._client.replace_lease(self.namespace, name, body))
