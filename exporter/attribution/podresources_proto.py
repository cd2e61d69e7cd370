"""The kubelet pod-resources v1 `List` call, declared in Python with the real API's numbers.

The messages are built at import time from a FileDescriptorProto instead of committing grpcio-tools
output: four messages do not justify generated code that mypy and ruff would have to exclude, and
this keeps the wire contract (package `v1`, service `PodResourcesLister`, field numbers copied from
k8s.io/kubelet/pkg/apis/podresources/v1/api.proto) readable in one place. Only the fields we read
are declared; protobuf skips the others (cpu_ids, memory, topology, dynamic_resources) on decode.
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
    ],
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
            if type_name:
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
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...]


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
                    }
                    for container in pod.containers
                ],
            }
            for pod in pods
        ]
    }
    return bytes(json_format.ParseDict(payload, _RESPONSE_CLASS()).SerializeToString())


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
            )
            for container in pod.get("containers", ())
        ),
    )
