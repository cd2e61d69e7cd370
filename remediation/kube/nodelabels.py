"""Node labels for the engine's scope (its node selector), read from the API with a short cache."""

from __future__ import annotations

from collections.abc import Mapping

from gpupulse.clock import Clock, SystemClock
from remediation.errors import KubeNotFound
from remediation.kube.client import KubeClient

DEFAULT_TTL_SECONDS = 60.0


class KubeNodeLabels:
    """Implements remediation.model.NodeLabels: GET /api/v1/nodes/{name}, each node at most once per
    TTL (a storm of alerts about one node costs one request). A missing node is None; other API
    errors propagate, so the alert is retried instead of being judged out of scope."""

    def __init__(
        self, client: KubeClient, ttl_seconds: float = DEFAULT_TTL_SECONDS, clock: Clock | None = None
    ):
        self.client = client
        self.ttl_seconds = ttl_seconds
        self.clock = clock or SystemClock()
        self._cache: dict[str, tuple[float, Mapping[str, str] | None]] = {}

    async def labels(self, node: str) -> Mapping[str, str] | None:
        """The node's metadata.labels ({} when it has none), None when it does not exist."""
        now = self.clock.monotonic()
        cached = self._cache.get(node)
        if cached is not None and now - cached[0] < self.ttl_seconds:
            return cached[1]
        try:
            found = await self.client.get_node(node)
        except KubeNotFound:
            labels: Mapping[str, str] | None = None
        else:
            raw = (found.get("metadata") or {}).get("labels") or {}
            labels = {str(k): str(v) for k, v in raw.items()}
        if len(self._cache) > 10_000:  # bounded: a cluster's nodes, not every name ever seen
            self._cache.clear()
        self._cache[node] = (now, labels)
        return labels
