"""The kubelet pod-resources v1 `List` call, declared in Python with the real API's numbers.

The exporter decodes the answer with the small wire reader below (`decode_list_response`): the
messages are strings and nested messages only, and the protobuf runtime (about 1.4 MiB of RSS, and
a List of 110 pods decoded through it cost about 2 ms of CPU every refresh) is then never imported
by the exporter. The same messages are declared as a FileDescriptorProto (built on first use) for
the other direction, which only the fake kubelets of tests, the demo and the benchmarks need: so
the real protobuf library encodes what our reader decodes. Either way the wire contract (package
`v1`, service `PodResourcesLister`, field numbers copied from
k8s.io/kubelet/pkg/apis/podresources/v1/api.proto) is readable in one place. Only the fields we read
are declared; both skip the others (cpu_ids, memory, topology) on decode.

`dynamic_resources` (field 5 of ContainerResources) carries the ResourceClaims a container uses
(Dynamic Resource Allocation, reported by default since Kubernetes 1.34 with the beta feature gate
KubeletPodResourcesDynamicResources): each claim's devices come as (driver, pool, device) names, not
device ids; exporter/attribution/slices.py maps them to GPU and MIG UUIDs. DynamicResource starts at
field 2 (its `class_name` = 1 was removed in 1.31); ClaimResource's `share_id` (5, optional) names a
share of a device with consumable capacity.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exporter.errors import PodResourcesDecodeError

if TYPE_CHECKING:
    from google.protobuf import descriptor_pool
    from google.protobuf.message import Message

LIST_METHOD = "/v1.PodResourcesLister/List"
SERVICE_NAME = "v1.PodResourcesLister"

# descriptor.proto's numbers (FieldDescriptorProto.Type and .Label), so the table needs no import
_STRING = 9
_MESSAGE = 11
_OPTIONAL = 1
_REPEATED = 3
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
    from google.protobuf import descriptor_pb2, descriptor_pool

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


@functools.cache
def _message_class(name: str) -> type[Message]:
    """The protobuf class of one message (the protobuf runtime is imported here, on first use)."""
    from google.protobuf import message_factory

    cls: type[Message] = message_factory.GetMessageClass(_build_pool().FindMessageTypeByName(name))
    return cls


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
    """Serialize the (empty) ListPodResourcesRequest: a message with no fields set is no bytes."""
    return b""


def decode_list_request(data: bytes) -> None:
    """Check that bytes parse as a ListPodResourcesRequest (used by the fake kubelet)."""
    _parse(_message_class("v1.ListPodResourcesRequest"), data)


def decode_list_response(data: bytes) -> tuple[PodResources, ...]:
    """Parse a ListPodResourcesResponse into typed, immutable records; PodResourcesDecodeError when
    the bytes are not one (truncated, a length past the end, a group, a string that is not UTF-8)."""
    try:
        return tuple(_read_pod(m) for m in _fields(memoryview(data), _RESPONSE_FIELDS).get(1, ()))
    except (ValueError, IndexError) as exc:  # UnicodeDecodeError is a ValueError
        raise PodResourcesDecodeError(f"not a ListPodResourcesResponse: {exc}") from exc


# ---- the wire reader: proto3's encoding of strings and nested messages ---------------------------
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
# per message, the numbers of the fields read (all length-delimited); every other field is skipped
_RESPONSE_FIELDS = frozenset({1})
_POD_FIELDS = frozenset({1, 2, 3})
_CONTAINER_FIELDS = frozenset({1, 2, 5})
_DEVICES_FIELDS = frozenset({1, 2})
_DYNAMIC_FIELDS = frozenset({2, 3, 4})
_CLAIM_FIELDS = frozenset({1, 2, 3, 4, 5})
_CDI_FIELDS = frozenset({1})


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")
        byte = data[pos]  # IndexError past the end: truncated
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(data: memoryview, wanted: frozenset[int]) -> dict[int, list[memoryview]]:
    """The length-delimited payloads of the wanted fields, by number, in wire order."""
    out: dict[int, list[memoryview]] = {}
    pos, end = 0, len(data)
    while pos < end:
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire == _LEN:
            length, pos = _varint(data, pos)
            if pos + length > end:
                raise ValueError("a length past the end of the message")
            if number in wanted:
                out.setdefault(number, []).append(data[pos : pos + length])
            pos += length
        elif wire == _VARINT:
            _, pos = _varint(data, pos)
        elif wire == _I64:
            pos += 8
        elif wire == _I32:
            pos += 4
        else:
            raise ValueError(f"wire type {wire} (groups are not part of this API)")
        if pos > end:
            raise ValueError("a field past the end of the message")
    return out


def _text(values: list[memoryview] | None, default: str = "") -> str:
    # a singular field given twice: the last one wins, as protobuf decodes it
    return str(values[-1], "utf-8") if values else default


def _texts(values: list[memoryview] | None) -> tuple[str, ...]:
    return tuple(str(v, "utf-8") for v in values or ())


def _many(values: list[memoryview] | None, read: Callable[[memoryview], Any]) -> tuple[Any, ...]:
    return tuple(read(v) for v in values or ())


def _read_pod(data: memoryview) -> PodResources:
    f = _fields(data, _POD_FIELDS)
    return PodResources(_text(f.get(1)), _text(f.get(2)), _many(f.get(3), _read_container))


def _read_container(data: memoryview) -> ContainerResources:
    f = _fields(data, _CONTAINER_FIELDS)
    return ContainerResources(_text(f.get(1)), _many(f.get(2), _read_devices), _many(f.get(5), _read_dynamic))


def _read_devices(data: memoryview) -> ContainerDevices:
    f = _fields(data, _DEVICES_FIELDS)
    return ContainerDevices(_text(f.get(1)), _texts(f.get(2)))


def _read_dynamic(data: memoryview) -> DynamicResource:
    f = _fields(data, _DYNAMIC_FIELDS)
    return DynamicResource(_text(f.get(2)), _text(f.get(3)), _many(f.get(4), _read_claim))


def _read_claim(data: memoryview) -> ClaimResource:
    f = _fields(data, _CLAIM_FIELDS)
    share = f.get(5)
    return ClaimResource(
        driver_name=_text(f.get(2)),
        pool_name=_text(f.get(3)),
        device_name=_text(f.get(4)),
        cdi_devices=tuple(_text(_fields(c, _CDI_FIELDS).get(1)) for c in f.get(1, ())),
        share_id=_text(share) if share is not None else None,  # proto3 `optional`: presence kept
    )


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
    from google.protobuf import json_format

    message = json_format.ParseDict(payload, _message_class("v1.ListPodResourcesResponse")())
    return bytes(message.SerializeToString())


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


def _parse(cls: type[Message], data: bytes) -> Message:
    from google.protobuf.message import DecodeError

    message = cls()
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise PodResourcesDecodeError(str(exc)) from exc
    return message
