"""A reflector over one kind of this node's objects: LIST, then WATCHes resumed from the last
resourceVersion, as client-go's reflector does.

The first LIST asks for resourceVersion "0" (answered from the API server's watch cache, not etcd)
with the field selector spec.nodeName=<node>, in pages of list_page_size (`limit`/`continue`; a
continue token that expired mid-list costs one LIST of everything at once, as client-go's pager
does). Each WATCH asks for bookmarks and resumes from the last resourceVersion seen (events and
BOOKMARKs); it ends after watch_timeout_seconds (jittered), when the next one starts where it
stopped. A 410 Expired costs a new LIST, first from the last resourceVersion seen
(resourceVersionMatch=NotOlderThan, served by the watch cache) and only when that is gone too
(410, or "too large resource version") a quorum read (resourceVersion ""). Failures, 410s and short
watches (under short_watch_seconds without a new resourceVersion: a server closing every watch at
once) keep the last good objects and back off as client-go does (exporter/kube/backoff.py; at least
as long as a 429's Retry-After asks); a watch silent for watch_idle_timeout_seconds is opened again
at once. Requests go through exporter/kube/client.py. Subclasses say what to list and watch and what
to derive from the objects (`_publish`); readers read that derived view and never wait on the API.
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
from exporter.kube.backoff import Backoff
from exporter.kube.client import ApiSettings, KubeClient, WatchEvent
from gpupulse.clock import Clock, SystemClock

Key = tuple[str, str]  # (namespace or "", name)
PODS = "/api/v1/pods"  # every namespace's, narrowed by the node selector
# One LIST's pages at most: a server handing out continue tokens forever is refused, not followed.
MAX_LIST_PAGES = 1000


@dataclass
class ReflectorStats:
    """Requests made and failures seen, for tests and docs/scale.md."""

    lists: int = 0
    watches: int = 0
    relists_after_expired: int = 0
    failures: int = 0
    events: int = 0
    silent_watches: int = 0  # watches given up after watch_idle_timeout_seconds without a byte
    short_watches: int = 0  # ended under short_watch_seconds without a new resourceVersion
    quorum_relists: int = 0  # LISTs at resourceVersion "" after the last one seen was gone too
    expired_continues: int = 0  # paged LISTs whose continue token expired: listed again at once
    list_pages: int = 0  # LIST requests, every page counted
    backoffs: int = 0
    backoff_seconds: float = 0.0  # waited in all


class Reflector(abc.ABC):
    """This node's objects of one resource, kept current by a watch; the last good state survives
    API errors."""

    resource = "objects"  # for messages
    log = logging.getLogger(__name__)

    def __init__(
        self,
        settings: ApiSettings,
        client_factory: Callable[[ApiSettings], KubeClient] = KubeClient,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._settings = settings
        self._client_factory = client_factory
        # the clock times the watches (short ones are backed off); it sleeps too unless told otherwise
        self._watch_clock: Clock = clock if clock is not None else SystemClock()
        self._sleep = sleep if sleep is not None else self._watch_clock.sleep
        self._backoff = Backoff(
            settings.retry_seconds,
            settings.retry_max_seconds,
            settings.retry_reset_seconds,
            settings.retry_jitter_ratio,
        )
        self._client: KubeClient | None = None
        self._objects: dict[Key, Mapping[str, Any]] = {}
        self._resource_version: str | None = None  # None: LIST before the next WATCH
        self._relist_from = "0"  # the next LIST's resourceVersion: "0", or the last seen after a 410
        self._list_rv = "0"  # the resourceVersion of the LIST under way ("" for a quorum read)
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
        while True:
            try:
                if self._resource_version is None:
                    await self._relist()
                if await self._watch():
                    self.stats.short_watches += 1
                    self.log.debug("%s: the watch ended at once with nothing new", self.resource)
                    await self._back_off()
            except Expired as exc:
                # client-go keeps the version: a LIST "not older than" it comes from the watch cache
                self.log.info("%s: %s; listing again", self.resource, exc)
                self.stats.relists_after_expired += 1
                if self._resource_version is not None:
                    self._relist_from = self._resource_version
                self._resource_version = None
                await self._back_off()  # a server answering every watch 410 must not get a LIST storm
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
                    # the collection is gone (an upgrade): list again, its versions mean nothing now
                    self._resource_version, self._relist_from = None, "0"
                self._notify()
                # a 429's Retry-After is honoured, within the back-off's cap
                retry_after = exc.retry_after_seconds if isinstance(exc, KubeError) else 0.0
                await self._back_off(retry_after)

    async def _back_off(self, at_least_seconds: float = 0.0) -> None:
        delay = self._backoff.next_delay(self._watch_clock.monotonic(), at_least_seconds)
        self.stats.backoffs += 1
        self.stats.backoff_seconds += delay
        await self._sleep(delay)

    async def _relist(self) -> None:
        """LIST from where the reflector stands; a quorum read only when the watch cache cannot
        serve that version (client-go's relistResourceVersion and its fallback)."""
        try:
            await self._list(self._relist_from)
        except KubeError as exc:
            if self._relist_from == "" or not _version_unavailable(exc):
                raise
            self.log.info("%s: %s; listing from etcd", self.resource, exc)
            self.stats.quorum_relists += 1
            await self._list("")
        self._relist_from = "0"

    async def _list(self, resource_version: str) -> None:
        self.stats.lists += 1
        self._list_rv = resource_version
        body = await self._list_body(resource_version == "")
        items = body.get("items")
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if not isinstance(items, list) or not isinstance(rv, str) or not rv:
            raise KubeError(f"LIST {self.resource}: no items or no resourceVersion")
        self._objects = {k: o for o in items if isinstance(o, dict) and (k := key_of(o)) is not None}
        self._resource_version = rv
        self._published()

    async def _watch(self) -> bool:
        """One WATCH until the server ends it; True when it was short (under short_watch_seconds and
        no newer resourceVersion: no event, no bookmark, or only replays of what was seen)."""
        s = self._settings
        self.stats.watches += 1
        self._notify()
        timeout = int(s.watch_timeout_seconds * (1 + random.random()))
        since = self._resource_version
        params = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "fieldSelector": self._node_selector,
            "resourceVersion": str(since),
            "timeoutSeconds": str(timeout),
        }
        started = self._watch_clock.monotonic()
        async with self._api().watch(f"WATCH {self.resource}", self._watch_path(), params) as events:
            if self.error:  # the server is answering again, and replays what changed meanwhile
                self.error = ""
                self._notify()
            async for event in events:
                self._apply(event)
        # the server ended the watch (timeoutSeconds): the next one resumes from the last RV
        return (
            self._resource_version == since
            and self._watch_clock.monotonic() - started < s.short_watch_seconds
        )

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
        """One LIST of this node's objects of a collection, at the reflector's resourceVersion
        ("" when consistent), page by page; None on 404 (not served here)."""
        what = f"LIST {self.resource}"
        rv = "" if consistent else self._list_rv
        params = {"fieldSelector": self._node_selector, "resourceVersion": rv}
        if rv not in ("", "0"):
            params["resourceVersionMatch"] = "NotOlderThan"
        # Paged, as client-go's reflector pages, except from a given version: with a limit the server
        # would read that from etcd, whole the watch cache serves it (client-go turns paging off there).
        limit = self._settings.list_page_size if rv in ("", "0") else 0
        if limit <= 0:
            self.stats.list_pages += 1
            return await self._api().list(what, path, params)
        items: list[Any] = []
        seen: set[str] = set()
        token = ""
        for _ in range(MAX_LIST_PAGES):
            # a continue token carries the list's version and selector; the server refuses both beside it
            page_params = {"fieldSelector": self._node_selector, "continue": token} if token else params
            self.stats.list_pages += 1
            try:
                body = await self._api().list(what, path, {**page_params, "limit": str(limit)})
            except Expired:
                if not token:
                    raise
                # the token outlived etcd's compaction: one LIST of everything (client-go's pager)
                self.log.info("%s: continue token expired; listing everything at once", self.resource)
                self.stats.expired_continues += 1
                self.stats.list_pages += 1
                return await self._api().list(what, path, params)
            if body is None:
                if token:
                    raise KubeError(f"{what}: HTTP 404 on a continued page", 404)
                return None
            page = body.get("items")
            meta = body.get("metadata") or {}
            if not isinstance(page, list) or not isinstance(meta, dict):
                raise KubeError(f"{what}: a page without items")
            items += page
            token = meta.get("continue") or ""
            if not isinstance(token, str) or token in seen:
                raise KubeError(f"{what}: a continue token that leads nowhere")
            if not token:
                # the last page's metadata: every page of one LIST carries the same resourceVersion
                return {**body, "items": items}
            seen.add(token)
        raise KubeError(f"{what}: more than {MAX_LIST_PAGES} pages")


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


def _version_unavailable(exc: KubeError) -> bool:
    """The LIST's resourceVersion is gone (410) or not yet in this server's watch cache (client-go's
    isExpiredError / isTooLargeResourceVersionError)."""
    return isinstance(exc, Expired) or "too large resource version" in str(exc).lower()
