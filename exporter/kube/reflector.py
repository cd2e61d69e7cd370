"""A reflector over one kind of this node's objects: LIST, then WATCHes resumed from the last
resourceVersion, as client-go's reflector does.

The first LIST asks for resourceVersion "0" (answered from the API server's watch cache, not etcd)
with the field selector spec.nodeName=<node>; each WATCH resumes from the last resourceVersion seen
(events and BOOKMARKs) and ends after watch_timeout_seconds (jittered), when the next one starts where
it stopped. Only a 410 Expired costs a new LIST, which then reads the current state (resourceVersion
""). Errors keep the last good objects and back off (at least as long as a 429's Retry-After asks);
a watch silent for watch_idle_timeout_seconds is opened again at once. Requests go through
exporter/kube/client.py. Subclasses say what to list and watch and what to derive from the objects
(`_publish`); readers read that derived view and never wait on the API.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.errors import Expired, KubeError, WatchSilentError
from exporter.kube.client import ApiSettings, KubeClient, WatchEvent

Key = tuple[str, str]  # (namespace or "", name)
PODS = "/api/v1/pods"  # every namespace's, narrowed by the node selector


@dataclass
class ReflectorStats:
    """Requests made and failures seen, for tests and docs/scale.md."""

    lists: int = 0
    watches: int = 0
    relists_after_expired: int = 0
    failures: int = 0
    events: int = 0
    silent_watches: int = 0  # watches given up after watch_idle_timeout_seconds without a byte


class Reflector(abc.ABC):
    """This node's objects of one resource, kept current by a watch; the last good state survives
    API errors."""

    resource = "objects"  # for messages
    log = logging.getLogger(__name__)

    def __init__(
        self,
        settings: ApiSettings,
        client_factory: Callable[[ApiSettings], KubeClient] = KubeClient,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._settings = settings
        self._client_factory = client_factory
        self._sleep = sleep
        self._client: KubeClient | None = None
        self._objects: dict[Key, Mapping[str, Any]] = {}
        self._resource_version: str | None = None  # None: LIST before the next WATCH
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.error = f"{self.resource} not listed yet"
        self.stats = ReflectorStats()

    # --- what a subclass says

    @abc.abstractmethod
    async def _list_body(self, consistent: bool) -> Mapping[str, Any]:
        """One LIST of this node's objects (resourceVersion "" when consistent, else "0")."""

    @abc.abstractmethod
    def _watch_path(self) -> str:
        """The collection a WATCH streams from (the one the last LIST read)."""

    @abc.abstractmethod
    def _publish(self) -> None:
        """Derive the readers' view from self._objects (after every LIST and every change)."""

    # --- lifecycle

    def start(self) -> None:
        """Start the reflector (idempotent; needs a running loop)."""
        if self._task is None:
            name = f"{self.resource}-watch-{self._settings.node_name}"
            self._task = asyncio.get_running_loop().create_task(self._run(), name=name)

    @property
    def started(self) -> bool:
        return self._task is not None

    async def wait_until(self, predicate: Callable[[], bool], timeout_seconds: float) -> None:
        """Wait until predicate() holds, re-checked after every change of objects or stats."""
        async with asyncio.timeout(timeout_seconds):
            while not predicate():
                await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def close(self) -> None:
        """Stop watching and close the HTTP session."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self._client is not None:
            await self._client.close()
            self._client = None

    def _api(self) -> KubeClient:
        if self._client is None:
            self._client = self._client_factory(self._settings)
        return self._client

    @property
    def _node_selector(self) -> str:
        return f"spec.nodeName={self._settings.node_name}"

    # --- the loop

    async def _run(self) -> None:
        delay = self._settings.retry_seconds
        consistent = False  # the first LIST may come from the watch cache
        while True:
            try:
                if self._resource_version is None:
                    await self._list(consistent)
                await self._watch()
                delay = self._settings.retry_seconds
            except Expired as exc:
                self.log.info("%s: %s; listing again", self.resource, exc)
                self.stats.relists_after_expired += 1
                self._resource_version, consistent = None, True
            except WatchSilentError as exc:
                # a quiet server or a dead connection: a new WATCH (from the same resourceVersion)
                # tells, and fails like any request if the server is gone
                self.log.info("%s: %s; watching again", self.resource, exc)
                self.stats.silent_watches += 1
            except (KubeError, ValueError) as exc:
                self.stats.failures += 1
                if str(exc) != self.error:  # once per change: a cluster without the API would log forever
                    self.log.warning(
                        "%s failed, keeping %d objects, retrying (backing off to %.0f s): %s",
                        self.resource,
                        len(self._objects),
                        self._settings.retry_max_seconds,
                        exc,
                    )
                self.error = str(exc)
                if isinstance(exc, KubeError) and exc.status == 404:
                    self._resource_version = None  # the collection is gone (an upgrade): list again
                self._notify()
                # a 429's Retry-After is honoured, within the back-off's cap
                retry_after = exc.retry_after_seconds if isinstance(exc, KubeError) else 0.0
                await self._sleep(max(delay, min(retry_after, self._settings.retry_max_seconds)))
                delay = min(delay * 2, self._settings.retry_max_seconds)

    async def _list(self, consistent: bool) -> None:
        self.stats.lists += 1
        body = await self._list_body(consistent)
        items = body.get("items")
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if not isinstance(items, list) or not isinstance(rv, str) or not rv:
            raise KubeError(f"LIST {self.resource}: no items or no resourceVersion")
        self._objects = {k: o for o in items if isinstance(o, dict) and (k := key_of(o)) is not None}
        self._resource_version = rv
        self._published()

    async def _watch(self) -> None:
        s = self._settings
        self.stats.watches += 1
        self._notify()
        timeout = int(s.watch_timeout_seconds * (1 + random.random()))
        params = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "fieldSelector": self._node_selector,
            "resourceVersion": str(self._resource_version),
            "timeoutSeconds": str(timeout),
        }
        async with self._api().watch(f"WATCH {self.resource}", self._watch_path(), params) as events:
            if self.error:  # the server is answering again, and replays what changed meanwhile
                self.error = ""
                self._notify()
            async for event in events:
                self._apply(event)
        # the server ended the watch (timeoutSeconds): the next one resumes from the last RV

    def _apply(self, event: WatchEvent) -> None:
        kind, obj = event.type, event.object
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if not isinstance(rv, str) or not rv:
            raise KubeError(f"WATCH {self.resource}: event without a resourceVersion")
        self.stats.events += 1
        self._resource_version = rv
        if kind == "BOOKMARK":
            self._notify()
            return
        key = key_of(obj)
        if key is None:
            raise KubeError(f"WATCH {self.resource}: event without a name")
        if kind in ("ADDED", "MODIFIED"):
            self._objects[key] = obj
        elif kind == "DELETED":
            self._objects.pop(key, None)
        else:
            raise KubeError(f"WATCH {self.resource}: unknown event type {kind!r}")
        self._published()

    def _published(self) -> None:
        self._publish()
        self.error = ""
        self._notify()

    async def _list_path(self, path: str, consistent: bool) -> Mapping[str, Any] | None:
        """One LIST of this node's objects of a collection; None on 404 (not served here)."""
        params = {"fieldSelector": self._node_selector, "resourceVersion": "" if consistent else "0"}
        return await self._api().list(f"LIST {self.resource}", path, params)


class PodReflector(Reflector):
    """This node's pods (LIST and WATCH of every namespace, with the reflector's node selector);
    subclasses keep what they need of them in `_publish`."""

    resource = "pods"

    async def _list_body(self, consistent: bool) -> Mapping[str, Any]:
        body = await self._list_path(PODS, consistent)
        if body is None:
            raise KubeError(f"LIST pods: HTTP 404: {PODS} is not served", 404)
        return body

    def _watch_path(self) -> str:
        return PODS


def key_of(obj: Mapping[str, Any]) -> Key | None:
    """(namespace, name) of an object; namespace "" for a cluster-scoped one."""
    meta = obj.get("metadata") or {}
    namespace, name = meta.get("namespace", ""), meta.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str):
        return None
    return namespace, name
