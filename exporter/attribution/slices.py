"""This node's ResourceSlices: DRA (driver, pool, device) names -> GPU and MIG UUIDs.

A DRA driver publishes the devices of a node as ResourceSlices (resource.k8s.io); the kubelet's
pod-resources API names a claim's devices only by (driver, pool, device). NVIDIA's DRA driver
(gpu.nvidia.com) gives each device the attributes `type` ("gpu" or "mig"), `uuid` (the GPU's or the
MIG device's UUID) and, for MIG, `parentUUID`. Attribute names may be written qualified with the
driver's domain (`gpu.nvidia.com/uuid`); both spellings are read.

Versions: `resource.k8s.io/v1` (Kubernetes 1.34, GA) and `v1beta2` keep the attributes on the device;
`v1beta1` nests them under `basic`. The source tries v1, then v1beta2, then v1beta1, and keeps the
first one the server serves (404 means "not served here").

A pool may be spread over several slices and is republished with a higher `pool.generation`; only
the slices of a pool's newest generation count, as the scheduler reads them.

The source is a reflector like exporter/engines/kube_pods.py: one LIST (resourceVersion "0", from
the watch cache) with the field selector spec.nodeName=<node>, then WATCHes resumed from the last
resourceVersion; a 410 Expired costs a new LIST; errors keep the last good index.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import watch as k8s_watch
from kubernetes_asyncio.client.exceptions import ApiException

from exporter.errors import Expired, KubeError

log = logging.getLogger(__name__)

GROUP = "resource.k8s.io"
PLURAL = "resourceslices"
VERSIONS: tuple[str, ...] = ("v1", "v1beta2", "v1beta1")
# DRA drivers whose devices are NVIDIA GPUs (NVIDIA's k8s-dra-driver-gpu).
DEFAULT_DRIVERS: tuple[str, ...] = ("gpu.nvidia.com",)

DeviceKey = tuple[str, str, str]  # (driver, pool, device)


@dataclass(frozen=True)
class SliceDevice:
    """What a ResourceSlice says about one device."""

    uuid: str  # GPU UUID, or the MIG device's UUID
    parent_uuid: str  # the GPU of a MIG device; "" for a whole GPU
    kind: str  # the driver's `type` attribute: gpu, mig, ...


def _attribute(attributes: Mapping[str, Any], driver: str, name: str) -> str:
    value = attributes.get(name)
    if value is None:
        value = attributes.get(f"{driver}/{name}")
    if not isinstance(value, Mapping):
        return ""
    for kind in ("string", "version"):
        if isinstance(value.get(kind), str):
            return str(value[kind])
    if isinstance(value.get("int"), int):
        return str(value["int"])
    return ""


def _devices_of(spec: Mapping[str, Any]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    devices = spec.get("devices")
    if not isinstance(devices, list):
        return
    for device in devices:
        if not isinstance(device, Mapping) or not isinstance(device.get("name"), str):
            continue
        attributes = device.get("attributes")
        if attributes is None and isinstance(device.get("basic"), Mapping):
            attributes = device["basic"].get("attributes")  # v1beta1
        yield device["name"], attributes if isinstance(attributes, Mapping) else {}


def index_slices(slices: Iterable[Mapping[str, Any]], drivers: Iterable[str]) -> dict[DeviceKey, SliceDevice]:
    """(driver, pool, device) -> UUIDs for the GPU drivers' devices, newest pool generation only."""
    wanted = set(drivers)
    newest: dict[tuple[str, str], int] = {}
    kept: list[tuple[str, str, int, Mapping[str, Any]]] = []
    for obj in slices:
        spec = obj.get("spec") if isinstance(obj, Mapping) else None
        if not isinstance(spec, Mapping):
            continue
        driver, pool = spec.get("driver"), spec.get("pool")
        if driver not in wanted or not isinstance(pool, Mapping) or not isinstance(pool.get("name"), str):
            continue
        generation = pool.get("generation", 0)
        generation = generation if isinstance(generation, int) else 0
        key = (str(driver), str(pool["name"]))
        newest[key] = max(newest.get(key, generation), generation)
        kept.append((key[0], key[1], generation, spec))
    out: dict[DeviceKey, SliceDevice] = {}
    for driver, pool, generation, spec in kept:
        if generation != newest[(driver, pool)]:
            continue  # a stale slice of a pool that was republished
        for name, attributes in _devices_of(spec):
            uuid = _attribute(attributes, driver, "uuid")
            if uuid:
                parent = _attribute(attributes, driver, "parentUUID")
                out[(driver, pool, name)] = SliceDevice(uuid, parent, _attribute(attributes, driver, "type"))
    return out


@dataclass(frozen=True)
class SliceSettings:
    """Where and how to watch this node's ResourceSlices."""

    node_name: str
    api_url: str = "https://kubernetes.default.svc"
    token_path: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    ca_path: Path | None = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
    drivers: tuple[str, ...] = DEFAULT_DRIVERS
    timeout_seconds: float = 5.0
    watch_timeout_seconds: float = 300.0  # jittered up to twice as long, as client-go's reflector
    retry_seconds: float = 1.0
    retry_max_seconds: float = 60.0


def api_client(settings: SliceSettings) -> k8s.ApiClient:
    """An API client for the pod's service account; the token is re-read before every request."""
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

    refresh(configuration)
    configuration.refresh_api_key_hook = refresh
    return k8s.ApiClient(configuration)


@dataclass
class SliceStats:
    """Requests made and failures seen, for tests and docs/scale.md."""

    lists: int = 0
    watches: int = 0
    relists_after_expired: int = 0
    failures: int = 0
    events: int = 0


class ResourceSliceSource:
    """This node's ResourceSlices kept current by a watch; `index()` never waits on the API server."""

    def __init__(
        self,
        settings: SliceSettings,
        client_factory: Callable[[SliceSettings], k8s.ApiClient] = api_client,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._settings = settings
        self._client_factory = client_factory
        self._sleep = sleep
        self._client: k8s.ApiClient | None = None
        self._slices: dict[str, Mapping[str, Any]] = {}
        self._index: dict[DeviceKey, SliceDevice] = {}
        self._resource_version: str | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.version: str | None = None  # the resource.k8s.io version the server serves
        self.error = "ResourceSlices not listed yet"
        self.stats = SliceStats()

    def start(self) -> None:
        """Start the reflector (idempotent; needs a running loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="resourceslice-watch")

    def index(self) -> dict[DeviceKey, SliceDevice]:
        """The latest (driver, pool, device) -> UUID index; the last good one while the API fails."""
        return self._index

    async def wait_until(self, predicate: Callable[[], bool], timeout_seconds: float) -> None:
        """Wait until predicate() holds, re-checked after every change."""
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

    async def _run(self) -> None:
        delay = self._settings.retry_seconds
        consistent = False
        while True:
            try:
                if self._resource_version is None:
                    await self._list(consistent)
                await self._watch()
                delay = self._settings.retry_seconds
            except Expired as exc:
                log.info("ResourceSlices: %s; listing again", exc)
                self.stats.relists_after_expired += 1
                self._resource_version, consistent = None, True
            except (KubeError, ApiException, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                self.stats.failures += 1
                if str(exc) != self.error:  # once per change: a cluster without DRA would log forever
                    log.warning(
                        "ResourceSlices failed, keeping %d devices, retrying (backing off to %.0f s): %s",
                        len(self._index),
                        self._settings.retry_max_seconds,
                        exc,
                    )
                self.error = str(exc)
                self._notify()
                await self._sleep(delay)
                delay = min(delay * 2, self._settings.retry_max_seconds)

    def _api(self) -> Any:  # Any: the generated CustomObjectsApi is untyped
        if self._client is None:
            self._client = self._client_factory(self._settings)
        return k8s.CustomObjectsApi(self._client)

    async def _list_version(self, version: str, consistent: bool) -> dict[str, Any] | None:
        """One LIST of this version; None when the server does not serve it (404)."""
        response = await self._api().list_cluster_custom_object(
            GROUP,
            version,
            PLURAL,
            field_selector=f"spec.nodeName={self._settings.node_name}",
            resource_version="" if consistent else "0",
            _preload_content=False,
            _request_timeout=self._settings.timeout_seconds,
        )
        try:
            if response.status == 404:
                return None
            text = await response.text()
            if response.status != 200:
                raise _error(response.status, text)
        finally:
            response.release()
        body = json.loads(text)
        if not isinstance(body, dict):
            raise KubeError("LIST resourceslices: not an object")
        return body

    async def _list(self, consistent: bool) -> None:
        self.stats.lists += 1
        versions = (self.version,) if self.version is not None else VERSIONS
        body = None
        for version in versions:
            try:
                body = await self._list_version(version, consistent)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                body = None
            if body is not None:
                if self.version != version:
                    log.info("ResourceSlices: reading %s/%s", GROUP, version)
                self.version = version
                break
        if body is None:
            self.version = None
            raise KubeError(f"{GROUP} is not served in any of {', '.join(VERSIONS)}")
        items = body.get("items")
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if not isinstance(items, list) or not isinstance(rv, str) or not rv:
            raise KubeError("LIST resourceslices: no items or no resourceVersion")
        self._slices = {n: o for o in items if isinstance(o, dict) and (n := _name(o)) is not None}
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
                self._api().list_cluster_custom_object,
                GROUP,
                self.version,
                PLURAL,
                field_selector=f"spec.nodeName={s.node_name}",
                resource_version=self._resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout,
                _request_timeout=(s.timeout_seconds, timeout + s.timeout_seconds),
            )
            while True:
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    return
                except (ApiException, aiohttp.ClientError, TimeoutError, asyncio.CancelledError):
                    raise
                except Exception as exc:  # kubernetes_asyncio raises a bare Exception on a malformed event
                    raise KubeError(f"WATCH resourceslices: {exc}") from exc
                self._apply(event)
        except ApiException as exc:
            if exc.status == 410:
                raise Expired(f"WATCH resourceslices: {exc.reason}") from exc
            raise
        finally:
            await stream.close()

    def _apply(self, event: Any) -> None:
        if not isinstance(event, dict) or not isinstance(event.get("raw_object"), dict):
            raise KubeError(f"WATCH resourceslices: not an event: {str(event)[:200]}")
        kind, obj = event.get("type"), event["raw_object"]
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if not isinstance(rv, str) or not rv:
            raise KubeError("WATCH resourceslices: event without a resourceVersion")
        self.stats.events += 1
        self._resource_version = rv
        if kind == "BOOKMARK":
            self._notify()
            return
        name = _name(obj)
        if name is None:
            raise KubeError("WATCH resourceslices: event without a name")
        if kind in ("ADDED", "MODIFIED"):
            self._slices[name] = obj
        elif kind == "DELETED":
            self._slices.pop(name, None)
        else:
            raise KubeError(f"WATCH resourceslices: unknown event type {kind!r}")
        self._publish()

    def _publish(self) -> None:
        self._index = index_slices(self._slices.values(), self._settings.drivers)
        self.error = ""
        self._notify()


def _name(obj: Mapping[str, Any]) -> str | None:
    name = (obj.get("metadata") or {}).get("name")
    return name if isinstance(name, str) else None


def _error(status: int, text: str) -> KubeError:
    try:
        body = json.loads(text)
    except ValueError:
        body = {}
    message = body.get("message", text[:200]) if isinstance(body, dict) else text[:200]
    if status == 410:
        return Expired(f"LIST resourceslices: HTTP 410: {message}")
    return KubeError(f"LIST resourceslices: HTTP {status}: {message}")
