"""The kubelet pod-resources v1 `List` call, declared in Python with the real API's numbers.

The messages are built at import time from a FileDescriptorProto instead of committing grpcio-tools
output: four messages do not justify generated code that mypy and ruff would have to exclude, and
this keeps the wire contract (package `v1`, service `PodResourcesLister`, field numbers copied from
k8s.io/kubelet/pkg/apis/podresources/v1/api.proto) readable in one place. Only the fields we read
are declared; protobuf skips the others (cpu_ids, memory, topology) on decode.

`dynamic_resources` (field 5 of ContainerResources) carries the ResourceClaims a container uses
(Dynamic Resource Allocation, reported by default since Kubernetes 1.34 with the beta feature gate
KubeletPodResourcesDynamicResources): each claim's devices come as (driver, pool, device) names, not
device ids; exporter/attribution/slices.py maps them to GPU and MIG UUIDs. DynamicResource starts at
field 2 (its `class_name` = 1 was removed in 1.31); ClaimResource's `share_id` (5, optional) names a
share of a device with consumable capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.message import DecodeError, Message

from exporter.errors import PodResourcesDecodeError

LIST_METHOD = "/v1.PodResourcesLister/List"
SERVICE_NAME = "v1.PodResourcesLister"

_STRING = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
_MESSAGE = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
_OPTIONAL = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
_REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
_PROTO3_OPTIONAL = "proto3_optional"

# message name -> [(field name, number, label, type, message type)]
_MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, _REPEATED, _MESSAGE, ".v1.PodResources")],
    "PodResources": [
        ("name", 1, _OPTIONAL, _STRING, ""),
        ("namespace", 2, _OPTIONAL, _STRING, ""),
        ("containers", 3, _REPEATED, _MESSAGE, ".v1.ContainerResources"),
    ],
    "ContainerResources": [
        ("name", 1, _OPTIONAL, _STRING, ""),
        ("devices", 2, _REPEATED, _MESSAGE, ".v1.ContainerDevices"),
        ("dynamic_resources", 5, _REPEATED, _MESSAGE, ".v1.DynamicResource"),
    ],
    "DynamicResource": [
        ("claim_name", 2, _OPTIONAL, _STRING, ""),
        ("claim_namespace", 3, _OPTIONAL, _STRING, ""),
        ("claim_resources", 4, _REPEATED, _MESSAGE, ".v1.ClaimResource"),
    ],
    "ClaimResource": [
        ("cdi_devices", 1, _REPEATED, _MESSAGE, ".v1.CDIDevice"),
        ("driver_name", 2, _OPTIONAL, _STRING, ""),
        ("pool_name", 3, _OPTIONAL, _STRING, ""),
        ("device_name", 4, _OPTIONAL, _STRING, ""),
        ("share_id", 5, _OPTIONAL, _STRING, _PROTO3_OPTIONAL),
    ],
    "CDIDevice": [("name", 1, _OPTIONAL, _STRING, "")],
    "ContainerDevices": [
        ("resource_name", 1, _OPTIONAL, _STRING, ""),
        ("device_ids", 2, _REPEATED, _STRING, ""),
    ],
}


def _build_pool() -> descriptor_pool.DescriptorPool:
    fdp = descriptor_pb2.FileDescriptorProto(name="gpupulse/podresources/v1/api.proto", package="v1")
    fdp.syntax = "proto3"
    for message_name, fields in _MESSAGES.items():
        message = fdp.message_type.add(name=message_name)
        for field_name, number, label, field_type, type_name in fields:
            field = message.field.add(name=field_name, number=number, label=label, type=field_type)
            if type_name == _PROTO3_OPTIONAL:
                # `optional string` in proto3: a synthetic oneof, so presence is kept on the wire.
                field.proto3_optional = True
                field.oneof_index = len(message.oneof_decl)
                message.oneof_decl.add(name="_" + field_name)
            elif type_name:
                field.type_name = type_name
    service = fdp.service.add(name="PodResourcesLister")
    service.method.add(
        name="List", input_type=".v1.ListPodResourcesRequest", output_type=".v1.ListPodResourcesResponse"
    )
    # A private pool: another library registering a `v1` package cannot collide with ours.
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return pool


_POOL = _build_pool()
_REQUEST_CLASS = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("v1.ListPodResourcesRequest"))
_RESPONSE_CLASS = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("v1.ListPodResourcesResponse"))


@dataclass(frozen=True)
class ContainerDevices:
    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class ClaimResource:
    """One device of a ResourceClaim: (driver, pool, device) names it uniquely on the cluster."""

    driver_name: str
    pool_name: str
    device_name: str
    cdi_devices: tuple[str, ...] = ()
    share_id: str | None = None


@dataclass(frozen=True)
class DynamicResource:
    """A ResourceClaim a container uses, with the devices allocated to it."""

    claim_name: str
    claim_namespace: str
    claim_resources: tuple[ClaimResource, ...]


@dataclass(frozen=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...]
    dynamic_resources: tuple[DynamicResource, ...] = ()


@dataclass(frozen=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...]


def encode_list_request() -> bytes:
    """Serialize the (empty) ListPodResourcesRequest."""
    return bytes(_REQUEST_CLASS().SerializeToString())


def decode_list_request(data: bytes) -> None:
    """Check that bytes parse as a ListPodResourcesRequest (used by the fake kubelet)."""
    _parse(_REQUEST_CLASS, data)


def decode_list_response(data: bytes) -> tuple[PodResources, ...]:
    """Parse a ListPodResourcesResponse into typed, immutable records."""
    as_dict = json_format.MessageToDict(_parse(_RESPONSE_CLASS, data), preserving_proto_field_name=True)
    return tuple(_pod_from_dict(pod) for pod in as_dict.get("pod_resources", ()))


def encode_list_response(pods: Sequence[PodResources]) -> bytes:
    """Serialize typed records as a ListPodResourcesResponse (used by the fake kubelet)."""
    payload = {
        "pod_resources": [
            {
                "name": pod.name,
                "namespace": pod.namespace,
                "containers": [
                    {
                        "name": container.name,
                        "devices": [
                            {"resource_name": dev.resource_name, "device_ids": list(dev.device_ids)}
                            for dev in container.devices
                        ],
                        "dynamic_resources": [_dynamic_to_dict(d) for d in container.dynamic_resources],
                    }
                    for container in pod.containers
                ],
            }
            for pod in pods
        ]
    }
    return bytes(json_format.ParseDict(payload, _RESPONSE_CLASS()).SerializeToString())


def _dynamic_to_dict(d: DynamicResource) -> dict[str, Any]:
    resources = []
    for r in d.claim_resources:
        item: dict[str, Any] = {
            "cdi_devices": [{"name": n} for n in r.cdi_devices],
            "driver_name": r.driver_name,
            "pool_name": r.pool_name,
            "device_name": r.device_name,
        }
        if r.share_id is not None:
            item["share_id"] = r.share_id
        resources.append(item)
    return {"claim_name": d.claim_name, "claim_namespace": d.claim_namespace, "claim_resources": resources}


def _dynamic_from_dict(d: dict[str, Any]) -> DynamicResource:
    return DynamicResource(
        claim_name=str(d.get("claim_name", "")),
        claim_namespace=str(d.get("claim_namespace", "")),
        claim_resources=tuple(
            ClaimResource(
                driver_name=str(r.get("driver_name", "")),
                pool_name=str(r.get("pool_name", "")),
                device_name=str(r.get("device_name", "")),
                cdi_devices=tuple(str(c.get("name", "")) for c in r.get("cdi_devices", ())),
                share_id=str(r["share_id"]) if "share_id" in r else None,
            )
            for r in d.get("claim_resources", ())
        ),
    )


def _parse(cls: type[Message], data: bytes) -> Message:
    message = cls()
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise PodResourcesDecodeError(str(exc)) from exc
    return message


def _pod_from_dict(pod: dict[str, Any]) -> PodResources:
    return PodResources(
        name=str(pod.get("name", "")),
        namespace=str(pod.get("namespace", "")),
        containers=tuple(
            ContainerResources(
                name=str(container.get("name", "")),
                devices=tuple(
                    ContainerDevices(
                        resource_name=str(dev.get("resource_name", "")),
                        device_ids=tuple(str(i) for i in dev.get("device_ids", ())),
                    )
                    for dev in container.get("devices", ())
                ),
                dynamic_resources=tuple(
                    _dynamic_from_dict(d) for d in container.get("dynamic_resources", ())
                ),
            )
            for container in pod.get("containers", ())
        ),
    )
