"""Kubelet pod-resources client and the background tracker that keeps its last good answer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.attribution.podresources_proto import (
    LIST_METHOD,
    PodResources,
    decode_list_response,
    encode_list_request,
)
from exporter.errors import PodResourcesDecodeError, PodResourcesError
from gpupulse.clock import Clock, SystemClock

if TYPE_CHECKING:  # imported on first use (see list)
    from exporter.wire.grpc import UnaryChannel

log = logging.getLogger(__name__)

DEFAULT_SOCKET_PATH = "/var/lib/kubelet/pod-resources/kubelet.sock"
# The kubelet's own limit for this API; a node with many pods answers with a few hundred KiB.
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class PodResourcesClient:
    """Client for `v1.PodResourcesLister/List` on the kubelet's unix socket (its connection kept)."""

    def __init__(
        self, socket_path: str, timeout_seconds: float, max_message_bytes: int = _MAX_MESSAGE_BYTES
    ) -> None:
        self._socket_path = socket_path
        self._timeout_seconds = timeout_seconds
        self._max_message_bytes = max_message_bytes
        # The kubelet answers the same bytes refresh after refresh while no pod comes or goes: those
        # are decoded once (decoding 110 pods cost 3-4 ms of the 5 ms a refresh took, every 10 s), and
        # the same objects come back, so what was made from them (allocations, PID -> pod) is kept.
        self._last: tuple[bytes, tuple[PodResources, ...]] | None = None
        self._channel: UnaryChannel | None = None

    @property
    def connections_opened(self) -> int:
        """Connections opened to the kubelet so far (one kept while it lasts)."""
        return self._channel.connections_opened if self._channel is not None else 0

    async def list(self) -> tuple[PodResources, ...]:
        """One List call within the timeout; raises PodResourcesError on any failure."""
        if self._channel is None:
            # h2 is imported on first use (under 1 MiB of RSS): nodes without a kubelet (bare metal,
            # --simulate) never need it.
            from exporter.wire.grpc import UnaryChannel

            self._channel = UnaryChannel(self._socket_path)
        data = await self._channel.call(
            LIST_METHOD,
            encode_list_request(),
            timeout_seconds=self._timeout_seconds,
            max_message_bytes=self._max_message_bytes,
        )
        last = self._last
        if last is not None and last[0] == data:
            return last[1]
        try:
            pods = decode_list_response(data)
        except PodResourcesDecodeError as exc:
            raise PodResourcesError(f"undecodable List answer: {exc}") from exc
        self._last = (data, pods)
        return pods

    async def close(self) -> None:
        """Close the kept connection (a later List opens a new one)."""
        if self._channel is not None:
            await self._channel.close()


@dataclass(frozen=True)
class TrackerSettings:
    refresh_interval_seconds: float = 10.0
    # How long the last good answer is still used while the kubelet cannot be reached.
    max_stale_seconds: float = 60.0


@dataclass(frozen=True)
class PodResourcesView:
    """What the tracker knows now."""

    pods: tuple[PodResources, ...]
    error: str  # "" when the latest refresh succeeded
    has_data: bool  # False before the first success or after the last one went stale


class PodResourcesTracker:
    """Refreshes pod-resources in the background on its own interval, never per scrape."""

    def __init__(
        self, client: PodResourcesClient, settings: TrackerSettings, clock: Clock | None = None
    ) -> None:
        self._client = client
        self._settings = settings
        self._clock = clock or SystemClock()
        self._pods: tuple[PodResources, ...] = ()
        self._last_success: float | None = None
        self._error = "pod-resources not refreshed yet"
        self._task: asyncio.Task[None] | None = None
        self._refreshed = asyncio.Condition()
        self._refresh_count = 0

    @property
    def refresh_count(self) -> int:
        """Number of refresh attempts so far (successful or not)."""
        return self._refresh_count

    async def refresh_once(self) -> None:
        """Ask the kubelet once and record the outcome."""
        try:
            pods = await self._client.list()
        except PodResourcesError as exc:
            if self._error != str(exc):
                log.warning("pod-resources refresh failed: %s", exc)
            self._error = str(exc)
        else:
            if self._error and self._last_success is not None:
                log.info("pod-resources refresh recovered")
            self._pods, self._error, self._last_success = pods, "", self._clock.monotonic()
        async with self._refreshed:
            self._refresh_count += 1
            self._refreshed.notify_all()

    async def wait_refreshed(self, after_count: int) -> None:
        """Wait until more than `after_count` refreshes have happened."""
        async with self._refreshed:
            await self._refreshed.wait_for(lambda: self._refresh_count > after_count)

    def start(self) -> None:
        """Start the background refresh loop (idempotent; needs a running event loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="pod-resources-refresh")

    async def _run(self) -> None:
        while True:
            await self.refresh_once()
            await asyncio.sleep(self._settings.refresh_interval_seconds)

    def view(self) -> PodResourcesView:
        """The latest answer, or none once it is older than max_stale_seconds."""
        fresh = (
            self._last_success is not None
            and self._clock.monotonic() - self._last_success <= self._settings.max_stale_seconds
        )
        return PodResourcesView(pods=self._pods if fresh else (), error=self._error, has_data=fresh)

    async def close(self) -> None:
        """Stop the loop and close the client."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._client.close()
