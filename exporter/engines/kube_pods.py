"""Engine targets from annotations on this node's pods: the exporter's only module that talks to the
Kubernetes API (through kubernetes_asyncio).

The pods come from one LIST and then a WATCH, both with the field selector spec.nodeName=<node>, as
a kubelet and client-go's reflector do: the LIST asks for resourceVersion "0", which the API server
answers from its watch cache instead of etcd; each WATCH resumes from the last resourceVersion seen
(events and BOOKMARKs) and ends after watch_timeout_seconds, when the next one starts where it
stopped; only a 410 Expired (the server no longer has that resourceVersion) costs a new LIST, which
then reads the current state (resourceVersion ""). docs/scale.md counts the requests.

Annotations (docs/design/engines.md):
  gpupulse.io/engine  vllm|sglang|tgi|triton|trtllm|dynamo|auto  (required: opts the pod in)
  gpupulse.io/port    metrics port (default per engine kind; required for auto)
  gpupulse.io/path    metrics path (default /metrics; /prometheus/metrics for trtllm)
  gpupulse.io/scheme  http|https (default http)
  gpupulse.io/model   model name override
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import watch as k8s_watch
from kubernetes_asyncio.client.exceptions import ApiException

from exporter.engines.detect import KINDS
from exporter.engines.settings import KubeSettings
from exporter.engines.targets import AUTO, Target
from exporter.errors import Expired, KubeError
from gpupulse.clock import Clock

log = logging.getLogger(__name__)

PREFIX = "gpupulse.io/"
DEFAULT_PORTS: Mapping[str, int] = {
    "vllm": 8000,
    "sglang": 30000,
    "tgi": 80,
    "triton": 8002,
    "trtllm": 8000,
    "dynamo": 8000,
}
DEFAULT_PATHS: Mapping[str, str] = {"trtllm": "/prometheus/metrics"}


def target_from_pod(pod: Mapping[str, Any]) -> Target | None:
    """The pod's engine target, or None when it is not annotated, not running, or malformed."""
    meta = pod.get("metadata") or {}
    ann = meta.get("annotations") or {}
    kind = ann.get(PREFIX + "engine")
    status = pod.get("status") or {}
    ip = status.get("podIP")
    if not kind or status.get("phase") != "Running" or not ip:
        return None
    if kind != AUTO and kind not in KINDS:
        log.warning("pod %s/%s: unknown engine %r", meta.get("namespace"), meta.get("name"), kind)
        return None
    try:
        port = int(ann[PREFIX + "port"]) if PREFIX + "port" in ann else DEFAULT_PORTS[kind]
    except (KeyError, ValueError):
        log.warning("pod %s/%s: no usable %sport", meta.get("namespace"), meta.get("name"), PREFIX)
        return None
    scheme = ann.get(PREFIX + "scheme", "http")
    path = ann.get(PREFIX + "path", DEFAULT_PATHS.get(kind, "/metrics"))
    if not path.startswith("/"):
        path = "/" + path
    host = f"[{ip}]" if ":" in ip else ip
    return Target(
        url=f"{scheme}://{host}:{port}{path}",
        kind=kind,
        model=ann.get(PREFIX + "model", ""),
        namespace=str(meta.get("namespace", "")),
        pod=str(meta.get("name", "")),
    )


@dataclass
class DiscoveryStats:
    """What the source asked of the API server (docs/scale.md), and how often it failed."""

    lists: int = 0
    watches: int = 0
    relists_after_expired: int = 0
    failures: int = 0
    events: int = 0


Sleep = Callable[[float], Awaitable[None]]


def api_client(settings: KubeSettings) -> k8s.ApiClient:
    """An API client for the pod's service account; the token is re-read before every request,
    because projected service-account tokens rotate."""
    configuration = k8s.Configuration(host=settings.api_url)
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    if settings.api_url.startswith("https"):
        configuration.verify_ssl = True
        if settings.ca_path is not None:
            configuration.ssl_ca_cert = str(settings.ca_path)

    def refresh(config: k8s.Configuration) -> None:
        try:
            config.api_key = {"BearerToken": settings.token_path.read_text().strip()}
        except OSError as exc:
            raise KubeError(f"service account token: {exc}") from exc

    refresh(configuration)  # the client sends a token only once one is set
    configuration.refresh_api_key_hook = refresh
    return k8s.ApiClient(configuration)


class KubePodSource:
    """This node's annotated pods, kept current by a watch; the last good state survives API errors."""

    def __init__(
        self,
        settings: KubeSettings,
        clock: Clock,
        client_factory: Callable[[KubeSettings], k8s.ApiClient] = api_client,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._client_factory = client_factory
        self._sleep = sleep
        self._client: k8s.ApiClient | None = None
        self._pods: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._targets: list[Target] = []
        self._resource_version: str | None = None  # None: LIST before the next WATCH
        self._synced = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.stats = DiscoveryStats()

    async def targets(self) -> list[Target]:
        """Annotated, running pods of this node as targets. Only the first call waits (at most
        timeout_seconds) for the first LIST; later calls never wait on the API server."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"pod-watch-{self._settings.node_name}")
            first = True
        else:
            first = False
        if first and not self._synced.is_set():
            try:
                await asyncio.wait_for(self._synced.wait(), self._settings.timeout_seconds)
            except TimeoutError:
                log.warning("engine pod discovery: no pod list yet from %s", self._settings.api_url)
        return self._targets

    async def wait_until(self, predicate: Callable[[], bool], timeout_seconds: float) -> None:
        """Wait until predicate() holds, re-checked after every change of targets or stats."""
        async with asyncio.timeout(timeout_seconds):
            while not predicate():
                changed = self._changed
                await changed.wait()

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

    # --- the reflector loop

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
                log.info("engine pod discovery: %s; listing again", exc)
                self.stats.relists_after_expired += 1
                self._resource_version, consistent = None, True
            except (KubeError, ApiException, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                self.stats.failures += 1
                self._notify()
                log.warning(
                    "engine pod discovery failed, keeping %d targets, retry in %.0f s: %s",
                    len(self._targets),
                    delay,
                    exc,
                )
                await self._sleep(delay)
                delay = min(delay * 2, self._settings.retry_max_seconds)

    def _api(self) -> Any:  # Any: the generated CoreV1Api is untyped
        if self._client is None:
            self._client = self._client_factory(self._settings)
        return k8s.CoreV1Api(self._client)

    async def _list(self, consistent: bool) -> None:
        self.stats.lists += 1
        response = await self._api().list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self._settings.node_name}",
            resource_version="" if consistent else "0",
            _preload_content=False,
            _request_timeout=self._settings.timeout_seconds,
        )
        try:
            if response.status != 200:
                raise _error(response.status, await response.text())
            body = json.loads(await response.read())
        finally:
            response.release()
        items = body.get("items") if isinstance(body, dict) else None
        rv = (body.get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
        if not isinstance(items, list) or not isinstance(rv, str) or not rv:
            raise KubeError("LIST pods: no items or no resourceVersion")
        pods: dict[tuple[str, str], Mapping[str, Any]] = {}
        for pod in items:
            key = _key(pod) if isinstance(pod, dict) else None
            if key is not None:
                pods[key] = pod
        self._pods = pods
        self._resource_version = rv
        self._publish()

    async def _watch(self) -> None:
        s = self._settings
        self.stats.watches += 1
        self._notify()
        timeout = int(s.watch_timeout_seconds * (1 + random.random()))
        stream = k8s_watch.Watch(return_type="object")
        try:
            events = stream.stream(
                self._api().list_pod_for_all_namespaces,
                field_selector=f"spec.nodeName={s.node_name}",
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
                except (ApiException, aiohttp.ClientError, TimeoutError, asyncio.CancelledError):
                    raise
                except Exception as exc:  # kubernetes_asyncio raises a bare Exception on a malformed event
                    raise KubeError(f"WATCH pods: {exc}") from exc
                self._apply(event)
        except ApiException as exc:
            if exc.status == 410:
                raise Expired(f"WATCH pods: {exc.reason}") from exc
            raise
        finally:
            await stream.close()  # its own ApiClient (used to decode) and the response

    def _apply(self, event: Any) -> None:
        if not isinstance(event, dict) or not isinstance(event.get("raw_object"), dict):
            raise KubeError(f"WATCH pods: not an event: {str(event)[:200]}")
        kind, pod = event.get("type"), event["raw_object"]
        rv = (pod.get("metadata") or {}).get("resourceVersion")
        if not isinstance(rv, str) or not rv:
            raise KubeError("WATCH pods: event without a resourceVersion")
        self.stats.events += 1
        self._resource_version = rv
        if kind == "BOOKMARK":
            self._notify()
            return
        key = _key(pod)
        if key is None:
            raise KubeError("WATCH pods: event without a namespace and name")
        if kind in ("ADDED", "MODIFIED"):
            self._pods[key] = pod
        elif kind == "DELETED":
            self._pods.pop(key, None)
        else:
            raise KubeError(f"WATCH pods: unknown event type {kind!r}")
        self._publish()

    def _publish(self) -> None:
        self._targets = sorted(
            (t for p in self._pods.values() if (t := target_from_pod(p)) is not None), key=lambda t: t.url
        )
        self._synced.set()
        self._notify()


def _key(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    meta = pod.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str):
        return None
    return namespace, name


def _error(status: int, text: str) -> KubeError:
    try:
        body = json.loads(text)
    except ValueError:
        body = {}
    message = body.get("message", text[:200]) if isinstance(body, dict) else text[:200]
    if status == 410:
        return Expired(f"LIST pods: HTTP 410: {message}")
    return KubeError(f"LIST pods: HTTP {status}: {message}")
