"""A reflector over one kind of this node's objects: LIST, then WATCHes resumed from the last
resourceVersion, as client-go's reflector does.

The first LIST asks for resourceVersion "0" (answered from the API server's watch cache, not etcd)
with the field selector spec.nodeName=<node>; each WATCH resumes from the last resourceVersion seen
(events and BOOKMARKs) and ends after watch_timeout_seconds (jittered), when the next one starts where
it stopped. Only a 410 Expired costs a new LIST, which then reads the current state (resourceVersion
""). Errors keep the last good objects and back off. Subclasses say what to list and watch and what
to derive from the objects (`_publish`); readers read that derived view and never wait on the API.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from exporter.errors import Expired, KubeError
from exporter.kube.client import ApiSettings, api_client

if TYPE_CHECKING:
    from kubernetes_asyncio import client as k8s
    from kubernetes_asyncio.client.exceptions import ApiException


def _api_exception() -> type[ApiException]:
    """kubernetes_asyncio's error type, imported on first use (see exporter.kube.client). An `except`
    names it only when an exception is on its way, and a reflector's requests begin by making its
    client, which imports the library anyway."""
    from kubernetes_asyncio.client.exceptions import ApiException

    return ApiException


Key = tuple[str, str]  # (namespace or "", name)
WatchCall = tuple[Callable[..., Any], tuple[Any, ...]]  # the list function and its positional args


@dataclass
class ReflectorStats:
    """Requests made and failures seen, for tests and docs/scale.md."""

    lists: int = 0
    watches: int = 0
    relists_after_expired: int = 0
    failures: int = 0
    events: int = 0


class Reflector(abc.ABC):
    """This node's objects of one resource, kept current by a watch; the last good state survives
    API errors."""

    resource = "objects"  # for messages
    log = logging.getLogger(__name__)

    def __init__(
        self,
        settings: ApiSettings,
        client_factory: Callable[[Any], k8s.ApiClient] = api_client,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._settings = settings
        self._client_factory = client_factory
        self._sleep = sleep
        self._client: k8s.ApiClient | None = None
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
    def _watch_call(self) -> WatchCall:
        """The generated list function a WATCH streams from, with its positional arguments."""

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

    def _api_client(self) -> k8s.ApiClient:
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
            except (KubeError, _api_exception(), aiohttp.ClientError, TimeoutError, ValueError) as exc:
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
                self._notify()
                await self._sleep(delay)
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
        func, args = self._watch_call()
        from kubernetes_asyncio import watch as k8s_watch

        stream = k8s_watch.Watch(return_type="object")
        try:
            events = stream.stream(
                func,
                *args,
                field_selector=self._node_selector,
                resource_version=self._resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout,
                # a silent connection is dead once the server's own timeout has passed
                _request_timeout=(s.timeout_seconds, timeout + s.timeout_seconds),
            )
            while True:
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    return  # the server ended the watch (timeoutSeconds): resume from the last RV
                except (_api_exception(), aiohttp.ClientError, TimeoutError, asyncio.CancelledError):
                    raise
                except Exception as exc:  # kubernetes_asyncio raises a bare Exception on a malformed event
                    raise KubeError(f"WATCH {self.resource}: {exc}") from exc
                self._apply(event)
        except _api_exception() as exc:
            if exc.status == 410:
                raise Expired(f"WATCH {self.resource}: {exc.reason}") from exc
            raise
        finally:
            await stream.close()  # its own ApiClient (used to decode) and the response

    def _apply(self, event: Any) -> None:
        if not isinstance(event, dict) or not isinstance(event.get("raw_object"), dict):
            raise KubeError(f"WATCH {self.resource}: not an event: {str(event)[:200]}")
        kind, obj = event.get("type"), event["raw_object"]
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

    def _core_api(self) -> Any:  # Any: the generated APIs are untyped
        from kubernetes_asyncio import client as k8s

        return k8s.CoreV1Api(self._api_client())

    def _custom_api(self) -> Any:
        from kubernetes_asyncio import client as k8s

        return k8s.CustomObjectsApi(self._api_client())

    async def _list_call(
        self, func: Callable[..., Any], *args: Any, consistent: bool
    ) -> Mapping[str, Any] | None:
        """One LIST of this node's objects through a generated list function; None on 404 (the
        resource is not served here)."""
        try:
            response = await func(
                *args,
                field_selector=self._node_selector,
                resource_version="" if consistent else "0",
                _preload_content=False,
                _request_timeout=self._settings.timeout_seconds,
            )
        except _api_exception() as exc:
            if exc.status == 404:
                return None
            raise
        return await self._read_list(response)

    async def _read_list(self, response: Any) -> Mapping[str, Any] | None:
        """The body of a LIST answered with _preload_content=False; None on 404 (not served)."""
        try:
            if response.status == 404:
                return None
            text = await response.text()
            if response.status != 200:
                raise http_error(f"LIST {self.resource}", response.status, text)
        finally:
            response.release()
        body = json.loads(text)
        if not isinstance(body, dict):
            raise KubeError(f"LIST {self.resource}: not an object")
        return body


class PodReflector(Reflector):
    """This node's pods (LIST and WATCH of every namespace, with the reflector's node selector);
    subclasses keep what they need of them in `_publish`."""

    resource = "pods"

    async def _list_body(self, consistent: bool) -> Mapping[str, Any]:
        body = await self._list_call(self._core_api().list_pod_for_all_namespaces, consistent=consistent)
        if body is None:
            raise http_error("LIST pods", 404, "")
        return body

    def _watch_call(self) -> WatchCall:
        return self._core_api().list_pod_for_all_namespaces, ()


def key_of(obj: Mapping[str, Any]) -> Key | None:
    """(namespace, name) of an object; namespace "" for a cluster-scoped one."""
    meta = obj.get("metadata") or {}
    namespace, name = meta.get("namespace", ""), meta.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str):
        return None
    return namespace, name


def http_error(what: str, status: int, text: str) -> KubeError:
    """An API server's non-200 answer as KubeError (Expired for 410), with its Status message."""
    try:
        body = json.loads(text)
    except ValueError:
        body = {}
    message = body.get("message", text[:200]) if isinstance(body, dict) else text[:200]
    if status == 410:
        return Expired(f"{what}: HTTP 410: {message}")
    return KubeError(f"{what}: HTTP {status}: {message}")
