"""Which DRA devices a GPU is, and which pods hold them: ResourceSlices and ResourceClaims, read by
the controller itself (the exporter has its own reflector; the two services do not import each other).

NVIDIA's DRA driver (gpu.nvidia.com) publishes one device per GPU and per MIG instance, with the
attributes `uuid` (and `parentUUID` for a MIG device), spelled bare or in the driver's domain
(`gpu.nvidia.com/uuid`). A fault of a GPU is a fault of its MIG devices too, so both are found.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from remediation.kube.client import KubeClient

JSON = dict[str, Any]
RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSION = "v1"  # Kubernetes 1.34+; DeviceTaintRule is served in v1 from 1.37


@dataclass(frozen=True)
class Device:
    """One device of a ResourceSlice: what a DeviceTaintRule's deviceSelector names."""

    driver: str
    pool: str
    name: str
    uuid: str  # the device's own UUID (a MIG device's, not its GPU's)

    @property
    def key(self) -> str:
        return f"{self.driver}/{self.pool}/{self.name}"


@dataclass(frozen=True)
class Holder:
    """A pod a ResourceClaim allocated on one of the devices is reserved for."""

    namespace: str
    name: str
    uid: str
    claim: str
    # the claim's allocation tolerates this taint key (the pod may stay on the tainted device)
    tolerates: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _attribute(attributes: Mapping[str, Any], driver: str, name: str) -> str:
    for key in (name, f"{driver}/{name}"):
        value = attributes.get(key)
        if isinstance(value, Mapping) and isinstance(value.get("string"), str):
            return str(value["string"])
    return ""


def devices_of_gpu(slices: Iterable[Mapping[str, Any]], uuid: str, drivers: Sequence[str]) -> list[Device]:
    """The devices of `slices` that are the GPU `uuid` or a MIG instance of it, by driver, pool, name."""
    found: dict[str, Device] = {}
    for obj in slices:
        spec = obj.get("spec") or {}
        driver = str(spec.get("driver") or "")
        if drivers and driver not in drivers:
            continue
        pool = str((spec.get("pool") or {}).get("name") or "")
        for device in spec.get("devices") or []:
            attributes = device.get("attributes") or (device.get("basic") or {}).get("attributes") or {}
            own = _attribute(attributes, driver, "uuid")
            if uuid and uuid in (own, _attribute(attributes, driver, "parentUUID")):
                dev = Device(driver, pool, str(device.get("name") or ""), own)
                found[dev.key] = dev
    return sorted(found.values(), key=lambda d: d.key)


def tolerates(tolerations: Iterable[Mapping[str, Any]], key: str, value: str, effect: str) -> bool:
    """A claim's device tolerations tolerate this taint (the rules of Kubernetes tolerations: an empty
    key with Exists tolerates every key, an empty effect every effect, Equal also compares the value)."""
    for t in tolerations:
        op = t.get("operator") or "Equal"
        if t.get("effect") and t.get("effect") != effect:
            continue
        if op == "Exists" and (not t.get("key") or t.get("key") == key):
            return True
        if op == "Equal" and t.get("key") == key and (t.get("value") or "") == value:
            return True
    return False


def holders_of(
    claims: Iterable[Mapping[str, Any]], devices: Sequence[Device], taint: Mapping[str, str]
) -> list[Holder]:
    """The pods the claims allocated on `devices` are reserved for (claim status.reservedFor)."""
    wanted = {(d.driver, d.pool, d.name) for d in devices}
    out: dict[str, Holder] = {}
    for claim in claims:
        meta, status = claim.get("metadata") or {}, claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        hits = [r for r in results if (r.get("driver"), r.get("pool"), r.get("device")) in wanted]
        if not hits:
            continue
        key, value, effect = taint.get("key", ""), taint.get("value", ""), taint.get("effect", "")
        ok = all(tolerates(r.get("tolerations") or [], key, value, effect) for r in hits)
        for ref in status.get("reservedFor") or []:
            if ref.get("resource") != "pods":
                continue
            holder = Holder(
                str(meta.get("namespace") or ""),
                str(ref.get("name") or ""),
                str(ref.get("uid") or ""),
                str(meta.get("name") or ""),
                ok,
            )
            out[holder.key] = holder
    return sorted(out.values(), key=lambda h: h.key)


async def find_gpu_devices(client: KubeClient, node: str, uuid: str, drivers: Sequence[str]) -> list[Device]:
    """The DRA devices of GPU `uuid` on `node` (none on a cluster whose GPUs a device plugin serves).

    Raises KubeNotFound when the server does not serve resource.k8s.io/v1 (a cluster before 1.34)."""
    slices = await client.list_cluster_objects(
        RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices", field_selector=f"spec.nodeName={node}"
    )
    return devices_of_gpu(slices, uuid, drivers)


async def find_holders(
    client: KubeClient, devices: Sequence[Device], taint: Mapping[str, str]
) -> list[Holder]:
    """The pods holding any of `devices` through an allocated ResourceClaim, in every namespace."""
    claims = await client.list_cluster_objects(RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims")
    return holders_of(claims, devices, taint)
