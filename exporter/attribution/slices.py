"""This node's ResourceSlices: DRA (driver, pool, device) names -> GPU and MIG UUIDs.

A DRA driver publishes the devices of a node as ResourceSlices (resource.k8s.io); the kubelet's
pod-resources API names a claim's devices only by (driver, pool, device). NVIDIA's DRA driver
(gpu.nvidia.com) gives each device the attributes `type` ("gpu" or "mig"), `uuid` (the GPU's or the
MIG device's UUID) and, for MIG, `parentUUID`. Attribute names may be written qualified with the
driver's domain (`gpu.nvidia.com/uuid`); both spellings are read.

Versions: `resource.k8s.io/v1` (Kubernetes 1.34, GA) and `v1beta2` keep the attributes on the device;
`v1beta1` nests them under `basic`. The source tries v1, then v1beta2, then v1beta1, and keeps the
first one the server serves (404 means "not served here"); when a WATCH of it answers 404 (an upgrade
stopped serving it), it lists again through the versions.

A pool may be spread over several slices and is republished with a higher `pool.generation`; only
the slices of a pool's newest generation count, as the scheduler reads them.

The source is the shared reflector (exporter/kube/reflector.py): one LIST (resourceVersion "0", from
the watch cache) with the field selector spec.nodeName=<node>, then WATCHes resumed from the last
resourceVersion; a 410 Expired costs a new LIST; errors keep the last good index.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.errors import KubeError
from exporter.kube.client import ApiSettings
from exporter.kube.reflector import Reflector

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
class SliceSettings(ApiSettings):
    """Where and how to watch this node's ResourceSlices, and which drivers' devices are GPUs."""

    drivers: tuple[str, ...] = DEFAULT_DRIVERS


def _path(version: str) -> str:
    return f"/apis/{GROUP}/{version}/{PLURAL}"


class ResourceSliceSource(Reflector):
    """This node's ResourceSlices kept current by a watch; `index()` never waits on the API server."""

    resource = "ResourceSlices"
    log = log

    def __init__(self, settings: SliceSettings, **kwargs: Any) -> None:
        super().__init__(settings, **kwargs)
        self._drivers = settings.drivers
        self._index: dict[DeviceKey, SliceDevice] = {}
        self.version: str | None = None  # the resource.k8s.io version the server serves

    def index(self) -> dict[DeviceKey, SliceDevice]:
        """The latest (driver, pool, device) -> UUID index; the last good one while the API fails."""
        return self._index

    async def _list_body(self, consistent: bool) -> Mapping[str, Any]:
        # the version read last first; every version when it is no longer served (an upgrade)
        versions = tuple(dict.fromkeys((self.version, *VERSIONS) if self.version else VERSIONS))
        for version in versions:
            body = await self._list_path(_path(version), consistent)
            if body is not None:
                if self.version != version:
                    log.info("ResourceSlices: reading %s/%s", GROUP, version)
                self.version = version
                return body
        self.version = None
        raise KubeError(f"{GROUP} is not served in any of {', '.join(VERSIONS)}", 404)

    def _watch_path(self) -> str:
        return _path(self.version or VERSIONS[0])

    def _publish(self) -> None:
        self._index = index_slices(self._objects.values(), self._drivers)
